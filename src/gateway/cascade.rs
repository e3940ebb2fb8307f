//! The confidence cascade for one request: run the stage routing picked, record how it ended,
//! ask routing ([`crate::select`]) what comes next, until a verdict stands or rules decide.
//!
//! Every choice is made by `select`; this loop only runs stages and writes the path. Tier
//! verdicts come from [`Tiers`]: the live tiers (recorded, so a shadow policy can replay them),
//! or a replay of recorded verdicts, which is also how the loop is unit-tested without a model.

use crate::action::Action;
use crate::complexity::{Complexity, TextStats};
use crate::decision::{Decision, Explain, Label, Outcome, Step, TierName};
use crate::error::ApiError;
use crate::metrics::{Metrics, ReasonLabels, RuleLabels};
use crate::policy::{ActionThresholds, Policy, Scenario};
use crate::request::ClassifyRequest;
use crate::rules::{ModelView, RulesInput, TextFacts};
use crate::select::{Fallback, Ineligible, LoadSnapshot, Recovery, Route, Router, Stage, Start};
use crate::tier::windows::Encoded;
use crate::tier::{ModelVerdict, Prepared, TierError};
use std::time::Duration;
use tokio::time::Instant;

mod tiers;
pub use tiers::{LiveTiers, Recorded, TenantGate, Tiers};

/// What the gateway measured of a request once before the cascade: its canonical text and
/// language, and how hard it is.
#[derive(Debug, Clone)]
pub struct Assessment {
    /// What the rules read of the text, the canonical text the models read among it (the
    /// request's own `text` is kept for the app and the audit); its language is detected by the
    /// cpu worker when the request gets there, else by the first stage that reads it.
    pub facts: TextFacts,
    pub stats: TextStats,
    pub complexity: Complexity,
    /// The cpu model's input, when assessment tokenised the text (it travels with the cpu job).
    pub encoded: Option<Encoded>,
    /// The request's campaign and entity velocity (`[campaign]`; `None`: off).
    pub campaign: Option<crate::campaign::Velocity>,
}

/// Everything the cascade reads for one request.
pub struct Inputs<'a> {
    pub policy: &'a Policy,
    /// The scenario the request named (`None`: the policy as written): its thresholds and rules.
    pub scenario: Option<&'a Scenario>,
    pub req: &'a ClassifyRequest,
    pub snapshot: &'a LoadSnapshot,
    pub started: Instant,
    /// The request's features, scored by the features model (`None`: no features model, or
    /// none of its features in the request).
    pub features: Option<&'a crate::features_model::Scored>,
}

impl Inputs<'_> {
    /// The thresholds that turn a model's risk score into an action: the scenario's, else the policy's.
    fn actions(&self) -> &ActionThresholds {
        self.scenario.map_or(&self.policy.actions, |s| &s.actions)
    }

    fn deadline(&self) -> Instant {
        self.started + self.req.deadline
    }

    /// The time left now: read again after every await.
    fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }
}

/// What a stage leads to.
enum Then {
    /// This tier's verdict stands.
    Decide(TierName, ModelVerdict),
    Stage(Stage),
}

/// Runs the cascade: start where routing says, then stage after stage until a verdict stands
/// or rules decide; then the guards. Errors only with `Shed` (both model tiers saturated,
/// policy says shed).
pub async fn run(
    x: &Inputs<'_>,
    assessment: Assessment,
    tiers: &Tiers<'_>,
) -> Result<(Decision, Option<Explain>), ApiError> {
    let (router, start) = Router::start(&assessment.complexity, x.policy, x.snapshot, x.req.deadline);
    let mut run = Run { metrics: tiers.metrics(), path: Vec::with_capacity(4), model: None, router, assessment };
    let mut stage = start.stage;
    let mut decision = loop {
        let then = match stage {
            Stage::Shed => {
                if let Some(m) = run.metrics {
                    m.shed.inc();
                }
                let retry_after_s = x.policy.routing.retry_after_s;
                return Err(ApiError::Shed { reason: start.reason.clone(), retry_after_s });
            }
            Stage::Cpu => run.cpu(x, tiers).await,
            Stage::Confirm => run.confirm(x, tiers).await,
            Stage::Gpu => run.gpu(x, tiers).await,
            Stage::Rules => break run.rules(x, &start, tiers),
        };
        stage = match then {
            Then::Decide(tier, v) => break run.decide(tier, &v, x.actions()),
            Then::Stage(next) => next,
        };
    };
    decision.overloaded = decision.tier == TierName::Rules
        && (start.cpu.as_ref().is_err_and(Ineligible::is_capacity)
            || decision.path.iter().any(|s| matches!(s.outcome, Outcome::Shed | Outcome::Doomed | Outcome::Timeout)));
    if let Some(scored) = x.features {
        super::features::combine(&mut decision, scored, &x.policy.features_model);
        super::trace::features(tiers.trace(), scored, &decision);
    }
    let (span, before) = (tiers.trace().start("guards"), decision.path.len());
    super::guard::apply(&mut decision, x.policy, &run.rules_input(x), run.metrics);
    tiers.trace().end(span, || super::trace::guard_attributes(&decision, before), None);
    let explain = x.req.explain.then(|| Explain {
        complexity: run.assessment.complexity,
        stats: run.assessment.stats,
        language: *run.assessment.facts.lang.get(),
        signals: x.snapshot.clone(),
        start,
        attributions: Vec::new(),
        features_model: None,
        campaign: run.assessment.campaign.clone(),
    });
    Ok((decision, explain))
}

/// The cascade's state for one request.
struct Run<'a> {
    /// Where to count escalations and fallbacks: live runs only.
    metrics: Option<&'a Metrics>,
    path: Vec<Step>,
    /// The model verdict the rules and guards see: the unsure one that handed over, or the one
    /// that stands.
    model: Option<ModelView>,
    /// What routing keeps between stages; asked once per stage.
    router: Router<'a>,
    /// The assessment; its complexity gains the cpu tier's OOD score once known, and its encoding
    /// goes to the cpu tier.
    assessment: Assessment,
}

impl Run<'_> {
    async fn cpu(&mut self, x: &Inputs<'_>, tiers: &Tiers<'_>) -> Then {
        let span = tiers.trace().start("tier cpu");
        let t = Instant::now();
        let prepared =
            Prepared { encoded: self.assessment.encoded.take(), lang: Some(self.assessment.facts.lang.clone()) };
        let (result, cached) = tiers.cpu(&self.assessment.facts.text, prepared, x.deadline()).await;
        let result = result.map(|v| cpu_verdict(v, tiers.cpu_temperature(), x.policy));
        let us = t.elapsed().as_micros() as u64;
        tiers.observe(TierName::Cpu, us, cached);
        if let Some(ood) = result.as_ref().ok().and_then(|v| v.ood_score) {
            self.assessment.complexity = self.assessment.complexity.with_ood(&x.policy.complexity, ood);
        }
        let before = self.path.len();
        let then = self.follow(TierName::Cpu, result, us, x);
        self.mark_cached(before, cached);
        super::trace::end_tier(tiers.trace(), span, TierName::Cpu, &self.path[before..]);
        then
    }

    async fn confirm(&mut self, x: &Inputs<'_>, tiers: &Tiers<'_>) -> Then {
        let span = tiers.trace().start("tier confirm");
        let t = Instant::now();
        let lang = self.assessment.facts.lang.clone();
        let (result, cached) = tiers.confirm(&self.assessment.facts.text, lang, x.deadline()).await;
        let us = t.elapsed().as_micros() as u64;
        tiers.observe(TierName::Confirm, us, cached);
        let before = self.path.len();
        let then = self.follow(TierName::Confirm, result, us, x);
        self.mark_cached(before, cached);
        super::trace::end_tier(tiers.trace(), span, TierName::Confirm, &self.path[before..]);
        then
    }

    async fn gpu(&mut self, x: &Inputs<'_>, tiers: &Tiers<'_>) -> Then {
        let span = tiers.trace().start("tier gpu");
        let context = tiers.trace().otel_context(&span);
        let t = Instant::now();
        let (result, cached) = tiers.gpu(x.policy, &self.assessment.facts.text, x.deadline(), context).await;
        let us = t.elapsed().as_micros() as u64;
        tiers.observe(TierName::Gpu, us, cached);
        let before = self.path.len();
        let then = self.follow(TierName::Gpu, result, us, x);
        self.mark_cached(before, cached);
        super::trace::end_tier(tiers.trace(), span, TierName::Gpu, &self.path[before..]);
        then
    }

    /// Marks the tier's step (the first written since `before`) as reused from the verdict cache.
    fn mark_cached(&mut self, before: usize, cached: bool) {
        if let Some(step) = self.path.get_mut(before).filter(|_| cached) {
            step.cached = true;
        }
    }

    /// Asks the router what follows `tier`'s `result` (the one routing question per stage) and
    /// writes the path accordingly.
    fn follow(&mut self, tier: TierName, result: Result<ModelVerdict, TierError>, us: u64, x: &Inputs<'_>) -> Then {
        let (lang, complexity, remaining) =
            (self.assessment.facts.lang.get(), &self.assessment.complexity, x.remaining());
        match result {
            Ok(v) => {
                let route = self.router.after_verdict(tier, &v, lang, complexity, remaining);
                self.model_step(tier, v, us, route)
            }
            Err(e) => match self.router.after_failure(tier, Outcome::from(&e), lang, complexity, remaining) {
                Recovery::Fallback(fallback) => Then::Stage(self.failed(tier, &e, us, fallback)),
                Recovery::CpuStands { verdict, note } => {
                    self.record_failure(tier, &e, us);
                    let mut step = Step::new(TierName::Cpu, Outcome::Accepted, 0);
                    step.confidence = Some(verdict.confidence);
                    step.risk_score = Some(verdict.risk_score);
                    step.reason = note;
                    self.path.push(step);
                    Then::Decide(TierName::Cpu, verdict)
                }
            },
        }
    }

    fn count(&self, family: fn(&Metrics) -> &crate::metrics::ReasonCounter, reason: Outcome) {
        if let Some(m) = self.metrics {
            family(m).get_or_create(&ReasonLabels { reason: reason.as_str() }).inc();
        }
    }

    /// Records a model tier's step for `route`: the verdict that stands, or the next stage.
    fn model_step(&mut self, tier: TierName, v: ModelVerdict, us: u64, route: Route) -> Then {
        let mut step = Self::step(tier, &v, us);
        let mut skipped = None;
        let next = match route {
            Route::HandOver { outcome, reason, next: Stage::Confirm, .. } => {
                step.outcome = outcome;
                step.reason = Some(format!("{reason}; asking the confirm model"));
                Some(Stage::Confirm)
            }
            Route::HandOver { outcome, reason, next: Stage::Gpu, .. } => {
                self.count(|m| &m.escalations, outcome);
                step.outcome = outcome;
                step.reason = Some(format!("{reason}; escalating to gpu"));
                Some(Stage::Gpu)
            }
            Route::HandOver { outcome, reason, skipped: gpu, .. } => {
                self.count(|m| &m.fallbacks, outcome);
                step.outcome = outcome;
                step.reason = Some(reason);
                skipped = gpu;
                Some(Stage::Rules)
            }
            Route::Accept { note } => {
                step.reason = note;
                None
            }
            Route::Confirmed { cpu, note } => {
                // The cpu verdict stands, confirmed: its score decides the action.
                step.reason = note;
                self.path.push(step);
                return Then::Decide(TierName::Confirm, cpu);
            }
        };
        // A model reading a language it was not trained on has no view worth showing the rules;
        // the confirm model only confirms, so the rules keep seeing the cpu verdict it was asked on.
        let view = tier != TierName::Confirm && !matches!(step.outcome, Outcome::Language | Outcome::Error);
        if next.is_some() && view {
            self.model = Some(ModelView { risk_score: v.risk_score, confidence: v.confidence, ood_score: v.ood_score });
        }
        self.path.push(step);
        if let Some(why) = skipped {
            self.path.push(Step::new(TierName::Gpu, Outcome::Skipped, 0).reason(format!("unavailable: {why}")));
        }
        match next {
            None => Then::Decide(tier, v),
            Some(next) => Then::Stage(next),
        }
    }

    /// A model tier's step for verdict `v`, as accepted (the caller sets how it ended).
    fn step(tier: TierName, v: &ModelVerdict, us: u64) -> Step {
        let mut step = Step::new(tier, Outcome::Accepted, us);
        step.confidence = Some(v.confidence);
        step.risk_score = Some(v.risk_score);
        step.ood_score = v.ood_score;
        step.endpoint = v.endpoint.clone();
        step.window = v.window;
        step
    }

    /// Records a tier's failure.
    fn record_failure(&mut self, tier: TierName, e: &TierError, us: u64) {
        let outcome = Outcome::from(e);
        self.count(|m| &m.fallbacks, outcome);
        self.path.push(Step::new(tier, outcome, us).reason(e.to_string()));
    }

    /// Records a tier's failure and where routing sends the request instead.
    fn failed(&mut self, tier: TierName, e: &TierError, us: u64, fallback: Fallback) -> Stage {
        self.record_failure(tier, e, us);
        match fallback {
            Fallback::Try(stage) => stage,
            Fallback::Rules { skipped } => {
                if let Some((other, why)) = skipped {
                    self.path.push(Step::new(other, Outcome::Skipped, 0).reason(why.to_string()));
                }
                Stage::Rules
            }
        }
    }

    fn decide(&mut self, tier: TierName, v: &ModelVerdict, actions: &ActionThresholds) -> Decision {
        // Guards see the verdict that stands.
        self.model = Some(ModelView { risk_score: v.risk_score, confidence: v.confidence, ood_score: v.ood_score });
        let action = actions.action_for(v.risk_score);
        decision(tier, v.risk_score, Some(v.confidence), action, std::mem::take(&mut self.path))
    }

    /// What the rules and guards see: the canonical text and its facts, the request's features
    /// and tenant, the model view.
    fn rules_input<'x>(&'x self, x: &'x Inputs<'_>) -> RulesInput<'x> {
        let campaign = self.assessment.campaign.as_ref();
        let mut input = self.assessment.facts.input(&x.req.features, x.req.tenant.as_deref(), self.model, campaign);
        input.features_model = x.features.and_then(|f| f.score.as_ref().ok()).map(|s| s.risk);
        input
    }

    /// The rules stage: never fails, never waits. A rule that errors is counted and logged.
    fn rules(&mut self, x: &Inputs<'_>, start: &Start, tiers: &Tiers<'_>) -> Decision {
        if self.path.is_empty() {
            // Neither model tier was tried: say why.
            self.path.push(Step::new(TierName::Cpu, Outcome::Skipped, 0).reason(start.reason.clone()));
        }
        let span = tiers.trace().start("rules");
        let t = Instant::now();
        let only = x.scenario.and_then(|s| s.rules.as_deref());
        let verdict = x.policy.rules.evaluate_subset(&self.rules_input(x), only);
        let us = t.elapsed().as_micros() as u64;
        if let Some(m) = self.metrics {
            for (rule, error) in &verdict.errors {
                m.rule_errors.get_or_create(&RuleLabels { rule: rule.clone() }).inc();
                tracing::warn!(%rule, %error, "rule evaluation failed; counted as no match");
            }
        }
        tiers.observe(TierName::Rules, us, false);
        let outcome = if verdict.rule.is_some() { Outcome::Matched } else { Outcome::Default };
        let mut step = Step::new(TierName::Rules, outcome, us);
        step.risk_score = Some(verdict.risk_score);
        step.rule = verdict.rule.clone();
        if verdict.rule.is_none() {
            step.reason = Some("no rule matched; policy default applies".into());
        }
        tiers.trace().end(span, || super::trace::step_attributes(&step), None);
        self.path.push(step);
        let mut d = decision(TierName::Rules, verdict.risk_score, None, verdict.action, std::mem::take(&mut self.path));
        d.rule = verdict.rule;
        d.signals = Some(verdict.signals);
        if let Some((rule, error)) = verdict.errors.first() {
            let why = format!("rule failed to evaluate: {error}");
            let _ = super::guard::at_least(&mut d, x.policy.safety.on_rule_error, rule, &why);
        }
        d
    }
}

/// A cpu verdict, calibrated at the model's temperature `model_t`, read at `policy`'s
/// `[calibration] cpu_temperature` when it sets one: risk and confidence as `softmax(logits / T)`
/// at the policy's `T` ([`crate::calibrate::retemper`]). The verdict cache and the shadow replay
/// keep the model's verdict, so each policy (live, `[ab]` candidate, shadow) reads it at its own.
fn cpu_verdict(mut v: ModelVerdict, model_t: Option<f64>, policy: &Policy) -> ModelVerdict {
    let (Some(from), Some(to)) = (model_t, policy.calibration.cpu_temperature) else { return v };
    v.risk_score = crate::calibrate::retemper(v.risk_score, from, to);
    v.confidence = v.risk_score.max(1.0 - v.risk_score);
    v
}

/// A decision before [`super::Gateway`] stamps the request id, policy version, model and latency.
fn decision(tier: TierName, risk_score: f64, confidence: Option<f64>, action: Action, path: Vec<Step>) -> Decision {
    Decision {
        request_id: String::new(),
        record_id: None,
        label: Label::from_risk_score(risk_score),
        risk_score,
        confidence,
        action,
        tier,
        rule: None,
        signals: None,
        path,
        policy_version: String::new(),
        scenario: None,
        arm: None,
        model: String::new(),
        latency_us: 0,
        overloaded: false,
        explain: None,
        subject: Default::default(),
    }
}
