//! The confirm stage end to end on ONNX Runtime, no gpu tier. No confirm model is bundled (the
//! recipe builds one: models/recipe/README.md, "Round 17"), so the bundled cpu model stands in for
//! it: a real model in a second pool, its tokenizer shared, whose scores the test can predict.

mod common;
use common::*;
use serde_json::json;
use tiergate::tier::ModelConfig;

/// A Hindi "your electricity will be cut tonight, call the officer at this number" SMS (a spent
/// blind set's, `blind_ml20.jsonl` line 334): the bundled cpu model (rounds 18, 21) leans risk without
/// the confidence a block needs, so it is the kind of verdict the confirm model is asked about.
fn unsure_risk_text() -> String {
    let line = std::fs::read_to_string(repo().join("tests/data/blind_ml20.jsonl")).unwrap();
    let row: serde_json::Value = serde_json::from_str(line.lines().nth(333).unwrap()).unwrap();
    row["text"].as_str().unwrap().to_string()
}

/// The bundled routing policy with `confirm_from` and `confirm_at` set.
fn policies(name: &str, confirm_from: f64, confirm_at: f64) -> std::path::PathBuf {
    let bundled = bundled_routing();
    let mut routing: Vec<String> = bundled.lines().filter(|l| !l.starts_with("confirm_")).map(String::from).collect();
    let at = routing.iter().position(|l| l.starts_with("accept_risk_below")).expect("the bundled policy sets it");
    routing.insert(at + 1, format!("confirm_from = {confirm_from}\nconfirm_at = {confirm_at}"));
    policies_with_routing(name, &routing.join("\n"))
}

fn with_confirm(policies: &std::path::Path) -> tiergate::config::Config {
    let mut c = config(policies);
    c.confirm = Some(ModelConfig { dir: repo().join("models"), sessions: 1, ..ModelConfig::default() });
    c
}

#[tokio::test]
async fn the_confirm_model_scores_an_unsure_risk_verdict_and_its_score_decides_whether_it_stands() {
    let text = unsure_risk_text();
    // confirm_at 0: whatever the confirm model says, it confirms.
    let addr = start(with_confirm(&policies("confirm-yes", 0.5, 0.0)));
    let d = classify_unhurried(addr, json!({ "text": text })).await.json();
    let steps = path_steps(&d);
    assert_eq!(steps[0], ("cpu".into(), "low_confidence".into()), "precondition: an unsure cpu verdict: {d}");
    let cpu = d["path"][0]["risk_score"].as_f64().unwrap();
    let stands = bundled_routing_number("accept_risk_below");
    assert!((0.5..stands).contains(&cpu), "precondition: a risk lean below accept_risk_below: {d}");
    assert_eq!(steps[1], ("confirm".into(), "accepted".into()), "{d}");
    let confirm = d["path"][1]["risk_score"].as_f64().unwrap();
    assert!((confirm - cpu).abs() < 1e-3, "the stand-in reads the text as the cpu tier did: {d}");
    assert_eq!((d["tier"].as_str(), d["risk_score"].as_f64()), (Some("confirm"), Some(cpu)), "{d}");
    // The readiness report names the confirm model and the band.
    let ready = send(addr, "GET", "/readyz", &[], "").await.json();
    let tier = &ready["tiers"]["confirm"];
    assert_eq!((tier["status"].as_str(), tier["workers"].as_u64()), (Some("ready"), Some(1)), "{ready}");
    assert_eq!(tier["model"]["name"], ready["model"]["name"], "the stand-in: {ready}");
    assert_eq!((tier["confirm_from"].as_f64(), tier["confirm_at"].as_f64()), (Some(0.5), Some(0.0)), "{ready}");

    // confirm_at 1: never confirms; the rules decide and see the cpu verdict (model_leaning_risky).
    let addr = start(with_confirm(&policies("confirm-no", 0.5, 1.0)));
    let d = classify_unhurried(addr, json!({ "text": text })).await.json();
    let steps = path_steps(&d);
    assert_eq!(steps[1], ("confirm".into(), "low_confidence".into()), "{d}");
    assert!(d["path"][1]["reason"].as_str().unwrap().contains("below confirm_at 1"), "{d}");
    assert_eq!((d["tier"].as_str(), d["rule"].as_str()), (Some("rules"), Some("model_leaning_risky")), "{d}");
    assert_eq!(d["action"], "review");

    // Without a confirm model loaded, the same policy never asks.
    let addr = start(config(&policies("confirm-none", 0.5, 0.0)));
    let d = classify_unhurried(addr, json!({ "text": text })).await.json();
    assert!(path_steps(&d).iter().all(|(tier, _)| tier != "confirm"), "{d}");
    let ready = send(addr, "GET", "/readyz", &[], "").await.json();
    assert_eq!(ready["tiers"]["confirm"]["status"], "unavailable", "{ready}");
}
