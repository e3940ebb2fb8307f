//! The shipper loop: takes the oldest unshipped records from the outbox, produces them, marks
//! them shipped once the broker acknowledged them; on failure keeps them in the outbox and
//! retries with capped exponential backoff. Logs a line when the link changes state, not per
//! retry. On stop it ships what is left, bounded by `drain_timeout_ms`, and returns.

use super::config::KafkaConfig;
use super::metrics::KafkaMetrics;
use super::session::{Produced, Session};
use crate::audit::outbox::Outbox;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Why a round failed: the outbox (the local store) or the broker.
enum Failure {
    Outbox(anyhow::Error),
    Broker(String),
}

/// Whether the broker answered the last attempt (`Unknown` before the first).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Link {
    Unknown,
    Up,
    Down,
}

pub struct Shipper {
    config: KafkaConfig,
    outbox: Arc<dyn Outbox>,
    metrics: KafkaMetrics,
    session: Option<Session>,
    link: Link,
    backoff: Duration,
}

impl Shipper {
    pub fn new(config: KafkaConfig, outbox: Arc<dyn Outbox>, metrics: KafkaMetrics) -> Shipper {
        let backoff = Duration::from_millis(config.backoff_initial_ms);
        Shipper { config, outbox, metrics, session: None, link: Link::Unknown, backoff }
    }

    /// Ships until `stop` turns true (or its sender is dropped), then drains.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        tracing::info!(brokers = ?self.config.brokers, topic = %self.config.topic, "audit kafka: shipper started");
        let poll = Duration::from_millis(self.config.poll_interval_ms);
        while !stop_requested(&stop) {
            let wait = match self.round().await {
                Ok(0) => poll,
                Ok(_) => continue,
                Err(failure) => self.failed(failure),
            };
            if pause(&mut stop, wait).await {
                break;
            }
        }
        self.drain().await;
    }

    /// Ships what is in the outbox until it is empty or `drain_timeout_ms` has passed.
    async fn drain(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(self.config.drain_timeout_ms);
        loop {
            match tokio::time::timeout_at(deadline, self.round()).await {
                Ok(Ok(0)) => {
                    tracing::info!("audit kafka: stopped with the outbox shipped");
                    return;
                }
                Ok(Ok(_)) => {}
                Ok(Err(failure)) => {
                    let wait = self.failed(failure);
                    if Instant::now() + wait >= deadline {
                        break;
                    }
                    tokio::time::sleep(wait).await;
                }
                Err(_) => break,
            }
        }
        let left = self.backlog().await.map_or_else(|e| format!("unknown ({e})"), |n| n.to_string());
        tracing::warn!(
            left = %left,
            drain_timeout_ms = self.config.drain_timeout_ms,
            "audit kafka: stopped with records still in the outbox; they ship on the next start"
        );
    }

    /// One batch: returns how many records were shipped (0: the outbox is empty).
    async fn round(&mut self) -> Result<usize, Failure> {
        let limit = self.config.batch_records;
        let batch = self.blocking(move |outbox| outbox.unshipped(limit)).await.map_err(Failure::Outbox)?;
        let backlog = self.backlog().await.map_err(Failure::Outbox)?;
        self.metrics.backlog.set(backlog as i64);
        if batch.is_empty() {
            return Ok(0);
        }
        let session = match self.session.take() {
            Some(session) => session,
            None => Session::connect(&self.config).await.map_err(Failure::Broker)?,
        };
        let produced = session.produce(batch, &self.config).await;
        let done = self.settle(&produced).await?;
        self.metrics.backlog.set(backlog.saturating_sub(done as u64) as i64);
        if let Some(error) = produced.error {
            // Dropped: the next round reconnects and re-reads the topic's metadata (the
            // topic may be gone, e.g. a broker restarted without its data).
            return Err(Failure::Broker(error));
        }
        self.session = Some(session);
        self.connected(backlog.saturating_sub(done as u64));
        Ok(done)
    }

    /// Marks what the broker acknowledged as shipped, and what it refused for good as refused
    /// (logged, and counted as dropped: it never reaches the topic; retrying cannot ship it, and
    /// it would hold back every later record). Returns how many records left the backlog.
    async fn settle(&self, produced: &Produced) -> Result<usize, Failure> {
        for r in &produced.rejected {
            tracing::error!(
                request_id = %r.request_id,
                reason = %r.reason,
                "audit kafka: the broker refused a record; it stays in the local store only (tiergate_audit_dropped_total)"
            );
        }
        let acked = produced.acked.clone();
        let refused: Vec<i64> = produced.rejected.iter().map(|r| r.id).collect();
        let done = acked.len() + refused.len();
        if !acked.is_empty() {
            // A failure here re-ships these records later: at least once, never lost.
            self.blocking(move |outbox| outbox.mark_shipped(&acked)).await.map_err(Failure::Outbox)?;
        }
        self.metrics.shipped.inc_by(produced.acked.len() as u64);
        if !refused.is_empty() {
            let n = refused.len() as u64;
            self.blocking(move |outbox| outbox.mark_refused(&refused)).await.map_err(Failure::Outbox)?;
            self.metrics.rejected.inc_by(n);
            self.metrics.dropped.inc_by(n);
        }
        Ok(done)
    }

    async fn backlog(&self) -> anyhow::Result<u64> {
        self.blocking(|outbox| outbox.backlog()).await
    }

    /// Runs an outbox call (a store transaction) off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        call: impl FnOnce(&dyn Outbox) -> anyhow::Result<T> + Send + 'static,
    ) -> anyhow::Result<T> {
        let outbox = Arc::clone(&self.outbox);
        tokio::task::spawn_blocking(move || call(outbox.as_ref()))
            .await
            .map_err(|e| anyhow::anyhow!("outbox call panicked: {e}"))?
    }

    fn connected(&mut self, backlog: u64) {
        self.backoff = Duration::from_millis(self.config.backoff_initial_ms);
        self.metrics.up.set(1);
        if self.link != Link::Up {
            tracing::info!(topic = %self.config.topic, backlog, "audit kafka: broker up, shipping");
            self.link = Link::Up;
        }
    }

    /// Records a failure; returns how long to wait before the next attempt.
    fn failed(&mut self, failure: Failure) -> Duration {
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_millis(self.config.backoff_max_ms));
        match failure {
            Failure::Broker(error) => {
                self.session = None;
                self.metrics.errors.inc();
                self.metrics.up.set(0);
                if self.link != Link::Down {
                    tracing::warn!(
                        %error,
                        backlog = self.metrics.backlog.get(),
                        "audit kafka: broker unreachable; records wait in the outbox, retrying with backoff"
                    );
                    self.link = Link::Down;
                }
            }
            // The store's own errors are rare and its own metrics say so: logged each time.
            Failure::Outbox(error) => tracing::warn!(error = %format!("{error:#}"), "audit kafka: outbox failed"),
        }
        wait
    }
}

fn stop_requested(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

/// Sleeps `wait` unless a stop comes first; true when it did.
async fn pause(stop: &mut watch::Receiver<bool>, wait: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(wait) => false,
        _ = stop.wait_for(|stopped| *stopped) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::kafka::session::Rejected;
    use crate::audit::outbox::Pending;
    use std::sync::Mutex;

    /// Remembers what was marked how.
    #[derive(Default)]
    struct Marks {
        shipped: Mutex<Vec<i64>>,
        refused: Mutex<Vec<i64>>,
    }

    impl Outbox for Marks {
        fn unshipped(&self, _: usize) -> anyhow::Result<Vec<Pending>> {
            Ok(Vec::new())
        }
        fn mark_shipped(&self, ids: &[i64]) -> anyhow::Result<()> {
            self.shipped.lock().unwrap().extend(ids);
            Ok(())
        }
        fn mark_refused(&self, ids: &[i64]) -> anyhow::Result<()> {
            self.refused.lock().unwrap().extend(ids);
            Ok(())
        }
        fn backlog(&self) -> anyhow::Result<u64> {
            Ok(0)
        }
    }

    #[tokio::test]
    async fn a_record_the_broker_refuses_is_counted_dropped_and_not_marked_shipped() {
        let outbox = Arc::new(Marks::default());
        let metrics = KafkaMetrics::default();
        let shipper = Shipper::new(KafkaConfig::default(), Arc::clone(&outbox) as Arc<dyn Outbox>, metrics.clone());
        let refused = Rejected { id: 2, request_id: "r2".into(), reason: "MessageTooLarge".into() };
        let produced = Produced { acked: vec![1, 3], rejected: vec![refused], error: None };
        assert_eq!(shipper.settle(&produced).await.ok(), Some(3), "three records left the backlog");
        assert_eq!(*outbox.shipped.lock().unwrap(), [1, 3]);
        assert_eq!(*outbox.refused.lock().unwrap(), [2]);
        assert_eq!((metrics.shipped.get(), metrics.rejected.get(), metrics.dropped.get()), (2, 1, 1));
    }
}
