//! Tenants end to end, against the real binary (`tiergate serve` with a `[tenants]` section):
//! identity from an API key and from a trusted header, a claimed tenant ignored by default,
//! rotating names held to the default class's one limit, and a tenant at its gpu fair share
//! routed down the cascade while another tenant's request still reaches the gpu tier (an
//! OpenAI-compatible stub stands in for the GPU model server; its latency holds the slot).

mod common;

use common::openai_stub::{self, Behaviour};
use common::routes::screened_route;
use common::Sidecar;
use serde_json::{json, Value};
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `printf %s KEY | sha256sum`.
fn sha256_hex(key: &str) -> String {
    sha2::Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `tiergate serve` on free ports with the bundled model, `policies` and the `extra` sections.
fn serve(name: &str, policies: &Path, extra: &str) -> Sidecar {
    let dir: PathBuf = std::env::temp_dir().join(format!("tiergate-tenants-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Sidecar::serve_in(&dir, policies, extra)
}

async fn classify(s: &Sidecar, headers: &[(&str, &str)], body: Value) -> common::Reply {
    let mut all = vec![("content-type", "application/json"), ("x-tiergate-deadline-ms", "8000")];
    all.extend_from_slice(headers);
    common::send(s.public, "POST", "/v1/classify", &all, body.to_string()).await
}

async fn metrics(s: &Sidecar) -> String {
    String::from_utf8_lossy(&common::send(s.admin, "GET", "/metrics", &[], "").await.body).into_owned()
}

/// Known tenants `payments` (gold, ample rate, by API key) and `chat` (standard: burst 2, by
/// the trusted header); unknown tenants: burst 1.
fn identity_config(extra: &str) -> String {
    format!(
        "[tenants]\ntrusted_header = \"x-client-tenant\"\n{extra}\n[tenants.api_keys]\n\"{}\" = \"payments\"\n\
         [tenants.known]\npayments = \"gold\"\nchat = \"standard\"\n\
         [tenants.classes.gold]\nrate = {{ per_second = 1000, burst = 1000 }}\n\
         [tenants.classes.standard]\nrate = {{ per_second = 1, burst = 2 }}\n\
         [tenants.classes.default]\nrate = {{ per_second = 1, burst = 1 }}\n",
        sha256_hex("pay-secret")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_from_an_api_key_and_from_a_trusted_header() {
    let s = serve("identity", &common::repo().join("policies"), &identity_config(""));
    // An unknown tenant warms the model up (chat's three requests below must come within 1 s).
    assert_eq!(classify(&s, &[], json!({"text": "hello"})).await.status, 200);
    // The key names `payments` (gold: none of these is limited), whatever the body claims.
    for auth in [("authorization", "Bearer pay-secret"), ("x-api-key", "pay-secret"), ("x-api-key", "pay-secret")] {
        let r = classify(&s, &[auth], json!({"text": "hello", "tenant": "chat"})).await;
        assert_eq!(r.status, 200, "{auth:?}: {}", String::from_utf8_lossy(&r.body));
    }
    // The trusted header names `chat` (standard: burst 2).
    for _ in 0..2 {
        assert_eq!(classify(&s, &[("x-client-tenant", "chat")], json!({"text": "hello"})).await.status, 200);
    }
    let r = classify(&s, &[("x-client-tenant", "chat")], json!({"text": "hello"})).await;
    assert_eq!(r.status, 429);
    assert!(r.headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let error = &r.json()["error"];
    assert_eq!((error["limit"].as_str(), error["field"].as_str()), (Some("rate"), Some("tenant")), "{error}");
    assert!(error["message"].as_str().unwrap().contains("tenant `chat` is over its rate limit (class `standard`"));
    // A header value that is not a tenant name: 422 naming the header.
    let r = classify(&s, &[("x-client-tenant", "no spaces")], json!({"text": "hello"})).await;
    assert_eq!((r.status.as_u16(), r.json()["error"]["field"].as_str()), (422, Some("x-client-tenant")));

    let m = metrics(&s).await;
    assert!(m.contains("tiergate_tenant_requests_total{tenant=\"payments\"} 3"), "{m}");
    assert!(m.contains("tiergate_tenant_requests_total{tenant=\"chat\"} 2"), "{m}");
    assert!(m.contains("tiergate_tenant_limited_total{tenant=\"chat\",limit=\"rate\"} 1"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_tenant_string_is_ignored_by_default() {
    let s = serve("claims", &common::repo().join("policies"), &identity_config(""));
    // A known tenant warms the model up, so the unknown tenant's requests follow each other
    // well within its 1 s emission interval.
    assert_eq!(classify(&s, &[("x-client-tenant", "chat")], json!({"text": "hello"})).await.status, 200);
    // Claiming `payments` (gold) in the body or the header gains nothing: the request is the
    // unknown tenant, whose class allows a burst of 1.
    let r = classify(&s, &[], json!({"text": "hello", "tenant": "payments"})).await;
    assert_eq!(r.status, 200);
    let r = classify(&s, &[("x-tiergate-tenant", "payments")], json!({"text": "hello"})).await;
    assert_eq!(r.status, 429, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("tenant `other`"), "{}", r.json());
    // Nor is an API key that is not configured anyone's.
    let r = classify(&s, &[("authorization", "Bearer guessed")], json!({"text": "hello", "tenant": "payments"})).await;
    assert_eq!(r.status, 429);
    let m = metrics(&s).await;
    assert!(m.contains("tiergate_tenant_requests_total{tenant=\"other\"} 1"), "{m}");
    assert!(m.contains("tiergate_tenant_limited_total{tenant=\"other\",limit=\"rate\"} 2"), "{m}");
    assert!(!m.contains("tenant=\"payments\""), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_tenant_names_cannot_exceed_the_default_class_limit() {
    // Even with claims accepted, names the config does not know share the default class's key.
    let extra = "[tenants]\naccept_claimed = true\n[tenants.classes.default]\nrate = { per_second = 2, burst = 5 }\n";
    let s = serve("rotate", &common::repo().join("policies"), extra);
    let started = std::time::Instant::now();
    let mut ok = 0u32;
    for i in 0..40 {
        let r = classify(&s, &[], json!({"text": "hello", "tenant": format!("rot-{i}")})).await;
        match r.status.as_u16() {
            200 => ok += 1,
            429 => assert_eq!(r.json()["error"]["limit"], "rate"),
            other => panic!("status {other}"),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    // GCRA: at most the burst plus the rate over the time taken (one more for a cell boundary).
    let most = 5 + (elapsed * 2.0).ceil() as u32 + 1;
    eprintln!("{ok} of 40 rotating names admitted in {elapsed:.2} s (at most {most})");
    assert!(ok >= 5 && ok <= most, "{ok} admitted in {elapsed:.2} s, limit {most}");
    assert!(ok < 40, "rotating names must not each get a fresh limit");
    let m = metrics(&s).await;
    assert!(!m.contains("rot-"), "metrics label only known tenants: {m}");
    assert!(m.contains(&format!("tiergate_tenant_requests_total{{tenant=\"other\"}} {ok}")), "{m}");
}

const ROUTING: &str = r#"
[actions]
review_at = 0.3
block_at = 0.8
[cascade]
escalate_below = 0.99999
accept_below = 0.5
ood_above = 1.0
[default]
action = "allow"
score = 0.2
[gpu]
max_in_flight = 8
[prompt]
system = "You screen messages for fraud, scams and phishing. Answer only with JSON {\"label\": \"risk\"} or {\"label\": \"ok\"}."
user = "Message:\n{text}"
"#;

fn reached_gpu(d: &Value) -> bool {
    common::path_steps(d).contains(&("gpu".into(), "accepted".into()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_gpu_share_or_budget_is_routed_down_while_another_reaches_the_gpu() {
    let stub = openai_stub::spawn(Behaviour::default()).await;
    let policies = common::policies_with_routing("tenant-share", ROUTING);
    // Every cpu verdict escalates; each tenant of `small` may hold 0.125 × 8 = 1 gpu slot.
    let extra = format!(
        "[gpu]\nbackend = \"upstream\"\ntimeout_ms = 6000\n[gpu.upstream]\nendpoints = [\"{}\"]\nmodel = \"risk-judge\"\n\
         health_interval_ms = 50\n[tenants]\ntrusted_header = \"x-client-tenant\"\n[tenants.known]\na = \"small\"\n\
         b = \"small\"\nc = \"metered\"\n[tenants.classes.small]\ngpu_share = 0.125\n\
         [tenants.classes.metered]\ngpu_daily_budget = 1\n",
        stub.url()
    );
    let s = serve("share", &policies, &extra);
    const TEXT: &str = "Your parcel is held at the depot; pay the customs fee at http://parcel-fee.example.top today";
    let (a, b) = ([("x-client-tenant", "a")], [("x-client-tenant", "b")]);
    // Until the upstream's first health check passes, the gpu tier may be skipped.
    let mut warm = false;
    for _ in 0..100 {
        if reached_gpu(&classify(&s, &b, json!({"text": TEXT})).await.json()) {
            warm = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(warm, "the gpu tier never answered");
    let before = stub.requests();

    // Tenant a's first request holds its one slot while the model server takes 1.5 s.
    stub.set_latency_ms(1500);
    let public = s.public;
    let holder = tokio::spawn(async move {
        let headers =
            [("content-type", "application/json"), ("x-tiergate-deadline-ms", "8000"), ("x-client-tenant", "a")];
        common::send(public, "POST", "/v1/classify", &headers, json!({"text": TEXT}).to_string()).await.json()
    });
    common::eventually("tenant a's request at the model server", || stub.requests() == before + 1).await;

    // Tenant a again: at its share, routed down the cascade without touching the gpu tier.
    let d = classify(&s, &a, json!({"text": TEXT})).await.json();
    assert!(!reached_gpu(&d), "{d}");
    assert!(
        d.to_string().contains("tenant a at its gpu fair share: 1 in flight, gpu_share 0.125 of max_in_flight = 1"),
        "{d}"
    );
    assert_eq!(stub.requests(), before + 1, "tenant a's second request never reached the model server");
    // Tenant b, meanwhile, is not held back.
    let d = classify(&s, &b, json!({"text": TEXT})).await.json();
    assert!(reached_gpu(&d), "{d}");
    let d = holder.await.unwrap();
    assert!(reached_gpu(&d), "{d}");
    assert_eq!(stub.requests(), before + 2);
    // Its slot is back: tenant a reaches the gpu tier again.
    stub.set_latency_ms(0);
    assert!(reached_gpu(&classify(&s, &a, json!({"text": TEXT})).await.json()));

    // Tenant c's class allows one gpu call a day: its next requests are routed down, screened
    // by the cpu tier and rules (the second finds the budget spent at the store, the third
    // already in its snapshot).
    let c = [("x-client-tenant", "c")];
    assert!(reached_gpu(&classify(&s, &c, json!({"text": TEXT})).await.json()));
    let calls = stub.requests();
    for _ in 0..2 {
        let d = classify(&s, &c, json!({"text": TEXT})).await.json();
        assert!(!reached_gpu(&d) && common::path_steps(&d)[0].0 == "cpu", "{d}");
        assert!(
            d.to_string().contains("tenant c spent its gpu_daily_budget of 1 calls (renews at midnight UTC)"),
            "{d}"
        );
    }
    assert_eq!(stub.requests(), calls, "no gpu call past the budget");

    let m = metrics(&s).await;
    assert!(m.contains("tiergate_tenant_limited_total{tenant=\"a\",limit=\"gpu_share\"} 1"), "{m}");
    assert!(m.contains("tiergate_tenant_limited_total{tenant=\"c\",limit=\"gpu_daily_budget\"} 2"), "{m}");
    assert!(!m.contains("tenant=\"b\",limit="), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_route_names_its_tenant_and_its_claim_source_is_ignored_by_default() {
    let app = common::app::start();
    let tenant = "tenant = \"/tenant\"";
    let routes = [
        screened_route("support", "/echo/support", &app.url(), &[tenant, "tenant_name = \"chat\""]),
        screened_route("open", "/echo/open", &app.url(), &[tenant]),
    ]
    .concat();
    let s = serve("route", &common::repo().join("policies"), &format!("{routes}{}", identity_config("")));
    let post = |path: &'static str, body: Value| {
        let public = s.public;
        async move {
            let headers = [("content-type", "application/json"), ("x-tiergate-deadline-ms", "8000")];
            common::send(public, "POST", path, &headers, body.to_string()).await
        }
    };
    // The route's tenant is `chat` (burst 2), whatever the body claims.
    for _ in 0..2 {
        assert_eq!(post("/echo/support", json!({"text": "hello", "tenant": "payments"})).await.status, 200);
    }
    let r = post("/echo/support", json!({"text": "hello", "tenant": "payments"})).await;
    assert_eq!(r.status, 429);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("tenant `chat`"), "{}", r.json());
    // A route without a tenant: the claim is not read (not even its length), so the request is
    // the unknown tenant (burst 1).
    let long = "p".repeat(300);
    assert_eq!(post("/echo/open", json!({"text": "hello", "tenant": long})).await.status, 200);
    let r = post("/echo/open", json!({"text": "hello", "tenant": "payments"})).await;
    assert_eq!(r.status, 429);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("tenant `other`"), "{}", r.json());
    let m = metrics(&s).await;
    assert!(m.contains("tiergate_tenant_requests_total{tenant=\"chat\"} 2"), "{m}");
    assert!(m.contains("tiergate_tenant_requests_total{tenant=\"other\"} 1"), "{m}");
}

#[test]
fn a_route_tenant_must_be_known_and_errors_name_the_key() {
    let text = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = [\"http://127.0.0.1:1\"]\n\
                [routes.screen]\ntext = [\"/text\"]\ntenant_name = \"ghost\"\n";
    let err = tiergate::Config::parse(text).unwrap().validate().unwrap_err().to_string();
    assert!(err.contains("`routes[0].screen.tenant_name`: tenant `ghost` is not in [tenants.known]"), "{err}");
    let err = tiergate::Config::parse("[tenants]\naccept_claims = true\n").unwrap_err().to_string();
    assert!(err.contains("tenants") && err.contains("accept_claims"), "{err}");
}
