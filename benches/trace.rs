//! The request path's share of tracing: one request's trace as tiergate records it — the root
//! span with its HTTP and decision attributes and eight stage spans with theirs — begun, ended
//! and finished, with tracing off, at ratio 0 (recorded, then dropped at the end: what 99 % of
//! requests cost at 0.01) and at ratio 1 (recorded and queued for export). The export itself
//! (protobuf encoding and the HTTP request, on the export task) is not in it:
//! `benches/trace_cost.sh` measures the whole server.
//!
//! Run: `cargo bench --bench trace`

use criterion::{criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use std::time::Duration;
use tiergate::trace::{attr, TraceMetrics, Tracer, TracingConfig};

/// One request's spans and attributes, as the gateway writes them.
fn one_request(tracer: &Tracer, headers: &HeaderMap) {
    let trace = tracer.begin(headers, SpanKind::Server);
    trace.set([
        KeyValue::new(attr::HTTP_REQUEST_METHOD, "POST"),
        KeyValue::new(attr::URL_PATH, "/v1/classify"),
        KeyValue::new(attr::REQUEST_ID, "0b5a4d1e-63b2-4f37-9f0e-4a3c2f1d9e8b"),
    ]);
    trace.rename("POST /v1/classify");
    for name in ["admission", "canonical", "tier cpu", "tier gpu", "rules", "guards", "record"] {
        let span = trace.start(name);
        let attributes = || {
            vec![
                KeyValue::new(attr::TIER, "cpu"),
                KeyValue::new(attr::OUTCOME, "low_confidence"),
                KeyValue::new(attr::RISK_SCORE, 0.42),
                KeyValue::new(attr::LATENCY_US, 4200_i64),
                KeyValue::new(
                    attr::REASON,
                    "confidence 0.612 below escalate_below 0.95; escalating to gpu".to_string(),
                ),
            ]
        };
        trace.end(span, attributes, None);
    }
    trace.set([
        KeyValue::new(attr::POLICY_VERSION, "08e65b91b576".to_string()),
        KeyValue::new(attr::ACTION, "allow"),
        KeyValue::new(attr::TIER, "cpu"),
        KeyValue::new(attr::HTTP_RESPONSE_STATUS_CODE, 200_i64),
    ]);
    std::hint::black_box(trace.trace_id());
    trace.finish();
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _entered = runtime.enter();
    let on = |ratio: f64| {
        // Nothing listens there: exports fail fast and their spans are counted as dropped.
        let config = TracingConfig {
            enabled: true,
            endpoint: "http://127.0.0.1:9/v1/traces".into(),
            sampling_ratio: ratio,
            max_queue_size: 1 << 20,
            max_export_batch_size: 512,
            ..TracingConfig::default()
        };
        Tracer::start(&config, TraceMetrics::default()).unwrap()
    };
    let headers = HeaderMap::new();
    let mut group = c.benchmark_group("trace");
    group.measurement_time(Duration::from_secs(5));
    for (name, tracer) in [("off", Tracer::default()), ("ratio_0", on(0.0)), ("ratio_1", on(1.0))] {
        group.bench_function(name, |b| b.iter(|| one_request(&tracer, &headers)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
