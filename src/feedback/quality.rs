//! Live quality: labelled decisions counted over sliding windows of decision time, one metric
//! family per dimension (tier, deciding rule, scenario, language, tenant class — never their
//! cross product), each series `{window, <dimension>, action, truth}`, plus the served models'
//! ECE on labelled traffic. Ratios are PromQL over these counts (docs/operations.md "Live
//! quality"): block precision = block∧risk / block; false-block rate = block∧ok / ok;
//! risk-allowed rate = allow∧risk / risk; review precision = review∧risk / review.
//!
//! Recomputed from the store (a read-only connection, on the blocking pool) every
//! `refresh_interval_ms` and soon after labels arrive — never on the request path. Labels are
//! bounded: rules and scenarios by the policy, languages by the detector's codes, classes by
//! `[tenants]`.

use super::live::{Latest, Snapshot, WindowQuality};
use super::store::{labelled, Labelled};
use super::Truth;
use crate::tenant::Tenants;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

macro_rules! dimension {
    ($name:ident, $field:ident) => {
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        pub struct $name {
            pub window: String,
            pub $field: String,
            pub action: String,
            pub truth: &'static str,
        }
    };
}
dimension!(ByTier, tier);
dimension!(ByRule, rule);
dimension!(ByScenario, scenario);
dimension!(ByLang, lang);
dimension!(ByTenantClass, class);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowLabels {
    pub window: String,
}

/// `tiergate_feedback_labels_total{source, outcome}`: `source` is `analyst`, `chargeback`,
/// `user_report` or `other`, so that a client cannot grow the series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LabelOutcome {
    pub source: &'static str,
    pub outcome: &'static str,
}

/// The feedback metrics; clones share the values.
#[derive(Clone, Debug, Default)]
pub struct QualityMetrics {
    pub by_tier: Family<ByTier, Gauge>,
    pub by_rule: Family<ByRule, Gauge>,
    pub by_scenario: Family<ByScenario, Gauge>,
    pub by_lang: Family<ByLang, Gauge>,
    pub by_tenant_class: Family<ByTenantClass, Gauge>,
    /// ECE (10 equal-width bins of the predicted label's probability) of model-tier decisions.
    pub ece: Family<WindowLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Labelled model-tier decisions the ECE is over.
    pub ece_decisions: Family<WindowLabels, Gauge>,
    pub labels: Family<LabelOutcome, Counter>,
}

impl QualityMetrics {
    pub fn register(registry: &mut Registry) -> QualityMetrics {
        let m = QualityMetrics::default();
        let help =
            |dimension: &str| format!("Labelled decisions decided in the window, by {dimension}, action and truth");
        registry.register("quality_labelled_by_tier", help("the tier that decided"), m.by_tier.clone());
        registry.register(
            "quality_labelled_by_rule",
            help("the deciding rule or guard (none: a model)"),
            m.by_rule.clone(),
        );
        registry.register("quality_labelled_by_scenario", help("policy scenario"), m.by_scenario.clone());
        registry.register("quality_labelled_by_lang", help("language (ISO 639-3)"), m.by_lang.clone());
        registry.register("quality_labelled_by_tenant_class", help("tenant class"), m.by_tenant_class.clone());
        registry.register(
            "quality_model_ece",
            "ECE of the model tiers' labelled decisions in the window",
            m.ece.clone(),
        );
        registry.register(
            "quality_model_labelled",
            "Labelled model-tier decisions the ECE is over",
            m.ece_decisions.clone(),
        );
        registry.register("feedback_labels", "Labels received, by source and outcome", m.labels.clone());
        m
    }
}

/// The source as a bounded metrics label.
pub fn source_label(source: &str) -> &'static str {
    match source {
        "analyst" => "analyst",
        "chargeback" => "chargeback",
        "user_report" => "user_report",
        _ => "other",
    }
}

/// Recomputes the gauges from the store at `db`.
pub struct Refresher {
    pub db: PathBuf,
    pub windows: Vec<(String, Duration)>,
    pub tenants: Arc<Tenants>,
    pub metrics: QualityMetrics,
    /// The same numbers as one snapshot, for the review console's panel.
    pub latest: Arc<Latest>,
}

type Counts = HashMap<(usize, String, String, Truth), i64>;

impl Refresher {
    /// One recomputation at `now_ms` (blocking: SQLite). Errors: the store cannot be read.
    pub fn refresh(&self, now_ms: u64) -> anyhow::Result<()> {
        let longest = self.windows.iter().map(|(_, d)| d.as_millis() as u64).max().unwrap_or(0);
        let conn = rusqlite::Connection::open_with_flags(&self.db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        let rows = labelled(&conn, now_ms.saturating_sub(longest), now_ms.saturating_add(1))?;
        let dims: [fn(&Refresher, &Labelled) -> String; 5] = [
            |_, r| r.tier.clone(),
            |_, r| r.rule.clone().unwrap_or_else(|| "none".into()),
            |_, r| r.scenario.clone().unwrap_or_else(|| "default".into()),
            |_, r| r.lang.clone().unwrap_or_else(|| "und".into()),
            |s, r| s.tenants.class_of(r.tenant.as_deref()).to_string(),
        ];
        let mut counts: Vec<Counts> = vec![Counts::new(); dims.len()];
        let mut calibration: Vec<(Vec<f64>, Vec<bool>)> = vec![(Vec::new(), Vec::new()); self.windows.len()];
        for r in &rows {
            for (w, (_, d)) in self.windows.iter().enumerate() {
                if r.decided_ms < now_ms.saturating_sub(d.as_millis() as u64) {
                    continue;
                }
                for (i, dim) in dims.iter().enumerate() {
                    *counts[i].entry((w, dim(self, r), r.action.clone(), r.truth)).or_default() += 1;
                }
                if let (Some(p), "cpu" | "gpu") = (r.risk_score, r.tier.as_str()) {
                    calibration[w].0.push(p.max(1.0 - p));
                    calibration[w].1.push((p >= 0.5) == (r.truth == Truth::Risk));
                }
            }
        }
        self.publish(&counts, &calibration);
        self.latest.set(self.snapshot(now_ms, &counts[0], &calibration));
        Ok(())
    }

    /// Per window, the totals over all tiers (every labelled decision has one tier, so `by_tier`
    /// sums to all of them) and the ECE, as the gauges have them.
    fn snapshot(&self, now_ms: u64, by_tier: &Counts, calibration: &[(Vec<f64>, Vec<bool>)]) -> Snapshot {
        let windows = self.windows.iter().enumerate().map(|(w, (name, _))| {
            let counts = by_tier
                .iter()
                .filter(|((cw, ..), _)| *cw == w)
                .map(|((_, _, action, truth), n)| (action.clone(), *truth, *n as u64));
            let (confidence, correct) = &calibration[w];
            let ece = (!confidence.is_empty()).then(|| crate::calibrate::ece(confidence, correct, 10));
            WindowQuality::new(name.clone(), counts, ece, confidence.len() as u64)
        });
        Snapshot { refreshed_ms: now_ms, windows: windows.collect() }
    }

    fn publish(&self, counts: &[Counts], calibration: &[(Vec<f64>, Vec<bool>)]) {
        let m = &self.metrics;
        let window = |w: usize| self.windows[w].0.clone();
        m.by_tier.clear();
        m.by_rule.clear();
        m.by_scenario.clear();
        m.by_lang.clear();
        m.by_tenant_class.clear();
        for (i, dim) in counts.iter().enumerate() {
            for ((w, value, action, truth), n) in with_zeros(dim) {
                let (window, truth) = (window(w), truth.as_str());
                let gauge = match i {
                    0 => m.by_tier.get_or_create(&ByTier { window, tier: value, action, truth }).clone(),
                    1 => m.by_rule.get_or_create(&ByRule { window, rule: value, action, truth }).clone(),
                    2 => m.by_scenario.get_or_create(&ByScenario { window, scenario: value, action, truth }).clone(),
                    3 => m.by_lang.get_or_create(&ByLang { window, lang: value, action, truth }).clone(),
                    _ => {
                        m.by_tenant_class.get_or_create(&ByTenantClass { window, class: value, action, truth }).clone()
                    }
                };
                gauge.set(n);
            }
        }
        for (w, (confidence, correct)) in calibration.iter().enumerate() {
            let labels = WindowLabels { window: window(w) };
            m.ece_decisions.get_or_create(&labels).set(confidence.len() as i64);
            let ece = if confidence.is_empty() { 0.0 } else { crate::calibrate::ece(confidence, correct, 10) };
            m.ece.get_or_create(&labels).set(ece);
        }
    }
}

/// `counts` with a 0 for every action and truth of each (window, value) that has any label, so a
/// ratio of two series (false blocks over ok-labelled decisions) reads 0 rather than no data.
/// A value with no labelled decision in a window has no series there: the families stay bounded.
fn with_zeros(counts: &Counts) -> Counts {
    let mut actions: std::collections::BTreeSet<&str> = ["allow", "review", "block"].into();
    actions.extend(counts.keys().map(|(_, _, action, _)| action.as_str()));
    let mut all = counts.clone();
    for (w, value, ..) in counts.keys() {
        for action in &actions {
            for truth in [Truth::Risk, Truth::Ok] {
                all.entry((*w, value.clone(), action.to_string(), truth)).or_default();
            }
        }
    }
    all
}
