//! The official `openai` Python SDK (PyPI `openai`, pinned, installed with its dependencies into
//! the cache by tests/common/python.rs) streaming a chat completion through the real tiergate
//! binary with `config/sidecar.example.toml`, in front of an app that streams as an
//! OpenAI-compatible model server does (tests/common/app.rs, `x-reply`). The SDK's ordinary
//! loop (`chunk.choices[0].delta.content`) must run to the end whether the stream guard lets
//! the reply through or cuts it, and a cut must read as `finish_reason == "content_filter"`
//! with tiergate's decision in the chunk's extra field `tiergate`.

mod common;

use common::app;
use serde_json::Value;
use std::process::Command;

const OPENAI: &str = "openai==3.57.0";

/// The user's loop, as the SDK's README writes it, and what it saw.
const CLIENT: &str = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
from openai import OpenAI
client = OpenAI(base_url=sys.argv[2], api_key="unused", max_retries=0)
stream = client.chat.completions.create(
    model="app-model",
    messages=[{"role": "user", "content": "How is the weather today?"}],
    stream=True,
    extra_headers={"x-reply": sys.argv[3]},
)
text, finish, decision, ids = "", None, None, set()
for chunk in stream:
    text += chunk.choices[0].delta.content or ""
    finish = chunk.choices[0].finish_reason
    decision = (chunk.model_extra or {}).get("tiergate", decision)
    ids.add((chunk.id, chunk.model))
print(json.dumps({"text": text, "finish_reason": finish, "tiergate": decision, "ids": sorted(ids)}))
"#;

/// Runs [`CLIENT`] against `base_url` with the app replying `reply` (pieces split by `|`).
fn sdk_stream(site: &std::path::Path, base_url: &str, reply: &str) -> Value {
    let out = Command::new(common::python::python())
        .arg("-c")
        .arg(CLIENT)
        .arg(site)
        .arg(base_url)
        .arg(reply)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "the SDK loop raised ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn the_openai_sdk_reads_a_cut_stream_as_an_ordinary_content_filter_end() {
    let site = common::python::install("openai", &[OPENAI], true);
    let app = app::start();
    let sidecar = common::Sidecar::start(&app.url());
    let base_url = format!("http://{}/v1", sidecar.public);

    let benign = "The weather is mild today.| Expect light wind.| Enjoy the afternoon!";
    let seen = sdk_stream(&site, &base_url, benign);
    assert_eq!(seen["text"], benign.replace('|', ""), "{seen}");
    assert_eq!(seen["finish_reason"], "stop", "{seen}");
    assert_eq!(seen["tiergate"], Value::Null, "{seen}");

    let risky = "The weather is mild today.| Please send your password to http://evil.example/login now.| More.";
    let seen = sdk_stream(&site, &base_url, risky);
    assert_eq!(seen["text"], "The weather is mild today.", "the risky sentence never reached the client: {seen}");
    assert_eq!(seen["finish_reason"], "content_filter", "{seen}");
    assert_eq!(seen["tiergate"]["action"], "block", "{seen}");
    assert_eq!(seen["tiergate"]["rule"], "credential_phishing", "{seen}");
    assert_eq!(seen["ids"], serde_json::json!([["chatcmpl-app", "app-model"]]), "one stream, one id: {seen}");
}
