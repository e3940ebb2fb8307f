//! [`Tracer`]: what every request's trace shares — the parent-based ratio sampler, span ids,
//! the bounded export queue — and the export task that batches the queue into OTLP/HTTP
//! (protobuf) requests with `opentelemetry-otlp`'s exporter. Drops are counted, never waited on.
//!
//! The queue is a locked buffer the export task drains on a timer (`scheduled_delay_ms`), or
//! at once when a batch is full, as the OpenTelemetry SDK's batch span processor does: a
//! finished trace never wakes the task by itself. (A channel woke it for every span, a thread
//! wake-up per span on an idle runtime: most of what tracing cost per request.)

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
use tokio::sync::{mpsc, oneshot, Notify};
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
        // Both reasons exported from the start (at 0), so a rate over them is never empty.
        for reason in ["queue_full", "export_failed"] {
            drop(m.dropped.get_or_create(&DropLabels { reason }));
        }
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
    queue: Arc<Queue>,
    /// Asks the export task to export what is queued and stop ([`Tracer::shutdown`]).
    flush: mpsc::Sender<oneshot::Sender<()>>,
    metrics: TraceMetrics,
}

impl Shared {
    pub(super) fn new_span_id(&self) -> SpanId {
        self.ids.new_span_id()
    }

    /// Queues a finished trace's spans without waiting; a trace that does not fit whole is
    /// dropped whole (a partial trace would mislead) and counted.
    pub(super) fn submit(&self, spans: Vec<SpanData>) {
        let n = spans.len();
        if self.queue.push(spans) {
            self.metrics.queued.inc_by(n as i64);
        } else {
            self.metrics.drop("queue_full", n);
        }
    }
}

/// The export queue: spans of finished traces, at most `capacity`; `full` wakes the export
/// task when a batch's worth is waiting.
struct Queue {
    spans: Mutex<Vec<SpanData>>,
    capacity: usize,
    batch: usize,
    full: Notify,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SpanData>> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `spans` if they all fit (false: nothing was queued).
    fn push(&self, spans: Vec<SpanData>) -> bool {
        let mut queued = self.lock();
        let before = queued.len();
        if before + spans.len() > self.capacity {
            return false;
        }
        queued.extend(spans);
        let filled = before < self.batch && queued.len() >= self.batch;
        drop(queued);
        if filled {
            self.full.notify_one();
        }
        true
    }

    /// The oldest `max` spans at most.
    fn take(&self, max: usize) -> Vec<SpanData> {
        let mut queued = self.lock();
        let n = queued.len().min(max);
        queued.drain(..n).collect()
    }

    fn len(&self) -> usize {
        self.lock().len()
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
        let queue = Arc::new(Queue {
            spans: Mutex::new(Vec::new()),
            capacity: config.max_queue_size,
            batch: config.max_export_batch_size,
            full: Notify::new(),
        });
        let (flush, flush_rx) = mpsc::channel(1);
        let batch = Batch {
            size: config.max_export_batch_size,
            delay: Duration::from_millis(config.scheduled_delay_ms),
            timeout,
            endpoint: config.endpoint.clone(),
        };
        tokio::spawn(export_loop(Arc::clone(&queue), flush_rx, exporter, batch, metrics.clone()));
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

/// Every `delay`, or as soon as a batch's worth is queued, exports what is queued in batches of
/// up to `size`. Ends when every [`Tracer`] is gone, or on a flush request (sent by
/// [`Tracer::shutdown`]): then what is queued is exported and the request answered.
async fn export_loop(
    queue: Arc<Queue>,
    mut flush: mpsc::Receiver<oneshot::Sender<()>>,
    exporter: opentelemetry_otlp::SpanExporter,
    batch: Batch,
    metrics: TraceMetrics,
) {
    let mut out = Export { exporter, batch, metrics, warned: None };
    let size = out.batch.size;
    loop {
        // `Some` once a flush was asked for or every sender is gone (with whom to answer).
        let mut stopping: Option<Option<oneshot::Sender<()>>> = None;
        tokio::select! {
            () = tokio::time::sleep(out.batch.delay) => {}
            () = queue.full.notified() => {}
            done = flush.recv() => stopping = Some(done),
        }
        // On a tick, what was queued by then (a full batch waits for the next round); when
        // stopping, everything.
        let mut due = if stopping.is_some() { usize::MAX } else { queue.len() };
        while due > 0 {
            let spans = queue.take(size.min(due));
            if spans.is_empty() {
                break;
            }
            due = due.saturating_sub(spans.len());
            out.export(spans).await;
        }
        if let Some(done) = stopping {
            if let Some(done) = done {
                let _ = done.send(());
            }
            return;
        }
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
