//! The held-out evasion check set (`tests/data/adversarial.jsonl`: 222 team-written messages by
//! kind, never trained or calibrated on) through the whole cascade with the bundled policy and
//! model. Prints the table per kind. The target (issue 11) is no risk message allowed, no
//! ordinary message blocked and label accuracy >= 0.95; the bounds asserted here are a ratchet at
//! what the shipped model and policy reach today, so nothing gets worse unnoticed: lower them as
//! the model improves, never raise them.

mod common;
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;

const MAX_RISK_ALLOWED: usize = 2;
const MAX_OK_BLOCKED: usize = 2;
const MIN_ACCURACY: f64 = 0.94;

#[tokio::test]
async fn the_evasion_check_set_never_gets_worse() {
    let rows: Vec<Value> = std::fs::read_to_string(repo().join("tests/data/adversarial.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(rows.len() >= 200, "{} messages", rows.len());
    // kind -> [n, correct label, risk allowed, ok blocked]
    let mut by_kind: BTreeMap<String, [usize; 4]> = BTreeMap::new();
    for row in &rows {
        let d = classify_unhurried(default_server(), json!({"text": row["text"]})).await.json();
        let risk = row["label"] == 1;
        let t = by_kind.entry(row["kind"].as_str().unwrap().to_string()).or_default();
        t[0] += 1;
        t[1] += ((d["label"] == "risk") == risk) as usize;
        t[2] += (risk && d["action"] == "allow") as usize;
        t[3] += (!risk && d["action"] == "block") as usize;
        if (risk && d["action"] == "allow") || (!risk && d["action"] == "block") {
            let text: String = row["text"].as_str().unwrap().chars().take(90).collect();
            let how =
                format!("{} by {} at risk {:.3}", d["action"], d["tier"], d["risk_score"].as_f64().unwrap_or(f64::NAN));
            eprintln!("miss [{}] {how}: {text:?}", row["kind"].as_str().unwrap());
        }
    }
    let mut total = [0usize; 4];
    eprintln!("{:<18} {:>4} {:>9} {:>13} {:>11}", "kind", "n", "accuracy", "risk allowed", "ok blocked");
    for (kind, t) in &by_kind {
        eprintln!("{kind:<18} {:>4} {:>9.3} {:>13} {:>11}", t[0], t[1] as f64 / t[0] as f64, t[2], t[3]);
        (0..4).for_each(|i| total[i] += t[i]);
    }
    let accuracy = total[1] as f64 / total[0] as f64;
    eprintln!("{:<18} {:>4} {accuracy:>9.3} {:>13} {:>11}", "all", total[0], total[2], total[3]);
    assert!(total[2] <= MAX_RISK_ALLOWED, "{} risk messages allowed (at most {MAX_RISK_ALLOWED})", total[2]);
    assert!(total[3] <= MAX_OK_BLOCKED, "{} ordinary messages blocked (at most {MAX_OK_BLOCKED})", total[3]);
    assert!(accuracy >= MIN_ACCURACY, "label accuracy {accuracy:.3} (at least {MIN_ACCURACY})");
}
