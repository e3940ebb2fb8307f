//! The verdict cache (`[cache]`) against a real server, the real model and a real SQLite audit
//! trail: a wave of 1,000 identical requests sent at once costs one model call (the cpu tier's
//! metrics and the cache's own say so), every one of them is in the audit trail, and a guard
//! that matches the text still fires on each; a request that differs in anything the key holds
//! (here its features) calls the model again.

mod common;

use bytes::Bytes;
use common::{repo, BENIGN};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiergate::audit::query::{self, Filter};
use tiergate::audit::store::Store;
use tiergate::audit::{AuditConfig, AuditRecord, TextMode};
use tiergate::gateway::{CacheConfig, Sources};

const WAVE: usize = 1000;
const GUARD: &str = "wave_template";

/// The bundled policies plus a signal for [`BENIGN`]'s wording and a guard that blocks it: the
/// model allows the text, so the guard's raise shows in every path.
fn guarded_policies() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-verdict-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(repo().join("policies")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let wave = format!(
        "[signals.{GUARD}]\ndescription = \"the wave's template\"\npatterns = ['(?i)the usual place']\n\n\
         [[guards]]\nname = \"{GUARD}\"\ndescription = \"the wave's template\"\nwhen = \"signals.{GUARD} > 0\"\n\
         action = \"block\"\nscore = 0.99\n"
    );
    std::fs::write(dir.join("wave.toml"), wave).unwrap();
    dir
}

/// A server with the cache on, the audit trail in `audit`, and an idle (fixed) CPU reading so that
/// routing always starts at the cpu tier.
fn server(audit: &Path) -> SocketAddr {
    let mut config = common::config(&guarded_policies());
    config.cache = CacheConfig { enabled: true, ..CacheConfig::default() };
    config.audit = Some(AuditConfig { dir: audit.to_path_buf(), text: TextMode::Redacted, ..AuditConfig::default() });
    let idle = common::FakeCpu(std::sync::Mutex::new(0.1));
    common::start_with(config, Sources { cpu: Arc::new(idle) as _, ..Sources::default() }).0
}

/// `POST /v1/classify` on `client`'s connection, with a deadline no loaded machine reaches.
async fn classify(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    body: &Value,
) -> Value {
    let req = Request::post(format!("http://{addr}/v1/classify"))
        .header("content-type", "application/json")
        .header("x-tiergate-deadline-ms", "8000")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client.request(req).await.expect("request reaches the server");
    assert_eq!(resp.status(), StatusCode::OK);
    serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

/// The value of the first `/metrics` line that starts with `line_start` (0 when absent).
async fn metric(addr: SocketAddr, line_start: &str) -> u64 {
    let text = common::send(addr, "GET", "/metrics", &[], "").await.body;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Every record in the audit store at `dir`.
fn records(dir: &Path) -> Vec<AuditRecord> {
    let conn = Store::open_read_only(dir).unwrap();
    let mut out = Vec::new();
    query::for_each(&conn, &Filter::default(), |json| {
        out.push(serde_json::from_str(json)?);
        Ok(())
    })
    .unwrap();
    out
}

/// The cpu step of a decision's (or audit record's) path, and whether it was reused.
fn cpu_step(path: &[Value]) -> (&Value, bool) {
    let step = path.iter().find(|s| s["tier"] == "cpu").unwrap_or_else(|| panic!("no cpu step: {path:?}"));
    (step, step["cached"] == json!(true))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wave_of_identical_requests_costs_one_model_call_and_each_is_guarded_and_audited() {
    let audit = std::env::temp_dir().join(format!("tiergate-verdict-cache-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&audit);
    let addr = server(&audit);
    // One HTTP/2 connection: the wave's requests reach the server together, as streams.
    let client = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let body = json!({"text": BENIGN, "features": {"amount": 12.5}});
    let wave: Vec<_> = (0..WAVE)
        .map(|_| {
            let (client, body) = (client.clone(), body.clone());
            tokio::spawn(async move { classify(&client, addr, &body).await })
        })
        .collect();
    let mut decisions = Vec::new();
    for d in wave {
        decisions.push(d.await.unwrap());
    }

    // Every answer: the guard raised the model's verdict to block; all but one reused it.
    let mut reused = 0;
    for d in &decisions {
        let path = d["path"].as_array().unwrap();
        assert_eq!((d["action"].as_str(), d["rule"].as_str()), (Some("block"), Some(GUARD)), "{d}");
        assert!(path.iter().any(|s| s["tier"] == "guard" && s["outcome"] == "raised"), "{d}");
        let (step, cached) = cpu_step(path);
        assert!(step["risk_score"].is_number(), "{d}");
        reused += usize::from(cached);
    }
    assert_eq!(reused, WAVE - 1, "one request called the model, the others reused its verdict");

    // The metrics: one cpu verdict from the model, one stored; the rest hit or waited for it.
    assert_eq!(metric(addr, "tiergate_batch_size_count{tier=\"cpu\"}").await, 1, "one cpu model call");
    assert_eq!(metric(addr, "tiergate_tier_latency_seconds_count{tier=\"cpu\"}").await, 1);
    let lookups = |result: &str| format!("tiergate_verdict_cache_lookups_total{{tier=\"cpu\",result=\"{result}\"}}");
    let (hit, coalesced, miss) = (
        metric(addr, &lookups("hit")).await,
        metric(addr, &lookups("coalesced")).await,
        metric(addr, &lookups("miss")).await,
    );
    eprintln!("wave of {WAVE}: {hit} hits, {coalesced} coalesced (single flight), {miss} miss");
    // How many waited for the call in flight (coalesced) rather than finding it stored (hit) is
    // timing: on a fast machine the call can end before the second stream arrives. Single flight
    // itself is pinned by the cache's unit test `concurrent_identical_requests_wait_for_one_call`.
    assert_eq!((hit + coalesced, miss), (WAVE as u64 - 1, 1));
    assert_eq!(metric(addr, "tiergate_verdict_cache_insertions_total{tier=\"cpu\"}").await, 1);
    assert_eq!(metric(addr, &lookups("timeout")).await, 0);

    // The audit trail: one record per request, each with the guard and the cpu step as answered.
    let mut stored = Vec::new();
    common::eventually("the wave's audit records", || {
        stored = records(&audit);
        stored.len() >= WAVE
    })
    .await;
    assert_eq!(stored.len(), WAVE);
    let mut ids: Vec<&str> = stored.iter().map(|r| r.request_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), WAVE, "a record for each request");
    for r in &stored {
        assert_eq!(r.action.as_str(), "block");
        assert!(r.rules.iter().any(|rule| rule == GUARD), "{:?}", r.rules);
    }
    assert_eq!(stored.iter().filter(|r| cpu_step(&r.path).1).count(), WAVE - 1, "cached: true in the trail too");

    // Anything the key holds, changed, is another question: the model is called again, once.
    let other = json!({"text": BENIGN, "features": {"amount": 99}});
    let (first, again) = (classify(&client, addr, &other).await, classify(&client, addr, &other).await);
    assert!(!cpu_step(first["path"].as_array().unwrap()).1 && cpu_step(again["path"].as_array().unwrap()).1);
    assert_eq!(metric(addr, "tiergate_batch_size_count{tier=\"cpu\"}").await, 2);
}
