//! The Kafka shipper's Prometheus metrics, registered into the server's registry by
//! [`KafkaMetrics::register`] (names below are with the registry's `tiergate` prefix).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Handles to the shipper's metrics; clones share the same values.
#[derive(Clone, Debug, Default)]
pub struct KafkaMetrics {
    /// `tiergate_audit_kafka_shipped_total`: records the broker acknowledged (a record shipped
    /// twice after a lost acknowledgement counts twice).
    pub shipped: Counter,
    /// `tiergate_audit_kafka_errors_total`: failed connects and produce round trips.
    pub errors: Counter,
    /// `tiergate_audit_kafka_rejected_total`: records the broker refused for good (too large,
    /// invalid); they stay in the local store and are not retried.
    pub rejected: Counter,
    /// `tiergate_audit_kafka_up`: 1 while the last round trip to the broker succeeded.
    pub up: Gauge,
    /// `tiergate_audit_kafka_backlog_records`: outbox records waiting to be shipped, as of the
    /// shipper's last poll.
    pub backlog: Gauge,
    /// `tiergate_audit_dropped_total` (the audit trail's own, not registered here): a record
    /// the broker refused is lost to the sink. The audit trail hands its counter in.
    pub dropped: Counter,
}

impl KafkaMetrics {
    /// Registers the metrics (under the registry's prefix) and returns the handles.
    pub fn register(registry: &mut Registry) -> KafkaMetrics {
        let metrics = KafkaMetrics::default();
        registry.register(
            "audit_kafka_shipped",
            "Audit records acknowledged by the Kafka broker (at least once: a re-shipped record counts again)",
            metrics.shipped.clone(),
        );
        registry.register(
            "audit_kafka_errors",
            "Failed connects and produce round trips to Kafka (each retry counts)",
            metrics.errors.clone(),
        );
        registry.register(
            "audit_kafka_rejected",
            "Audit records the Kafka broker refused for good (too large, invalid); kept in the local store only",
            metrics.rejected.clone(),
        );
        registry.register("audit_kafka_up", "1 while the Kafka broker answers the audit shipper", metrics.up.clone());
        registry.register(
            "audit_kafka_backlog_records",
            "Audit records in the outbox waiting to be shipped to Kafka, as of the shipper's last poll",
            metrics.backlog.clone(),
        );
        metrics
    }
}
