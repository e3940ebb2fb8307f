//! The writer thread: takes drafts off the bounded queue, renders them (text hash or redaction,
//! JSON) and commits them in one transaction per flush — when `flush_interval_ms` has passed
//! since the first record of the batch arrived, or `flush_max_records` wait, whichever is first —
//! and runs retention every `retention_interval_ms`. The only writer of the store's records.
//!
//! A failed commit (the store locked by another connection past its busy timeout, a full disk)
//! is retried with backoff until it succeeds: the batch is kept, the queue backs up behind it,
//! and once it is full the request path refuses under `on_full = "block"` — no answered request
//! loses its record. Only after [`super::Audit::close`] is a failing commit given up, after
//! [`STOP_RETRY`], and its records counted dropped, so that a dead disk cannot hold a shutdown.
//!
//! Records and control messages travel apart: the writer wakes for the first record of a batch,
//! then sleeps until the batch is due and takes everything queued at once, so a busy server
//! pays one wake-up per flush rather than a futex wake and a context switch per decision. Control
//! messages (flush, pause, stop, and the queue reaching its wake-up length) wake it at once.

use super::outbox::Backlog;
use super::record::{now_ms, AuditRecord, Draft};
use super::review_text::ReviewTexts;
use super::store::{Retention, Store};
use super::text::TextPolicy;
use super::AuditMetrics;
use crate::feedback::{Applied, Label, Outcome, Target};
use crate::metrics::KindLabels;
use crossbeam_channel::{select, Receiver};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Write these labels (after the records queued before them, which they may name) and
    /// answer what became of each.
    Feedback { labels: Vec<Label>, reply: tokio::sync::oneshot::Sender<anyhow::Result<Vec<Applied>>> },
}

pub(super) struct Writer {
    pub records: Receiver<Box<Draft>>,
    /// Records no response waits on that found `records` full.
    pub overflow: Receiver<Box<Draft>>,
    /// [`super::Audit::close`] was called: a failing commit is given up after [`STOP_RETRY`].
    pub stopping: Arc<AtomicBool>,
    pub control: Receiver<Control>,
    pub store: Store,
    pub text: TextPolicy,
    pub flush_every: Duration,
    pub flush_max: usize,
    pub retention: Retention,
    pub retention_every: Duration,
    pub backlog: Arc<Backlog>,
    pub metrics: AuditMetrics,
    /// `[audit.review_text]` on: where the text of committed `review` records is kept.
    pub review_texts: Option<ReviewTexts>,
}

/// After [`super::Audit::close`], a commit that keeps failing is given up after this long and
/// its records counted dropped: a shutdown must end even on a dead disk.
const STOP_RETRY: Duration = Duration::from_secs(30);

/// The first pause between failed commits; it doubles up to [`RETRY_MAX`]. Each attempt itself
/// waits up to the store's busy timeout for another connection's lock.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// A commit that keeps failing is logged again at this interval, not at every attempt.
const RETRY_LOG_EVERY: Duration = Duration::from_secs(30);

// The writer runs at the process's priority. It once ran at nice 10, as bookkeeping no response
// waits on; but on a CPU-bound server a starved writer let the queue hold tens of seconds of
// decisions, all lost to a SIGKILL, and then filled it (503s). Its cost is small (one wake-up
// and one transaction per flush), and the crash bound — one `flush_interval_ms` — needs it to
// keep up.

impl Writer {
    pub(super) fn run(mut self) {
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
                    recv(self.overflow) -> draft => match draft {
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
            self.commit_before(&control, &mut batch, &mut due);
            match control {
                Control::Flush(done) => {
                    let _ = done.send(());
                }
                Control::Pause { paused, resume } => {
                    let _ = paused.send(());
                    let _ = resume.recv();
                }
                Control::Full => {}
                Control::Feedback { labels, reply } => {
                    let applied = self.store.feedback(&labels, now_ms());
                    if let Ok(applied) = &applied {
                        let changed =
                            applied.iter().filter(|a| matches!(a.outcome, Outcome::Accepted | Outcome::Updated));
                        self.backlog.add(changed.count() as u64);
                    }
                    let _ = reply.send(applied);
                }
                Control::Stop => {
                    // Whatever raced in behind the stop is written too.
                    while !self.records.is_empty() || !self.overflow.is_empty() {
                        self.flush(&mut batch);
                    }
                    tracing::info!("audit writer stopped: every queued record is committed");
                    return;
                }
            }
        }
    }

    /// Commits the open batch before `control` (`due`: when the batch is due, `None` once
    /// committed). Labels must find their records, but usually come long after their decisions:
    /// for labels the batch is committed only when it holds a record one of them names, else it
    /// stays open until due (a commit per label would cost the writer its batching).
    fn commit_before(&mut self, control: &Control, batch: &mut Vec<Draft>, due: &mut Option<Instant>) {
        let must = match control {
            Control::Feedback { labels, .. } => {
                self.gather(batch);
                batch.iter().any(|d| {
                    labels.iter().any(|l| match &l.target {
                        Target::RecordId(id) => *id == d.record_id,
                        Target::RequestId(id) => *id == d.request_id,
                    })
                })
            }
            _ => true,
        };
        if must {
            self.flush(batch);
            *due = None;
        } else if !batch.is_empty() && due.is_none() {
            *due = Some(Instant::now() + self.flush_every);
        }
    }

    /// Takes every record queued so far into the batch; at most a queue's worth, so that
    /// senders outpacing the writer cannot keep it here.
    fn gather(&self, batch: &mut Vec<Draft>) {
        for queue in [&self.records, &self.overflow] {
            let queued = queue.len();
            batch.extend(queue.try_iter().take(queued).map(|draft| *draft));
        }
    }

    /// Takes every record queued so far into the batch, then renders and commits it (in chunks
    /// of `flush_max`), retrying a failed commit.
    fn flush(&mut self, batch: &mut Vec<Draft>) {
        self.gather(batch);
        while !batch.is_empty() {
            let take = batch.len().min(self.flush_max);
            let started = Instant::now();
            let drafts = batch.drain(..take);
            let (records, texts): (Vec<AuditRecord>, Vec<Option<Arc<str>>>) = match &self.review_texts {
                None => (drafts.map(|d| d.render(&self.text)).collect(), Vec::new()),
                Some(_) => drafts
                    .map(|d| {
                        let text = ReviewTexts::wanted(d.kind, d.action).then(|| Arc::clone(&d.text));
                        (d.render(&self.text), text)
                    })
                    .unzip(),
            };
            self.commit(&records);
            self.keep_review_texts(&records, &texts);
            self.metrics.flush_seconds.observe(started.elapsed().as_secs_f64());
        }
        self.metrics.queue_depth.set((self.records.len() + self.overflow.len()) as i64);
    }

    /// Commits `records`, retrying with backoff until it succeeds (the batch is held meanwhile
    /// and the queue backs up behind it); after a stop was asked, for [`STOP_RETRY`] at most.
    fn commit(&mut self, records: &[AuditRecord]) {
        let started = Instant::now();
        let mut logged: Option<Instant> = None;
        let mut pause = RETRY_FIRST;
        let mut stop_deadline: Option<Instant> = None;
        for attempt in 1u64.. {
            let e = match self.store.insert(records) {
                Ok(()) => return self.committed(records, attempt, started),
                Err(e) => e,
            };
            if self.stopping.load(Ordering::Relaxed) {
                let deadline = *stop_deadline.get_or_insert_with(|| Instant::now() + STOP_RETRY);
                if Instant::now() >= deadline {
                    tracing::error!(error = %format!("{e:#}"), records = records.len(), path = %self.store.path().display(),
                        "audit commit failed at shutdown; the records are dropped (tiergate_audit_dropped_total)");
                    self.metrics.dropped.inc_by(records.len() as u64);
                    return;
                }
            }
            if logged.is_none_or(|at| at.elapsed() >= RETRY_LOG_EVERY) {
                tracing::error!(error = %format!("{e:#}"), attempt, records = records.len(), path = %self.store.path().display(),
                    "audit commit failed; retrying (the queue backs up, then requests are refused or dropped as [audit] on_full says)");
                logged = Some(Instant::now());
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(RETRY_MAX);
        }
    }

    /// Counts a committed batch (and says so when it took retries).
    fn committed(&self, records: &[AuditRecord], attempts: u64, since: Instant) {
        for r in records {
            self.metrics.records.get_or_create(&KindLabels { kind: r.kind.as_str() }).inc();
        }
        self.backlog.add(records.len() as u64);
        if attempts > 1 {
            tracing::warn!(
                attempts,
                records = records.len(),
                secs = since.elapsed().as_secs_f64(),
                "audit commit succeeded after retries"
            );
        }
    }

    /// Keeps the texts of the `review` records just committed (`[audit.review_text]`). A failure
    /// loses only the texts: the console then shows the record's hash and signals.
    fn keep_review_texts(&mut self, records: &[AuditRecord], texts: &[Option<Arc<str>>]) {
        let Some(store) = self.review_texts.as_mut().filter(|_| texts.iter().any(Option::is_some)) else { return };
        if let Err(e) = store.keep(records, texts) {
            tracing::error!(error = %format!("{e:#}"), "keeping the text of review decisions failed; the console shows their hash");
        }
    }

    fn retain(&mut self) {
        let started = Instant::now();
        if let Some(store) = self.review_texts.as_mut() {
            match store.retain(now_ms()) {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "review-text retention deleted the oldest texts"),
                Err(e) => tracing::error!(error = %format!("{e:#}"), "review-text retention failed"),
            }
        }
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
