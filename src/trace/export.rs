//! [`Tracer`]: what every request's trace shares — the parent-based ratio sampler, span ids,
//! the bounded export queue — and the export task that batches the queue into OTLP/HTTP
//! (protobuf) requests with `opentelemetry-otlp`'s exporter. Drops are counted, never waited on.

use super::client::HyperClient;
use super::{context, Inner, State, Trace, TracingConfig};
use http::HeaderMap;
use opentelemetry::trace::{SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags};
use opentelemetry::{Context, InstrumentationScope};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Why spans were dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// `queue_full` (the export queue was at `max_queue_size`) or `export_failed` (the
    /// collector refused, was unreachable or did not answer within `export_timeout_ms`).
    pub reason: &'static str,
}

/// `tiergate_trace_*`.
#[derive(Clone, Default)]
pub struct TraceMetrics {
    /// Spans the collector accepted.
    pub exported: Counter,
    pub dropped: Family<DropLabels, Counter>,
    /// Spans waiting in the export queue.
    pub queued: Gauge,
}

impl TraceMetrics {
    /// Registers `tiergate_trace_spans_exported_total`, `tiergate_trace_spans_dropped_total{reason}`
    /// and `tiergate_trace_queue_spans` (zero while tracing is off).
    pub fn register(registry: &mut Registry) -> TraceMetrics {
        let m = TraceMetrics::default();
        registry.register("trace_spans_exported", "Trace spans the OTLP collector accepted", m.exported.clone());
        registry.register(
            "trace_spans_dropped",
            "Trace spans dropped: export queue full, or the export failed",
            m.dropped.clone(),
        );
        registry.register("trace_queue_spans", "Trace spans waiting for export", m.queued.clone());
        m
    }

    fn drop(&self, reason: &'static str, n: usize) {
        self.dropped.get_or_create(&DropLabels { reason }).inc_by(n as u64);
    }
}

/// What every trace shares. `None` inside [`Tracer`]: tracing off.
pub(super) struct Shared {
    sampler: Sampler,
    ids: RandomIdGenerator,
    pub(super) scope: InstrumentationScope,
    queue: mpsc::Sender<SpanData>,
    metrics: TraceMetrics,
}

impl Shared {
    pub(super) fn new_span_id(&self) -> SpanId {
        self.ids.new_span_id()
    }

    /// Queues a finished trace's spans without waiting; what does not fit is dropped and counted.
    pub(super) fn submit(&self, spans: Vec<SpanData>) {
        for span in spans {
            match self.queue.try_send(span) {
                Ok(()) => {
                    self.metrics.queued.inc();
                }
                Err(_) => self.metrics.drop("queue_full", 1),
            }
        }
    }
}

/// The process's tracer (`[tracing]`); cheap to clone. [`Tracer::default`] is off.
#[derive(Clone, Default)]
pub struct Tracer {
    shared: Option<Arc<Shared>>,
}

impl Tracer {
    /// Off (`enabled = false`), or the sampler and the export task started on the current
    /// tokio runtime. Errors: the exporter could not be built from `config`.
    pub fn start(config: &TracingConfig, metrics: TraceMetrics) -> anyhow::Result<Tracer> {
        if !config.enabled {
            return Ok(Tracer::default());
        }
        let timeout = Duration::from_millis(config.export_timeout_ms);
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(HyperClient::new(timeout))
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(config.endpoint.clone())
            .with_timeout(timeout)
            .with_headers(config.headers.clone().into_iter().collect())
            .build()?;
        exporter.set_resource(&Resource::builder().with_service_name(config.service_name.clone()).build());
        let (queue, rx) = mpsc::channel(config.max_queue_size);
        let batch = Batch {
            size: config.max_export_batch_size,
            delay: Duration::from_millis(config.scheduled_delay_ms),
            timeout,
            endpoint: config.endpoint.clone(),
        };
        tokio::spawn(export_loop(rx, exporter, batch, metrics.clone()));
        let shared = Shared {
            sampler: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sampling_ratio))),
            ids: RandomIdGenerator::default(),
            scope: InstrumentationScope::builder("tiergate").with_version(env!("CARGO_PKG_VERSION")).build(),
            queue,
            metrics,
        };
        tracing::info!(endpoint = %config.endpoint, ratio = config.sampling_ratio, "exporting traces over OTLP/HTTP");
        Ok(Tracer { shared: Some(Arc::new(shared)) })
    }

    /// Whether traces are made.
    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// A request's trace, its root span (of `kind`, named later with [`Trace::rename`]) started
    /// now: under the client's span when `headers` carry a valid `traceparent` (with its
    /// `tracestate`), else in a new trace; sampled as the parent-based ratio sampler says.
    /// [`Trace::OFF`] when tracing is off.
    pub fn begin(&self, headers: &HeaderMap, kind: SpanKind) -> Trace {
        let Some(shared) = &self.shared else { return Trace::OFF };
        let parent = context::extract(headers);
        let trace_id = parent.as_ref().map_or_else(|| shared.ids.new_trace_id(), |p| p.trace_id());
        let parent_cx = parent.as_ref().map(|p| Context::new().with_remote_span_context(p.clone()));
        let sampling = shared.sampler.should_sample(parent_cx.as_ref(), trace_id, "request", &kind, &[], &[]);
        let flags = match sampling.decision {
            SamplingDecision::RecordAndSample => TraceFlags::SAMPLED,
            _ => TraceFlags::default(),
        };
        let root = SpanContext::new(trace_id, shared.new_span_id(), flags, false, sampling.trace_state);
        Trace {
            inner: Some(Arc::new(Inner {
                shared: Arc::clone(shared),
                root,
                parent: parent.map(|p| p.span_id()),
                kind,
                start: SystemTime::now(),
                state: Mutex::new(State { name: "request".into(), ..State::default() }),
            })),
        }
    }
}

/// How the export task batches.
struct Batch {
    size: usize,
    delay: Duration,
    timeout: Duration,
    endpoint: String,
}

/// Takes spans off the queue in batches of up to `size`, waiting at most `delay` for a batch
/// to fill, and exports each; a failed or late export drops its spans (counted, and logged at
/// most once a minute). Ends when every sender is gone.
async fn export_loop(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    batch: Batch,
    metrics: TraceMetrics,
) {
    let mut buf = Vec::with_capacity(batch.size);
    let mut warned: Option<Instant> = None;
    loop {
        if rx.recv_many(&mut buf, batch.size).await == 0 {
            return;
        }
        let until = Instant::now() + batch.delay;
        while buf.len() < batch.size {
            let room = batch.size - buf.len();
            match tokio::time::timeout_at(until, rx.recv_many(&mut buf, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let n = buf.len();
        metrics.queued.dec_by(n as i64);
        let error = match tokio::time::timeout(batch.timeout, exporter.export(std::mem::take(&mut buf))).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {} ms", batch.timeout.as_millis())),
        };
        match error {
            None => {
                metrics.exported.inc_by(n as u64);
            }
            Some(error) => {
                metrics.drop("export_failed", n);
                if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                    warned = Some(Instant::now());
                    tracing::warn!(endpoint = %batch.endpoint, spans = n, %error, "trace export failed; spans dropped (counted in tiergate_trace_spans_dropped_total)");
                }
            }
        }
    }
}
