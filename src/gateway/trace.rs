//! A decision in its trace ([`crate::trace`]): the attributes of the stage spans the cascade
//! records (from the path's steps, so a span says what the path says) and the decision's on the
//! root span, with the tail decision that exports blocked, errored and over-deadline decisions
//! whatever the sampling ratio. Only ids, scores, outcomes and counts: never message text.

use crate::action::Action;
use crate::decision::{Decision, Outcome, Step, TierName};
use crate::trace::{attr, Span, Trace};
use opentelemetry::KeyValue;
use std::time::{Duration, SystemTime};

/// Ends a model tier's span (`tier cpu`, `tier gpu`) with what the path says of it: the first
/// of `steps` (those the stage pushed) that is this tier's. A failed or timed-out tier's span
/// has an error status.
pub(super) fn end_tier(trace: &Trace, span: Span, tier: TierName, steps: &[Step]) {
    if !trace.is_on() {
        return;
    }
    let Some(step) = steps.iter().find(|s| s.tier == tier) else {
        trace.end(span, || vec![KeyValue::new(attr::TIER, tier.as_str())], None);
        return;
    };
    let failed = matches!(step.outcome, Outcome::Error | Outcome::Timeout | Outcome::Doomed | Outcome::Unavailable);
    let error = failed.then(|| step.reason.clone().unwrap_or_else(|| step.outcome.as_str().into()));
    trace.end(span, || step_attributes(step), error);
}

/// The features model's span (`tier features`): it ran before the cascade, from `scored.at` for
/// its latency; its attributes are its path step's (the last `features` step of `d`).
pub(super) fn features(trace: &Trace, scored: &crate::features_model::Scored, d: &Decision) {
    if let Some(step) = d.path.iter().rev().find(|s| s.tier == TierName::Features).filter(|_| trace.is_on()) {
        let end = scored.at + Duration::from_micros(scored.latency_us);
        trace.record("tier features", scored.at, end, step_attributes(step));
    }
}

/// A step's attributes: tier, outcome, reason, calibrated scores, window, endpoint, rule, latency.
pub(super) fn step_attributes(step: &Step) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::new(attr::TIER, step.tier.as_str()),
        KeyValue::new(attr::OUTCOME, step.outcome.as_str()),
        KeyValue::new(attr::LATENCY_US, step.latency_us as i64),
    ];
    let floats =
        [(attr::RISK_SCORE, step.risk_score), (attr::CONFIDENCE, step.confidence), (attr::OOD_SCORE, step.ood_score)];
    a.extend(floats.into_iter().filter_map(|(k, v)| Some(KeyValue::new(k, v?))));
    if let Some(reason) = &step.reason {
        a.push(KeyValue::new(attr::REASON, reason.clone()));
    }
    if let Some(rule) = &step.rule {
        a.push(KeyValue::new(attr::RULE, rule.clone()));
    }
    if step.cached {
        a.push(KeyValue::new(attr::CACHED, true));
    }
    if let Some(endpoint) = &step.endpoint {
        a.push(KeyValue::new(attr::ENDPOINT, endpoint.clone()));
        if let Ok(uri) = endpoint.parse::<http::Uri>() {
            if let Some(host) = uri.host() {
                a.push(KeyValue::new(attr::SERVER_ADDRESS, host.to_string()));
            }
            if let Some(port) = uri.port_u16() {
                a.push(KeyValue::new(attr::SERVER_PORT, i64::from(port)));
            }
        }
    }
    if let Some(w) = step.window {
        a.push(KeyValue::new(attr::WINDOW, w.index as i64));
    }
    a
}

/// The guards span's attributes: the guard and allow-list steps the guards added (after the
/// cascade's `before` steps), their rule ids and the action that stands.
pub(super) fn guard_attributes(d: &Decision, before: usize) -> Vec<KeyValue> {
    let rules: Vec<&str> = d.path[before.min(d.path.len())..].iter().filter_map(|s| s.rule.as_deref()).collect();
    let mut a = vec![KeyValue::new(attr::ACTION, d.action.as_str())];
    if !rules.is_empty() {
        a.push(KeyValue::new(attr::RULE, rules.join(",")));
        a.push(KeyValue::new(attr::OUTCOME, d.path.last().map_or("", |s| s.outcome.as_str())));
    }
    a
}

/// When the canonical text was made (before the cascade) and the complexity it was rated at;
/// its span is recorded once the language is known (the cpu worker or the guards detect it).
pub(super) struct Canonical {
    pub start: SystemTime,
    pub end: SystemTime,
    pub complexity: f64,
}

/// The `canonical` span (language, text length in characters, complexity), the decision on the
/// root span (`tiergate.request_id`, `policy_version`, `action`, `tier`), and the tail decision:
/// a blocked decision, one a tier errored in, or one past its `deadline` (a stage timed out or
/// was doomed, or it took longer) is exported whatever the ratio.
pub(super) fn decided(trace: &Trace, d: &Decision, deadline: Duration, canonical: Canonical) {
    if !trace.is_on() {
        return;
    }
    let attributes = vec![
        KeyValue::new(attr::LANGUAGE, d.subject.lang),
        KeyValue::new(attr::TEXT_CHARS, d.subject.text.chars().count() as i64),
        KeyValue::new(attr::COMPLEXITY, canonical.complexity),
    ];
    trace.record("canonical", canonical.start, canonical.end, attributes);
    trace.set([
        KeyValue::new(attr::REQUEST_ID, d.request_id.clone()),
        KeyValue::new(attr::POLICY_VERSION, d.policy_version.clone()),
        KeyValue::new(attr::ACTION, d.action.as_str()),
        KeyValue::new(attr::TIER, d.tier.as_str()),
    ]);
    if d.action == Action::Block {
        trace.keep(attr::KEPT_BLOCKED);
    }
    if d.path.iter().any(|s| s.outcome == Outcome::Error) {
        trace.keep(attr::KEPT_ERROR);
    }
    let late = d.latency_us > deadline.as_micros() as u64;
    if late || d.path.iter().any(|s| matches!(s.outcome, Outcome::Timeout | Outcome::Doomed)) {
        trace.keep(attr::KEPT_DEADLINE);
    }
}
