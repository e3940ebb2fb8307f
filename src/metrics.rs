//! Prometheus metrics (`GET /metrics`, OpenMetrics text format via `prometheus-client`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub tier: &'static str,
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    pub tier: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    pub device: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub trigger: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

/// Proxied requests by route and outcome (`forwarded`, `blocked`, `unscreened`, `refused`,
/// `upstream_error`, `upstream_timeout`), and stream-guard cuts by route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
    pub outcome: &'static str,
}

/// One app address of a proxy route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub route: String,
    pub upstream: String,
}

/// A drift signal (`risk_score`, `ood_score`, `text_chars`, `language`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: &'static str,
}

/// Counts by reason (escalations, fallbacks).
pub type ReasonCounter = Family<ReasonLabels, Counter>;

pub struct Metrics {
    registry: Registry,
    pub decisions: Family<DecisionLabels, Counter>,
    pub steps: Family<StepLabels, Counter>,
    pub responses: Family<ResponseLabels, Counter>,
    pub rule_errors: Family<RuleLabels, Counter>,
    pub decision_latency: Histogram,
    pub tier_latency: Family<TierLabels, Histogram>,
    pub escalations: ReasonCounter,
    pub fallbacks: ReasonCounter,
    pub shed: Counter,
    pub rate_limited: Counter,
    pub cpu_queue_depth: Gauge,
    pub cpu_in_flight: Gauge,
    pub cpu_queue_wait: Gauge<f64, AtomicU64>,
    pub cpu_service_time: Gauge<f64, AtomicU64>,
    pub cpu_utilization: Gauge<f64, AtomicU64>,
    pub gpu_in_flight: Gauge,
    pub gpu_circuit_open: Gauge,
    pub gpu_free_bytes: Family<DeviceLabels, Gauge>,
    pub gpu_total_bytes: Family<DeviceLabels, Gauge>,
    pub gpu_utilization: Family<DeviceLabels, Gauge<f64, AtomicU64>>,
    pub policy_reloads: Family<ReloadLabels, Counter>,
    pub shadow_evaluations: Counter,
    pub shadow_disagreements: Family<KindLabels, Counter>,
    pub shadow_log_dropped: Counter,
    pub proxy_requests: Family<RouteLabels, Counter>,
    pub proxy_upstream_latency: Family<RouteLabels, Histogram>,
    pub stream_guard: Family<RouteLabels, Counter>,
    pub proxy_upstream_ejected: Family<UpstreamLabels, Gauge>,
    pub audit_records: Family<KindLabels, Counter>,
    pub audit_dropped: Counter,
    pub audit_queue_full: Counter,
    pub audit_queue_depth: Gauge,
    pub audit_backlog: Gauge,
    pub audit_retention_deleted: Counter,
    pub audit_flush_seconds: Histogram,
    /// Model-tier batch sizes, per request (a batch of k counts k times), by tier.
    pub batch_size: Family<TierLabels, Histogram>,
    /// Two-sample KS statistic of a numeric signal's live window against the reference.
    pub drift_ks: Family<SignalLabels, Gauge<f64, AtomicU64>>,
    /// Total variation distance of the language shares' live window against the reference.
    pub drift_tvd: Family<SignalLabels, Gauge<f64, AtomicU64>>,
    /// Decisions in the drift window at the last computation.
    pub drift_window_size: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tiergate");
        let decisions = Family::<DecisionLabels, Counter>::default();
        let steps = Family::<StepLabels, Counter>::default();
        let responses = Family::<ResponseLabels, Counter>::default();
        let rule_errors = Family::<RuleLabels, Counter>::default();
        // 50 µs .. ~3.3 s in 17 doublings.
        let decision_latency = Histogram::new(exponential_buckets(50e-6, 2.0, 17));
        let cpu_queue_depth = Gauge::default();
        let cpu_in_flight = Gauge::default();
        let cpu_queue_wait = Gauge::<f64, AtomicU64>::default();
        let cpu_service_time = Gauge::<f64, AtomicU64>::default();
        let tier_latency = Family::<TierLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(50e-6, 2.0, 17))
        });
        let escalations = Family::<ReasonLabels, Counter>::default();
        let fallbacks = Family::<ReasonLabels, Counter>::default();
        let shed = Counter::default();
        let rate_limited = Counter::default();
        let cpu_utilization = Gauge::<f64, AtomicU64>::default();
        let gpu_in_flight = Gauge::default();
        let gpu_circuit_open = Gauge::default();
        let gpu_free_bytes = Family::<DeviceLabels, Gauge>::default();
        let gpu_total_bytes = Family::<DeviceLabels, Gauge>::default();
        let gpu_utilization = Family::<DeviceLabels, Gauge<f64, AtomicU64>>::default();
        let policy_reloads = Family::<ReloadLabels, Counter>::default();
        let shadow_evaluations = Counter::default();
        let shadow_disagreements = Family::<KindLabels, Counter>::default();
        let shadow_log_dropped = Counter::default();
        let proxy_requests = Family::<RouteLabels, Counter>::default();
        let proxy_upstream_latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(50e-6, 2.0, 20))
        });
        let stream_guard = Family::<RouteLabels, Counter>::default();
        let proxy_upstream_ejected = Family::<UpstreamLabels, Gauge>::default();
        let audit_records = Family::<KindLabels, Counter>::default();
        let audit_dropped = Counter::default();
        let audit_queue_full = Counter::default();
        let audit_queue_depth = Gauge::default();
        let audit_backlog = Gauge::default();
        let audit_retention_deleted = Counter::default();
        // 100 µs .. ~6.6 s in 17 doublings.
        let audit_flush_seconds = Histogram::new(exponential_buckets(100e-6, 2.0, 17));
        registry.register("audit_records", "Audit records committed to the store, by kind", audit_records.clone());
        registry.register(
            "audit_dropped",
            "Audit records lost: dropped on a full queue (on_full = drop), after the writer stopped, when commits kept failing, or deleted by retention before the sink shipped them",
            audit_dropped.clone(),
        );
        registry.register(
            "audit_queue_full",
            "Audit records that found the queue full (a 503 under on_full = block, a drop under drop)",
            audit_queue_full.clone(),
        );
        registry.register("audit_queue_depth", "Audit records waiting for the writer", audit_queue_depth.clone());
        registry.register(
            "audit_backlog",
            "Audit records in the store not yet shipped by the sink (0 without a sink)",
            audit_backlog.clone(),
        );
        registry.register(
            "audit_retention_deleted",
            "Audit records deleted by retention (size or age limit), oldest first",
            audit_retention_deleted.clone(),
        );
        registry.register(
            "audit_flush_seconds",
            "Time to render and commit one batch of audit records, seconds",
            audit_flush_seconds.clone(),
        );
        // 1, 2, 4, ... 256.
        let batch_size =
            Family::<TierLabels, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(1.0, 2.0, 9)));
        let drift_ks = Family::<SignalLabels, Gauge<f64, AtomicU64>>::default();
        let drift_tvd = Family::<SignalLabels, Gauge<f64, AtomicU64>>::default();
        let drift_window_size = Gauge::default();
        registry.register(
            "batch_size",
            "Size of the model-tier batch each request ran in, by tier (a batch of k counts k times)",
            batch_size.clone(),
        );
        registry.register(
            "drift_ks",
            "Two-sample Kolmogorov-Smirnov statistic of the drift window against the model's reference, by signal (NaN: window below drift.min_window)",
            drift_ks.clone(),
        );
        registry.register(
            "drift_tvd",
            "Total variation distance of the drift window's language shares against the reference (NaN: window below drift.min_window)",
            drift_tvd.clone(),
        );
        registry.register(
            "drift_window_size",
            "Decisions in the drift window at the last drift computation",
            drift_window_size.clone(),
        );
        registry.register(
            "proxy_upstream_ejected",
            "1 while a route's app address is ejected after consecutive failures (as of the last scrape)",
            proxy_upstream_ejected.clone(),
        );
        registry.register(
            "proxy_requests",
            "Proxied requests by route and outcome (forwarded, blocked, unscreened, refused, upstream_error, upstream_timeout)",
            proxy_requests.clone(),
        );
        registry.register(
            "proxy_upstream_header_seconds",
            "Time from sending a proxied request to the app's response head, by route and status class",
            proxy_upstream_latency.clone(),
        );
        registry.register(
            "stream_guard_evaluations",
            "Stream-guard evaluations of streamed responses by route and outcome (pass, cut, unreadable: compressed)",
            stream_guard.clone(),
        );
        registry.register(
            "shadow_evaluations",
            "Requests also decided by the shadow policy",
            shadow_evaluations.clone(),
        );
        registry.register(
            "shadow_disagreements",
            "Shadow decisions that differ from the live one, by kind (label, action, tier)",
            shadow_disagreements.clone(),
        );
        registry.register(
            "shadow_log_dropped",
            "Shadow log lines (policy disagreements, model scores) dropped: the writer fell behind or the disk refused them (still counted in the other shadow metrics)",
            shadow_log_dropped.clone(),
        );
        registry.register("decisions", "Decisions by deciding tier and action", decisions.clone());
        registry.register("stage_outcomes", "Cascade stages by tier and outcome", steps.clone());
        registry.register("http_responses", "HTTP responses by status", responses.clone());
        registry.register("rule_errors", "Rule evaluations that failed (counted as no match)", rule_errors.clone());
        registry.register("decision_latency_seconds", "Time to decide, seconds", decision_latency.clone());
        registry.register("cpu_queue_depth", "Requests waiting for a cpu-tier worker", cpu_queue_depth.clone());
        registry.register("cpu_in_flight", "Requests a cpu-tier worker is running", cpu_in_flight.clone());
        registry.register(
            "cpu_queue_wait_seconds",
            "Expected queue wait of a cpu job joining now (queue depth x service time per job / workers), seconds",
            cpu_queue_wait.clone(),
        );
        registry.register(
            "cpu_service_time_seconds",
            "EWMA of a cpu-tier batch's service time (tokenisation + inference), seconds",
            cpu_service_time.clone(),
        );
        registry.register("tier_latency_seconds", "Time spent in each tier, seconds", tier_latency.clone());
        registry.register("escalations", "cpu verdicts escalated to the gpu tier, by reason", escalations.clone());
        registry.register("fallbacks", "Model tiers left for the next stage, by reason", fallbacks.clone());
        registry.register("shed", "Requests refused with 503 because both model tiers were saturated", shed.clone());
        registry.register("rate_limited", "Requests refused with 429 for a tenant over its rate", rate_limited.clone());
        registry.register("cpu_utilization_ratio", "Machine CPU utilisation EWMA (0 to 1)", cpu_utilization.clone());
        registry.register("gpu_in_flight", "Requests on the gpu tier", gpu_in_flight.clone());
        registry.register("gpu_circuit_open", "1 while the gpu tier's circuit is open", gpu_circuit_open.clone());
        registry.register("gpu_memory_free_bytes", "Free GPU memory per device", gpu_free_bytes.clone());
        registry.register("gpu_memory_total_bytes", "Total GPU memory per device", gpu_total_bytes.clone());
        registry.register(
            "policy_reloads",
            "Policy reloads by trigger and result (ok, unchanged, refused)",
            policy_reloads.clone(),
        );
        registry.register(
            "gpu_utilization_ratio",
            "GPU kernel-busy share per device (NVML, 0 to 1)",
            gpu_utilization.clone(),
        );
        Metrics {
            registry,
            decisions,
            steps,
            responses,
            rule_errors,
            decision_latency,
            tier_latency,
            escalations,
            fallbacks,
            shed,
            rate_limited,
            cpu_queue_depth,
            cpu_in_flight,
            cpu_queue_wait,
            cpu_service_time,
            cpu_utilization,
            gpu_in_flight,
            gpu_circuit_open,
            gpu_free_bytes,
            gpu_total_bytes,
            gpu_utilization,
            policy_reloads,
            shadow_evaluations,
            shadow_disagreements,
            shadow_log_dropped,
            proxy_requests,
            proxy_upstream_latency,
            stream_guard,
            proxy_upstream_ejected,
            audit_records,
            audit_dropped,
            audit_queue_full,
            audit_queue_depth,
            audit_backlog,
            audit_retention_deleted,
            audit_flush_seconds,
            batch_size,
            drift_ks,
            drift_tvd,
            drift_window_size,
        }
    }

    /// The registry, for components that register their own metrics at start (the Kafka
    /// shipper); names get the `tiergate_` prefix.
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
