//! The gateway: one request through the cascade, cpu tier -> (gpu tier) -> rules.
//!
//! A decision is always produced: a tier that is unsure, out of its domain, overloaded,
//! failing or out of time hands over to the next stage, and the rules engine never fails.
//! Every stage tried lands in `path` with its outcome and reason.

use crate::config::{Config, GpuBackend};
use crate::decision::{Decision, Label, Step, TierName};
use crate::metrics::{DecisionLabels, Metrics, RuleLabels, StepLabels};
use crate::policy::{Policy, PolicyStore};
use crate::route::{after_model, gpu_unavailable, AfterModel};
use crate::rules::{ModelView, RulesInput};
use crate::signals::gpu::GpuProbe;
use crate::tier::cpu::CpuTier;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A validated classification request (see `ingress::extract`).
#[derive(Debug, Clone)]
pub struct ClassifyRequest {
    pub text: Arc<str>,
    pub features: serde_json::Map<String, serde_json::Value>,
    pub tenant: Option<String>,
    /// Time budget for the decision; past it model tiers are abandoned and rules decide.
    pub deadline: Duration,
}

pub struct Gateway {
    pub cpu: CpuTier,
    pub policies: PolicyStore,
    pub metrics: Metrics,
    pub gpu: GpuProbe,
    gpu_unavailable: Option<String>,
}

impl Gateway {
    /// Loads ONNX Runtime, the model and the policy, and probes for a GPU.
    pub fn start(config: &Config) -> anyhow::Result<Gateway> {
        let policy = Policy::load_dir(&config.policies.dir)?;
        let env = crate::ort_lib::environment(config.model.onnxruntime.as_deref()).map_err(anyhow::Error::msg)?;
        let cpu = CpuTier::start(env, &config.model)?;
        let gpu = crate::signals::gpu::probe();
        let gpu_unavailable = gpu_unavailable(config.gpu.backend != GpuBackend::None, gpu.unavailable.as_deref());
        tracing::info!(policy_version = %policy.version, rules = policy.rules.rule_count(), gpu = ?gpu_unavailable, "gateway ready");
        Ok(Gateway { cpu, policies: PolicyStore::new(policy), metrics: Metrics::new(), gpu, gpu_unavailable })
    }

    /// Decides one request. Never fails: the rules engine is the last stage.
    pub async fn classify(&self, req: ClassifyRequest, request_id: String) -> Decision {
        let started = Instant::now();
        let deadline = started + req.deadline;
        let policy = self.policies.snapshot();
        let mut path = Vec::with_capacity(3);

        let cpu_started = Instant::now();
        let model = match self.cpu.classify(Arc::clone(&req.text), deadline).await {
            Ok(v) => {
                let mut step = Step::new(TierName::Cpu, "accepted", cpu_started.elapsed().as_micros() as u64);
                step.confidence = Some(v.confidence);
                step.risk_score = Some(v.risk_score);
                step.ood_score = v.ood_score;
                match after_model(&v, &policy.cascade) {
                    AfterModel::Accept => {
                        path.push(step);
                        return self.finish(
                            Decision {
                                request_id,
                                label: Label::from_risk_score(v.risk_score),
                                risk_score: v.risk_score,
                                confidence: Some(v.confidence),
                                action: policy.actions.action_for(v.risk_score),
                                tier: TierName::Cpu,
                                rule: None,
                                signals: None,
                                path,
                                policy_version: policy.version.clone(),
                                model: self.cpu.info().name.clone(),
                                latency_us: 0,
                            },
                            started,
                        );
                    }
                    AfterModel::Fallback { outcome, reason } => {
                        step.outcome = outcome;
                        path.push(step.reason(reason));
                        Some(ModelView { risk_score: v.risk_score, confidence: v.confidence, ood_score: v.ood_score })
                    }
                }
            }
            Err(e) => {
                path.push(
                    Step::new(TierName::Cpu, e.outcome(), cpu_started.elapsed().as_micros() as u64)
                        .reason(e.to_string()),
                );
                None
            }
        };

        // The escalation stage. Until a gpu tier exists it is always skipped, with the reason.
        if let Some(why) = &self.gpu_unavailable {
            path.push(Step::new(TierName::Gpu, "skipped", 0).reason(format!("unavailable: {why}")));
        }

        let rules_started = Instant::now();
        let verdict = policy.rules.evaluate(&RulesInput {
            text: &req.text,
            features: &req.features,
            tenant: req.tenant.as_deref(),
            model,
        });
        for (rule, error) in &verdict.errors {
            self.metrics.rule_errors.get_or_create(&RuleLabels { rule: rule.clone() }).inc();
            tracing::debug!(%request_id, %rule, %error, "rule evaluation failed; counted as no match");
        }
        let mut step = Step::new(
            TierName::Rules,
            if verdict.rule.is_some() { "matched" } else { "default" },
            rules_started.elapsed().as_micros() as u64,
        );
        step.risk_score = Some(verdict.risk_score);
        step.rule = verdict.rule.clone();
        if verdict.rule.is_none() {
            step.reason = Some("no rule matched; policy default applies".into());
        }
        path.push(step);
        self.finish(
            Decision {
                request_id,
                label: Label::from_risk_score(verdict.risk_score),
                risk_score: verdict.risk_score,
                confidence: None,
                action: verdict.action,
                tier: TierName::Rules,
                rule: verdict.rule,
                signals: Some(verdict.signals),
                path,
                policy_version: policy.version.clone(),
                model: self.cpu.info().name.clone(),
                latency_us: 0,
            },
            started,
        )
    }

    fn finish(&self, mut decision: Decision, started: Instant) -> Decision {
        let elapsed = started.elapsed();
        decision.latency_us = elapsed.as_micros() as u64;
        let m = &self.metrics;
        m.decision_latency.observe(elapsed.as_secs_f64());
        m.decisions
            .get_or_create(&DecisionLabels { tier: decision.tier.as_str(), action: decision.action.as_str() })
            .inc();
        for step in &decision.path {
            m.steps.get_or_create(&StepLabels { tier: step.tier.as_str(), outcome: step.outcome }).inc();
        }
        decision
    }

    /// Why the gpu tier cannot serve, if it cannot.
    pub fn gpu_unavailable(&self) -> Option<&str> {
        self.gpu_unavailable.as_deref()
    }
}
