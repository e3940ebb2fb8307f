//! Answer parsing, prompt and config validation, metrics text.

use super::*;
use serde_json::{json, Value};

fn prompt() -> PromptSpec {
    PromptSpec {
        system: "Classify.".into(),
        user: "Text: {text}".into(),
        max_tokens: 16,
        risk_label: "risk".into(),
        ok_label: "ok".into(),
    }
}

fn completion(content: &str, logprobs: Option<Value>) -> Vec<u8> {
    let mut choice = json!({"index": 0, "message": {"role": "assistant", "content": content}});
    if let Some(lp) = logprobs {
        choice["logprobs"] = json!({ "content": lp });
    }
    serde_json::to_vec(&json!({"choices": [choice], "usage": {"prompt_tokens": 42}})).unwrap()
}

#[test]
fn answer_forms() {
    let p = prompt();
    let c = parse_completion(&completion(r#"{"label": "risk", "confidence": 0.9}"#, None), &p).unwrap();
    assert_eq!(
        (c.is_risk, c.probability, c.source, c.prompt_tokens),
        (true, 0.9, ProbabilitySource::Confidence, Some(42))
    );
    let c =
        parse_completion(&completion("```json\n{\"label\":\"OK\",\"confidence\":\"0.75\"}\n```", None), &p).unwrap();
    assert_eq!((c.is_risk, c.probability), (false, 0.75));
    assert_eq!(c.scores(), (0.25, 0.75));
    let c =
        parse_completion(&completion("Sure! {\"label\": \"ok\", \"confidence\": 1} Hope it helps", None), &p).unwrap();
    assert_eq!(c.scores(), (0.0, 1.0));
    // A bare word needs logprobs.
    assert!(parse_completion(&completion(" risk.\n", None), &p).unwrap_err().contains("neither token logprobs"));
    let lp = json!([{"token": "risk", "logprob": (0.8f64).ln()}, {"token": ".", "logprob": 0.0}]);
    let c = parse_completion(&completion("risk.", Some(lp)), &p).unwrap();
    assert!((c.probability - 0.8).abs() < 1e-12 && c.source == ProbabilitySource::Logprobs);
}

#[test]
fn logprobs_take_the_first_label_token_after_the_key() {
    let p = prompt();
    // "ok" appears inside the system-ish prose before the key: must not be picked.
    let tokens = ["ok", " {\"", "label", "\":", " \"", "ok", "\",", " \"confidence\":", " 0.6", "}"];
    let lp: Vec<Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"token": t, "logprob": if i == 5 { (0.7f64).ln() } else { -0.01 }}))
        .collect();
    let content: String = tokens.concat();
    let c = parse_completion(&completion(&content, Some(Value::Array(lp))), &p).unwrap();
    assert!((c.probability - 0.7).abs() < 1e-12, "{c:?}");
    assert!(!c.is_risk);
    // Logprobs that do not spell the label fall back to the confidence.
    let lp = json!([{"token": "x", "logprob": -0.1}]);
    let c = parse_completion(&completion(r#"{"label":"ok","confidence":0.6}"#, Some(lp)), &p).unwrap();
    assert_eq!((c.probability, c.source), (0.6, ProbabilitySource::Confidence));
    // Garbage logprob values fall back too.
    let lp = json!([{"token": "ok", "logprob": "high"}]);
    let c = parse_completion(&completion(r#"{"label":"ok","confidence":0.6}"#, Some(lp)), &p).unwrap();
    assert_eq!(c.source, ProbabilitySource::Confidence);
}

#[test]
fn malformed_answers_are_errors() {
    let p = prompt();
    for (body, needle) in [
        (b"not json".to_vec(), "not JSON"),
        (b"{}".to_vec(), "choices[0]"),
        (br#"{"choices": [{"message": {"content": null}}]}"#.to_vec(), "content"),
        (completion("maybe", None), "neither JSON"),
        (completion(r#"{"label": "fraud", "confidence": 0.9}"#, None), "neither `risk` nor `ok`"),
        (completion(r#"{"label": 3}"#, None), "no string `label`"),
        (completion(r#"{"label": "risk", "confidence": 95}"#, None), "in [0, 1]"),
        (completion(r#"{"label": "risk"}"#, None), "neither token logprobs"),
        (completion(&"x".repeat(10_000), None), "…"),
    ] {
        let err = parse_completion(&body, &p).unwrap_err();
        assert!(err.contains(needle), "{err}");
        assert!(err.len() < 600, "{err}");
    }
}

#[test]
fn prompt_validation() {
    assert!(prompt().validate().is_ok());
    let mut p = prompt();
    p.user = "no placeholder".into();
    assert!(p.validate().unwrap_err().contains("{text}"));
    let mut p = prompt();
    p.ok_label = " RISK ".into();
    assert!(p.validate().unwrap_err().contains("differ"));
    let mut p = prompt();
    p.risk_label = "".into();
    assert!(p.validate().is_err());
    let p: PromptSpec = serde_json::from_value(json!({"system": "s", "user": "{text}"})).unwrap();
    assert_eq!((p.max_tokens, p.risk_label.as_str(), p.ok_label.as_str()), (16, "risk", "ok"));
    let body = request_body(&p, "m", "a {text} b");
    assert_eq!(body["messages"][1]["content"], "a {text} b");
}

#[test]
fn metrics_text() {
    let text = "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage.\n\
        vllm:gpu_cache_usage_perc{model_name=\"a\",engine=\"0\"} 0.25\n\
        vllm:gpu_cache_usage_perc{model_name=\"b}\"} 0.5 1700000000\n\
        vllm:num_requests_waiting{model_name=\"a\"} 2\n\
        vllm:num_requests_waiting 3.0\n\
        vllm:kv_cache_usage_perc NaN\n\
        garbage line\n\
        vllm:num_requests_running 7\n";
    assert_eq!(parse_vllm_metrics(text), (Some(0.5), Some(5.0)));
    assert_eq!(parse_vllm_metrics("vllm:kv_cache_usage_perc 1.5"), (Some(1.0), None));
    assert_eq!(parse_vllm_metrics(""), (None, None));
}

#[test]
fn config_validation() {
    let mut c =
        UpstreamConfig { endpoints: vec!["http://127.0.0.1:8000/".into()], model: "m".into(), ..Default::default() };
    assert!(c.validate().is_ok());
    let uris = EndpointUris::parse("http://127.0.0.1:8000/", "health", Some("/metrics")).unwrap();
    assert_eq!(uris.chat, "http://127.0.0.1:8000/v1/chat/completions");
    assert_eq!(uris.health, "http://127.0.0.1:8000/health");
    c.endpoints = vec!["https://x".into()];
    assert!(c.validate().unwrap_err().contains("https"));
    c.endpoints = vec!["127.0.0.1:8000".into()];
    assert!(c.validate().is_err());
    c.endpoints = vec![];
    assert!(c.validate().unwrap_err().contains("endpoints"));
    let parsed: Result<UpstreamConfig, _> = serde_json::from_value(json!({"endpoints": [], "bogus": 1}));
    assert!(parsed.is_err());
}
