//! The gpu tier's upstream pool against stub OpenAI-compatible servers, for what a real server
//! cannot be made to show on cue (tests/upstream_llama.rs runs a real llama.cpp server): exact
//! probabilities and temperature, answers outside the schema, failing statuses, P2C load
//! balancing, outlier ejection and re-admission, deadlines, availability and KV-cache headroom.
//! Timing margins are generous (a loaded 2-core machine); assertions are on counts.

mod common;

use common::openai_stub::{self, Behaviour, Fail, StubHandle};
use std::sync::Arc;
use std::time::Duration;
use tiergate::breaker::CircuitState;
use tiergate::policy::{Policy, PromptSpec};
use tiergate::select::{CpuLoad, GpuLoad, GpuMemory, KvCache, LoadSnapshot};
use tiergate::tier::gpu::upstream::{self, UpstreamConfig, UpstreamPool};
use tiergate::tier::gpu::GpuTier;
use tiergate::tier::{GpuConfig, TierError};
use tokio::time::Instant;

/// Load as routing sees it with the gpu tier free in every respect but the KV cache.
fn gpu_snapshot() -> LoadSnapshot {
    LoadSnapshot {
        confirm: false,
        tenant: Default::default(),
        cpu: CpuLoad { utilization: None, queue_depth: 0, in_flight: 0, service_us: None, queue_wait_us: None },
        gpu: GpuLoad {
            unavailable: None,
            memory: GpuMemory::NotPresent("upstream servers".into()),
            utilization: None,
            in_flight: 0,
            p95_us: None,
            queue_wait_us: None,
            ewma_us: None,
            circuit: CircuitState::Closed,
            kv_cache: KvCache::NotExposed,
            was_below: Default::default(),
            endpoints_available: Some(1),
        },
    }
}

/// The pool's KV-cache headroom when it has a fresh reading.
fn headroom(pool: &UpstreamPool) -> Option<f64> {
    match pool.kv_cache() {
        KvCache::Headroom(h) => Some(h),
        _ => None,
    }
}

fn config(stubs: &[&StubHandle]) -> UpstreamConfig {
    UpstreamConfig {
        endpoints: stubs.iter().map(|s| s.url()).collect(),
        model: "stub-model".into(),
        health_interval_ms: 50,
        eject_ms: 300,
        eject_after_failures: 3,
        ewma_decay_ms: 1000,
        ..Default::default()
    }
}

fn prompt() -> PromptSpec {
    PromptSpec {
        system: "You screen messages for fraud. Answer JSON {\"label\": \"risk\"|\"ok\"}.".into(),
        user: "Message: {text}".into(),
        max_tokens: 16,
        risk_label: "risk".into(),
        ok_label: "ok".into(),
    }
}

fn deadline(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Polls `condition` every 10 ms for up to `limit`; returns whether it became true.
async fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_is_the_normalised_label_probability_at_the_tier_temperature() {
    // Exact probabilities on cue: what the real server (tests/upstream_llama.rs) cannot give.
    let stub = openai_stub::spawn(Behaviour::default().label("risk").logprob(Some(0.6f64.ln()))).await;
    stub.update(|b| b.other_logprob = Some(0.2f64.ln()));
    let pool = UpstreamPool::start(&config(&[&stub])).unwrap();
    let v = pool.classify(&prompt(), "send me your PIN", deadline(5000)).await.unwrap();
    assert!(close(v.risk_score, 0.75) && close(v.confidence, 0.75), "{v:?}");
    assert_eq!(v.endpoint.as_deref(), Some(stub.url().as_str()));
    assert_eq!((v.batch_size, v.queue_us, v.ood_score, v.tokens), (1, 0, None, Some(17)));
    assert!(v.infer_us > 0);

    // The request: structured output, the text as data in the user turn, greedy, logprobs.
    let req = stub.last_request().unwrap();
    assert_eq!(req["model"], "stub-model");
    assert_eq!(req["messages"][0]["role"], "system");
    assert!(req["messages"][0]["content"].as_str().unwrap().ends_with(upstream::DATA_RULE), "{req}");
    assert_eq!(req["messages"][1]["content"], "Message: <message>\n\"send me your PIN\"\n</message>");
    assert_eq!((req["temperature"].as_f64(), req["logprobs"].as_bool()), (Some(0.0), Some(true)));
    assert_eq!(req["response_format"]["json_schema"]["schema"], upstream::verdict_schema(&prompt()));
    assert_eq!(req["max_tokens"], 16);

    // `ok` stated: risk is the other label's share.
    stub.set_answer("ok", 0.8f64.ln(), None);
    let v = pool.classify(&prompt(), "lunch at noon?", deadline(5000)).await.unwrap();
    assert!(close(v.risk_score, 0.2) && close(v.confidence, 0.8), "{v:?}");

    // Forced against the model (`ok` stated at 0.01, `risk` listed at 0.5): unsure, never risk 0.01.
    stub.set_answer("ok", 0.01f64.ln(), Some(0.5f64.ln()));
    let v = pool.classify(&prompt(), "x", deadline(5000)).await.unwrap();
    assert_eq!((v.risk_score, v.confidence), (0.5, 0.5), "{v:?}");

    // The tier's temperature scales the log-odds: logit(0.8) / 2 = ln 2, risk 2/3.
    let mut cfg = config(&[&stub]);
    cfg.temperature = 2.0;
    let hot = UpstreamPool::start(&cfg).unwrap();
    assert_eq!(hot.temperature(), 2.0);
    stub.set_answer("risk", 0.8f64.ln(), None);
    let v = hot.classify(&prompt(), "x", deadline(5000)).await.unwrap();
    assert!(close(v.risk_score, 2.0 / 3.0) && close(v.confidence, 2.0 / 3.0), "{v:?}");
    let a = hot.answer(&prompt(), "x", deadline(5000)).await.unwrap();
    assert!(close(a.parsed.p_risk().unwrap(), 0.8), "{a:?}");
    assert_eq!(pool.endpoints()[0].failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_answers_are_inference_errors() {
    // Answers outside the schema: a real server under `response_format` never gives these.
    let stub = openai_stub::spawn(Behaviour::default()).await;
    let mut cfg = config(&[&stub]);
    cfg.eject_after_failures = 1000; // keep the endpoint in to see every error
    let pool = UpstreamPool::start(&cfg).unwrap();

    type Setup = Box<dyn Fn(&StubHandle)>;
    let content = |c: &'static str| -> Setup { Box::new(move |s| s.set_content(Some(c))) };
    let cases: Vec<(Setup, &str)> = vec![
        (content("I think this might be fraud"), "not JSON"),
        (content("```json\n{\"label\": \"risk\"}\n```"), "not JSON"),
        (content("Sure: {\"label\": \"risk\"}"), "not JSON"),
        (content("{\"label\": \"risk\", \"confidence\": 0.99}"), "unexpected key `confidence`"),
        (content("{\"label\": \"fraud\"}"), "neither `risk` nor `ok`"),
        (content("{\"label\": \"Risk\"}"), "neither `risk` nor `ok`"),
        (content("{\"label\""), "not JSON"),
        (
            Box::new(|s| {
                s.set_content(None);
                s.set_logprob(None);
            }),
            "no token logprobs",
        ),
        (Box::new(|s| s.set_content(Some(&"a".repeat(2 << 20)))), "over 1048576 bytes"),
        (
            Box::new(|s| {
                s.set_content(None);
                s.set_fail(Fail::InvalidJson)
            }),
            "not JSON",
        ),
        (Box::new(|s| s.set_fail(Fail::Status(500))), "500"),
        (Box::new(|s| s.set_fail(Fail::Status(404))), "404"),
    ];
    for (i, (setup, needle)) in cases.iter().enumerate() {
        setup(&stub);
        match pool.classify(&prompt(), "x", deadline(5000)).await {
            Err(TierError::Inference(message)) => assert!(message.contains(needle), "case {i}: {message}"),
            other => panic!("case {i}: expected an Inference error containing `{needle}`, got {other:?}"),
        }
    }
    let n = cases.len() as u64;
    let status = &pool.endpoints()[0];
    assert_eq!((status.requests, status.failures, status.consecutive_failures as u64), (n, n, n));
    assert!(!status.ejected);
    // One success resets the consecutive count.
    stub.set_fail(Fail::None);
    stub.set_content(None);
    stub.set_answer("ok", 0.9f64.ln(), None);
    pool.classify(&prompt(), "x", deadline(5000)).await.unwrap();
    assert_eq!(pool.endpoints()[0].consecutive_failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_skews_traffic_to_fast_endpoints() {
    let fast_a = openai_stub::spawn(Behaviour::default().latency_ms(5)).await;
    let fast_b = openai_stub::spawn(Behaviour::default().latency_ms(5)).await;
    let slow = openai_stub::spawn(Behaviour::default().latency_ms(100)).await;
    let pool = UpstreamPool::start(&config(&[&fast_a, &slow, &fast_b])).unwrap();

    // 5 workers × 30 sequential requests: some concurrency, so outstanding counts matter too.
    let workers: Vec<_> = (0..5)
        .map(|_| {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                for _ in 0..30 {
                    pool.classify(&prompt(), "x", deadline(10_000)).await.expect("every request succeeds");
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let (a, b, s) = (fast_a.requests(), fast_b.requests(), slow.requests());
    eprintln!("requests: fast {a}, {b}; slow {s}");
    assert_eq!(a + b + s, 150);
    assert!(s * 5 < 150, "slow endpoint got {s} of 150 requests (fast: {a}, {b})");
    assert!(a > 20 && b > 20, "both fast endpoints share the load: {a}, {b}");
    let status = pool.endpoints();
    assert!(status[1].ewma_latency_ms > status[0].ewma_latency_ms, "{status:?}");
    assert!(status.iter().all(|e| e.outstanding == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_endpoint_is_ejected_and_readmitted() {
    let good = openai_stub::spawn(Behaviour::default().latency_ms(2)).await;
    let flaky = openai_stub::spawn(Behaviour::default().latency_ms(2)).await;
    // With two endpoints P2C always compares both, so the slower one gets traffic only once its
    // idle estimate has decayed below the other's: a short decay keeps this test short.
    let mut cfg = config(&[&good, &flaky]);
    cfg.ewma_decay_ms = 200;
    let pool = UpstreamPool::start(&cfg).unwrap();
    for _ in 0..20 {
        pool.classify(&prompt(), "x", deadline(5000)).await.unwrap();
    }

    // The flaky one answers 500 (its /health still passes, as vLLM's does when the model breaks):
    // after 3 failed requests it is ejected.
    flaky.set_fail(Fail::Status(500));
    let before = flaky.requests();
    let mut errors = 0;
    let give_up = deadline(10_000);
    while Instant::now() < give_up {
        if pool.classify(&prompt(), "x", deadline(5000)).await.is_err() {
            errors += 1;
        }
        if pool.endpoints()[1].ejected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let status = &pool.endpoints()[1];
    assert!(status.ejected, "not ejected after {errors} errors: {status:?}");
    assert_eq!(errors, 3);
    assert_eq!(flaky.requests() - before, 3);
    assert_eq!(pool.available(), 1);

    // While ejected (and now failing its health checks too, so it stays out), no traffic.
    flaky.set_health(503);
    let during = flaky.requests();
    for _ in 0..40 {
        pool.classify(&prompt(), "x", deadline(5000)).await.expect("the good endpoint answers");
    }
    assert_eq!(flaky.requests(), during, "an ejected endpoint got traffic");
    assert!(eventually(Duration::from_secs(5), || !pool.endpoints()[1].healthy).await);

    // It recovers: after eject_ms (300) a passing health check (every 50 ms) re-admits it.
    flaky.set_fail(Fail::None);
    flaky.set_health(200);
    let recovered = Instant::now();
    assert!(eventually(Duration::from_secs(10), || pool.available() == 2).await, "{:?}", pool.endpoints());
    assert!(recovered.elapsed() < Duration::from_secs(10));
    let status = &pool.endpoints()[1];
    assert!(status.healthy && !status.ejected && status.consecutive_failures == 0, "{status:?}");

    // And gets traffic again.
    let readmitted = flaky.requests();
    let mut served = 0;
    let give_up = deadline(10_000);
    while Instant::now() < give_up {
        pool.classify(&prompt(), "x", deadline(5000)).await.expect("both endpoints answer");
        served += 1;
        if flaky.requests() > readmitted + 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(flaky.requests() > readmitted + 2, "re-admitted endpoint got no traffic in {served} requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_is_enforced() {
    let stub = openai_stub::spawn(Behaviour::default().latency_ms(500)).await;
    let pool = UpstreamPool::start(&config(&[&stub])).unwrap();
    let start = Instant::now();
    let err = pool.classify(&prompt(), "x", deadline(50)).await.unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, TierError::DeadlineExceeded { waited_us } if waited_us >= 40_000), "{err:?}");
    assert!(took < Duration::from_millis(400), "gave up after {took:?}");
    let status = &pool.endpoints()[0];
    assert_eq!(status.outstanding, 0);
    // The caller's deadline, not the server's fault: latency (P2C avoids it), never a failure
    // toward ejection, so callers with short deadlines cannot switch a healthy server off.
    assert_eq!((status.failures, status.consecutive_failures), (0, 0), "{status:?}");
    assert!(status.ewma_latency_ms >= 40.0, "{status:?}");

    // A server that never answers, and a deadline already past.
    stub.set_fail(Fail::Hang);
    let start = Instant::now();
    let err = pool.classify(&prompt(), "x", deadline(100)).await.unwrap_err();
    assert!(matches!(err, TierError::DeadlineExceeded { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_millis(1000));
    let err = pool.classify(&prompt(), "x", Instant::now()).await.unwrap_err();
    assert!(matches!(err, TierError::DeadlineExceeded { waited_us: 0 }), "{err:?}");
    assert_eq!(stub.requests(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_cannot_switch_the_gpu_tier_off() {
    // Only the backend's own faults count against the tier's circuit (threshold 5 by default):
    // not a caller's short deadline, not a caller that goes away mid-call.
    let slow = openai_stub::spawn(Behaviour::default().latency_ms(200)).await;
    let env = tiergate::ort_lib::environment(None).expect("ONNX Runtime");
    let tier_with = |timeout_ms| {
        let gpu =
            GpuConfig { backend: "upstream".into(), timeout_ms, upstream: config(&[&slow]), ..Default::default() };
        GpuTier::start(env, &gpu).unwrap().expect("an upstream tier")
    };
    let tier = tier_with(5_000);
    for _ in 0..8 {
        let err = tier.classify(Some(&prompt()), Arc::from("x"), deadline(20)).await.unwrap_err();
        assert!(matches!(err, TierError::DeadlineExceeded { .. }), "{err:?}");
    }
    let p = prompt();
    for _ in 0..8 {
        let call = tier.classify(Some(&p), Arc::from("x"), deadline(5_000));
        assert!(tokio::time::timeout(Duration::from_millis(20), call).await.is_err(), "the client left");
    }
    assert_eq!(tier.circuit(Instant::now()), CircuitState::Closed);
    let endpoints = &tier.status()["endpoints"];
    assert!(endpoints.as_array().unwrap().iter().all(|e| e["failures"] == 0 && e["ejected"] == false), "{endpoints}");
    // The tier's own timeout (20 ms, the caller allowing 5 s) is the backend's fault.
    let strict = tier_with(20);
    for _ in 0..5 {
        let err = strict.classify(Some(&prompt()), Arc::from("x"), deadline(5_000)).await.unwrap_err();
        assert!(matches!(err, TierError::DeadlineExceeded { .. }), "{err:?}");
    }
    assert_eq!(strict.circuit(Instant::now()), CircuitState::Open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_eligible_endpoint_is_unavailable() {
    // One endpoint whose health fails, one that refuses connections.
    let sick = openai_stub::spawn(Behaviour::default()).await;
    sick.set_health(503);
    let gone = openai_stub::spawn(Behaviour::default()).await;
    gone.stop();
    let pool = UpstreamPool::start(&config(&[&sick, &gone])).unwrap();
    assert!(eventually(Duration::from_secs(5), || pool.available() == 0).await, "{:?}", pool.endpoints());
    match pool.classify(&prompt(), "x", deadline(5000)).await {
        Err(TierError::Unavailable(message)) => assert!(message.contains("no healthy upstream endpoint"), "{message}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(sick.requests(), 0);
    // Failed health checks mark unhealthy; only failed requests eject.
    assert!(pool.endpoints().iter().all(|e| !e.healthy && !e.ejected), "{:?}", pool.endpoints());
    // The sick one recovers: the next passing check brings it back.
    sick.set_health(200);
    assert!(eventually(Duration::from_secs(5), || pool.available() == 1).await, "{:?}", pool.endpoints());
    pool.classify(&prompt(), "x", deadline(5000)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_failures() {
    let gone = openai_stub::spawn(Behaviour::default()).await;
    gone.stop();
    let mut cfg = config(&[&gone]);
    cfg.health_interval_ms = 60_000; // only the first check, which may not have run yet
    cfg.eject_after_failures = 1000;
    let pool = UpstreamPool::start(&cfg).unwrap();
    // Endpoints start healthy; whatever the first health check did, a request now fails fast.
    let err = pool.classify(&prompt(), "x", deadline(5000)).await.unwrap_err();
    assert!(matches!(err, TierError::Unavailable(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_cache_headroom_from_metrics() {
    let busy = openai_stub::spawn(Behaviour::default().kv_cache_usage(Some(0.8))).await;
    busy.set_requests_waiting(4.0);
    let mut cfg = config(&[&busy]);
    cfg.metrics_path = Some("/metrics".into());
    let pool = UpstreamPool::start(&cfg).unwrap();
    assert!(eventually(Duration::from_secs(5), || headroom(&pool).is_some()).await);
    assert!((headroom(&pool).unwrap() - 0.2).abs() < 1e-9, "{:?}", pool.kv_cache());
    let status = &pool.endpoints()[0];
    assert_eq!((status.kv_cache_usage, status.requests_waiting), (Some(0.8), Some(4.0)));

    busy.set_kv_cache_usage(Some(0.3));
    assert!(eventually(Duration::from_secs(5), || headroom(&pool).is_some_and(|h| (h - 0.7).abs() < 1e-9)).await);

    // Max over available endpoints; an unhealthy one does not count.
    let idle = openai_stub::spawn(Behaviour::default().kv_cache_usage(Some(0.1))).await;
    let mut cfg = config(&[&busy, &idle]);
    cfg.metrics_path = Some("/metrics".into());
    let pool = UpstreamPool::start(&cfg).unwrap();
    assert!(eventually(Duration::from_secs(5), || headroom(&pool).is_some_and(|h| (h - 0.9).abs() < 1e-9)).await);
    idle.set_health(503);
    assert!(eventually(Duration::from_secs(5), || headroom(&pool).is_some_and(|h| (h - 0.7).abs() < 1e-9)).await);
    // The scrape starts failing (404 here; a 500 alike): the last reading stays in use, then,
    // stale after 3 health intervals, it is unknown (for `unknown_signals`), never "no limit".
    busy.set_kv_cache_usage(None);
    assert!(eventually(Duration::from_secs(5), || pool.kv_cache() == KvCache::Unknown).await, "{:?}", pool.kv_cache());

    // llama.cpp's names (`llamacpp:kv_cache_usage_ratio`, `llamacpp:requests_deferred`).
    let llama = openai_stub::spawn(Behaviour::default().kv_cache_usage(Some(0.4))).await;
    llama.update(|b| {
        b.llama_metrics = true;
        b.requests_waiting = 2.0;
    });
    let mut cfg = config(&[&llama]);
    cfg.metrics_path = Some("/metrics".into());
    let pool = UpstreamPool::start(&cfg).unwrap();
    assert!(eventually(Duration::from_secs(5), || headroom(&pool).is_some_and(|h| (h - 0.6).abs() < 1e-9)).await);
    let status = &pool.endpoints()[0];
    assert_eq!((status.requests_waiting, status.requests_running), (Some(2.0), Some(1.0)));

    // No metrics_path: never any headroom, never a scrape.
    let plain = openai_stub::spawn(Behaviour::default().kv_cache_usage(Some(0.5))).await;
    let pool = UpstreamPool::start(&config(&[&plain])).unwrap();
    assert!(eventually(Duration::from_millis(300), || plain.health_checks() >= 2).await);
    assert_eq!((pool.kv_cache(), plain.metrics_scrapes()), (KvCache::NotExposed, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_whose_metrics_fail_is_unknown_and_kept_off_the_gpu_tier() {
    // 0.99 KV usage, then `/metrics` fails: before the fix the reading was cleared and the
    // headroom check skipped, so every request went to the full server.
    let full = openai_stub::spawn(Behaviour::default().kv_cache_usage(Some(0.99))).await;
    let mut cfg = config(&[&full]);
    cfg.metrics_path = Some("/metrics".into());
    let pool = UpstreamPool::start(&cfg).unwrap();
    assert!(eventually(Duration::from_secs(5), || headroom(&pool).is_some()).await);
    full.set_kv_cache_usage(None);
    let policy_of = |unknown: &str| {
        let routing = std::fs::read_to_string(common::repo().join("policies/routing.toml"))
            .unwrap()
            .replace("unknown_signals = \"eligible\"", &format!("unknown_signals = \"{unknown}\""));
        Policy::load_dir(&common::policies_with_routing(&format!("kv-{unknown}"), &routing)).unwrap()
    };
    let (strict, lenient) = (policy_of("ineligible"), policy_of("eligible"));
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(600) {
        let mut snapshot = gpu_snapshot();
        snapshot.gpu.kv_cache = pool.kv_cache();
        assert_ne!(snapshot.gpu.kv_cache, KvCache::NotExposed, "a failed scrape never reads as no limit");
        let remaining = Duration::from_secs(1);
        assert!(
            tiergate::select::gpu_eligibility(&strict, &snapshot, remaining).is_err(),
            "{:?}",
            snapshot.gpu.kv_cache
        );
        if snapshot.gpu.kv_cache == KvCache::Unknown {
            assert!(tiergate::select::gpu_eligibility(&lenient, &snapshot, remaining).is_ok());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pool.kv_cache(), KvCache::Unknown, "stale after 3 health intervals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_stop_when_pool_is_dropped() {
    let stub = openai_stub::spawn(Behaviour::default()).await;
    let pool = UpstreamPool::start(&config(&[&stub])).unwrap();
    assert!(eventually(Duration::from_secs(5), || stub.health_checks() >= 3).await);
    drop(pool);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = stub.health_checks();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(stub.health_checks(), after, "health checks kept running after the pool was dropped");
}

#[test]
fn config_is_validated() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    let mut cfg = UpstreamConfig { model: "m".into(), ..Default::default() };
    assert!(UpstreamPool::start(&cfg).unwrap_err().to_string().contains("endpoints"));
    cfg.endpoints = vec!["ftp://x".into()];
    assert!(UpstreamPool::start(&cfg).is_err());
    cfg.endpoints = vec!["http://127.0.0.1:9".into()];
    cfg.eject_after_failures = 0;
    assert!(UpstreamPool::start(&cfg).unwrap_err().to_string().contains("eject_after_failures"));
    let parsed: UpstreamConfig = serde_json::from_str(r#"{"endpoints": ["http://a:1"], "model": "m"}"#).unwrap();
    assert_eq!(
        (parsed.health_path.as_str(), parsed.eject_after_failures, parsed.ewma_decay_ms),
        ("/health", 3, 10_000)
    );
    assert!(serde_json::from_str::<UpstreamConfig>(r#"{"endpoint": []}"#).is_err());
}
