//! Prometheus metrics (`GET /metrics`, OpenMetrics text format via `prometheus-client`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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
pub struct ResponseLabels {
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

pub struct Metrics {
    registry: Registry,
    pub decisions: Family<DecisionLabels, Counter>,
    pub steps: Family<StepLabels, Counter>,
    pub responses: Family<ResponseLabels, Counter>,
    pub rule_errors: Family<RuleLabels, Counter>,
    pub decision_latency: Histogram,
    pub cpu_queue_depth: Gauge,
    pub cpu_in_flight: Gauge,
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
        registry.register("decisions", "Decisions by deciding tier and action", decisions.clone());
        registry.register("stage_outcomes", "Cascade stages by tier and outcome", steps.clone());
        registry.register("http_responses", "HTTP responses by status", responses.clone());
        registry.register("rule_errors", "Rule evaluations that failed (counted as no match)", rule_errors.clone());
        registry.register("decision_latency_seconds", "Time to decide, seconds", decision_latency.clone());
        registry.register("cpu_queue_depth", "Requests waiting for a cpu-tier worker", cpu_queue_depth.clone());
        registry.register("cpu_in_flight", "Requests a cpu-tier worker is running", cpu_in_flight.clone());
        Metrics { registry, decisions, steps, responses, rule_errors, decision_latency, cpu_queue_depth, cpu_in_flight }
    }

    /// OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
