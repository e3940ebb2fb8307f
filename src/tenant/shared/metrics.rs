//! The shared quota store's Prometheus metrics, registered into the server's registry by
//! [`SharedQuotaMetrics::register`] (names below are with the registry's `tiergate` prefix).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a round trip to Redis failed: `timeout` (slower than `timeout_ms`), `connection`
/// (refused, reset, or no connection yet), or `response` (an error reply).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    pub error: &'static str,
}

/// A check that took the outage path: `check` is `rate` or `daily`, `on_outage` the configured
/// fallback (`local`, `open`, `closed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    pub check: &'static str,
    pub on_outage: &'static str,
}

/// Handles to the store's metrics; clones share the same values.
#[derive(Clone, Debug, Default)]
pub struct SharedQuotaMetrics {
    /// `tiergate_quota_store_errors_total{error}`: failed round trips to Redis (connects included).
    pub errors: Family<StoreErrorLabels, Counter>,
    /// `tiergate_quota_store_fallbacks_total{check,on_outage}`: checks decided without Redis
    /// (after an error, or while the circuit is open).
    pub fallbacks: Family<FallbackLabels, Counter>,
    /// `tiergate_quota_store_reconciled_total`: requests the local fallback admitted while Redis
    /// was out of reach, charged to the shared cell once it answered again (a rate check carries
    /// them as a floor under the shared TAT), so the outage's admissions count against the
    /// fleet's limit after it too.
    pub reconciled: Counter,
    /// `tiergate_quota_store_up`: 1 while the last round trip to Redis succeeded.
    pub up: Gauge,
    /// `tiergate_quota_store_circuit_open`: 1 while the circuit breaker keeps checks off Redis.
    pub circuit_open: Gauge,
}

impl SharedQuotaMetrics {
    /// Registers the metrics (under the registry's prefix) and returns the handles.
    pub fn register(registry: &mut Registry) -> SharedQuotaMetrics {
        let metrics = SharedQuotaMetrics::default();
        registry.register(
            "quota_store_errors",
            "Failed round trips to the shared quota store (Redis), by error: timeout, connection, response",
            metrics.errors.clone(),
        );
        registry.register(
            "quota_store_fallbacks",
            "Quota checks decided without the shared store (Redis out of reach), by check and on_outage",
            metrics.fallbacks.clone(),
        );
        registry.register(
            "quota_store_reconciled",
            "Requests the local fallback admitted while Redis was out of reach, charged to Redis once it answered",
            metrics.reconciled.clone(),
        );
        registry.register("quota_store_up", "1 while the shared quota store (Redis) answers", metrics.up.clone());
        registry.register(
            "quota_store_circuit_open",
            "1 while the circuit breaker keeps quota checks off the shared store (Redis)",
            metrics.circuit_open.clone(),
        );
        metrics
    }
}
