//! After the cascade, on every request: guard rules (the most severe match can only raise the
//! action: a confident model cannot talk its way past a hard rule), the allow-list (lowers an
//! action, a guard's only where `[safety] allowlist_overrides_guards` says so), and rule failures
//! (never skipped in silence: the decision is at least `[safety] on_rule_error`). Each change is
//! a step of the path, so the decision says which guard raised it.

use crate::action::Action;
use crate::decision::{Decision, Label, Outcome, Step, TierName};
use crate::metrics::{Metrics, RuleLabels};
use crate::policy::Policy;
use crate::rules::{ClassVerdict, RulesInput};

/// Applies guards, the allow-list and `on_rule_error` to a decision the cascade made.
/// `input` is what the rules see, with the model view of the verdict that stood (if any).
pub(super) fn apply(d: &mut Decision, policy: &Policy, input: &RulesInput<'_>, metrics: Option<&Metrics>) {
    let (guard, allow) = policy.rules.guard_stage(input);
    count_errors(&guard, metrics);
    // The lowest action the allow-list may leave (unless `allowlist_overrides_guards`): a matching
    // guard's own action even when it raised nothing because the action already stood there (a
    // guard that agrees with the model still vouches for it), and wherever a guard or a failing
    // rule raised the action (the rules stage's floor for a rule that failed counts: failing closed).
    let raised = d.path.iter().any(|s| s.tier == TierName::Guard && s.outcome == Outcome::Raised);
    let mut floor = raised.then_some(d.action);
    if let Some((name, action, score)) = guard.matched {
        floor = floor.max(Some(action));
        if action > d.action {
            let reason = format!("guard raised {} to {}", d.action.as_str(), action.as_str());
            d.path.push(step(Outcome::Raised, &name, Some(score), reason));
            d.risk_score = d.risk_score.max(score);
            d.label = Label::from_risk_score(d.risk_score);
            d.confidence = None;
            d.action = action;
            d.tier = TierName::Guard;
            d.rule = Some(name);
        }
    }
    if let Some((name, error)) = guard.errors.first() {
        at_least(d, policy.safety.on_rule_error, name, &format!("guard failed to evaluate: {error}"));
        floor = floor.max(Some(policy.safety.on_rule_error));
    }
    count_errors(&allow, metrics);
    if let Some((name, action, _)) = allow.matched {
        let to =
            if policy.safety.allowlist_overrides_guards { action } else { floor.map_or(action, |f| action.max(f)) };
        if to < d.action {
            let reason = format!("allow-list lowered {} to {}", d.action.as_str(), to.as_str());
            d.path.push(step(Outcome::Lowered, &name, None, reason));
            d.action = to;
            d.tier = TierName::Guard;
            d.rule = Some(name);
        }
    }
    if let Some((name, error)) = allow.errors.first() {
        at_least(d, policy.safety.on_rule_error, name, &format!("allow-list entry failed to evaluate: {error}"));
    }
}

/// Raises the decision to `floor` because `rule` failed; the path says so. Whether it raised.
pub(super) fn at_least(d: &mut Decision, floor: Action, rule: &str, why: &str) -> bool {
    let raise = floor > d.action;
    if raise {
        let reason = format!("{why}; on_rule_error raises {} to {}", d.action.as_str(), floor.as_str());
        d.path.push(step(Outcome::Raised, rule, None, reason));
        d.action = floor;
        d.tier = TierName::Guard;
        d.rule = Some(rule.to_string());
    }
    raise
}

fn step(outcome: Outcome, rule: &str, risk_score: Option<f64>, reason: String) -> Step {
    let mut s = Step::new(TierName::Guard, outcome, 0).reason(reason);
    s.rule = Some(rule.to_string());
    s.risk_score = risk_score;
    s
}

/// Counts and logs entries that failed to evaluate.
fn count_errors(verdict: &ClassVerdict, metrics: Option<&Metrics>) {
    let Some(m) = metrics else { return };
    for (rule, error) in &verdict.errors {
        m.rule_errors.get_or_create(&RuleLabels { rule: rule.clone() }).inc();
        tracing::warn!(%rule, %error, "rule evaluation failed");
    }
}
