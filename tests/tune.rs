//! `tiergate tune` end to end: decisions made by the real server (its audit trail on), labelled
//! through `POST /v1/feedback` so that the best block threshold is known, then the binary's
//! `tune` proposes it within one grid step, writes a candidate that `check-policy` passes and
//! that only changes that value, refuses too few labels and a fit with nothing to change, and
//! the candidate decides its share as the `[ab]` candidate of a started server.

mod common;
use common::*;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tiergate::decision::Arm;
use tiergate::gateway::ab::band::arm_of;

/// Decisions with a score at or above this are labelled risk, the others ok. The test sample must
/// hold a cpu score between the bundled `review_at` (0.3) and it, so that the best `block_at` is
/// above `review_at` and tune changes `block_at` alone (0.5 until the lexical model, whose scores
/// of the sample jump from 0.135 to 0.506).
const BOUNDARY: f64 = 0.7;
/// The API key of tenant `acme` (its SHA-256 is in the config), as in tests/ab.rs.
const API_KEY: &str = "ab-test-key";
const TENANT: &str = "[tenants]\n[tenants.known]\nacme = \"default\"\n[tenants.api_keys]\n\
                      \"2f92845518aab11b622f37edb67bcca73d8aabb6d1771b11ff2cde5c159c2840\" = \"acme\"\n";

/// The bundled policies with every cpu verdict standing (so the model decides scores across the
/// range, the ones thresholds apply to).
fn live_policy() -> PathBuf {
    let dir = policies_with_edited_routing(
        "tune-live",
        &[
            ("escalate_below = 0.95", "escalate_below = 0.5"),
            ("accept_below = 0.94", "accept_below = 0.5"),
            ("accept_risk_below = 0.94", "accept_risk_below = 0.5"),
            ("ood_above = 0.99", "ood_above = 1.0"),
        ],
    );
    std::fs::copy(repo().join("policies/scenarios.toml"), dir.join("scenarios.toml")).unwrap();
    dir
}

async fn classify_as(addr: SocketAddr, text: &str, key: Option<&str>) -> Value {
    let mut headers = vec![("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000")];
    if let Some(key) = key {
        headers.extend([("x-api-key", API_KEY), ("x-ab-key", key)]);
    }
    let reply = send(addr, "POST", "/v1/classify", &headers, json!({"text": text}).to_string()).await;
    assert_eq!(reply.status, http::StatusCode::OK, "{:?}", reply.body);
    reply.json()
}

/// A decided request: its record id and, when the cpu tier decided, its risk score.
async fn decide(addr: SocketAddr, text: &str) -> (String, Option<f64>) {
    let d = classify_as(addr, text, None).await;
    let record = d["record_id"].as_str().unwrap_or_else(|| panic!("no record_id: {d}")).to_string();
    (record, (d["tier"] == "cpu").then(|| d["risk_score"].as_f64().unwrap()))
}

/// Labels `records` (record id, risk) through the admin listener, again for those whose record
/// the audit writer had not committed yet.
async fn label(admin: SocketAddr, records: &[(String, bool)]) {
    let mut pending: Vec<&(String, bool)> = records.iter().collect();
    for _ in 0..50 {
        let body: Vec<Value> = pending
            .iter()
            .map(|(id, risk)| json!({"record_id": id, "label": if *risk { "risk" } else { "ok" }, "source": "analyst"}))
            .collect();
        let headers = [("content-type", "application/json")];
        let reply = send(admin, "POST", "/v1/feedback", &headers, Value::Array(body).to_string()).await;
        assert_eq!(reply.status, http::StatusCode::OK, "{:?}", reply.body);
        let results = reply.json()["results"].as_array().unwrap().clone();
        pending =
            pending.into_iter().zip(&results).filter(|(_, r)| r["outcome"] == "unknown").map(|(p, _)| p).collect();
        if pending.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{} labels found no record", pending.len());
}

/// What the labelled traffic was built from: the highest ok-labelled cpu score, the text with the
/// lowest risk-labelled one, and the number of decisions labelled.
struct Labelled {
    highest_ok: f64,
    lowest_risk: (String, f64),
    n: usize,
}

/// Decides the test sample, each text once, then the texts at the boundary ten times each (so
/// each split holds them) and ordinary ok and risk traffic often enough for a 1 % false-block
/// budget; labels every cpu decision risk from [`BOUNDARY`] up.
async fn make_labels(public: SocketAddr, admin: SocketAddr) -> Labelled {
    let mut scored: Vec<(String, f64)> = Vec::new();
    let mut records = Vec::new();
    for (text, _) in labelled("test_sample.jsonl") {
        if let (record, Some(score)) = decide(public, &text).await {
            records.push((record, score >= BOUNDARY));
            scored.push((text, score));
        }
    }
    let below = scored.iter().filter(|(_, s)| *s < BOUNDARY).max_by(|a, b| a.1.total_cmp(&b.1)).unwrap().clone();
    assert!(below.1 >= 0.3, "no cpu score of the sample between review_at and BOUNDARY: {below:?}");
    let above = scored.iter().filter(|(_, s)| *s >= BOUNDARY).min_by(|a, b| a.1.total_cmp(&b.1)).unwrap().clone();
    let riskiest = scored.iter().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap().clone();
    let calmest = scored.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap().clone();
    eprintln!("{} cpu decisions; boundary texts at {} and {}", scored.len(), below.1, above.1);
    let repeats = [(&below, 10), (&above, 10), (&riskiest, 40), (&calmest, 400)];
    for ((text, score), times) in repeats {
        for _ in 0..times {
            let (record, again) = decide(public, text).await;
            assert_eq!(again, Some(*score), "the same text, the same cpu score: {text:?}");
            records.push((record, *score >= BOUNDARY));
        }
    }
    label(admin, &records).await;
    Labelled { highest_ok: below.1, lowest_risk: above, n: records.len() }
}

/// `tiergate tune` with `args`: exit code, stdout, stderr.
fn tune(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .current_dir(repo())
        .arg("tune")
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn block_at(dir: &Path) -> f64 {
    let routing: toml::Value = toml::from_str(&std::fs::read_to_string(dir.join("routing.toml")).unwrap()).unwrap();
    routing["actions"]["block_at"].as_float().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_proposes_the_known_best_threshold_and_its_candidate_runs_in_ab() {
    let work = std::env::temp_dir().join(format!("tiergate-tune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let live = live_policy();
    let extra = format!("[audit]\ndir = \"{}\"\n[cache]\nenabled = true\n", work.join("audit").display());
    let server = Sidecar::serve_in(&work, &live, &extra);
    let config = work.join(format!("tiergate-{}.toml", server.public.port()));
    let labels = make_labels(server.public, server.admin).await;

    // Known: no ok-labelled score above `highest_ok`, and ten copies of it in the data: at a 1 %
    // budget the lowest threshold blocks none of them, the first grid point above it.
    let best = ((labels.highest_ok * 100.0).floor() + 1.0) / 100.0;
    let candidate = work.join("candidate");
    let (code, stdout, stderr) = tune(&[
        "--config",
        config.to_str().unwrap(),
        "--since",
        "1h",
        "--max-false-block",
        "0.01",
        "--fit",
        "block",
        "--out",
        candidate.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let proposed = block_at(&candidate);
    assert!((proposed - best).abs() <= 0.01 + 1e-9, "proposed {proposed}, best {best}:\n{stdout}");
    assert!(stderr.contains(&format!("{} labelled decisions in the window", labels.n)), "{stderr}");
    assert_eq!(check_policy(&candidate).0, Some(0), "the candidate passes check-policy");
    assert_only_block_at_changed(&live, &candidate, proposed);
    let tune_md = std::fs::read_to_string(candidate.join("TUNE.md")).unwrap();
    assert!(tune_md.contains("false-block rate") && tune_md.contains("```diff"), "{tune_md}");

    refusals(&config, &work, &candidate).await;
    drop(server);
    the_candidate_decides_in_ab(&work, &live, &candidate, &labels.lowest_risk, proposed).await;
}

/// The candidate is the live policy with `[actions] block_at` alone changed, comments and all.
fn assert_only_block_at_changed(live: &Path, candidate: &Path, proposed: f64) {
    for name in ["rules.toml", "guards.toml", "scenarios.toml"] {
        let read = |d: &Path| std::fs::read_to_string(d.join(name)).unwrap();
        assert_eq!(read(live), read(candidate), "{name} unchanged");
    }
    let before = std::fs::read_to_string(live.join("routing.toml")).unwrap();
    let after = std::fs::read_to_string(candidate.join("routing.toml")).unwrap();
    assert_eq!(after, before.replacen("block_at = 0.8\n", &format!("block_at = {proposed}\n"), 1));
}

/// Too few labels for the budget, and labels under another policy version, are refused, naming
/// what is needed; a re-fit that finds the same values has nothing to change.
async fn refusals(config: &Path, work: &Path, candidate: &Path) {
    let config = config.to_str().unwrap();
    let out = work.join("refused");
    let (code, stdout, stderr) =
        tune(&["--config", config, "--max-false-block", "0.001", "--fit", "block", "--out", out.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("refused: too few labels"), "{stderr}");
    assert!(stderr.contains("needs 1000 ok- and 10 risk-labelled model decisions in each split"), "{stderr}");
    assert!(!out.exists(), "nothing written");

    let cand = candidate.to_str().unwrap();
    let args = ["--config", config, "--policy-dir", cand, "--fit", "block", "--out", out.to_str().unwrap()];
    let (code, _, stderr) = tune(&args);
    assert!(code == Some(1) && stderr.contains("under other policy versions"), "{stderr}");
    let (code, _, stderr) = tune(&[&args[..], &["--any-version"]].concat());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("refused: nothing to change"), "{stderr}");
}

/// `tiergate serve` with the live policy and the candidate as `[ab]` candidate on half of acme's
/// keys: the text with the lowest risk-labelled score, a review for the live policy, is blocked
/// by the candidate.
async fn the_candidate_decides_in_ab(work: &Path, live: &Path, candidate: &Path, text: &(String, f64), block: f64) {
    let ab = format!(
        "[ab]\ndir = \"{}\"\nshare = 0.5\nsticky = \"header\"\nkey_header = \"x-ab-key\"\n{TENANT}",
        candidate.display()
    );
    let server = Sidecar::serve_in(&work.join("ab"), live, &ab);
    let key = |arm| (0..100).map(|i| format!("k-{i}")).find(|k| arm_of(&format!("acme\n{k}"), 0.5) == arm).unwrap();
    let status = send(server.admin, "GET", "/admin/policy", &[], "").await.json();
    let version = &status["ab"]["candidate"]["version"];
    let (ours, theirs) = (
        classify_as(server.public, &text.0, Some(&key(Arm::Candidate))).await,
        classify_as(server.public, &text.0, Some(&key(Arm::Live))).await,
    );
    assert_eq!((&ours["arm"], &ours["policy_version"]), (&json!("candidate"), version), "{ours}");
    assert_eq!(theirs["arm"], "live", "{theirs}");
    let (score, expected) = (text.1, |at: f64| {
        if text.1 >= at {
            "block"
        } else if text.1 >= 0.3 {
            "review"
        } else {
            "allow"
        }
    });
    assert_eq!(ours["risk_score"].as_f64(), Some(score));
    assert_eq!((ours["action"].as_str(), theirs["action"].as_str()), (Some(expected(block)), Some(expected(0.8))));
    drop(server);
}
