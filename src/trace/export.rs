//! [`Tracer`]: what every request's trace shares — the parent-based ratio sampler, span ids,
//! the bounded export queue — and the export task that batches the queue into OTLP/HTTP
//! (protobuf) requests with `opentelemetry-otlp`'s exporter. Drops are counted, never waited on.

use super::client::HyperClient;
use super::{context, Inner, State, Trace, TracingConfig};
use futures_util::FutureExt;
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
use tokio::sync::{mpsc, oneshot};
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
    /// Asks the export task to export what is queued and stop ([`Tracer::shutdown`]).
    flush: mpsc::Sender<oneshot::Sender<()>>,
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
        let (flush, flush_rx) = mpsc::channel(1);
        let batch = Batch {
            size: config.max_export_batch_size,
            delay: Duration::from_millis(config.scheduled_delay_ms),
            timeout,
            endpoint: config.endpoint.clone(),
        };
        tokio::spawn(export_loop(rx, flush_rx, exporter, batch, metrics.clone()));
        let shared = Shared {
            sampler: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sampling_ratio))),
            ids: RandomIdGenerator::default(),
            scope: InstrumentationScope::builder("tiergate").with_version(env!("CARGO_PKG_VERSION")).build(),
            queue,
            flush,
            metrics,
        };
        tracing::info!(endpoint = %config.endpoint, ratio = config.sampling_ratio, "exporting traces over OTLP/HTTP");
        Ok(Tracer { shared: Some(Arc::new(shared)) })
    }

    /// At shutdown, once the listeners are drained: exports what is queued and stops the export
    /// task, waiting at most `within`. Spans finished later are dropped (counted as
    /// `queue_full`).
    pub async fn shutdown(&self, within: Duration) {
        let Some(shared) = &self.shared else { return };
        let (done, finished) = oneshot::channel();
        if shared.flush.try_send(done).is_ok() && tokio::time::timeout(within, finished).await.is_err() {
            tracing::warn!(
                within_ms = within.as_millis() as u64,
                "queued trace spans not exported in time at shutdown"
            );
        }
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
/// to fill, and exports each. Ends when every sender is gone, or on a flush request (sent by
/// [`Tracer::shutdown`]): then what is queued is exported and the request answered.
async fn export_loop(
    mut rx: mpsc::Receiver<SpanData>,
    mut flush: mpsc::Receiver<oneshot::Sender<()>>,
    exporter: opentelemetry_otlp::SpanExporter,
    batch: Batch,
    metrics: TraceMetrics,
) {
    let mut out = Export { exporter, batch, metrics, warned: None };
    let size = out.batch.size;
    let mut buf = Vec::with_capacity(size);
    // `Some` once a flush was asked for (with whom to answer).
    let mut stopping: Option<Option<oneshot::Sender<()>>> = None;
    while stopping.is_none() {
        tokio::select! {
            received = rx.recv_many(&mut buf, size) => if received == 0 { return },
            done = flush.recv() => stopping = Some(done),
        }
        let until = Instant::now() + out.batch.delay;
        while stopping.is_none() && buf.len() < size {
            let room = size - buf.len();
            tokio::select! {
                received = tokio::time::timeout_at(until, rx.recv_many(&mut buf, room)) => match received {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
                done = flush.recv() => stopping = Some(done),
            }
        }
        out.export(std::mem::take(&mut buf)).await;
    }
    while rx.recv_many(&mut buf, size).now_or_never().unwrap_or(0) > 0 {
        out.export(std::mem::take(&mut buf)).await;
    }
    if let Some(Some(done)) = stopping {
        let _ = done.send(());
    }
}

/// The exporter and what an export counts.
struct Export {
    exporter: opentelemetry_otlp::SpanExporter,
    batch: Batch,
    metrics: TraceMetrics,
    /// When a failed export was last logged.
    warned: Option<Instant>,
}

impl Export {
    /// Exports one batch within the export timeout; a refused, failed or late export drops its
    /// spans (counted, and logged at most once a minute).
    async fn export(&mut self, spans: Vec<SpanData>) {
        let n = spans.len();
        if n == 0 {
            return;
        }
        self.metrics.queued.dec_by(n as i64);
        let timeout = self.batch.timeout;
        let error = match tokio::time::timeout(timeout, self.exporter.export(spans)).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {} ms", timeout.as_millis())),
        };
        let Some(error) = error else {
            self.metrics.exported.inc_by(n as u64);
            return;
        };
        self.metrics.drop("export_failed", n);
        if self.warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            self.warned = Some(Instant::now());
            let endpoint = &self.batch.endpoint;
            tracing::warn!(%endpoint, spans = n, %error, "trace export failed; spans dropped (counted in tiergate_trace_spans_dropped_total)");
        }
    }
}
