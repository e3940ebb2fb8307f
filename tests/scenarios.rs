//! Scenario policies on `/v1/classify` against the real binary (`tiergate serve`, the real model,
//! the bundled policies plus test scenarios): a scenario's thresholds change the action for the
//! same text, its deadline and name reach the decision and the audit record, an unknown scenario
//! is a 422 naming the known ones, and a bad scenario file is refused on reload while the last
//! good policy keeps serving.

mod common;

use http::StatusCode;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tiergate::audit::query::{self, Filter};
use tiergate::audit::store::Store;
use tiergate::audit::AuditRecord;

use common::BENIGN_WITH_EMAIL as BENIGN;

/// Thresholds every model score reaches, and a deadline no model tier can meet.
const TEST_SCENARIOS: &str = "[scenarios.strict]\nreview_at = 0.0\nblock_at = 0.0\n\
                              [scenarios.instant]\ndeadline_ms = 1\n";

/// A copy of the bundled policies (scenarios.toml included) plus `zz_test.toml`.
fn policies(name: &str, extra: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-scenarios-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    for entry in std::fs::read_dir(common::repo().join("policies")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join("policies").join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.join("policies/zz_test.toml"), extra).unwrap();
    dir
}

/// `tiergate serve` on `dir/policies` (no file watch: reloads are the test's), with an audit
/// trail in `dir/audit` flushed every 20 ms.
fn serve(dir: &Path) -> common::Sidecar {
    let audit = format!("[audit]\ndir = \"{}\"\nflush_interval_ms = 20\n", dir.join("audit").display());
    common::Sidecar::serve_in(dir, &dir.join("policies"), &audit)
}

/// `POST /v1/classify` with a 5 s deadline (decisions, not this machine's load, are under test),
/// the scenario header when given, and request id `id`.
async fn classify(addr: SocketAddr, id: &str, scenario: Option<&str>, body: Value) -> common::Reply {
    let mut headers =
        vec![("content-type", "application/json"), ("x-request-id", id), ("x-tiergate-deadline-ms", "5000")];
    if let Some(s) = scenario {
        headers.push(("x-tiergate-scenario", s));
    }
    common::send(addr, "POST", "/v1/classify", &headers, body.to_string()).await
}

/// The audit record of `request_id`, once the writer has committed it.
async fn audited(dir: &Path, request_id: &str) -> AuditRecord {
    let started = Instant::now();
    loop {
        if let Ok(conn) = Store::open_read_only(dir) {
            let mut found = Vec::new();
            let filter = Filter { request_id: Some(request_id.into()), ..Filter::default() };
            query::for_each(&conn, &filter, |json| {
                found.push(serde_json::from_str::<AuditRecord>(json)?);
                Ok(())
            })
            .unwrap();
            if let Some(record) = found.pop() {
                return record;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no audit record for {request_id}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_thresholds_change_the_action_for_the_same_text() {
    let dir = policies("thresholds", TEST_SCENARIOS);
    let server = serve(&dir);
    let plain = classify(server.public, "plain", None, json!({"text": BENIGN})).await;
    assert_eq!(plain.status, StatusCode::OK);
    let plain = plain.json();
    assert_eq!((plain["tier"].as_str(), plain["action"].as_str()), (Some("cpu"), Some("allow")), "{plain}");
    assert!(plain.get("scenario").is_none(), "no scenario, none named: {plain}");

    let strict = classify(server.public, "strict", Some("strict"), json!({"text": BENIGN})).await.json();
    assert_eq!((strict["tier"].as_str(), strict["action"].as_str()), (Some("cpu"), Some("block")), "{strict}");
    assert_eq!(strict["risk_score"], plain["risk_score"], "the same verdict, another action");
    assert_eq!(strict["scenario"], "strict");
    // The body field names it just as well.
    let body = classify(server.public, "body", None, json!({"text": BENIGN, "scenario": "strict"})).await.json();
    assert_eq!((body["action"].as_str(), body["scenario"].as_str()), (Some("block"), Some("strict")));

    // The shipped scenarios decide by their own thresholds.
    let payments = classify(server.public, "payments", Some("payments"), json!({"text": BENIGN})).await.json();
    assert_eq!(payments["scenario"], "payments");
    if payments["tier"] == "cpu" {
        assert_eq!(payments["action"], "allow", "{payments}");
    }
    // A scenario's deadline replaces the request's: 1 ms leaves no model tier time, rules decide.
    let instant = classify(server.public, "instant", Some("instant"), json!({"text": BENIGN})).await.json();
    assert_eq!((instant["tier"].as_str(), instant["scenario"].as_str()), (Some("rules"), Some("instant")), "{instant}");

    let record = audited(&dir.join("audit"), "strict").await;
    assert_eq!((record.scenario.as_deref(), record.action.as_str()), (Some("strict"), "block"));
    assert_eq!(audited(&dir.join("audit"), "plain").await.scenario, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_scenario_is_a_422_naming_the_known_ones() {
    let dir = policies("unknown", TEST_SCENARIOS);
    let server = serve(&dir);
    let reply = classify(server.public, "chat", Some("chat"), json!({"text": BENIGN})).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    let error = &reply.json()["error"];
    assert_eq!((error["code"].as_str(), error["field"].as_str()), (Some("unknown_scenario"), Some("scenario")));
    assert_eq!(error["known"], json!(["content_review", "instant", "payments", "strict"]), "{error}");
    assert!(error["message"].as_str().unwrap().contains("unknown scenario `chat`"), "{error}");
    // A malformed name never reaches the policy.
    let reply = classify(server.public, "bad", None, json!({"text": BENIGN, "scenario": "Pay Ments"})).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reply.json()["error"]["field"], "scenario");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_scenario_file_is_refused_on_reload_and_the_old_policy_keeps_serving() {
    let dir = policies("reload", TEST_SCENARIOS);
    let server = serve(&dir);
    let before = common::send(server.admin, "GET", "/admin/policy", &[], "").await.json();
    let bad =
        format!("{TEST_SCENARIOS}[scenarios.chat]\nreview_at = 0.9\nblock_at = 0.5\nrules = [\"no_such_rule\"]\n");
    std::fs::write(dir.join("policies/zz_test.toml"), bad).unwrap();
    let reload = common::send(server.admin, "POST", "/admin/reload", &[], "").await;
    assert_eq!(reload.status, StatusCode::UNPROCESSABLE_ENTITY);
    let problems = reload.json()["error"]["problems"].to_string();
    assert!(
        problems.contains("scenarios.chat.review_at: review_at (0.9) must not exceed block_at (0.5)"),
        "{problems}"
    );
    assert!(problems.contains("scenarios.chat.rules: unknown rule `no_such_rule`"), "{problems}");

    let after = common::send(server.admin, "GET", "/admin/policy", &[], "").await.json();
    assert_eq!(after["version"], before["version"], "the last good policy serves");
    assert!(after["last_error"].to_string().contains("scenarios.chat"), "{after}");
    let strict = classify(server.public, "strict", Some("strict"), json!({"text": BENIGN})).await.json();
    assert_eq!(strict["policy_version"], before["version"]);
    let chat = classify(server.public, "chat", Some("chat"), json!({"text": BENIGN})).await;
    assert_eq!(chat.status, StatusCode::UNPROCESSABLE_ENTITY, "the refused file's scenario does not exist");

    // Fixed, it loads, and the new scenario decides.
    let good = format!("{TEST_SCENARIOS}[scenarios.chat]\nreview_at = 0.4\nblock_at = 0.9\n");
    std::fs::write(dir.join("policies/zz_test.toml"), good).unwrap();
    let reload = common::send(server.admin, "POST", "/admin/reload", &[], "").await;
    assert_eq!(reload.status, StatusCode::OK, "{:?}", reload.json());
    let chat = classify(server.public, "chat2", Some("chat"), json!({"text": BENIGN})).await.json();
    assert_eq!(chat["scenario"], "chat");
    assert_ne!(chat["policy_version"], before["version"]);
}
