//! The Kafka sink for fleets: a task that ships the audit outbox to a topic, keyed by request
//! id, at least once. Records stay in the local store until the broker acknowledged them, so a
//! broker outage only grows the backlog (bounded by the store's cap); they ship when it is
//! back. Client: `rskafka` (pure Rust). Operations guide: `docs/operations.md ("Kafka sink")`.

mod config;
mod metrics;
mod session;
mod shipper;

pub use config::{KafkaCompression, KafkaConfig, SaslConfig, SaslMechanism};
pub use metrics::KafkaMetrics;
pub use session::partition_for;

use crate::audit::outbox::Outbox;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Starts the shipper on the current tokio runtime.
///
/// It polls `outbox` every `poll_interval_ms` while empty, produces up to `batch_records` per
/// round trip, and calls [`Outbox::mark_shipped`] only for records the broker acknowledged.
/// While the broker is unreachable it retries with exponential backoff (`backoff_initial_ms`
/// doubling up to `backoff_max_ms`), sets `tiergate_audit_kafka_up` to 0 and logs once per
/// change of state. When `stop` turns `true` (or its sender is dropped) it ships what is left
/// for at most `drain_timeout_ms` and the handle completes. `config` should have passed
/// [`KafkaConfig::validate`].
pub fn spawn(
    config: KafkaConfig,
    outbox: Arc<dyn Outbox>,
    metrics: KafkaMetrics,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(shipper::Shipper::new(config, outbox, metrics).run(stop))
}
