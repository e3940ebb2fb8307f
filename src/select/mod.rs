//! Tier selection: every routing choice of the cascade, as pure functions of (complexity,
//! policy, signals snapshot, remaining deadline, what was tried) -> what happens next, with the
//! reason in words. No threads, clocks or I/O here: the gateway takes one [`LoadSnapshot`]
//! per request and asks these functions at each step —
//!
//! - where a request starts: [`start`];
//! - after the cpu tier answered: [`after_cpu`] (accept, escalate to the gpu tier, or rules),
//!   with [`gpu_left`] saying whether the gpu tier is still open to it;
//! - after the gpu tier answered: [`after_gpu`];
//! - after a model tier failed: [`after_failure`] (the other model tier, or rules), and for a
//!   failed escalation [`after_failed_escalation`] (the cpu verdict stands, or rules).
//!
//! So every branch is unit-tested with hand-built snapshots and verdicts (`tests.rs`). The
//! cascade asks these through a [`Router`] (`router.rs`), which keeps the request's routing
//! state between stages (tiers tried, the verdict an escalation started from).

mod eligibility;
mod router;
mod signals;

pub use router::{Recovery, Route, Router};

pub use eligibility::{below_limit, cpu_eligibility, gpu_below, gpu_eligibility, tenant_gpu_eligibility, Ineligible};
pub use signals::{Below, CpuLoad, GpuLoad, GpuMemory, KvCache, LoadSnapshot, TenantLoad};

use crate::complexity::Complexity;
use crate::policy::{Cascade, Policy, WhenSaturated};
use crate::text::Language;
use crate::tier::{ModelVerdict, TierError};
use serde::Serialize;
use std::time::Duration;

/// A stage of the cascade, as a decision's path names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierName {
    Cpu,
    Gpu,
    Rules,
    /// Guard rules and the allow-list, evaluated on every request after the cascade.
    Guard,
    /// The features model (`[features_model]`): the request's `features`, scored beside the text.
    Features,
    /// The confirm model (`[confirm]`): a second opinion on an unsure cpu risk verdict
    /// (`[cascade] confirm_from`).
    Confirm,
}

impl TierName {
    pub fn as_str(self) -> &'static str {
        match self {
            TierName::Cpu => "cpu",
            TierName::Gpu => "gpu",
            TierName::Rules => "rules",
            TierName::Guard => "guard",
            TierName::Features => "features",
            TierName::Confirm => "confirm",
        }
    }
}

/// How a stage ended (`path[].outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A model verdict stands.
    Accepted,
    /// A model verdict below the policy's confidence bar.
    LowConfidence,
    /// A cpu verdict on text unlike the training data.
    OutOfDistribution,
    /// The text ran past the model's windows: part of it was not read.
    Unread,
    /// The text is in a language or script the model does not read (`[cascade] model_languages`,
    /// `model_scripts`).
    Language,
    /// The deadline passed before the tier answered.
    Timeout,
    /// The tier's queue was full.
    Shed,
    /// A worker did not start the job: it would have finished after its deadline.
    Doomed,
    /// Tokenisation, inference or the model server failed.
    Error,
    /// The tier is not configured or not present.
    Unavailable,
    /// The tier's circuit breaker is open.
    CircuitOpen,
    /// Not tried (the reason says why).
    Skipped,
    /// A rule decided.
    Matched,
    /// No rule matched; the policy's default decided.
    Default,
    /// A guard rule raised the action.
    Raised,
    /// An allow-list entry lowered the action.
    Lowered,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::LowConfidence => "low_confidence",
            Outcome::OutOfDistribution => "out_of_distribution",
            Outcome::Unread => "unread",
            Outcome::Language => "language",
            Outcome::Timeout => "timeout",
            Outcome::Shed => "shed",
            Outcome::Doomed => "doomed",
            Outcome::Error => "error",
            Outcome::Unavailable => "unavailable",
            Outcome::CircuitOpen => "circuit_open",
            Outcome::Skipped => "skipped",
            Outcome::Matched => "matched",
            Outcome::Default => "default",
            Outcome::Raised => "raised",
            Outcome::Lowered => "lowered",
        }
    }
}

impl From<&TierError> for Outcome {
    fn from(e: &TierError) -> Outcome {
        match e {
            TierError::Overloaded { .. } => Outcome::Shed,
            TierError::DeadlineExceeded { .. } => Outcome::Timeout,
            TierError::Doomed { .. } => Outcome::Doomed,
            TierError::Unavailable(_) => Outcome::Unavailable,
            TierError::CircuitOpen => Outcome::CircuitOpen,
            TierError::Inference(_) => Outcome::Error,
        }
    }
}

/// The stage that runs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Cpu,
    /// The confirm model, on an unsure cpu risk verdict on its way to the rules.
    Confirm,
    Gpu,
    Rules,
    /// Refuse with 503 + Retry-After (policy `when_saturated = "shed"`).
    Shed,
}

/// Where a request starts, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Start {
    pub stage: Stage,
    pub reason: String,
    /// The complexity this choice used (before the cpu tier's OOD score was known).
    pub complexity: f64,
    /// `Err(why)` when the cpu tier may not take the request.
    #[serde(serialize_with = "eligibility")]
    pub cpu: Result<(), Ineligible>,
    #[serde(serialize_with = "eligibility")]
    pub gpu: Result<(), Ineligible>,
}

/// `{"eligible": true}` or `{"eligible": false, "reason": ...}`.
fn eligibility<S: serde::Serializer>(e: &Result<(), Ineligible>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(None)?;
    m.serialize_entry("eligible", &e.is_ok())?;
    if let Err(reason) = e {
        m.serialize_entry("reason", reason)?;
    }
    m.end()
}

/// What to do with a model verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// The verdict stands; `note` says why a wanted escalation did not happen.
    Accept { note: Option<String> },
    /// Try the gpu tier (`outcome` names why the verdict was not trusted).
    Escalate { outcome: Outcome, reason: String },
    /// Rules decide.
    Rules { outcome: Outcome, reason: String },
}

/// The model tiers a request has been sent to so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tried {
    pub cpu: bool,
    pub gpu: bool,
}

/// Where a request goes after a model tier failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Fallback {
    /// The other model tier, untried and eligible.
    Try(Stage),
    /// Rules; `skipped` names the other model tier when it was untried but ineligible.
    Rules { skipped: Option<(TierName, Ineligible)> },
}

/// Where a request starts: complex requests on the gpu tier when it is eligible, the rest on
/// the cpu tier; either one when the other is not eligible; neither -> `when_saturated`.
pub fn start(complexity: &Complexity, policy: &Policy, s: &LoadSnapshot, remaining: Duration) -> Start {
    let cpu = cpu_eligibility(policy, s, remaining);
    let gpu = gpu_eligibility(policy, s, remaining);
    let max = policy.routing.cpu_max_complexity;
    let complex = complexity.score > max;
    let (stage, reason) = match (&cpu, &gpu) {
        (_, Ok(())) if complex => {
            (Stage::Gpu, format!("complexity {:.2} above cpu_max_complexity {max}", complexity.score))
        }
        (Ok(()), Err(why)) if complex => (
            Stage::Cpu,
            format!("complexity {:.2} above cpu_max_complexity {max}, but gpu ineligible: {why}", complexity.score),
        ),
        (Ok(()), _) => (Stage::Cpu, format!("complexity {:.2} within cpu_max_complexity {max}", complexity.score)),
        (Err(why), Ok(())) => (Stage::Gpu, format!("cpu ineligible: {why}")),
        (Err(c), Err(g)) => {
            let stage = match policy.routing.when_saturated {
                WhenSaturated::Rules => Stage::Rules,
                WhenSaturated::Shed => Stage::Shed,
            };
            (stage, format!("no model tier can take it: cpu: {c}; gpu: {g}"))
        }
    };
    Start { stage, reason, complexity: complexity.score, cpu, gpu }
}

/// Whether the gpu tier is still open to a request after the cpu tier answered: not when it was
/// already tried, else its eligibility now.
pub fn gpu_left(tried: Tried, policy: &Policy, s: &LoadSnapshot, remaining: Duration) -> Result<(), Ineligible> {
    if tried.gpu {
        return Err(Ineligible::AlreadyTried);
    }
    gpu_eligibility(policy, s, remaining)
}

/// After the cpu tier answered: accept, escalate to the gpu tier, or hand over to rules.
/// `gpu` is the gpu tier's eligibility now ([`gpu_left`]); `lang` the text's language.
pub fn after_cpu(
    v: &ModelVerdict,
    lang: &Language,
    complexity: &Complexity,
    policy: &Policy,
    gpu: &Result<(), Ineligible>,
) -> Next {
    let c = &policy.cascade;
    let escalate_below = c.escalate_below_for(v.risk_score);
    let (outcome, reason) = if let Some(why) = not_finite(v) {
        (Outcome::Error, why)
    } else if let Some(why) = foreign(lang, policy) {
        (Outcome::Language, why)
    } else if let Some(why) = unread_ok(v) {
        (Outcome::Unread, why)
    } else if let Some(ood) = v.ood_score.filter(|&o| o > c.ood_above) {
        (Outcome::OutOfDistribution, format!("ood_score {ood:.3} above ood_above {}", c.ood_above))
    } else if v.confidence < escalate_below {
        let name = if escalate_below > c.escalate_below() { "accept_risk_below" } else { "escalate_below" };
        (Outcome::LowConfidence, format!("confidence {:.3} below {name} {escalate_below}", v.confidence))
    } else {
        return Next::Accept { note: None };
    };
    let min = policy.routing.gpu_min_complexity;
    let blocked = match gpu {
        Err(why) => Some(format!("gpu ineligible: {why}")),
        Ok(()) if complexity.score < min => {
            Some(format!("complexity {:.2} below gpu_min_complexity {min}", complexity.score))
        }
        Ok(()) => None,
    };
    match blocked {
        None => Next::Escalate { outcome, reason },
        Some(why) if outcome != Outcome::LowConfidence || v.confidence < c.accept_below_for(v.risk_score) => {
            let reason = if outcome == Outcome::LowConfidence {
                format!("confidence {:.3} below {}", v.confidence, accept_name(c, v.risk_score))
            } else {
                reason
            };
            Next::Rules { outcome, reason: format!("{reason}; {why}") }
        }
        Some(why) => Next::Accept { note: Some(format!("{reason}, not escalated: {why}")) },
    }
}

/// After the gpu tier answered: accept, or hand over to rules.
pub fn after_gpu(v: &ModelVerdict, policy: &Policy) -> Next {
    let accept_below = policy.cascade.accept_below_for(v.risk_score);
    if let Some(reason) = not_finite(v) {
        Next::Rules { outcome: Outcome::Error, reason }
    } else if let Some(reason) = unread_ok(v) {
        // The same windows as the cpu tier's: an ok over the part read clears nothing past it.
        Next::Rules { outcome: Outcome::Unread, reason }
    } else if v.confidence < accept_below {
        Next::Rules {
            outcome: Outcome::LowConfidence,
            reason: format!("confidence {:.3} below {}", v.confidence, accept_name(&policy.cascade, v.risk_score)),
        }
    } else if v.confidence <= 0.5 {
        // Two labels at even odds say nothing, whatever accept_below allows.
        Next::Rules { outcome: Outcome::LowConfidence, reason: "unsure: confidence 0.5 (even odds)".into() }
    } else {
        Next::Accept { note: None }
    }
}

/// After the confirm model answered `c` on a cpu verdict in the `confirm_from` band: `Accept`
/// (the cpu verdict stands) when its calibrated risk is at or above `confirm_at`, else rules.
pub fn after_confirm(c: &ModelVerdict, policy: &Policy) -> Next {
    let at = policy.cascade.confirm_at;
    match not_finite(c) {
        Some(reason) => Next::Rules { outcome: Outcome::Error, reason },
        None if c.risk_score >= at => Next::Accept {
            note: Some(format!("risk {:.3} at or above confirm_at {at}: the cpu verdict stands", c.risk_score)),
        },
        None => Next::Rules {
            outcome: Outcome::LowConfidence,
            reason: format!("confirm model risk {:.3} below confirm_at {at}", c.risk_score),
        },
    }
}

/// The threshold a verdict missed, named as in the policy: "accept_risk_below 0.97" or
/// "accept_below 0.9".
fn accept_name(c: &Cascade, risk_score: f64) -> String {
    let below = c.accept_below_for(risk_score);
    if below > c.accept_below {
        format!("accept_risk_below {below}")
    } else {
        format!("accept_below {below}")
    }
}

/// Why the cpu model cannot judge a text in this language: a reliably detected language outside
/// `[cascade] model_languages` (and not one of its `language_neighbours`), or a script outside
/// `[cascade] model_scripts` — in its first window or anywhere past it ([`Language::elsewhere`]:
/// a later window in another language, or a passage in another script, as in code-mixed chat).
pub fn foreign(lang: &Language, policy: &Policy) -> Option<String> {
    let c = &policy.cascade;
    let (languages, scripts) = (&c.model_languages, &c.model_scripts);
    let reads = |code: &str| languages.iter().any(|k| k == code);
    let unknown =
        |code: &str| code != "und" && !reads(code) && !c.language_neighbours.get(code).is_some_and(|s| reads(s));
    let unknown_script = |script: &str| script != "Zzzz" && !scripts.iter().any(|k| k == script);
    let served = || format!("{}; scripts {}", languages.join(", "), scripts.join(", "));
    if lang.reliable && unknown(lang.code) {
        return Some(format!("language {} is not one the model reads ({})", lang.code, served()));
    }
    if unknown_script(lang.script) {
        return Some(format!("{} script is not one the model reads ({})", lang.script, served()));
    }
    let e = lang.elsewhere.filter(|e| unknown(e.code) || unknown_script(e.script))?;
    let what = if unknown(e.code) { format!("language {}", e.code) } else { format!("{} script", e.script) };
    Some(format!("a later part of the text is in {what}: not one the model reads ({})", served()))
}

/// Why an ok verdict cannot stand on a text the model did not read whole. The riskiest window
/// decides, so unread text can only add risk: a risk verdict from the windows read stands on its
/// own; an ok one might be hiding the pitch further on. Both model tiers read through windows.
fn unread_ok(v: &ModelVerdict) -> Option<String> {
    (v.unread && v.risk_score < 0.5).then(|| {
        let read = v.window.map_or(1, |w| w.of);
        format!("text past the {read} window(s) the model reads was not read")
    })
}

/// Why a verdict cannot be judged at all: a non-finite score (NaN passes every `<` test, so it
/// must never reach a threshold).
fn not_finite(v: &ModelVerdict) -> Option<String> {
    let finite = v.risk_score.is_finite() && v.confidence.is_finite() && v.ood_score.is_none_or(f64::is_finite);
    (!finite).then(|| format!("non-finite score from the model (risk {}, confidence {})", v.risk_score, v.confidence))
}

/// After the `failed` model tier gave no verdict (and it was not an escalation): the other
/// model tier if it is untried and `other` (its eligibility now) allows it, else rules.
pub fn after_failure(failed: TierName, tried: Tried, other: Result<(), Ineligible>) -> Fallback {
    let (other_tried, stage, name) = match failed {
        TierName::Cpu => (tried.gpu, Stage::Gpu, TierName::Gpu),
        _ => (tried.cpu, Stage::Cpu, TierName::Cpu),
    };
    match other {
        _ if other_tried => Fallback::Rules { skipped: None },
        Ok(()) => Fallback::Try(stage),
        Err(why) => Fallback::Rules { skipped: Some((name, why)) },
    }
}

/// An escalation to the gpu tier failed with `outcome`: the cpu verdict stands if it would have
/// stood without a gpu tier (`Accept`), else rules decide.
pub fn after_failed_escalation(
    cpu: &ModelVerdict,
    lang: &Language,
    complexity: &Complexity,
    policy: &Policy,
    outcome: Outcome,
) -> Next {
    after_cpu(cpu, lang, complexity, policy, &Err(Ineligible::Failed(outcome)))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod verdict_tests;
