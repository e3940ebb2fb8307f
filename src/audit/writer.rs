//! The writer thread: takes drafts off the bounded queue, renders them (text hash or redaction,
//! JSON) and commits them in one transaction per flush — when `flush_interval_ms` has passed
//! since the first record of the batch arrived, or `flush_max_records` wait, whichever is first —
//! and runs retention every `retention_interval_ms`. The only writer of the store's records.
//!
//! Records and control messages travel apart: the writer wakes for the first record of a batch,
//! then sleeps until the batch is due and takes everything queued at once, so a busy server
//! pays one wake-up per flush rather than a futex wake and a context switch per decision. Control
//! messages (flush, pause, stop, and the queue reaching its wake-up length) wake it at once.

use super::outbox::Backlog;
use super::record::{now_ms, AuditRecord, Draft};
use super::store::{Retention, Store};
use super::text::TextPolicy;
use super::AuditMetrics;
use crate::metrics::KindLabels;
use crossbeam_channel::{select, Receiver};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the control channel carries. Each one first takes every record queued so far.
pub(super) enum Control {
    /// Commit everything queued before this message, then answer.
    Flush(mpsc::Sender<()>),
    /// Commit, answer on `paused`, then take nothing until `resume` is answered or dropped.
    Pause { paused: mpsc::Sender<()>, resume: mpsc::Receiver<()> },
    /// Commit everything queued and end the thread.
    Stop,
    /// The queue reached its wake-up length (`flush_max_records`, or half the queue when that is
    /// less): commit now rather than at the interval.
    Full,
}

pub(super) struct Writer {
    pub records: Receiver<Box<Draft>>,
    pub control: Receiver<Control>,
    pub store: Store,
    pub text: TextPolicy,
    pub flush_every: Duration,
    pub flush_max: usize,
    pub retention: Retention,
    pub retention_every: Duration,
    pub backlog: Arc<Backlog>,
    pub metrics: AuditMetrics,
}

/// A failed commit is tried this many times before its records are dropped (and counted).
const COMMIT_ATTEMPTS: u32 = 3;

/// The writer thread's nice value. Its work (rendering, SQLite commits) is deferred bookkeeping
/// that no response waits on, so on a CPU-bound server it yields to the tiers' workers and the
/// runtime (CFS weight 110 against 1024 at nice 0) and catches up in their idle time; the
/// bounded queue absorbs the lag (`queue_capacity`, 8192 records by default: half a minute at
/// 280 decisions/s with the writer fully starved).
const WRITER_NICE: libc::c_int = 10;

/// Lowers the calling thread's priority to [`WRITER_NICE`]. Linux keeps a nice value per thread
/// (setpriority(2), NOTES), so this leaves the rest of the process alone. Best effort: a failure
/// is logged and the writer runs at normal priority.
fn lower_own_priority() {
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, WRITER_NICE) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "audit writer keeps normal priority");
    }
}

impl Writer {
    pub(super) fn run(mut self) {
        lower_own_priority();
        let mut batch: Vec<Draft> = Vec::with_capacity(self.flush_max);
        let mut due: Option<Instant> = None;
        let mut next_retention = Instant::now();
        loop {
            let now = Instant::now();
            if now >= next_retention {
                self.retain();
                next_retention = Instant::now() + self.retention_every;
            }
            let wake = due.map_or(next_retention, |d| d.min(next_retention));
            let timeout = wake.saturating_duration_since(Instant::now());
            let control = match due {
                // Idle: the first record starts a batch.
                None => select! {
                    recv(self.records) -> draft => match draft {
                        Ok(draft) => {
                            batch.push(*draft);
                            due = Some(Instant::now() + self.flush_every);
                            continue;
                        }
                        Err(_) => Control::Stop,
                    },
                    recv(self.control) -> msg => msg.unwrap_or(Control::Stop),
                    default(timeout) => continue,
                },
                // A batch is open: the rest of it waits in the queue until it is due.
                Some(d) => select! {
                    recv(self.control) -> msg => msg.unwrap_or(Control::Stop),
                    default(timeout) => {
                        if Instant::now() >= d {
                            self.flush(&mut batch);
                            due = None;
                        }
                        continue;
                    }
                },
            };
            self.flush(&mut batch);
            due = None;
            match control {
                Control::Flush(done) => {
                    let _ = done.send(());
                }
                Control::Pause { paused, resume } => {
                    let _ = paused.send(());
                    let _ = resume.recv();
                }
                Control::Full => {}
                Control::Stop => {
                    // Whatever raced in behind the stop is written too.
                    while !self.records.is_empty() {
                        self.flush(&mut batch);
                    }
                    tracing::info!("audit writer stopped: every queued record is committed");
                    return;
                }
            }
        }
    }

    /// Takes every record queued so far into the batch, then renders and commits it (in chunks
    /// of `flush_max`), retrying a failed commit.
    fn flush(&mut self, batch: &mut Vec<Draft>) {
        // At most a queue's worth, so that senders outpacing the writer cannot keep it here.
        let queued = self.records.len();
        batch.extend(self.records.try_iter().take(queued).map(|draft| *draft));
        while !batch.is_empty() {
            let take = batch.len().min(self.flush_max);
            let started = Instant::now();
            let records: Vec<AuditRecord> = batch.drain(..take).map(|d| d.render(&self.text)).collect();
            self.commit(&records);
            self.metrics.flush_seconds.observe(started.elapsed().as_secs_f64());
        }
        self.metrics.queue_depth.set(self.records.len() as i64);
    }

    fn commit(&mut self, records: &[AuditRecord]) {
        for attempt in 1..=COMMIT_ATTEMPTS {
            match self.store.insert(records) {
                Ok(()) => {
                    for r in records {
                        self.metrics.records.get_or_create(&KindLabels { kind: r.kind.as_str() }).inc();
                    }
                    self.backlog.add(records.len() as u64);
                    return;
                }
                Err(e) if attempt < COMMIT_ATTEMPTS => {
                    tracing::warn!(error = %format!("{e:#}"), attempt, "audit commit failed; retrying");
                    std::thread::sleep(Duration::from_millis(100 * attempt as u64));
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), records = records.len(), path = %self.store.path().display(),
                        "audit commit failed; the records are dropped (tiergate_audit_dropped_total)");
                    self.metrics.dropped.inc_by(records.len() as u64);
                }
            }
        }
    }

    fn retain(&mut self) {
        let started = Instant::now();
        match self.store.retain(&self.retention, now_ms()) {
            Ok(d) if d.by_age + d.by_size > 0 => {
                self.metrics.retention_deleted.inc_by(d.by_age + d.by_size);
                self.backlog.sub(d.unshipped);
                // Without a sink nothing is ever shipped, and "unshipped" means nothing.
                let unshipped = self.retention.shipped_first.then_some(d.unshipped);
                tracing::info!(
                    by_age = d.by_age,
                    by_size = d.by_size,
                    unshipped,
                    ms = started.elapsed().as_millis() as u64,
                    "audit retention deleted the oldest records"
                );
                if let Some(lost @ 1..) = unshipped {
                    // Lost to the sink as surely as a dropped record: TiergateAuditRecordsDropped.
                    self.metrics.dropped.inc_by(lost);
                    tracing::warn!(unshipped = lost, "audit retention deleted records the sink had not shipped");
                }
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %format!("{e:#}"), "audit retention failed"),
        }
    }
}
