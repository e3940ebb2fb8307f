use super::*;
use crate::test_support::on_current_thread_runtime;
use http::HeaderMap;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, v.parse().unwrap());
    }
    h
}

fn config(ratio: f64, queue: usize) -> TracingConfig {
    // Port 9 (discard) on loopback: nothing listens, every export fails fast.
    TracingConfig {
        enabled: true,
        endpoint: "http://127.0.0.1:9/v1/traces".into(),
        sampling_ratio: ratio,
        max_queue_size: queue,
        max_export_batch_size: queue,
        scheduled_delay_ms: 60_000,
        ..TracingConfig::default()
    }
}

fn dropped(m: &TraceMetrics, reason: &'static str) -> u64 {
    m.dropped.get_or_create(&export::DropLabels { reason }).get()
}

#[test]
fn a_valid_traceparent_is_continued_with_its_tracestate() {
    let sc = context::extract(&headers(&[("traceparent", PARENT), ("tracestate", "vendor=abc")])).unwrap();
    assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
    assert!(sc.is_sampled() && sc.is_remote());
    assert_eq!(sc.trace_state().header(), "vendor=abc");
}

#[test]
fn invalid_traceparents_are_not_continued() {
    for bad in [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // forbidden version
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  // short
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", // v00 has 4 fields
        "+0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "garbage",
    ] {
        assert!(context::extract(&headers(&[("traceparent", bad)])).is_none(), "{bad}");
    }
    assert!(context::extract(&HeaderMap::new()).is_none());
    let mut two = headers(&[("traceparent", PARENT)]);
    two.append("traceparent", PARENT.parse().unwrap());
    assert!(context::extract(&two).is_none(), "several traceparent headers are invalid");
    // A later version may add fields.
    let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
    assert!(context::extract(&headers(&[("traceparent", future)])).is_some());
}

#[test]
fn inject_replaces_what_the_client_sent() {
    let sc = context::extract(&headers(&[("traceparent", PARENT)])).unwrap();
    let mut out = headers(&[("traceparent", "garbage"), ("tracestate", "evil=1")]);
    context::inject(&sc, &mut out);
    assert_eq!(out["traceparent"], PARENT);
    assert!(out.get("tracestate").is_none(), "an empty tracestate is not sent");
    context::inject(&SpanContext::NONE, &mut out);
    assert!(out.get("traceparent").is_none(), "an invalid context removes the header");
}

#[test]
fn off_records_nothing() {
    let trace = Tracer::default().begin(&headers(&[("traceparent", PARENT)]), SpanKind::Server);
    assert!(!trace.is_on() && trace.trace_id().is_none());
    let span = trace.start("x");
    assert!(!trace.context_of(&span).is_valid());
    trace.end(span, Vec::new, None);
    trace.finish();
}

#[test]
fn sampled_parent_decides_and_unsampled_traces_are_kept_only_when_marked() {
    on_current_thread_runtime(async {
        let metrics = TraceMetrics::default();
        let tracer = Tracer::start(&config(0.0, 64), metrics.clone()).unwrap();
        // A sampled client parent: parent-based, sampled whatever the ratio.
        let t = tracer.begin(&headers(&[("traceparent", PARENT)]), SpanKind::Server);
        assert_eq!(t.trace_id().unwrap(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(t.root().unwrap().is_sampled());
        let span = t.start("admission");
        let child = t.context_of(&span);
        assert_eq!((child.trace_id(), child.is_sampled()), (t.root().unwrap().trace_id(), true));
        assert_ne!(child.span_id(), t.root().unwrap().span_id());
        t.end(span, Vec::new, None);
        t.finish();
        assert_eq!(metrics.queued.get(), 2, "root and one stage");
        t.finish();
        assert_eq!(metrics.queued.get(), 2, "a second finish does nothing");
        // Ratio 0, no parent: not sampled, dropped at the end...
        let t = tracer.begin(&HeaderMap::new(), SpanKind::Server);
        assert!(!t.root().unwrap().is_sampled());
        t.finish();
        assert_eq!(metrics.queued.get(), 2);
        // ...unless the decision marked it (blocked).
        let t = tracer.begin(
            &headers(&[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")]),
            SpanKind::Server,
        );
        assert!(!t.root().unwrap().is_sampled(), "an unsampled parent decides too");
        t.keep(attr::KEPT_BLOCKED);
        t.finish();
        assert_eq!(metrics.queued.get(), 3);
    })
    .unwrap();
}

#[test]
fn an_invalid_traceparent_starts_a_new_trace() {
    on_current_thread_runtime(async {
        let tracer = Tracer::start(&config(1.0, 8), TraceMetrics::default()).unwrap();
        let bad = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let t = tracer.begin(&headers(&[("traceparent", bad), ("tracestate", "evil=1")]), SpanKind::Server);
        let root = t.root().unwrap();
        assert!(root.is_valid() && root.is_sampled());
        assert_eq!(root.trace_state().header(), "", "the invalid parent's tracestate is not carried");
        let mut out = headers(&[("traceparent", bad)]);
        context::inject(&t.context_of(&t.start("app")), &mut out);
        assert!(out["traceparent"].to_str().unwrap().starts_with(&format!("00-{}-", root.trace_id())));
    })
    .unwrap();
}

#[test]
fn a_full_queue_drops_and_counts_without_waiting() {
    on_current_thread_runtime(async {
        let metrics = TraceMetrics::default();
        let tracer = Tracer::start(&config(1.0, 2), metrics.clone()).unwrap();
        tracer.begin(&HeaderMap::new(), SpanKind::Server).finish();
        let t = tracer.begin(&HeaderMap::new(), SpanKind::Server);
        for name in ["a", "b", "c", "d"] {
            let span = t.start(name);
            t.end(span, Vec::new, None);
        }
        // No await since start: the export task has not run; the first trace (its root span)
        // is queued, the second (5 spans) does not fit in the 1 place left and is dropped whole.
        t.finish();
        assert_eq!((metrics.queued.get(), dropped(&metrics, "queue_full")), (1, 5));
    })
    .unwrap();
}

#[test]
fn a_failed_export_is_counted_as_dropped() {
    on_current_thread_runtime(async {
        let metrics = TraceMetrics::default();
        let mut c = config(1.0, 4);
        c.scheduled_delay_ms = 10;
        let tracer = Tracer::start(&c, metrics.clone()).unwrap();
        tracer.begin(&HeaderMap::new(), SpanKind::Server).finish();
        for _ in 0..200 {
            if dropped(&metrics, "export_failed") == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(dropped(&metrics, "export_failed"), 1);
        assert_eq!(metrics.queued.get(), 0);
    })
    .unwrap();
}

#[test]
fn config_checks_name_the_key() {
    let mut c = TracingConfig { enabled: true, ..TracingConfig::default() };
    assert!(c.check().is_ok());
    c.sampling_ratio = 1.5;
    assert!(c.check().unwrap_err().contains("tracing.sampling_ratio"));
    c.sampling_ratio = 0.5;
    c.endpoint = "https://collector:4318/v1/traces".into();
    assert!(c.check().unwrap_err().contains("tracing.endpoint"));
    let off = TracingConfig { endpoint: "nonsense".into(), ..TracingConfig::default() };
    assert!(off.check().is_ok(), "an unused endpoint is not checked");
}

#[test]
fn shutdown_exports_what_is_queued_without_waiting_for_the_batch_delay() {
    on_current_thread_runtime(async {
        let metrics = TraceMetrics::default();
        // Batches wait 60 s to fill: only the flush can send these before then.
        let tracer = Tracer::start(&config(1.0, 64), metrics.clone()).unwrap();
        tracer.begin(&HeaderMap::new(), SpanKind::Server).finish();
        tokio::task::yield_now().await;
        tracer.begin(&HeaderMap::new(), SpanKind::Server).finish();
        let started = std::time::Instant::now();
        tracer.shutdown(std::time::Duration::from_secs(10)).await;
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // Nothing listens at the endpoint: the export of both traces was tried, and failed.
        assert_eq!((dropped(&metrics, "export_failed"), metrics.queued.get()), (2, 0));
    })
    .unwrap();
}

#[test]
fn the_bundled_configs_commented_tracing_section_is_valid() {
    let bundled = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tiergate.toml")).unwrap();
    let at = bundled.find("# [tracing]").expect("config/tiergate.toml documents [tracing]");
    let section: String = bundled[at..]
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim_start())
        .collect::<Vec<_>>()
        .join("\n");
    std::env::set_var("OTEL_TOKEN", "t");
    let config = crate::config::Config::parse(&section).unwrap_or_else(|e| panic!("{e}\n{section}"));
    assert!(config.tracing.enabled);
    assert_eq!(config.tracing.headers["authorization"], "Bearer t");
    config.tracing.check().unwrap();
}
