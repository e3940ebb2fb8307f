//! Shadow evaluation: a candidate policy decides beside the live one on live traffic, its
//! disagreements are counted by kind and logged with both decisions, and it never changes a
//! response. Also `check-policy --against`, which replays labelled requests the same way.

mod common;
use common::*;
use serde_json::{json, Value};
use std::process::Command;

/// A candidate that trusts no model verdict: rules decide everything, default `block`.
fn candidate_dir(name: &str) -> std::path::PathBuf {
    policies_with_routing(
        name,
        "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\naccept_below = 1.0\nood_above = 1.0\n[default]\naction = \"block\"\nscore = 0.9\n",
    )
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_shadow_policy_is_counted_and_logged_and_never_changes_a_response() {
    let log = std::env::temp_dir().join(format!("tiergate-shadow-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut c = config(&repo().join("policies"));
    c.shadow.dir = Some(candidate_dir("shadow"));
    c.shadow.share = 1.0;
    c.shadow.log = Some(log.clone());
    let shadowed = start(c);
    let plain = default_server();

    let sample = labelled("test_sample.jsonl");
    let texts: Vec<&str> = sample.iter().take(12).map(|(t, _)| t.as_str()).collect();
    let strip =
        |d: &Value| json!([d["label"], d["action"], d["tier"], d["risk_score"], d["rule"], d["policy_version"]]);
    let mut by_model = 0;
    for text in &texts {
        let a = classify_unhurried(shadowed, json!({"text": text})).await.json();
        let b = classify_unhurried(plain, json!({"text": text})).await.json();
        assert_eq!(strip(&a), strip(&b), "the shadow must not change the answer");
        by_model += (a["tier"] == "cpu") as u64;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await; // the log writer is asynchronous
    let metrics = String::from_utf8_lossy(&send(shadowed, "GET", "/metrics", &[], "").await.body).to_string();
    assert_eq!(metric(&metrics, "tiergate_shadow_evaluations_total"), texts.len() as u64, "{metrics}");

    let lines: Vec<Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!lines.is_empty(), "a candidate that decides everything by rules disagrees with the model");
    for kind in ["label", "action", "tier"] {
        let logged = lines.iter().filter(|l| l["disagree"].as_array().unwrap().contains(&json!(kind))).count() as u64;
        let counted = metric(&metrics, &format!("tiergate_shadow_disagreements_total{{kind=\"{kind}\"}}"));
        assert_eq!(logged, counted, "{kind}: log and metric agree");
    }
    for l in &lines {
        assert_eq!(l["candidate"]["tier"], "rules", "{l}");
        assert_ne!(l["live"]["policy_version"], l["candidate"]["policy_version"]);
        assert!(l["candidate"]["path"][0]["reason"].is_string(), "{l}");
    }
    // Every live answer the model decided disagrees on the tier (a long mail past the model's
    // windows is decided by rules in both).
    let tier_disagreements = metric(&metrics, "tiergate_shadow_disagreements_total{kind=\"tier\"}");
    assert!(by_model >= texts.len() as u64 / 2, "most of the sample is decided by the model");
    assert_eq!(tier_disagreements, by_model, "{metrics}");
}

#[tokio::test]
async fn share_zero_evaluates_nothing() {
    let mut c = config(&repo().join("policies"));
    c.shadow.dir = Some(candidate_dir("share0"));
    c.shadow.share = 0.0;
    let addr = start(c);
    for _ in 0..5 {
        classify(addr, json!({"text": "see you at 6"})).await;
    }
    let metrics = String::from_utf8_lossy(&send(addr, "GET", "/metrics", &[], "").await.body).to_string();
    assert_eq!(metric(&metrics, "tiergate_shadow_evaluations_total"), 0);
}

#[test]
fn check_policy_against_reports_how_decisions_would_change() {
    let samples = std::env::temp_dir().join(format!("tiergate-against-{}.jsonl", std::process::id()));
    let text = std::fs::read_to_string(repo().join("tests/data/ood_short.jsonl")).unwrap();
    std::fs::write(&samples, text.lines().take(20).collect::<Vec<_>>().join("\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .current_dir(repo())
        .arg("check-policy")
        .arg(candidate_dir("against"))
        .arg("--against")
        .arg(&samples)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("replayed 20 labelled requests"), "{stdout}");
    let row = |name: &str| -> Vec<f64> {
        let line = stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} row:\n{stdout}"));
        line[name.len()..].split_whitespace().map(|v| v.parse().unwrap()).collect()
    };
    assert_eq!(row("decided by rules")[1], 20.0, "the candidate decides everything by rules:\n{stdout}");
    assert!(row("action block")[1] >= row("action block")[0], "{stdout}");
    assert!(stdout.contains("changed: label"), "{stdout}");
    // An invalid candidate is refused before anything is replayed.
    let broken = policies_with_routing("against-broken", "[actions]\nreview_at = 2\n");
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .current_dir(repo())
        .arg("check-policy")
        .arg(&broken)
        .arg("--against")
        .arg(&samples)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}
