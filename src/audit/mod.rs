//! The audit trail: one record per decision — `/v1/classify`, proxy screening (allowed,
//! reviewed, blocked, forwarded unscreened), stream-guard cuts, shadow disagreements — kept in
//! an embedded SQLite store that also serves as the outbox of a sink such as Kafka.
//!
//! The request path builds a [`Draft`] (clones, no formatting) and `try_send`s it to a bounded
//! queue (control messages — flush, stop — go on a channel of their own); one writer thread
//! renders the text as `[audit] text` says, writes JSON and commits in batches, retrying a failed
//! commit (a busy or failing store) until it succeeds while the queue backs up. A full queue, or
//! a writer that has stopped, is `[audit] on_full`: the request gets 503 (`block`, the default:
//! no answered request is without its record) or the record is dropped and counted (`drop`).
//! Records no response waits on go to an overflow queue of the same size when the queue is full.
//! SIGTERM drains the server, then [`Audit::close`] commits everything queued.
//!
//! Files by concern: [`config`] (`[audit]`), [`record`] (the record), [`text`] (hash and
//! redaction), `key` (the HMAC key), [`store`] (SQLite, retention), `writer` (the thread),
//! [`outbox`] (what a sink reads), [`kafka`] (the Kafka sink), [`query`] (filters for `tiergate audit`).

pub mod config;
pub mod kafka;
mod key;
pub mod outbox;
pub mod query;
pub mod record;
pub mod review_text;
pub mod store;
pub mod text;
mod writer;

pub use config::{AuditConfig, OnFull, TextMode};
pub use outbox::{Outbox, Pending};
pub use record::{AuditRecord, Draft, Kind, ModelRef};
pub use review_text::ReviewTextConfig;

use crate::error::ApiError;
use crate::metrics::{KindLabels, Metrics};
use crossbeam_channel::{Sender, TrySendError};
use outbox::{Backlog, SqliteOutbox};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use writer::{Control, Writer};

/// The audit metrics (handles into [`Metrics`]).
#[derive(Clone)]
pub struct AuditMetrics {
    pub records: Family<KindLabels, Counter>,
    pub dropped: Counter,
    pub queue_full: Counter,
    pub queue_depth: Gauge,
    pub backlog: Gauge,
    pub retention_deleted: Counter,
    pub flush_seconds: Histogram,
}

impl AuditMetrics {
    pub fn from(m: &Metrics) -> AuditMetrics {
        AuditMetrics {
            records: m.audit_records.clone(),
            dropped: m.audit_dropped.clone(),
            queue_full: m.audit_queue_full.clone(),
            queue_depth: m.audit_queue_depth.clone(),
            backlog: m.audit_backlog.clone(),
            retention_deleted: m.audit_retention_deleted.clone(),
            flush_seconds: m.audit_flush_seconds.clone(),
        }
    }
}

/// The audit trail's front: the queue, the writer thread and the outbox.
pub struct Audit {
    tx: Sender<Box<Draft>>,
    /// Records no response waits on that found `tx` full (under `block`): a second bounded
    /// queue the writer also takes from, so that waiting for room costs no task per record.
    overflow: Sender<Box<Draft>>,
    /// Set by [`Audit::close`]: from then on the writer gives a failing commit a bounded time.
    stopping: Arc<AtomicBool>,
    control: Sender<Control>,
    /// A queue this long wakes the writer before its interval: `flush_max_records`, or half the
    /// queue when that is less, so that a small queue does not fill while the writer sleeps.
    wake_at: usize,
    on_full: OnFull,
    metrics: AuditMetrics,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    outbox: Arc<SqliteOutbox>,
    backlog: Arc<Backlog>,
    shipping: bool,
    /// `[audit] dir`: where the store (and `[audit.review_text]`'s file) is, for readers.
    dir: std::path::PathBuf,
    /// The Kafka shipper (`[audit.kafka]`): its stop signal and task.
    sink: Option<(tokio::sync::watch::Sender<bool>, Mutex<Option<tokio::task::JoinHandle<()>>>)>,
}

impl Audit {
    /// Opens the store in `config.dir` (creating it), loads the HMAC key (for `text = "hash"`)
    /// and starts the writer; with `[audit.kafka]` also the shipper (on the current tokio
    /// runtime), and then retention deletes shipped records first and `tiergate_audit_backlog`
    /// counts what waits for it.
    ///
    /// Errors: the directory or database cannot be created or opened, the key is missing,
    /// unreadable or short (naming the key).
    pub fn open(config: &AuditConfig, metrics: &Metrics, kafka_metrics: kafka::KafkaMetrics) -> anyhow::Result<Audit> {
        let shipping = config.kafka.is_some();
        config.validate().map_err(anyhow::Error::msg)?;
        let store = store::Store::open(&config.dir)?;
        let key = if config.text == TextMode::Hash { key::load(config)? } else { Vec::new() };
        if config.text == TextMode::Full {
            tracing::warn!(dir = %config.dir.display(), "audit records keep the full text ([audit] text = \"full\")");
        }
        let review_texts = review_text::ReviewTexts::open(&config.dir, &config.review_text)?;
        if review_texts.is_some() {
            tracing::warn!(dir = %config.dir.display(), retention_hours = config.review_text.retention_hours,
                "the text of review decisions is kept for the review console ([audit.review_text] enabled = true)");
        }
        let backlog = Arc::new(Backlog::default());
        let outbox = Arc::new(SqliteOutbox::open(&config.dir, Arc::clone(&backlog))?);
        let (tx, records) = crossbeam_channel::bounded(config.queue_capacity);
        let (overflow, overflow_rx) = crossbeam_channel::bounded(config.queue_capacity);
        let stopping = Arc::new(AtomicBool::new(false));
        // Room for the few control messages in flight at once (flush, stop, a full-queue nudge);
        // a sender of a further nudge finds it full and leaves it, one is enough.
        let (control, control_rx) = crossbeam_channel::bounded(8);
        let metrics = AuditMetrics::from(metrics);
        let writer = Writer {
            records,
            overflow: overflow_rx,
            stopping: Arc::clone(&stopping),
            control: control_rx,
            store,
            text: text::TextPolicy::new(config.text, key),
            flush_every: Duration::from_millis(config.flush_interval_ms),
            flush_max: config.flush_max_records,
            retention: store::Retention {
                max_bytes: config.max_bytes,
                max_age_ms: (config.max_age_days > 0).then(|| config.max_age_days.saturating_mul(86_400_000)),
                shipped_first: shipping,
            },
            retention_every: Duration::from_millis(config.retention_interval_ms),
            backlog: Arc::clone(&backlog),
            metrics: metrics.clone(),
            review_texts,
        };
        let handle = std::thread::Builder::new().name("tiergate-audit".into()).spawn(move || writer.run())?;
        tracing::info!(dir = %config.dir.display(), text = ?config.text, on_full = ?config.on_full, "audit trail on");
        let sink = config.kafka.clone().map(|kafka| {
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let outbox = Arc::clone(&outbox) as Arc<dyn Outbox>;
            // A record the broker refuses is lost to the sink: a drop like any other.
            let kafka_metrics = kafka::KafkaMetrics { dropped: metrics.dropped.clone(), ..kafka_metrics };
            (stop, Mutex::new(Some(kafka::spawn(kafka, outbox, kafka_metrics, stopped))))
        });
        Ok(Audit {
            tx,
            overflow,
            stopping,
            control,
            wake_at: config.flush_max_records.min(config.queue_capacity / 2).max(1),
            on_full: config.on_full,
            metrics,
            writer: Mutex::new(Some(handle)),
            outbox,
            backlog,
            shipping,
            dir: config.dir.clone(),
            sink,
        })
    }

    /// For shutdown, after [`Audit::close`]: the Kafka shipper ships what is left (for at most
    /// its `drain_timeout_ms`) and stops. Records it could not ship stay in the store and go out
    /// after the next start. Idempotent; nothing to do without a sink.
    pub async fn stop_sink(&self) {
        let Some((stop, task)) = &self.sink else { return };
        let _ = stop.send(true);
        let task = task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Queues a record on the request path. Under `on_full = "block"` a full queue, or a writer
    /// that has stopped (after [`Audit::close`], or a panic), is an `ApiError::Shed` (503 with
    /// `Retry-After`) for the caller to answer with instead of the decision; under `drop` the
    /// record is dropped and counted.
    pub fn submit(&self, draft: Draft) -> Result<(), ApiError> {
        let reason = match self.tx.try_send(Box::new(draft)) {
            Ok(()) => {
                self.nudge();
                return Ok(());
            }
            Err(TrySendError::Full(_)) => {
                self.metrics.queue_full.inc();
                "the audit trail's queue is full ([audit] on_full = \"block\")"
            }
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("an audit record arrived after the writer stopped");
                "the audit trail's writer has stopped ([audit] on_full = \"block\")"
            }
        };
        match self.on_full {
            OnFull::Block => Err(ApiError::Shed { reason: reason.into(), retry_after_s: 1 }),
            OnFull::Drop => {
                self.metrics.dropped.inc();
                Ok(())
            }
        }
    }

    /// Wakes the writer before its interval once the queue reaches `wake_at`.
    fn nudge(&self) {
        if self.tx.len() + self.overflow.len() >= self.wake_at {
            let _ = self.control.try_send(Control::Full);
        }
    }

    /// Queues a record that no response waits on (a stream cut, a shadow disagreement). Under
    /// `block` a full queue sends it to the overflow queue (as large as the queue, and taken by
    /// the same writer), and only when that is full too is it dropped and counted; under `drop`
    /// a full queue drops and counts it. After [`Audit::close`] it is dropped and counted.
    pub fn submit_detached(self: &Arc<Self>, draft: Draft) {
        let draft = match self.tx.try_send(Box::new(draft)) {
            Ok(()) => return self.nudge(),
            Err(TrySendError::Full(draft)) => {
                self.metrics.queue_full.inc();
                draft
            }
            Err(TrySendError::Disconnected(_)) => {
                self.metrics.dropped.inc();
                return;
            }
        };
        if self.on_full == OnFull::Drop {
            self.metrics.dropped.inc();
            return;
        }
        match self.overflow.try_send(draft) {
            Ok(()) => self.nudge(),
            Err(_) => {
                self.metrics.dropped.inc();
                tracing::warn!(
                    "the audit trail's queue and overflow queue are full; a stream-cut or shadow record is dropped"
                );
            }
        }
    }

    /// Waits until every record queued before the call is committed (blocking).
    pub fn flush(&self) {
        let (done, wait) = mpsc::channel();
        if self.control.send(Control::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Commits everything queued and stops the writer (blocking; for shutdown). Idempotent.
    pub fn close(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.control.send(Control::Stop);
        if let Some(handle) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = handle.join();
        }
    }

    /// The audit data directory (`[audit] dir`): `audit.db`, and `review_text.db` when
    /// `[audit.review_text]` is on. Readers open their own read-only connections there.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The store as a sink's outbox.
    /// Writes `labels` through the writer thread, after every record queued before them, and
    /// says what became of each. Errors: 503 when the writer's control queue is full or it has
    /// stopped, 500 when the store refused the transaction (nothing of it was written; a retry
    /// is safe, labels being idempotent).
    pub async fn feedback(
        &self,
        labels: Vec<crate::feedback::Label>,
    ) -> Result<Vec<crate::feedback::Applied>, ApiError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let busy = |reason: &str| ApiError::Shed { reason: reason.into(), retry_after_s: 1 };
        match self.control.try_send(Control::Feedback { labels, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(busy("the audit writer is busy; retry the labels")),
            Err(TrySendError::Disconnected(_)) => return Err(busy("the audit trail's writer has stopped")),
        }
        match answer.await {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(e)) => Err(ApiError::Internal(format!("writing the labels: {e:#}"))),
            Err(_) => Err(busy("the audit trail's writer has stopped")),
        }
    }

    pub fn outbox(&self) -> Arc<dyn Outbox> {
        Arc::clone(&self.outbox) as Arc<dyn Outbox>
    }

    /// Sets the queue depth and backlog gauges (at each scrape).
    pub fn export(&self) {
        self.metrics.queue_depth.set((self.tx.len() + self.overflow.len()) as i64);
        self.metrics.backlog.set(if self.shipping { self.backlog.get() as i64 } else { 0 });
    }

    /// Test hook: the writer commits what it has, then takes nothing from the queue until the
    /// returned guard is dropped. For tests of a full queue; not for production use.
    #[doc(hidden)]
    pub fn pause_writer_for_tests(&self) -> WriterPaused {
        let (paused, is_paused) = mpsc::channel();
        let (resume, resumed) = mpsc::channel();
        if self.control.send(Control::Pause { paused, resume: resumed }).is_ok() {
            let _ = is_paused.recv();
        }
        WriterPaused { _resume: resume }
    }
}

/// Dropping it lets the writer go on (see [`Audit::pause_writer_for_tests`]).
pub struct WriterPaused {
    _resume: mpsc::Sender<()>,
}
