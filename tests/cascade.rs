//! The confidence cascade end to end, with the gpu tier on both backends: `onnx` (the real
//! model on the CPU execution provider) and `upstream` (OpenAI-compatible stub servers with
//! controllable latency, errors and log-probabilities). GPU and CPU load come from test doubles.

mod common;
use common::openai_stub::{self, Behaviour, Fail};
use common::*;
use serde_json::json;
use std::sync::{Arc, Mutex};
use tiergate::gateway::Sources;
use tiergate::select::GpuMemory;
use tiergate::tier::Provider;

const PROMPT: &str = r#"
[prompt]
system = "You screen messages for fraud, scams and phishing. Answer only with JSON {\"label\": \"risk\"} or {\"label\": \"ok\"}."
user = "Message:\n{text}"
"#;

/// A routing policy: every cpu verdict escalates (escalate_below near 1), model verdicts stand
/// from 0.5, or, in `strict`, from 0.99999 (so a cpu verdict never stands and failures end in rules).
fn routing(extra: &str) -> String {
    routing_with(0.5, extra)
}

fn strict(extra: &str) -> String {
    routing_with(0.99999, extra)
}

fn routing_with(accept_below: f64, extra: &str) -> String {
    format!(
        "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\nescalate_below = 0.99999\naccept_below = {accept_below}\nood_above = 1.0\n\
         [default]\naction = \"allow\"\nscore = 0.2\n[gpu]\nmin_free_memory_mb = 2048\nmax_in_flight = 8\n{PROMPT}\n{extra}"
    )
}

fn sources(cpu: &Arc<FakeCpu>, gpu: &Arc<FakeGpu>) -> Sources {
    Sources { cpu: Arc::clone(cpu) as _, gpu: Arc::clone(gpu) as _ }
}

fn idle_cpu() -> Arc<FakeCpu> {
    Arc::new(FakeCpu(Mutex::new(0.1)))
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

async fn upstream_server(
    name: &str,
    stubs: &[&openai_stub::StubHandle],
    routing: &str,
    cpu: &Arc<FakeCpu>,
    gpu: &Arc<FakeGpu>,
) -> (std::net::SocketAddr, Arc<tiergate::Gateway>) {
    let mut c = fast_config(&policies_with_routing(name, routing));
    c.gpu.backend = "upstream".into();
    c.gpu.upstream.endpoints = stubs.iter().map(|s| s.url()).collect();
    c.gpu.upstream.model = "risk-judge".into();
    c.gpu.upstream.health_interval_ms = 50;
    c.gpu.circuit.failure_threshold = 3;
    c.gpu.circuit.open_ms = 60_000;
    start_with(c, sources(cpu, gpu))
}

const PHISH: &str = "Your account is locked. Confirm your password at http://secure-login.example.top/verify";

#[tokio::test]
async fn onnx_backend_takes_escalations_and_low_gpu_memory_routes_down() {
    let gpu = Arc::new(FakeGpu::with_free_mb(40_000));
    let mut c = fast_config(&policies_with_routing("onnx", &routing("")));
    c.gpu.backend = "onnx".into();
    c.gpu.onnx.dir = repo().join("models");
    c.gpu.onnx.provider = Provider::Cpu; // the same path runs on the CUDA provider where there is a GPU
    c.gpu.onnx.intra_threads = 1;
    let (addr, gateway) = start_with(c, sources(&idle_cpu(), &gpu));
    let free_mb = move |mb: u64| {
        let g = Arc::clone(&gateway);
        move || load_now(&g).gpu.memory == GpuMemory::FreeMb(mb)
    };
    eventually("a GPU reading", free_mb(40_000)).await;

    let d = classify(addr, json!({"text": PHISH})).await.json();
    assert_eq!(path_steps(&d), pairs(&[("cpu", "low_confidence"), ("gpu", "accepted")]), "{d}");
    assert!(d["path"][0]["reason"].as_str().unwrap().contains("escalating to gpu"), "{d}");
    assert_eq!(d["tier"], "gpu");
    assert_eq!(d["label"], "risk");
    assert!(d["confidence"].as_f64().unwrap() >= 0.5);

    // Free GPU memory below the policy's minimum: the gpu tier is not eligible, so the cpu
    // verdict (confident enough to accept, not enough to skip escalation) stands, and says why.
    gpu.set_free_mb(1000);
    eventually("the low GPU memory reading", free_mb(1000)).await;
    let d = classify(addr, json!({"text": PHISH})).await.json();
    assert_eq!(path_steps(&d), pairs(&[("cpu", "accepted")]), "{d}");
    let reason = d["path"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("not escalated: gpu ineligible: gpu free memory 1000 MiB below min_free_memory_mb 2048"),
        "{d}"
    );
}

#[tokio::test]
async fn upstream_backend_escalation_with_logprob_confidence() {
    let stub = openai_stub::spawn(Behaviour::default().label("risk").logprob(Some(0.97f64.ln()))).await;
    let (addr, _) =
        upstream_server("up-ok", &[&stub], &routing(""), &idle_cpu(), &Arc::new(FakeGpu::with_free_mb(40_000))).await;
    let d = classify(addr, json!({"text": PHISH})).await.json();
    assert_eq!(path_steps(&d), pairs(&[("cpu", "low_confidence"), ("gpu", "accepted")]), "{d}");
    assert_eq!(d["tier"], "gpu");
    assert!((d["risk_score"].as_f64().unwrap() - 0.97).abs() < 1e-6, "{d}");
    assert_eq!(d["path"][1]["endpoint"], stub.url());
    assert_eq!(d["action"], "block");
    let sent = stub.last_request().unwrap();
    assert!(sent["messages"][1]["content"].as_str().unwrap().contains("secure-login.example.top"), "{sent}");
}

#[tokio::test]
async fn upstream_errors_fall_back_to_rules_and_open_the_circuit() {
    let stub = openai_stub::spawn(Behaviour::default()).await;
    stub.set_fail(Fail::Status(500));
    let (addr, gateway) =
        upstream_server("up-500", &[&stub], &strict(""), &idle_cpu(), &Arc::new(FakeGpu::with_free_mb(40_000))).await;
    for _ in 0..3 {
        let r = classify(addr, json!({"text": PHISH})).await;
        assert_eq!(r.status, 200, "a tier failure never fails the request");
        let d = r.json();
        assert_eq!(d["tier"], "rules", "{d}");
        let gpu_outcome = path_steps(&d)[1].1.clone();
        assert!(matches!(gpu_outcome.as_str(), "error" | "unavailable"), "{d}");
    }
    // Three failures opened the circuit: the gpu tier is skipped without being called.
    let calls = stub.requests();
    let d = classify(addr, json!({"text": PHISH})).await.json();
    assert_eq!(path_steps(&d), pairs(&[("cpu", "low_confidence"), ("gpu", "skipped"), ("rules", "matched")]), "{d}");
    assert!(d["path"][1]["reason"].as_str().unwrap().contains("gpu circuit open"), "{d}");
    assert_eq!(stub.requests(), calls);
    let ready = send(addr, "GET", "/readyz", &[], "").await.json();
    assert_eq!(ready["tiers"]["gpu"]["circuit"], "open", "{ready}");
    drop(gateway);
}

#[tokio::test]
async fn a_failed_escalation_keeps_a_cpu_verdict_that_would_have_stood() {
    let stub = openai_stub::spawn(Behaviour::default()).await;
    stub.set_fail(Fail::Status(503));
    let (addr, _) =
        upstream_server("up-keep", &[&stub], &routing(""), &idle_cpu(), &Arc::new(FakeGpu::with_free_mb(40_000))).await;
    let d = classify(addr, json!({"text": PHISH})).await.json();
    let o = path_steps(&d);
    assert_eq!(o[0], ("cpu".to_string(), "low_confidence".to_string()), "{d}");
    assert_eq!(o[1].0, "gpu", "{d}");
    assert_eq!(o[2], ("cpu".to_string(), "accepted".to_string()), "{d}");
    assert!(d["path"][2]["reason"].as_str().unwrap().contains("not escalated: gpu ineligible: gpu tier"), "{d}");
    assert_eq!(d["tier"], "cpu");
}

#[tokio::test]
async fn upstream_timeout_falls_back_and_a_short_deadline_skips_the_gpu() {
    let stub = openai_stub::spawn(Behaviour::default().latency_ms(400)).await;
    let (addr, _) =
        upstream_server("up-slow", &[&stub], &strict(""), &idle_cpu(), &Arc::new(FakeGpu::with_free_mb(40_000))).await;
    let started = std::time::Instant::now();
    let r = classify_within(addr, json!({"text": PHISH}), 120).await;
    let d = r.json();
    assert_eq!(path_steps(&d), pairs(&[("cpu", "low_confidence"), ("gpu", "timeout"), ("rules", "matched")]), "{d}");
    assert!(started.elapsed() < std::time::Duration::from_millis(380), "the deadline cut the call short");

    // Teach the tier its p95 (~100 ms), then ask with a deadline that cannot cover it.
    stub.set_latency_ms(100);
    stub.set_logprob(Some(0.999999f64.ln()));
    for _ in 0..3 {
        let d = classify(addr, json!({"text": PHISH})).await.json();
        assert_eq!(d["tier"], "gpu", "{d}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(150)).await; // p95 refresh
    let r = classify_within(addr, json!({"text": PHISH}), 60).await;
    let d = r.json();
    assert_eq!(path_steps(&d)[1], ("gpu".to_string(), "skipped".to_string()), "{d}");
    assert!(d["path"][1]["reason"].as_str().unwrap().contains("does not cover gpu queue wait 0.0 ms + service"), "{d}");
    assert_eq!(d["tier"], "rules");
}

#[tokio::test]
async fn saturated_cpu_routes_to_gpu_and_both_saturated_sheds() {
    let stub = openai_stub::spawn(Behaviour::default().label("ok").logprob(Some(0.99f64.ln()))).await;
    let cpu = idle_cpu();
    let extra = "[cpu]\nmax_utilization = 0.8\n[routing]\nwhen_saturated = \"shed\"\nretry_after_s = 3\n";
    let (addr, gateway) =
        upstream_server("saturated", &[&stub], &routing(extra), &cpu, &Arc::new(FakeGpu::with_free_mb(40_000))).await;
    *cpu.0.lock().unwrap() = 0.97;
    let g = Arc::clone(&gateway);
    eventually("cpu utilisation above 0.8", move || load_now(&g).cpu.utilization.is_some_and(|u| u > 0.8)).await;
    let d = classify(addr, json!({"text": "see you at the station at 6"})).await.json();
    assert_eq!(path_steps(&d), pairs(&[("gpu", "accepted")]), "{d}");
    assert_eq!(d["tier"], "gpu");
    assert_eq!(d["label"], "ok");

    // And with the only upstream failing its health checks, nothing can take the request: 503.
    stub.set_health(503);
    let g = Arc::clone(&gateway);
    eventually("the upstream marked unhealthy", move || load_now(&g).gpu.endpoints_available == Some(0)).await;
    let r = classify(addr, json!({"text": "see you at the station at 6"})).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.headers["retry-after"], "3");
    let e = r.json();
    assert_eq!(e["error"]["code"], "overloaded");
    assert!(e["error"]["message"].as_str().unwrap().contains("no model tier can take it"), "{e}");
}

#[tokio::test]
async fn complex_requests_start_on_the_gpu_and_explain_says_why() {
    let stub = openai_stub::spawn(Behaviour::default()).await;
    let (addr, _) = upstream_server(
        "complex",
        &[&stub],
        &routing("[routing]\ncpu_max_complexity = 0.05\n"),
        &idle_cpu(),
        &Arc::new(FakeGpu::with_free_mb(40_000)),
    )
    .await;
    let r = send(
        addr,
        "POST",
        "/v1/classify?explain=true",
        &[("content-type", "application/json")],
        json!({"text": PHISH, "features": {"amount": 5}}).to_string(),
    )
    .await;
    let d = r.json();
    assert_eq!(path_steps(&d), pairs(&[("gpu", "accepted")]), "{d}");
    let ex = &d["explain"];
    assert_eq!(ex["start"]["stage"], "gpu");
    assert!(ex["start"]["reason"].as_str().unwrap().contains("above cpu_max_complexity 0.05"), "{ex}");
    let contributions = ex["complexity"]["contributions"].as_object().unwrap();
    for feature in ["tokens", "links", "signals", "features"] {
        assert!(contributions[feature].as_f64().unwrap() > 0.0, "{feature} contributes: {ex}");
    }
    let sum: f64 = contributions.values().map(|v| v.as_f64().unwrap()).sum();
    assert!((sum.min(1.0) - ex["complexity"]["score"].as_f64().unwrap()).abs() < 1e-9);
    assert!(ex["stats"]["tokens"].as_u64().unwrap() > 10, "{ex}");
    assert!(ex["signals"]["gpu"]["endpoints_available"].is_u64(), "{ex}");
    // Without explain, none of it.
    assert!(classify(addr, json!({"text": PHISH})).await.json().get("explain").is_none());
}

#[tokio::test]
async fn tenants_over_their_rate_get_429_with_retry_after() {
    // `[admission]` (the older single rate) is the default class's rate: every tenant the
    // config does not know shares it; a known tenant counts on its own key.
    let mut c = config(&repo().join("policies"));
    c.admission.tenant_rps = 1;
    c.admission.tenant_burst = 2;
    c.tenants = tiergate::Config::parse("[tenants]\naccept_claimed = true\n[tenants.known]\nglobex = \"default\"\n")
        .unwrap()
        .tenants;
    let addr = start(c);
    for _ in 0..2 {
        assert_eq!(classify(addr, json!({"text": "hi", "tenant": "acme"})).await.status, 200);
    }
    let r = classify(addr, json!({"text": "hi", "tenant": "acme"})).await;
    assert_eq!(r.status, 429);
    assert!(r.headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let error = &r.json()["error"];
    assert_eq!(
        (error["code"].as_str(), error["limit"].as_str(), error["field"].as_str()),
        (Some("rate_limited"), Some("rate"), Some("tenant"))
    );
    assert!(error["message"].as_str().unwrap().contains("tenant `other` is over its rate limit"), "{error}");
    let r = classify(addr, json!({"text": "hi", "tenant": "initech"})).await;
    assert_eq!(r.status, 429, "another unknown name shares the same limit");
    let r = send(
        addr,
        "POST",
        "/v1/classify",
        &[("content-type", "application/json"), ("x-tiergate-tenant", "globex")],
        r#"{"text":"hi"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "a known tenant has its own budget");
}

#[tokio::test]
async fn without_libcuda_the_service_starts_and_reports_the_gpu_absent() {
    let addr = default_server();
    let ready = send(addr, "GET", "/readyz", &[], "").await.json();
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["tiers"]["gpu"]["status"], "unavailable");
    // On a CPU-only machine the real driver probe reports the GPU absent (on a GPU machine, present).
    let devices = &ready["devices"];
    match devices["status"].as_str().unwrap() {
        "absent" => assert!(devices["reason"].as_str().unwrap().contains("CUDA"), "{ready}"),
        "present" | "unknown" => {}
        other => panic!("unexpected devices status {other}: {ready}"),
    }
    let d = classify(addr, json!({"text": "hello"})).await.json();
    assert_eq!(d["path"][0]["tier"], "cpu", "without a gpu tier every request starts on the cpu tier: {d}");
}
