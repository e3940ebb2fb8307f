//! Same decisions before and after a change that should not change behaviour: every labelled
//! set in tests/data (and the bundled model's validation set, tests/data/pack/validation.jsonl)
//! is decided by the default config with the bundled model and policies, and each decision's action, tier, rule
//! and risk score is compared with the one recorded in tests/data/replay/<set>.tsv.
//!
//! Load cannot steer routing here (fixed CPU reading, no gpu tier, unhurried deadline), and the
//! default config runs the model with batching off, so a decision depends on its text only.
//! Scores may differ by ONNX Runtime's float noise (`SCORE_TOLERANCE`); everything else must
//! match exactly. After an intended change of decisions, rewrite the records with
//! `TIERGATE_REPLAY_WRITE=1 cargo test --release --test replay` and review their diff. A blind
//! set (`<set>.sha256` beside it) has no record until its first measurement, which writes it.

mod common;
use common::*;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tiergate::gateway::Sources;

/// Largest difference in `risk_score` taken as the same decision (ORT's float noise between
/// runs is ~1e-7; a real change of model, calibration or route moves scores far more).
const SCORE_TOLERANCE: f64 = 1e-4;

/// Requests in flight at once: the shipped config's two cpu-tier sessions, kept busy.
const IN_FLIGHT: usize = 2;

fn sets() -> Vec<PathBuf> {
    let data = repo().join("tests/data");
    let mut sets: Vec<PathBuf> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    sets.push(data.join("pack/validation.jsonl"));
    sets.sort();
    sets
}

/// The record's name for a set: its path under tests/data, `/` as `_`.
fn record_path(set: &Path) -> PathBuf {
    let rel = set.strip_prefix(repo().join("tests/data")).unwrap().to_string_lossy().replace('/', "_");
    repo().join("tests/data/replay").join(rel.replace(".jsonl", ".tsv"))
}

/// `action \t tier \t rule (or -) \t risk_score`, one line per message in the set's order.
fn line(d: &Value) -> String {
    format!(
        "{}\t{}\t{}\t{:.6}",
        d["action"].as_str().unwrap(),
        d["tier"].as_str().unwrap(),
        d["rule"].as_str().unwrap_or("-"),
        d["risk_score"].as_f64().unwrap()
    )
}

fn same(recorded: &str, now: &str) -> bool {
    let (r, n): (Vec<&str>, Vec<&str>) = (recorded.split('\t').collect(), now.split('\t').collect());
    r.len() == 4
        && n.len() == 4
        && r[..3] == n[..3]
        && (r[3].parse::<f64>().unwrap() - n[3].parse::<f64>().unwrap()).abs() <= SCORE_TOLERANCE
}

#[tokio::test]
async fn every_set_is_decided_as_recorded() {
    let sources = Sources { cpu: Arc::new(FakeCpu(Mutex::new(0.1))) as _, ..Default::default() };
    let (addr, _) = start_with(config(&repo().join("policies")), sources);
    let write = std::env::var_os("TIERGATE_REPLAY_WRITE").is_some();
    let mut differences = Vec::new();
    let mut decided = 0;
    for set in sets() {
        if !write && !record_path(&set).exists() && set.with_extension("sha256").exists() {
            // A blind set is committed with its sha256 before its first measurement, and decided
            // by nothing until then (models/recipe/check_sets/); its record comes with that
            // measurement.
            println!("{}: a blind set not yet measured, no record yet", set.display());
            continue;
        }
        let texts: Vec<String> = std::fs::read_to_string(&set)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["text"].as_str().unwrap().to_string())
            .collect();
        let lines: Vec<String> = stream::iter(texts)
            .map(|text| async move {
                let r = classify_within(addr, json!({ "text": text }), 10_000).await;
                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                line(&r.json())
            })
            .buffered(IN_FLIGHT)
            .collect()
            .await;
        decided += lines.len();
        let path = record_path(&set);
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, lines.join("\n") + "\n").unwrap();
            continue;
        }
        let recorded = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (write it with TIERGATE_REPLAY_WRITE=1)", path.display()));
        let recorded: Vec<&str> = recorded.lines().collect();
        assert_eq!(recorded.len(), lines.len(), "{}: a record per message", path.display());
        for (i, (r, n)) in recorded.iter().zip(&lines).enumerate() {
            if !same(r, n) {
                differences.push(format!("{} line {}: recorded {r:?}, now {n:?}", set.display(), i + 1));
            }
        }
    }
    assert!(decided > 4000, "every set was read ({decided} messages)");
    assert!(differences.is_empty(), "{} decisions changed:\n{}", differences.len(), differences.join("\n"));
}

#[test]
fn a_changed_action_tier_rule_or_score_is_a_difference() {
    let recorded = "review\trules\tforeign_link\t0.500000";
    assert!(same(recorded, "review\trules\tforeign_link\t0.500050"), "float noise is not a change");
    for now in [
        "block\trules\tforeign_link\t0.500000",
        "review\tcpu\tforeign_link\t0.500000",
        "review\trules\t-\t0.500000",
        "review\trules\tforeign_link\t0.501000",
    ] {
        assert!(!same(recorded, now), "{now:?} is a different decision");
    }
}
