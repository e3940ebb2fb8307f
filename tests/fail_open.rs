//! `on_error = "open"` forwards unscreened only what tiergate's own faults left unscreened: a
//! table crossing every error kind a client controls with a fail-open and a fail-closed route
//! (both refuse it with the same status, neither forwards it), and tiergate's own faults (no
//! model capacity under `when_saturated = "shed"`: the open route forwards it, marked
//! `unscreened`; the closed one refuses it). `quota_store_unavailable` (a shared quota store
//! down under `on_outage = "closed"`) is refused too: see `ApiError::may_fail_open` for why.

mod common;

use common::app::{self, AppHandle};
use common::routes::screened_route;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::BENIGN;

/// Routes `/echo/open/*` and `/echo/closed/*` (text at `/text`, bodies up to 4 KiB) under the
/// live policy, and `/echo/open-busy`, `/echo/closed-busy` under a policy whose cpu tier is
/// saturated at the fake 95 % load and which sheds when no model tier can take a request.
fn routes(app: &AppHandle, busy_policy: &std::path::Path) -> String {
    let policy = format!("policy = \"{}\"", busy_policy.display());
    let mut out = String::new();
    for (name, mode) in [("open", "open"), ("closed", "closed")] {
        let on_error = format!("on_error = \"{mode}\"");
        let busy = format!("{name}-busy");
        out.push_str(&screened_route(&busy, &format!("/echo/{busy}"), &app.url(), &[&on_error, &policy]));
        let limit = "max_body_bytes = 4096";
        out.push_str(&screened_route(name, &format!("/echo/{name}"), &app.url(), &[limit, &on_error]));
    }
    out
}

/// One tiergate with the routes above, a trusted tenant header, and tenant `limited` held to one
/// request per second (burst 1); the app behind it.
fn start() -> (SocketAddr, AppHandle) {
    let app = app::start();
    // One directory per server: the tests run on parallel threads, and each call rewrites its
    // directory, which would pull the policy out from under another test's watcher.
    static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let busy_policy = common::saturated_policies(&format!("fail-open-busy-{n}"), true);
    let tenants = r#"
        [tenants]
        trusted_header = "x-client-tenant"
        [tenants.known]
        limited = "tiny"
        [tenants.classes.tiny]
        rate = { per_second = 1, burst = 1 }
    "#;
    let mut config = common::config_with_routes(&common::repo().join("policies"), &routes(&app, &busy_policy));
    config.tenants = tiergate::Config::parse(tenants).unwrap().tenants;
    config.server.max_text_bytes = 1000;
    config.readings.cpu_interval_ms = 20;
    let busy_cpu = common::FakeCpu(std::sync::Mutex::new(0.95));
    let sources = tiergate::gateway::Sources { cpu: std::sync::Arc::new(busy_cpu) as _, ..Default::default() };
    (common::start_with(config, sources).0, app)
}

/// A request on `route` carrying a unique marker; whether the app got it, and the reply.
async fn send(
    addr: SocketAddr,
    app: &AppHandle,
    route: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (bool, common::Reply) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let marker = format!("m-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    let mut all = vec![("x-marker", marker.as_str()), ("x-tiergate-deadline-ms", "5000")];
    all.extend_from_slice(headers);
    let reply = common::send(addr, "POST", &format!("/echo/{route}"), &all, body).await;
    let forwarded = app.requests().iter().any(|r| r.headers.get("x-marker").is_some_and(|v| *v == *marker));
    (forwarded, reply)
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_client_controls_is_never_forwarded_unscreened() {
    let (addr, app) = start();
    let text = |t: &str| json!({ "text": t }).to_string();
    // (kind, headers, body, status, error code)
    let cases: Vec<(&str, Vec<(&str, &str)>, String, u16, &str)> = vec![
        ("text over max_text_bytes", vec![JSON], text(&"word ".repeat(400)), 422, "invalid_field"),
        ("body over screen.max_body_bytes", vec![JSON], text(&"x".repeat(5000)), 413, "payload_too_large"),
        ("a repeated JSON key", vec![JSON], format!(r#"{{"text":"{BENIGN}","text":"hi"}}"#), 400, "malformed_json"),
        ("malformed JSON", vec![JSON], r#"{"text": "#.into(), 400, "malformed_json"),
        ("not JSON", vec![("content-type", "text/plain")], BENIGN.into(), 415, "unsupported_media_type"),
        ("no text at the sources", vec![JSON], json!({"other": BENIGN}).to_string(), 422, "invalid_field"),
        ("a malformed tenant header", vec![JSON, ("x-client-tenant", "no spaces")], text(BENIGN), 422, "invalid_field"),
        (
            "a repeated identity header",
            vec![JSON, ("x-client-tenant", "a"), ("x-client-tenant", "b")],
            text(BENIGN),
            400,
            "repeated_header",
        ),
    ];
    // Every row is tried before anything is asserted, so a failure lists every kind it concerns.
    let mut wrong = Vec::new();
    for (kind, headers, body, status, code) in &cases {
        for route in ["open", "closed"] {
            let (forwarded, reply) = send(addr, &app, route, headers, body.clone()).await;
            let error = serde_json::from_slice::<serde_json::Value>(&reply.body).ok();
            let got = (reply.status.as_u16(), error.and_then(|e| e.pointer("/error/code").cloned()));
            if forwarded || got != (*status, Some(json!(code))) {
                wrong.push(format!("{kind} on {route}: forwarded {forwarded}, answered {got:?}"));
            }
        }
    }
    // The client's own rate: tenant `limited` (burst 1) sends four at once on each route;
    // whatever is over its limit must be refused 429 on both, and some of it is.
    for route in ["open", "closed"] {
        let sends = (0..4).map(|_| {
            let app = app.clone();
            async move { send(addr, &app, route, &[JSON, ("x-client-tenant", "limited")], text(BENIGN)).await }
        });
        let results = futures_util::future::join_all(sends).await;
        let admitted = results.iter().filter(|(_, r)| r.status == 200).count();
        let limited = results.iter().filter(|(forwarded, r)| r.status == 429 && !forwarded).count();
        if limited == 0 || admitted + limited != 4 {
            let got: Vec<_> = results.iter().map(|(f, r)| (r.status.as_u16(), *f)).collect();
            wrong.push(format!("the client's own rate on {route}: (status, forwarded) {got:?}"));
        }
        // Its next second's worth, so the other route's burst starts full.
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
    assert!(wrong.is_empty(), "expected each refused with its own status, never forwarded:\n{}", wrong.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiergates_own_faults_may_fail_open() {
    let (addr, app) = start();
    let body = json!({ "text": BENIGN }).to_string();
    // No model tier can take the request and the policy sheds: the closed route answers 503
    // (once the fake load has been sampled: an unknown load counts as eligible)...
    let mut tries = 0;
    let (forwarded, reply) = loop {
        let (forwarded, reply) = send(addr, &app, "closed-busy", &[JSON], body.clone()).await;
        tries += 1;
        if reply.status == 503 || tries == 50 {
            break (forwarded, reply);
        }
        assert!(forwarded, "a decided request is forwarded");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(!forwarded);
    assert_eq!(reply.status, 503, "{:?}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.json()["error"]["code"], "overloaded");
    // ...and the open one forwards it, marked unscreened, with the reason.
    let (forwarded, reply) = send(addr, &app, "open-busy", &[JSON], body.clone()).await;
    assert!(forwarded, "{:?}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.status, 200);
    let seen = app.last();
    assert_eq!(seen.headers["x-tiergate-action"], "unscreened");
    assert!(
        seen.headers["x-tiergate-screen-error"].to_str().unwrap().contains("no model tier can take it"),
        "{seen:?}"
    );
}

/// A shared quota store out of reach under `on_outage = "closed"`: 429
/// `quota_store_unavailable` on both routes, never forwarded (the operator chose that no
/// request passes unmetered during an outage; `on_outage = "local"` or `"open"` would admit
/// them, screened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_store_outage_under_on_outage_closed_is_not_failed_open() {
    let app = app::start();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let busy_policy = common::repo().join("policies");
    let redis = format!(
        "[tenants.classes.default]\nrate = {{ per_second = 1000, burst = 1000 }}\n\
         [tenants.redis]\nurl = \"redis://{dead}\"\nreplicas = 1\non_outage = \"closed\"\ntimeout_ms = 50\n"
    );
    let mut config = common::config_with_routes(&common::repo().join("policies"), &routes(&app, &busy_policy));
    config.tenants = tiergate::Config::parse(&redis).unwrap().tenants;
    let addr = common::start(config);
    for route in ["open", "closed"] {
        let (forwarded, reply) = send(addr, &app, route, &[JSON], json!({ "text": BENIGN }).to_string()).await;
        assert!(!forwarded, "{route}: forwarded while the quota store is out of reach");
        assert_eq!(reply.status, 429, "{route}: {:?}", String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.json()["error"]["limit"], "quota_store_unavailable", "{route}");
    }
}
