//! A candidate model scored beside the live cpu tier (`[shadow.model]`: a model directory as
//! `tiergate model pack` writes it, with the `[model]` keys). On the shadowed share of requests,
//! once the live decision is made, the candidate reads the same canonical text on its own pool
//! of workers in a detached task: it never delays, changes or decides an answer.
//!
//! Each scored request is counted in `tiergate_shadow_model_verdicts_total{live, candidate}`, a
//! confusion matrix against the live cpu verdict (`live="none"` where the live cpu tier gave none:
//! a language it does not read, a shed, a text the rules decided first), and written to the
//! shadow log as one JSON line (`"kind": "model"`), which `tiergate model agreement` turns into
//! agreement figures (overall, by language, Cohen's kappa). A candidate that could not score in
//! time is counted in `tiergate_shadow_model_skipped_total{reason}`, never retried.

use super::cascade::Recorded;
use crate::decision::{Decision, Outcome, TierName};
use crate::metrics::KindLabels;
use crate::tier::onnx::OnnxPool;
use crate::tier::Prepared;
use crate::tier::{ModelConfig, ModelVerdict, TierError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;

/// How long a shadow scoring may queue and run. The candidate's workers answer a job past it
/// at once (`doomed`), so a slow candidate sheds shadow work instead of piling it up.
const SCORING_TIMEOUT: Duration = Duration::from_secs(5);

/// A risk score at or above this is the label `risk`, for the live cpu verdict and the
/// candidate's alike (both are calibrated probabilities of the risk class).
const RISK_AT: f64 = 0.5;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PairLabels {
    /// The live cpu tier's label: `risk`, `ok`, or `none` when it gave no verdict.
    live: &'static str,
    candidate: &'static str,
}

pub struct ShadowModel {
    pool: Arc<OnnxPool>,
    /// Share of requests scored, [0, 1] (`[shadow] share`).
    share: f64,
    verdicts: Family<PairLabels, Counter>,
    skipped: Family<KindLabels, Counter>,
    log: Option<super::shadow::Log>,
}

/// What the live run had, for comparison: the cpu tier's verdict if it gave one the cascade
/// could use, and the decision.
pub(super) struct Live<'a> {
    cpu: Option<&'a ModelVerdict>,
    decision: &'a Decision,
}

impl<'a> Live<'a> {
    /// A verdict on a text in a language the live model does not read (outcome `language`), or an
    /// ok on a text it did not read to the end (`unread`), is no verdict: the cascade set it
    /// aside, and comparing with it would count noise as disagreement.
    pub fn new(recorded: &'a Recorded, decision: &'a Decision) -> Live<'a> {
        let set_aside = decision
            .path
            .iter()
            .any(|s| s.tier == TierName::Cpu && matches!(s.outcome, Outcome::Language | Outcome::Unread));
        let cpu = recorded.cpu.as_ref().and_then(|r| r.as_ref().ok()).filter(|_| !set_aside);
        Live { cpu, decision }
    }
}

impl ShadowModel {
    /// Loads the candidate (`config.dir`) and starts its workers (`{sessions}` named
    /// `tiergate-shadow-{i}`); registers its metrics. Errors: what [`OnnxPool::start`] reports
    /// (a missing or invalid model directory), prefixed `shadow model`.
    pub(super) fn start(
        env: &'static ort::environment::Environment,
        config: &ModelConfig,
        share: f64,
        log: Option<super::shadow::Log>,
        registry: &mut Registry,
    ) -> anyhow::Result<ShadowModel> {
        let pool =
            OnnxPool::start(env, config, "tiergate-shadow").map_err(|e| anyhow::anyhow!("shadow model: {e:#}"))?;
        tracing::info!(model = %pool.info().name, manifest_sha256 = %pool.info().manifest_sha256, share, "shadow model loaded");
        let verdicts = Family::<PairLabels, Counter>::default();
        let skipped = Family::<KindLabels, Counter>::default();
        registry.register(
            "shadow_model_verdicts",
            "Requests the shadow model scored, by the live cpu tier's label (none: no cpu verdict) and the candidate's",
            verdicts.clone(),
        );
        registry.register(
            "shadow_model_skipped",
            "Shadowed requests the shadow model did not score, by reason (overloaded, deadline, error)",
            skipped.clone(),
        );
        Ok(ShadowModel { pool: Arc::new(pool), share, verdicts, skipped, log })
    }

    /// For `/readyz`: the candidate (name, sha256s, temperature), its share, live workers and
    /// queue depth.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.pool.info(),
            "share": self.share,
            "workers": self.pool.workers_alive(),
            "queue_depth": self.pool.queue_depth(),
        })
    }

    /// Whether this request is one of the shadowed share.
    pub(super) fn sampled(&self) -> bool {
        fastrand::f64() < self.share
    }

    /// Scores `text` (the canonical text the live cpu tier read) in a detached task and counts
    /// and logs the pair when it finishes; returns at once.
    pub(super) fn score(&self, text: Arc<str>, live: Live<'_>) {
        let line = LiveLine::new(&live);
        let (pool, verdicts, skipped, log) =
            (Arc::clone(&self.pool), self.verdicts.clone(), self.skipped.clone(), self.log.clone());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + SCORING_TIMEOUT;
            match pool.classify(text, Prepared::default(), deadline).await {
                Ok(v) => {
                    let candidate = label(v.risk_score);
                    verdicts.get_or_create(&PairLabels { live: line.cpu_label, candidate }).inc();
                    if let Some(log) = &log {
                        log.send(line.json(pool.info().name.as_str(), &v));
                    }
                }
                Err(e) => {
                    skipped.get_or_create(&KindLabels { kind: reason(&e) }).inc();
                }
            }
        });
    }
}

fn label(risk_score: f64) -> &'static str {
    if risk_score >= RISK_AT {
        "risk"
    } else {
        "ok"
    }
}

fn reason(e: &TierError) -> &'static str {
    match e {
        TierError::Overloaded { .. } => "overloaded",
        TierError::DeadlineExceeded { .. } | TierError::Doomed { .. } => "deadline",
        _ => "error",
    }
}

/// What the log line keeps of the live run (owned: the scoring outlives the request).
struct LiveLine {
    cpu_label: &'static str,
    value: serde_json::Value,
}

impl LiveLine {
    fn new(live: &Live<'_>) -> LiveLine {
        let d = live.decision;
        let cpu = live.cpu.map(|v| serde_json::json!({"risk_score": v.risk_score, "label": label(v.risk_score)}));
        let value = serde_json::json!({
            "request_id": d.request_id,
            "lang": d.subject.lang,
            "live": {"label": d.label, "action": d.action, "tier": d.tier, "rule": d.rule,
                     "policy_version": d.policy_version, "cpu": cpu},
        });
        LiveLine { cpu_label: live.cpu.map_or("none", |v| label(v.risk_score)), value }
    }

    fn json(mut self, model: &str, v: &ModelVerdict) -> String {
        self.value["kind"] = "model".into();
        self.value["candidate"] = serde_json::json!({
            "model": model, "risk_score": v.risk_score, "label": label(v.risk_score), "confidence": v.confidence,
            "ood_score": v.ood_score, "windows": v.window.map_or(1, |w| w.of), "unread": v.unread, "infer_us": v.infer_us,
        });
        self.value.to_string()
    }
}
