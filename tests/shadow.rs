//! Shadow evaluation: a candidate policy decides beside the live one on live traffic, its
//! disagreements are counted by kind and logged with both decisions, and it never changes a
//! response; a candidate model scores beside the live cpu tier and `tiergate model agreement`
//! reports how often they agree. Also `check-policy --against`, which replays labelled requests
//! the same way.

mod common;
use common::*;
use serde_json::{json, Value};
use std::process::Command;

/// A candidate that trusts no model verdict: rules decide everything, default `block`.
fn candidate_dir(name: &str) -> std::path::PathBuf {
    rules_only_candidate(name, 0.9)
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

/// The bundled model as its own candidate: every request is scored (also those the live cpu tier
/// gives no verdict, e.g. a language outside `model_languages`), the pairs are counted and logged, and
/// where the live cpu tier scored, the candidate's score is the same (one model, one text, batch
/// of one), so `tiergate model agreement` reports 1.000.
#[tokio::test]
async fn a_shadow_model_scores_beside_the_cpu_tier_and_its_agreement_is_reported() {
    let log = std::env::temp_dir().join(format!("tiergate-shadow-model-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let mut c = config(&repo().join("policies"));
    c.shadow.share = 1.0;
    c.shadow.log = Some(log.clone());
    c.shadow.model = Some(tiergate::tier::ModelConfig { sessions: 1, ..c.model.clone() });
    let addr = start(c);
    let plain = default_server();
    let mut texts: Vec<String> = labelled("test_sample.jsonl").into_iter().take(10).map(|(t, _)| t).collect();
    texts.push("您好，您的快递已到小区驿站，取件码 3-2-1147，请于今天18点前取走。".into());
    texts.push("Twoja paczka czeka w automacie InPost przy ul. Długiej, kod odbioru 482913, odbierz do piątku.".into());
    let mut cpu_scored = Vec::new();
    for text in &texts {
        let a = classify_unhurried(addr, json!({"text": text})).await.json();
        let b = classify_unhurried(plain, json!({"text": text})).await.json();
        assert_eq!(a["action"], b["action"], "a shadow model never changes the answer");
        assert_eq!(a["risk_score"], b["risk_score"]);
        // A verdict the cascade set aside (its language, text past the windows) is no verdict to compare.
        let step = &a["path"][0];
        let set_aside = step["outcome"] == "language" || step["outcome"] == "unread";
        if step["tier"] == "cpu" && step["risk_score"].is_number() && !set_aside {
            cpu_scored.push((a["request_id"].clone(), step["risk_score"].as_f64().unwrap()));
        }
    }
    assert!(cpu_scored.len() >= 5, "most of the sample is scored by the cpu tier");
    // Scoring is detached from the answers: wait for the candidate to finish.
    let mut lines: Vec<Value> = Vec::new();
    for _ in 0..100 {
        lines = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if lines.len() == texts.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(lines.len(), texts.len(), "one line per scored request: {lines:?}");
    for (id, live_score) in &cpu_scored {
        let l = lines.iter().find(|l| &l["request_id"] == id).expect("logged");
        assert_eq!(l["kind"], "model");
        let cand = l["candidate"]["risk_score"].as_f64().unwrap();
        assert!((cand - live_score).abs() < 1e-6, "same model, same text: {cand} vs {live_score}: {l}");
        assert_eq!(l["live"]["cpu"]["label"], l["candidate"]["label"], "{l}");
    }
    let chinese = lines.iter().find(|l| l["lang"] == "cmn").expect("the Chinese notice is scored");
    assert!(chinese["live"]["cpu"].is_object(), "the bundled model reads Chinese: {chinese}");
    let polish = lines.iter().find(|l| l["lang"] == "pol").expect("the Polish notice is scored too");
    assert!(
        polish["live"]["cpu"].is_null(),
        "Polish is not among model_languages: the live verdict is set aside, not compared: {polish}"
    );

    let ready = send(addr, "GET", "/readyz", &[], "").await.json();
    assert_eq!(ready["shadow_model"]["model"]["name"], "risk-ml-e5s-l2-int8", "{ready}");
    assert_eq!(ready["shadow_model"]["workers"], 1, "{ready}");
    let metrics = String::from_utf8_lossy(&send(addr, "GET", "/metrics", &[], "").await.body).to_string();
    let scored: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("tiergate_shadow_model_verdicts_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(scored, texts.len() as u64, "{metrics}");
    assert_eq!(metric(&metrics, "tiergate_shadow_evaluations_total"), 0, "no shadow policy is configured");

    let out = Command::new(env!("CARGO_BIN_EXE_tiergate")).args(["model", "agreement"]).arg(&log).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let all = stdout.lines().find(|l| l.starts_with("all ")).unwrap_or_else(|| panic!("{stdout}"));
    let cols: Vec<&str> = all.split_whitespace().collect();
    assert_eq!(cols[1], cpu_scored.len().to_string(), "{stdout}");
    assert_eq!(cols[2], "1.000", "{stdout}");
    assert_eq!(cols[6], (texts.len() - cpu_scored.len()).to_string(), "{stdout}");
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
