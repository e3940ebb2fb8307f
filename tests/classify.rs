//! End to end: the real server, the real INT8 model, real messages from the held-out test split.

mod common;
use common::*;
use serde_json::{json, Value};

/// Checks the decision schema and its internal consistency; returns the decision.
fn check_schema(d: &Value, request_id: &str) {
    assert_eq!(d["request_id"], request_id, "request id is echoed: {d}");
    let label = d["label"].as_str().unwrap();
    assert!(matches!(label, "ok" | "risk"), "{d}");
    let risk = d["risk_score"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&risk), "{d}");
    assert_eq!(label == "risk", risk >= 0.5, "label follows risk_score: {d}");
    assert!(matches!(d["action"].as_str().unwrap(), "allow" | "review" | "block"), "{d}");
    let tier = d["tier"].as_str().unwrap();
    assert!(matches!(tier, "cpu" | "gpu" | "rules" | "guard"), "{d}");
    match tier {
        "rules" | "guard" => assert!(d["confidence"].is_null(), "rules give no calibrated confidence: {d}"),
        _ => {
            let c = d["confidence"].as_f64().unwrap();
            assert!((0.5..=1.0).contains(&c), "{d}");
            assert!((c - risk.max(1.0 - risk)).abs() < 1e-9, "confidence is the predicted class's probability: {d}");
        }
    }
    let path = d["path"].as_array().unwrap();
    assert!(!path.is_empty(), "{d}");
    assert_eq!(path.last().unwrap()["tier"], tier, "the deciding tier is the last step: {d}");
    assert_eq!(path[0]["tier"], "cpu", "every request starts on the cpu tier: {d}");
    for step in path {
        assert!(step["outcome"].is_string() && step["latency_us"].is_u64(), "{step}");
    }
    let version = d["policy_version"].as_str().unwrap();
    assert!(version.len() == 12 && version.chars().all(|c| c.is_ascii_hexdigit()), "{d}");
    assert!(d["latency_us"].is_u64(), "{d}");
}

#[tokio::test]
async fn real_test_split_messages_are_classified_accurately() {
    let addr = default_server();
    let sample = labelled("test_sample.jsonl");
    assert!(sample.len() >= 100, "the committed sample has {} messages", sample.len());
    let mut correct = 0;
    let mut by_tier = std::collections::BTreeMap::<String, usize>::new();
    for (i, (text, label)) in sample.iter().enumerate() {
        let id = format!("sample-{i}");
        let r = send(
            addr,
            "POST",
            "/v1/classify",
            // Unhurried: this measures what is decided, not how fast on a loaded test machine.
            &[("content-type", "application/json"), ("x-request-id", &id), ("x-tiergate-deadline-ms", "5000")],
            json!({"text": text}).to_string(),
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.headers["x-request-id"], id.as_str());
        let d = r.json();
        check_schema(&d, &id);
        *by_tier.entry(d["tier"].as_str().unwrap().to_string()).or_default() += 1;
        correct += ((d["label"] == "risk") == (*label == 1)) as usize;
    }
    let accuracy = correct as f64 / sample.len() as f64;
    eprintln!("accuracy {accuracy:.4} on {} test-split messages; deciding tiers {by_tier:?}", sample.len());
    // 0.95 with the English model trained on this corpus (its own test split); the multilingual
    // model that replaced it reads this 2002 English mail worse (0.915, models/MODEL_CARD.md).
    assert!(accuracy >= 0.9, "accuracy {accuracy} on the test sample");
    // 80 % until round 6 (2026-12-05): 157 of 200 now (was 160), the rest of this 2002 mail
    // handed to the rules as unsure; accuracy here rose 0.915 -> 0.945 (models/MODEL_CARD.md).
    assert!(
        by_tier.get("cpu").copied().unwrap_or(0) * 4 >= sample.len() * 3,
        "most messages are decided by the model: {by_tier:?}"
    );
}

#[tokio::test]
async fn low_confidence_verdicts_go_to_rules_which_name_the_rule() {
    // A policy that trusts no model verdict below 0.9999 makes every verdict "unsure".
    let dir = policies_with_routing(
        "strict",
        "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\naccept_below = 0.99999\nood_above = 1.0\n[default]\naction = \"review\"\nscore = 0.4\n",
    );
    let addr = start(config(&dir));
    let r = classify(
        addr,
        json!({"text": "Your account is locked. Confirm your password at http://secure-login.example.top/verify"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let d = r.json();
    let path = d["path"].as_array().unwrap();
    assert_eq!(path[0]["tier"], "cpu");
    assert_eq!(path[0]["outcome"], "low_confidence", "{d}");
    assert!(path[0]["reason"].as_str().unwrap().contains("below accept_below 0.99999"), "{d}");
    assert!(path[0]["confidence"].as_f64().is_some(), "{d}");
    assert_eq!(path[1]["tier"], "gpu");
    assert_eq!(path[1]["outcome"], "skipped");
    assert!(path[1]["reason"].as_str().unwrap().contains("no gpu tier configured"), "{d}");
    assert_eq!(d["tier"], "rules");
    assert_eq!(d["rule"], "credential_phishing");
    assert_eq!(path[2]["rule"], "credential_phishing");
    assert_eq!(d["action"], "block");
    assert!(d["signals"]["credential_request"].as_i64().unwrap() >= 1, "{d}");

    // No rule matches: the policy default decides (fail closed: review), and says so.
    let d = classify(addr, json!({"text": "Lunch at noon tomorrow? I booked the usual place."})).await.json();
    assert_eq!(d["tier"], "rules");
    assert!(d.get("rule").is_none(), "{d}");
    assert_eq!(d["path"].as_array().unwrap().last().unwrap()["outcome"], "default");
    assert_eq!(d["action"], "review");
    assert_eq!(d["label"], "ok");

    // Features reach the guards (here the guard's review equals the default, so nothing is
    // raised; tests/evasion.rs shows a guard raising a confident allow).
    let d = classify(
        addr,
        json!({"text": "invoice 2291", "features": {"amount": 25000, "country": "NG", "home_country": "DE"}}),
    )
    .await
    .json();
    assert_eq!(d["action"], "review", "{d}");
}

#[tokio::test]
async fn a_deadline_the_model_cannot_meet_hands_over_to_rules() {
    let addr = default_server();
    let text = "Dear customer, we noticed unusual activity. ".repeat(30);
    let r = classify_within(addr, json!({"text": text}), 1).await;
    assert_eq!(r.status, 200);
    let d = r.json();
    assert_eq!(d["path"][0]["tier"], "cpu");
    // Either the cpu tier ran out of time, or (once it has a service-time estimate) routing saw
    // that it cannot fit in 1 ms and did not try it, or the worker did not start it (doomed).
    match d["path"][0]["outcome"].as_str().unwrap() {
        "timeout" | "doomed" => {}
        "skipped" => assert!(d["path"][0]["reason"].as_str().unwrap().contains("does not cover cpu queue wait"), "{d}"),
        other => panic!("unexpected outcome {other}: {d}"),
    }
    assert_eq!(d["tier"], "rules", "{d}");
}

#[tokio::test]
async fn concurrent_requests_all_get_decisions() {
    let addr = default_server();
    let sample = labelled("test_sample.jsonl");
    let tasks: Vec<_> = sample
        .iter()
        .take(48)
        .map(|(text, _)| {
            let text = text.clone();
            tokio::spawn(async move { classify(addr, json!({"text": text})).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert!(r.json()["action"].is_string());
    }
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let addr = default_server();
    let r = send(addr, "GET", "/healthz", &[], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ok");
    let r = send(addr, "GET", "/readyz", &[], "").await;
    assert_eq!(r.status, 200);
    let ready = r.json();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["tiers"]["cpu"]["status"], "ready");
    assert_eq!(ready["tiers"]["gpu"]["status"], "unavailable");
    assert!(ready["tiers"]["gpu"]["reason"].as_str().unwrap().contains("gpu"), "{ready}");
    assert_eq!(ready["model"]["sha256"].as_str().unwrap().len(), 64);
    classify(addr, json!({"text": "hello there"})).await;
    let r = send(addr, "GET", "/metrics", &[], "").await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains("tiergate_decisions_total{"), "{text}");
    assert!(text.contains("tiergate_decision_latency_seconds_bucket"), "{text}");
    assert!(text.contains("tiergate_cpu_queue_depth"), "{text}");
}

#[tokio::test]
async fn the_public_listener_serves_no_evasion_oracle() {
    let mut c = config(&repo().join("policies"));
    c.admin = Default::default(); // the defaults: public_metrics, public_readyz_details, public_explain off
    let (public, admin, _) = start_with_admin(c, Default::default(), None);
    let r = send(public, "GET", "/metrics", &[], "").await;
    assert_eq!(r.status, 404);
    let r = send(public, "GET", "/readyz", &[], "").await;
    assert_eq!((r.status.as_u16(), r.json()), (200, json!({"status": "ready"})));
    let body = json!({"text": "hello there"}).to_string();
    let ct = [("content-type", "application/json")];
    let r = send(public, "POST", "/v1/classify?explain=true", &ct, body.clone()).await;
    assert_eq!(r.status, 422);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("public_explain"), "{}", r.json());
    assert_eq!(send(public, "POST", "/v1/classify", &ct, body.clone()).await.status, 200);
    // All of it on the admin listener.
    assert_eq!(send(admin, "GET", "/metrics", &[], "").await.status, 200);
    assert_eq!(send(admin, "GET", "/readyz", &[], "").await.json()["tiers"]["cpu"]["status"], "ready");
    let r = send(admin, "POST", "/v1/classify?explain=true", &ct, body).await;
    assert_eq!(r.status, 200);
    assert!(r.json()["explain"].is_object(), "{}", r.json());
}
