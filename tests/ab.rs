//! A live A/B test against the real binary: a candidate policy that blocks everything takes
//! half of the sticky keys, decides for real, is rolled back automatically once its block rate
//! leaves the band around the live policy's, and afterwards decides nothing; the rollback shows
//! in `GET /admin/policy` and in `/metrics`. The sticky key needs an authenticated tenant: a
//! client without one cannot pick its arm by sending keys or naming tenants. Also the `[ab]`
//! section's strictness, relative bands included.

mod common;

use http::StatusCode;
use serde_json::{json, Value};
use std::net::SocketAddr;
use tiergate::decision::Arm;
use tiergate::gateway::ab::band::arm_of;
use tiergate::Config;

use common::BENIGN_WITH_EMAIL as BENIGN;

/// A candidate that trusts no model verdict (rules decide everything) and blocks by default.
fn blocks_everything() -> std::path::PathBuf {
    common::rules_only_candidate("ab-candidate", 0.95)
}

/// The API key of tenant `acme` (its SHA-256 is in the config).
const API_KEY: &str = "ab-test-key";

/// The arm the candidate's share gives `key` of the authenticated tenant `acme`: the sticky key
/// is the tenant and the header together (spelt out here rather than taken from tiergate).
fn arm_of_acme(key: &str) -> Arm {
    arm_of(&format!("acme\n{key}"), 0.5)
}

/// A request of the authenticated tenant `acme` with the key header `key`.
async fn classify(addr: SocketAddr, key: &str) -> Value {
    classify_with(addr, &[("x-api-key", API_KEY), ("x-ab-key", key)]).await
}

/// `POST /v1/classify` of [`BENIGN`] with a 5 s deadline and `extra` headers; must be decided.
async fn classify_with(addr: SocketAddr, extra: &[(&str, &str)]) -> Value {
    let mut headers = vec![("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000")];
    headers.extend_from_slice(extra);
    let reply = common::send(addr, "POST", "/v1/classify", &headers, json!({"text": BENIGN}).to_string()).await;
    assert_eq!(reply.status, StatusCode::OK);
    reply.json()
}

fn metric(text: &str, line_start: &str) -> Option<u64> {
    text.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `tiergate serve` with the bundled policies live and `candidate` on half the authenticated
/// traffic (sticky by `x-ab-key`), rolled back after 5 decisions whose block rate is out of band.
fn serve_ab(candidate: &std::path::Path) -> (common::Sidecar, SocketAddr, SocketAddr) {
    let dir = std::env::temp_dir().join(format!("tiergate-ab-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ab = format!(
        "[ab]\ndir = \"{}\"\nshare = 0.5\nsticky = \"header\"\nkey_header = \"x-ab-key\"\nblock_band = 0.2\n\
         min_samples = 5\nwindow_s = 60\nbreach_for_s = 0\n\
         [tenants]\naccept_claimed = true\n[tenants.known]\nacme = \"default\"\n\
         [tenants.api_keys]\n\"2f92845518aab11b622f37edb67bcca73d8aabb6d1771b11ff2cde5c159c2840\" = \"acme\"\n",
        candidate.display(),
    );
    let server = common::Sidecar::serve_in(&dir, &common::repo().join("policies"), &ab);
    let (public, admin) = (server.public, server.admin);
    (server, public, admin)
}

/// Only an authenticated tenant's key can reach the candidate, and only for scenarios it has.
async fn unauthenticated_keys_stay_live(public: SocketAddr) {
    // The live policy decides a request without a key, and one naming a scenario the candidate
    // lacks even when its key is the candidate's (the bundled `payments` is live-only here).
    assert_eq!(classify_with(public, &[]).await["arm"], "live");
    let theirs = (0..100).map(|i| format!("probe-{i}")).find(|k| arm_of_acme(k) == Arm::Candidate).unwrap();
    let d =
        classify_with(public, &[("x-api-key", API_KEY), ("x-ab-key", &theirs), ("x-tiergate-scenario", "payments")])
            .await;
    assert_eq!((d["arm"].as_str(), d["scenario"].as_str()), (Some("live"), Some("payments")), "{d}");

    // Without an authenticated tenant no key counts: a client sending any key it likes, or
    // naming a tenant (a claim, accepted for its name only), never reaches the candidate. Half
    // of these keys are in the candidate's share by their own hash, and acme's keys with it.
    for i in 0..24 {
        let key = format!("pick-{i}");
        let bare = classify_with(public, &[("x-ab-key", &key)]).await;
        assert_eq!(bare["arm"], "live", "an unauthenticated key {key} ({:?} by its hash): {bare}", arm_of(&key, 0.5));
        let body = json!({"text": BENIGN, "tenant": "acme"}).to_string();
        let headers = [("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000"), ("x-ab-key", &key)];
        let claimed = common::send(public, "POST", "/v1/classify", &headers, body).await.json();
        assert_eq!(
            claimed["arm"],
            "live",
            "a claimed tenant with key {key} ({:?} for acme): {claimed}",
            arm_of_acme(&key)
        );
    }
}

/// The A/B state and metrics after the rollback; the count of candidate decisions it saw.
async fn assert_rolled_back(admin: SocketAddr, candidate_version: &Value, by_candidate: usize) -> Option<u64> {
    let status = common::send(admin, "GET", "/admin/policy", &[], "").await.json();
    let ab = &status["ab"];
    assert_eq!(ab["state"], "rolled_back", "{ab}");
    let rollback = &ab["rollback"];
    assert_eq!((rollback["measure"].as_str(), rollback["candidate_rate"].as_f64()), (Some("block"), Some(1.0)));
    assert!(rollback["live_rate"].as_f64().unwrap() < 0.8, "{rollback}");
    assert!(rollback["at_unix"].as_f64().unwrap() > 1.7e9, "{rollback}");
    assert!(rollback["reason"].as_str().unwrap().starts_with("block rate 1.000 vs live"), "{rollback}");
    assert_eq!(&rollback["candidate_version"], candidate_version);

    let metrics = String::from_utf8_lossy(&common::send(admin, "GET", "/metrics", &[], "").await.body).to_string();
    assert_eq!(metric(&metrics, "tiergate_ab_rollbacks_total{measure=\"block\"}"), Some(1), "{metrics}");
    assert_eq!(metric(&metrics, "tiergate_ab_candidate_active"), Some(0));
    let counted = metric(&metrics, "tiergate_ab_decisions_total{arm=\"candidate\",action=\"block\"}");
    assert_eq!(counted, Some(by_candidate as u64), "every candidate decision counted for its arm");

    counted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ab_rollback_fires_on_a_candidate_that_blocks_everything() {
    let candidate = blocks_everything();
    let (server, public, admin) = serve_ab(&candidate);
    let status = common::send(admin, "GET", "/admin/policy", &[], "").await.json();
    assert_eq!(status["ab"]["state"], "active", "{status}");
    let (live_version, candidate_version) = (status["version"].clone(), status["ab"]["candidate"]["version"].clone());

    unauthenticated_keys_stay_live(public).await;

    let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
    let mut by_candidate = Vec::new();
    for key in &keys {
        let d = classify(public, key).await;
        match d["arm"].as_str() {
            Some("candidate") => {
                assert_eq!((d["action"].as_str(), &d["policy_version"]), (Some("block"), &candidate_version), "{d}");
                assert_eq!(arm_of_acme(key), Arm::Candidate, "{key}: the arm of acme's key");
                by_candidate.push(key.clone());
            }
            Some("live") => assert_eq!(d["policy_version"], live_version, "{d}"),
            other => panic!("every decision names its arm, got {other:?}: {d}"),
        }
        // Sticky: the same key, the same arm (until the rollback).
        if d["arm"] == "live" {
            assert_eq!(classify(public, key).await["arm"], "live");
        }
    }
    assert!(by_candidate.len() >= 5, "about half of 40 keys are the candidate's: {}", by_candidate.len());

    let counted = assert_rolled_back(admin, &candidate_version, by_candidate.len()).await;

    // Rolled back: the candidate's own keys are decided by the live policy.
    for key in &by_candidate {
        let d = classify(public, key).await;
        assert_eq!((d["arm"].as_str(), &d["policy_version"]), (Some("live"), &live_version), "{d}");
    }
    let metrics = String::from_utf8_lossy(&common::send(admin, "GET", "/metrics", &[], "").await.body).to_string();
    let after = metric(&metrics, "tiergate_ab_decisions_total{arm=\"candidate\",action=\"block\"}");
    assert_eq!(after, counted, "nothing more decided by the candidate");

    // A fixed candidate (a new version) takes its share again, with fresh counts.
    std::fs::copy(common::repo().join("policies/routing.toml"), candidate.join("routing.toml")).unwrap();
    let reload = common::send(admin, "POST", "/admin/reload", &[], "").await;
    assert_eq!(reload.status, StatusCode::OK);
    let ab = common::send(admin, "GET", "/admin/policy", &[], "").await.json()["ab"].clone();
    assert_eq!((ab["state"].as_str(), &ab["rollback"]), (Some("active"), &Value::Null), "{ab}");
    assert_ne!(ab["candidate"]["version"], candidate_version);
    assert_eq!(ab["window"]["candidate"]["counts"]["requests"], 0);
    assert_eq!(classify(public, &by_candidate[0]).await["arm"], "candidate", "sticky again");
    drop(server);
}

#[test]
fn the_ab_section_is_strict_and_its_errors_name_the_key() {
    let unknown = Config::parse("[ab]\nshar = 0.5\n").unwrap_err().to_string();
    assert!(unknown.contains("ab") && unknown.contains("unknown field `shar`"), "{unknown}");
    let sticky = Config::parse("[ab]\nsticky = \"cookie\"\n").unwrap_err().to_string();
    assert!(sticky.contains("ab.sticky"), "{sticky}");
    let invalid = |text: &str| Config::parse(text).unwrap().validate().unwrap_err().to_string();
    assert_eq!(invalid("[ab]\nshare = 1.5\n"), "`ab.share` must be in [0, 1], got 1.5");
    assert_eq!(invalid("[ab]\nblock_band = -0.1\n"), "`ab.block_band` must be in [0, 1], got -0.1");
    assert_eq!(invalid("[ab]\nmin_samples = 0\n"), "`ab.min_samples` must be at least 1");
    for key in ["block_relative_band", "fallback_relative_band", "error_relative_band"] {
        for bad in ["-0.5", "50.0", "nan"] {
            let e = invalid(&format!("[ab]\n{key} = {bad}\n"));
            assert!(e.starts_with(&format!("`ab.{key}` must be in [0, 10]")), "{key} = {bad}: {e}");
        }
        Config::parse(&format!("[ab]\n{key} = 2.0\n")).unwrap().validate().expect("a rate may triple");
    }
    assert_eq!(
        invalid("[ab]\nkey_header = \"bad header\"\n"),
        "`ab.key_header` is not a valid header name: `bad header`"
    );
}
