//! The audit trail against a real server and a real SQLite store: exactly one record per
//! decision and kind (classify, screen allowed/blocked/unscreened, stream cut, shadow), a full
//! queue answering 503 under `on_full = "block"` (and counting under `drop`), SIGTERM committing
//! everything queued, and the `tiergate audit` command's filters and errors.

mod common;

use common::app;
use common::routes::screened_route;
use http::StatusCode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tiergate::audit::query::{self, Filter};
use tiergate::audit::record::{RecordedAction, RecordedTier};
use tiergate::audit::store::Store;
use tiergate::audit::{AuditConfig, AuditRecord, Draft, Kind, ModelRef, OnFull, TextMode};
use tiergate::gateway::{ShadowConfig, Sources};

use common::{BENIGN_WITH_EMAIL as BENIGN, PHISHING};
const RISKY: &str = "Please send your password to http://evil.example/login now.";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-audit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Every record of `request_id` in the store at `dir`.
fn records(dir: &Path, request_id: &str) -> Vec<AuditRecord> {
    let conn = Store::open_read_only(dir).unwrap();
    let mut out = Vec::new();
    let filter = Filter { request_id: Some(request_id.into()), ..Filter::default() };
    query::for_each(&conn, &filter, |json| {
        out.push(serde_json::from_str(json)?);
        Ok(())
    })
    .unwrap();
    out
}

fn count(dir: &Path) -> u64 {
    query::count(&Store::open_read_only(dir).unwrap(), &Filter::default()).unwrap()
}

async fn post(addr: std::net::SocketAddr, path: &str, id: &str, body: Value) -> common::Reply {
    let headers = [("content-type", "application/json"), ("x-request-id", id), ("x-tiergate-deadline-ms", "5000")];
    common::send(addr, "POST", path, &headers, body.to_string()).await
}

/// The server of [`every_decision_has_exactly_one_record_of_its_kind`]: redacted audit in `dir`,
/// a shadow candidate on every request, and routes in front of `app` (one whose policy finds the
/// fake cpu saturated, so that its requests are forwarded unscreened, and one with a stream guard).
fn one_each_server(app: &app::AppHandle, dir: &Path) -> (std::net::SocketAddr, std::sync::Arc<tiergate::Gateway>) {
    // A route policy under which the (fake, 95 %) busy cpu is saturated and no model tier can
    // take a request: tiergate's own fault, which the fail-open route forwards unscreened.
    let busy = common::saturated_policies("audit-busy", true);
    let app = app.url();
    let busy = format!("policy = \"{}\"", busy.display());
    let routes = [
        screened_route("chat", "/echo/chat", &app, &["tenant = \"/tenant\"", "on_error = \"open\""]),
        screened_route("busy", "/echo/busy", &app, &["on_error = \"open\"", &busy]),
        format!("[[routes]]\nname = \"guarded\"\npath = \"/text\"\nupstream = [\"{app}\"]\n[routes.stream_guard]\nbuffer_ms = 50\n"),
    ]
    .concat();
    let policies = common::repo().join("policies");
    let mut config = common::config_with_routes(&policies, &routes);
    config.audit = Some(AuditConfig { dir: dir.to_path_buf(), text: TextMode::Redacted, ..AuditConfig::default() });
    // The requests name their tenant themselves; the audit records it only where claims count.
    config.tenants.accept_claimed = true;
    // A candidate under which every model verdict is at least `review`: it disagrees with the
    // live policy's `allow`s.
    let candidate = common::reviewing_policies("audit-shadow");
    config.shadow = ShadowConfig { dir: Some(candidate), share: 1.0, ..Default::default() };
    config.readings.cpu_interval_ms = 20;
    let busy_cpu = common::FakeCpu(std::sync::Mutex::new(0.95));
    common::start_with(config, Sources { cpu: std::sync::Arc::new(busy_cpu) as _, ..Sources::default() })
}

/// `n` classify requests and `m` screened ones, benign and phishing in turn: (request id, kind,
/// action answered, text).
async fn send_mix(addr: std::net::SocketAddr, n: usize, m: usize) -> Vec<(String, &'static str, String, &'static str)> {
    let mut said = Vec::new();
    for i in 0..n {
        let (id, text) = (format!("classify-{i}"), if i % 2 == 0 { BENIGN } else { PHISHING });
        let reply = post(addr, "/v1/classify", &id, json!({"text": text, "tenant": "acme"})).await;
        assert_eq!(reply.status, StatusCode::OK);
        said.push((id, "classify", reply.json()["action"].as_str().unwrap().to_string(), text));
    }
    for i in 0..m {
        let id = format!("screen-{i}");
        let text = [BENIGN, PHISHING, BENIGN][i % 3];
        let path = if i % 3 == 2 { "/echo/busy" } else { "/echo/chat" };
        let reply = post(addr, path, &id, json!({"text": text, "tenant": "acme"})).await;
        let action = match reply.status {
            StatusCode::OK => reply.headers.get("x-tiergate-action").map_or("unscreened", |v| v.to_str().unwrap()),
            StatusCode::FORBIDDEN => "block",
            other => panic!("{other}: {:?}", reply.body),
        };
        said.push((id, "screen", action.to_string(), text));
    }
    said
}

/// The records of request `id`: one of `kind` with the action the client was told, at most one
/// shadow record beside it, and what each kind must carry.
fn check_records(dir: &Path, id: &str, kind: &str, action: &str, text: &str) {
    let found = records(dir, id);
    let of_kind: Vec<_> = found.iter().filter(|r| r.kind.as_str() == kind).collect();
    assert_eq!(of_kind.len(), 1, "{id}: one {kind} record, got {found:?}");
    let r = of_kind[0];
    assert_eq!((r.action.as_str(), r.request_id.as_str()), (action, id), "{id}");
    let shadows = found.iter().filter(|r| r.kind.as_str() == "shadow").count();
    assert!(shadows <= 1 && found.len() == 1 + shadows, "{id}: {found:?}");
    if action == "unscreened" {
        assert_eq!((r.tier.as_str(), r.label, r.risk_score), ("unscreened", None, None));
        assert!(r.path[0]["reason"].as_str().unwrap().contains("no model tier can take it"), "{:?}", r.path);
    } else {
        assert_eq!(r.tenant.as_deref(), Some("acme"));
        assert_eq!(r.model.sha256.as_deref().map(str::len), Some(64), "the model's manifest digest");
        assert!(!r.policy_version.is_empty() && !r.path.is_empty() && r.lang.is_some());
        assert_eq!(r.route.as_deref(), (kind == "screen").then_some("chat"));
    }
    if action == "allow" {
        assert_eq!(shadows, 1, "{id}: the candidate reviews what the live policy allows");
    }
    // An unscreened request (shed before screening) keeps no text.
    if text == BENIGN && action != "unscreened" {
        assert!(r.text.value.contains("[email]") && !r.text.value.contains("jan@"), "{}", r.text.value);
        assert_eq!(r.text_chars, BENIGN.chars().count() as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_has_exactly_one_record_of_its_kind() {
    let app = app::start();
    let dir = scratch("one-each");
    let (addr, gateway) = one_each_server(&app, &dir);
    let (n, m) = (6, 6);
    let said = send_mix(addr, n, m).await;
    assert!(said.iter().any(|(_, _, a, _)| a == "unscreened") && said.iter().any(|(_, _, a, _)| a == "block"));
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("chunks", &format!("Hello there.|{RISKY}"))
        .append_pair("gap_ms", "10")
        .finish();
    let cut = common::send(addr, "GET", &format!("/text?{query}"), &[("x-request-id", "cut-1")], "").await;
    assert!(String::from_utf8_lossy(&cut.body).contains("stream guard"), "the stream was cut");

    gateway.audit.as_ref().unwrap().flush();
    for (id, kind, action, text) in &said {
        check_records(&dir, id, kind, action, text);
    }
    let cut = records(&dir, "cut-1");
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!((cut[0].kind.as_str(), cut[0].route.as_deref()), ("stream_cut", Some("guarded")));
    assert!(!cut[0].rules.is_empty() && cut[0].action == RecordedAction::Block, "{:?}", cut[0]);
    let total = count(&dir);
    let shadows = query::count(
        &Store::open_read_only(&dir).unwrap(),
        &Filter { kind: Some("shadow".into()), ..Filter::default() },
    )
    .unwrap();
    assert_eq!(total, (n + m + 1) as u64 + shadows, "nothing but these records");
    let metrics = gateway.metrics.encode();
    assert!(metrics.contains(&format!("tiergate_audit_records_total{{kind=\"classify\"}} {n}")), "{metrics}");
}

/// A server whose audit queue holds one record, with the given `on_full`.
fn tiny_queue(name: &str, on_full: OnFull) -> (std::net::SocketAddr, std::sync::Arc<tiergate::Gateway>, PathBuf) {
    let dir = scratch(name);
    let mut config = common::config(&common::repo().join("policies"));
    config.audit = Some(AuditConfig { dir: dir.clone(), queue_capacity: 1, on_full, ..AuditConfig::default() });
    config.readings.cpu_interval_ms = 20;
    let busy_cpu = common::FakeCpu(std::sync::Mutex::new(0.95));
    let (addr, gateway) =
        common::start_with(config, Sources { cpu: std::sync::Arc::new(busy_cpu) as _, ..Sources::default() });
    (addr, gateway, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_retry_after_under_block() {
    let (addr, gateway, dir) = tiny_queue("block", OnFull::Block);
    let audit = gateway.audit.clone().unwrap();
    let paused = audit.pause_writer_for_tests();
    assert_eq!(post(addr, "/v1/classify", "first", json!({"text": BENIGN})).await.status, StatusCode::OK);
    let refused = post(addr, "/v1/classify", "second", json!({"text": BENIGN})).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers["retry-after"], "1");
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("audit"), "{:?}", refused.body);
    drop(paused);
    // The resumed writer must take "first" off the one-slot queue before "third" can fit: without
    // this wait the third request raced the writer and was (rightly) refused on a busy machine.
    let waiting = audit.clone();
    tokio::task::spawn_blocking(move || waiting.flush()).await.unwrap();
    assert_eq!(post(addr, "/v1/classify", "third", json!({"text": BENIGN})).await.status, StatusCode::OK);
    audit.flush();
    let ids: Vec<usize> = ["first", "second", "third"].iter().map(|id| records(&dir, id).len()).collect();
    assert_eq!(ids, [1, 0, 1], "answered requests have their record; the refused one has none");
    assert_eq!(gateway.metrics.audit_queue_full.get(), 1);
    assert_eq!(gateway.metrics.audit_dropped.get(), 0, "nothing was lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_and_counts_under_drop() {
    let (addr, gateway, dir) = tiny_queue("drop", OnFull::Drop);
    let audit = gateway.audit.clone().unwrap();
    let paused = audit.pause_writer_for_tests();
    for id in ["first", "second"] {
        assert_eq!(post(addr, "/v1/classify", id, json!({"text": BENIGN})).await.status, StatusCode::OK);
    }
    drop(paused);
    audit.flush();
    assert_eq!((records(&dir, "first").len(), records(&dir, "second").len()), (1, 0));
    assert_eq!(gateway.metrics.audit_dropped.get(), 1);
    let reply = common::send(addr, "GET", "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&reply.body);
    assert!(text.contains("tiergate_audit_dropped_total 1") && text.contains("tiergate_audit_queue_depth 0"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_writer_stopped_requests_are_refused_not_answered_without_a_record() {
    let (addr, gateway, dir) = tiny_queue("stopped", OnFull::Block);
    assert_eq!(post(addr, "/v1/classify", "before", json!({"text": BENIGN})).await.status, StatusCode::OK);
    let audit = gateway.audit.clone().unwrap();
    tokio::task::spawn_blocking(move || audit.close()).await.unwrap();
    let refused = post(addr, "/v1/classify", "after", json!({"text": BENIGN})).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", refused.body);
    assert_eq!(refused.headers["retry-after"], "1");
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("writer has stopped"), "{:?}", refused.body);
    assert_eq!((records(&dir, "before").len(), records(&dir, "after").len()), (1, 0));
}

/// A record no response waits on (a shadow disagreement) for `id`.
fn detached(id: &str) -> Draft {
    Draft {
        record_id: tiergate::audit::record::record_id(0),
        request_id: id.into(),
        unix_ms: tiergate::audit::record::now_ms(),
        kind: Kind::Shadow,
        tenant: None,
        route: None,
        policy_version: "p".into(),
        scenario: None,
        model: ModelRef { name: "m".into(), sha256: None },
        action: RecordedAction::Allow,
        label: None,
        risk_score: None,
        tier: RecordedTier::Cpu,
        path: Vec::new(),
        note: None,
        latency_us: 0,
        lang: None,
        text: std::sync::Arc::from("x"),
        trace_id: None,
    }
}

/// Under `block`, records no response waits on that find the queue full wait in an overflow
/// queue of the same size (no task per record polling for room); past it they are dropped and
/// counted, so a stalled writer cannot make them pile up without bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_records_wait_in_a_bounded_overflow_and_past_it_are_counted_dropped() {
    let dir = scratch("overflow");
    let mut config = common::config(&common::repo().join("policies"));
    config.audit = Some(AuditConfig { dir: dir.clone(), queue_capacity: 2, ..AuditConfig::default() });
    let (_, gateway) = common::start_with(config, Sources::default());
    let audit = gateway.audit.clone().unwrap();
    let paused = audit.pause_writer_for_tests();
    for i in 0..10 {
        audit.submit_detached(detached(&format!("cut-{i}")));
    }
    assert_eq!(gateway.metrics.audit_dropped.get(), 6, "2 in the queue, 2 in the overflow, the rest dropped");
    drop(paused);
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::task::spawn_blocking(move || audit.flush()).await.unwrap();
    let kept: Vec<usize> = (0..10).map(|i| records(&dir, &format!("cut-{i}")).len()).collect();
    assert_eq!(kept, [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]);
    assert_eq!(gateway.metrics.audit_dropped.get(), 6);
}

/// `tiergate serve` with the audit trail in `dir/audit`, an hour between flushes (so that only a
/// full queue or the shutdown can commit) and `audit` (more `[audit]` lines).
fn serve_audited(dir: &Path, audit: &str) -> common::Sidecar {
    common::Sidecar::audited(dir, &format!("flush_interval_ms = 3600000\n{audit}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_flush_max_records_commits_before_the_interval() {
    let dir = scratch("flush-max");
    let server = serve_audited(&dir, "flush_max_records = 10");
    let k = 25;
    for i in 0..k {
        let reply = post(server.public, "/v1/classify", &format!("max-{i}"), json!({"text": BENIGN})).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    // Each time 10 wait, the writer commits them (and the one it holds): at most the last
    // 10 + 1 still wait for the hour-long interval.
    let started = Instant::now();
    while count(&dir.join("audit")) < k - 11 {
        assert!(started.elapsed() < Duration::from_secs(10), "a full batch was not committed before the interval");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_smaller_than_flush_max_records_never_fills_at_light_load() {
    let dir = scratch("small-queue");
    // Half of 64 wakes the writer, long before 1024 (which a queue of 64 never reaches) would;
    // the other half is the writer's slack to wake, even on a busy machine.
    let server = serve_audited(&dir, "queue_capacity = 64\nflush_max_records = 1024");
    for i in 0..200 {
        let reply = post(server.public, "/v1/classify", &format!("small-{i}"), json!({"text": BENIGN})).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}: {}", String::from_utf8_lossy(&reply.body));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_every_queued_record() {
    let dir = scratch("sigterm");
    let mut server = serve_audited(&dir, "flush_max_records = 100000");
    let k = 25;
    for i in 0..k {
        let reply = post(server.public, "/v1/classify", &format!("term-{i}"), json!({"text": BENIGN})).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    assert_eq!(count(&dir.join("audit")), 0, "nothing is committed before the flush interval");
    let term = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(term.success());
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(stopped.elapsed() < Duration::from_secs(30), "tiergate did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}");
    assert_eq!(count(&dir.join("audit")), k, "every answered request's record was committed at shutdown");
    for i in 0..k {
        assert_eq!(records(&dir.join("audit"), &format!("term-{i}")).len(), 1);
    }
}
