//! The router: the routing state of one request's cascade — which model tiers it has tried, the
//! cpu verdict an escalation started from — and the one question the cascade asks after each
//! stage ([`Router::after_verdict`] or [`Router::after_failure`], by how it ended). Every choice is still made by the pure functions of [`super`]; the
//! router only keeps what they need between stages, so the cascade runs stages and writes the
//! path, and asks once per stage.

use super::{
    after_confirm, after_cpu, after_failed_escalation, after_failure, after_gpu, cpu_eligibility, gpu_eligibility,
    gpu_left, Fallback, Ineligible, LoadSnapshot, Next, Outcome, Stage, Start, TierName, Tried,
};
use crate::complexity::Complexity;
use crate::policy::Policy;
use crate::text::Language;
use crate::tier::ModelVerdict;
use std::time::Duration;

/// What comes after a model tier's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// The verdict stands; `note` says why a wanted escalation did not happen.
    Accept { note: Option<String> },
    /// The verdict is not trusted (`outcome` and `reason` for its step): go to `next`, the confirm
    /// model, the gpu tier (an escalation) or the rules. `skipped`: the gpu tier, when it was
    /// untried but ineligible on the way to the rules.
    HandOver { outcome: Outcome, reason: String, next: Stage, skipped: Option<Ineligible> },
    /// The confirm model confirmed the unsure cpu verdict `cpu`, which stands (`note` for the
    /// confirm model's step).
    Confirmed { cpu: ModelVerdict, note: Option<String> },
}

/// What comes after a model tier gave no verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Recovery {
    /// The other model tier, or the rules (naming the other tier when it was untried but
    /// ineligible).
    Fallback(Fallback),
    /// An escalation failed and the cpu verdict it started from stands on its own.
    CpuStands { verdict: ModelVerdict, note: Option<String> },
}

/// One request's routing state, between the cascade's stages.
pub struct Router<'a> {
    policy: &'a Policy,
    snapshot: &'a LoadSnapshot,
    tried: Tried,
    /// The cpu verdict an escalation to the gpu tier started from.
    escalated: Option<ModelVerdict>,
    /// The cpu verdict the confirm model was asked about, and the gpu tier's ineligibility to
    /// name on the way to the rules should it not confirm.
    confirming: Option<(ModelVerdict, Option<Ineligible>)>,
}

impl<'a> Router<'a> {
    /// Where the request starts ([`super::start`]), and the router that follows it.
    pub fn start(
        complexity: &Complexity,
        policy: &'a Policy,
        snapshot: &'a LoadSnapshot,
        remaining: Duration,
    ) -> (Router<'a>, Start) {
        let start = super::start(complexity, policy, snapshot, remaining);
        (Router { policy, snapshot, tried: Tried::default(), escalated: None, confirming: None }, start)
    }

    /// After `tier` answered `v`: whether it stands. `lang` and `complexity` are the text's as
    /// known now (the complexity with the cpu tier's OOD score); `remaining` is the time left.
    pub fn after_verdict(
        &mut self,
        tier: TierName,
        v: &ModelVerdict,
        lang: &Language,
        complexity: &Complexity,
        remaining: Duration,
    ) -> Route {
        let (policy, snapshot) = (self.policy, self.snapshot);
        if tier == TierName::Cpu {
            self.tried.cpu = true;
            let gpu = gpu_left(self.tried, policy, snapshot, remaining);
            return match after_cpu(v, lang, complexity, policy, &gpu) {
                Next::Accept { note } => Route::Accept { note },
                Next::Escalate { outcome, reason } => {
                    self.escalated = Some(v.clone());
                    Route::HandOver { outcome, reason, next: Stage::Gpu, skipped: None }
                }
                Next::Rules { outcome, reason } => {
                    let skipped = gpu.err().filter(|_| !self.tried.gpu);
                    if outcome == Outcome::LowConfidence && snapshot.confirm && policy.cascade.confirms(v.risk_score) {
                        self.confirming = Some((v.clone(), skipped));
                        return Route::HandOver { outcome, reason, next: Stage::Confirm, skipped: None };
                    }
                    Route::HandOver { outcome, reason, next: Stage::Rules, skipped }
                }
            };
        }
        if tier == TierName::Confirm {
            let Some((cpu, skipped)) = self.confirming.take() else {
                return Route::HandOver {
                    outcome: Outcome::Error,
                    reason: "confirm model answered without a cpu verdict to confirm".into(),
                    next: Stage::Rules,
                    skipped: None,
                };
            };
            return match after_confirm(v, policy) {
                Next::Accept { note } => Route::Confirmed { cpu, note },
                Next::Escalate { outcome, reason } | Next::Rules { outcome, reason } => {
                    Route::HandOver { outcome, reason, next: Stage::Rules, skipped }
                }
            };
        }
        self.tried.gpu = true;
        self.escalated = None;
        match after_gpu(v, policy) {
            Next::Accept { note } => Route::Accept { note },
            Next::Escalate { outcome, reason } | Next::Rules { outcome, reason } => {
                Route::HandOver { outcome, reason, next: Stage::Rules, skipped: None }
            }
        }
    }

    /// After `tier` gave no verdict (`outcome`: timeout, shed, error, ...): the other model tier,
    /// the rules, or — for a failed escalation — the cpu verdict it started from. Arguments as
    /// [`Router::after_verdict`].
    pub fn after_failure(
        &mut self,
        tier: TierName,
        outcome: Outcome,
        lang: &Language,
        complexity: &Complexity,
        remaining: Duration,
    ) -> Recovery {
        let (policy, snapshot) = (self.policy, self.snapshot);
        if tier == TierName::Cpu {
            self.tried.cpu = true;
            let gpu = gpu_eligibility(policy, snapshot, remaining);
            return Recovery::Fallback(after_failure(TierName::Cpu, self.tried, gpu));
        }
        if tier == TierName::Confirm {
            // No second opinion: the cpu verdict goes to the rules, as it would have without one.
            let skipped = self.confirming.take().and_then(|(_, skipped)| skipped).map(|why| (TierName::Gpu, why));
            return Recovery::Fallback(Fallback::Rules { skipped });
        }
        self.tried.gpu = true;
        match self.escalated.take() {
            Some(cpu) => match after_failed_escalation(&cpu, lang, complexity, policy, outcome) {
                Next::Accept { note } => Recovery::CpuStands { verdict: cpu, note },
                _ => Recovery::Fallback(Fallback::Rules { skipped: None }),
            },
            None => {
                let cpu = cpu_eligibility(policy, snapshot, remaining);
                Recovery::Fallback(after_failure(tier, self.tried, cpu))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{complexity, en, idle, policy, verdict, PLENTY};
    use super::*;

    #[test]
    fn an_escalation_that_fails_keeps_the_cpu_verdict_it_started_from() {
        let (p, s) = (policy(""), idle());
        let (mut router, start) = Router::start(&complexity(0.2), &p, &s, PLENTY);
        assert_eq!(start.stage, Stage::Cpu);
        // 0.8: below escalate_below 0.9 (escalates), above accept_below 0.7 (would stand alone).
        let cpu = verdict(0.8, Some(0.5));
        let route = router.after_verdict(TierName::Cpu, &cpu, &en(), &complexity(0.2), PLENTY);
        assert!(matches!(route, Route::HandOver { next: Stage::Gpu, .. }), "{route:?}");
        match router.after_failure(TierName::Gpu, Outcome::Timeout, &en(), &complexity(0.2), PLENTY) {
            Recovery::CpuStands { verdict, note: Some(note) } => {
                assert_eq!(verdict, cpu);
                assert!(note.contains("gpu tier timeout"), "{note}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_an_unsure_risk_lean_on_its_way_to_the_rules_asks_the_confirm_model() {
        let mut p = policy("");
        p.cascade.confirm_from = Some(0.6);
        let mut s = idle();
        s.gpu.unavailable = Some("none".into());
        s.confirm = true;
        let c = complexity(0.2);
        fn ask<'a>(p: &'a Policy, s: &'a LoadSnapshot, risk: f64) -> (Router<'a>, Route) {
            let c = complexity(0.2);
            let (mut router, _) = Router::start(&c, p, s, PLENTY);
            let route = router.after_verdict(TierName::Cpu, &verdict(risk, Some(0.5)), &en(), &c, PLENTY);
            (router, route)
        }
        // 0.65: unsure (below accept_below 0.7), leaning risk, above confirm_from.
        let (mut router, route) = ask(&p, &s, 0.65);
        assert!(matches!(route, Route::HandOver { next: Stage::Confirm, .. }), "{route:?}");
        let mut yes = verdict(0.97, Some(0.5));
        match router.after_verdict(TierName::Confirm, &yes, &en(), &c, PLENTY) {
            Route::Confirmed { cpu, note } => {
                assert_eq!(cpu.risk_score, 0.65);
                assert!(note.unwrap().contains("at or above confirm_at"));
            }
            other => panic!("{other:?}"),
        }
        // Below confirm_at, or NaN: to the rules, naming the gpu tier it could not use.
        for no in [0.969, f64::NAN] {
            let (mut router, _) = ask(&p, &s, 0.65);
            yes.risk_score = no;
            match router.after_verdict(TierName::Confirm, &yes, &en(), &c, PLENTY) {
                Route::HandOver { next: Stage::Rules, skipped: Some(_), reason, .. } => {
                    assert!(reason.contains(if no.is_nan() { "non-finite" } else { "below confirm_at" }), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        }
        // A failed confirm model: the rules, as without one.
        let (mut router, _) = ask(&p, &s, 0.65);
        let recovery = router.after_failure(TierName::Confirm, Outcome::Shed, &en(), &c, PLENTY);
        assert!(matches!(recovery, Recovery::Fallback(Fallback::Rules { skipped: Some((TierName::Gpu, _)) })));
        // Never asked: below confirm_from; an ok lean; no confirm model; an eligible gpu tier.
        for (risk, confirm, gpu) in [(0.55, true, false), (0.35, true, false), (0.65, false, false), (0.65, true, true)]
        {
            let mut s = s.clone();
            s.confirm = confirm;
            s.gpu.unavailable = (!gpu).then(|| "none".into());
            let mut p = policy("");
            p.cascade.confirm_from = Some(if risk < 0.5 { 0.3 } else { 0.6 });
            let (_, route) = ask(&p, &s, risk);
            assert!(
                !matches!(route, Route::HandOver { next: Stage::Confirm, .. }),
                "{risk} {confirm} {gpu}: {route:?}"
            );
        }
    }

    #[test]
    fn a_failed_tier_hands_over_to_the_other_once_then_rules() {
        let (p, s) = (policy(""), idle());
        let (mut router, _) = Router::start(&complexity(0.2), &p, &s, PLENTY);
        let c = complexity(0.2);
        let recovery = router.after_failure(TierName::Cpu, Outcome::Shed, &en(), &c, PLENTY);
        assert_eq!(recovery, Recovery::Fallback(Fallback::Try(Stage::Gpu)));
        // Not an escalation: no cpu verdict to keep, and the cpu tier was tried.
        let recovery = router.after_failure(TierName::Gpu, Outcome::Error, &en(), &c, PLENTY);
        assert_eq!(recovery, Recovery::Fallback(Fallback::Rules { skipped: None }));
    }

    #[test]
    fn an_unsure_cpu_verdict_names_the_ineligible_gpu_tier_on_the_way_to_rules() {
        let p = policy("");
        let mut s = idle();
        s.gpu.memory = crate::select::GpuMemory::FreeMb(100);
        let (mut router, _) = Router::start(&complexity(0.2), &p, &s, PLENTY);
        let unsure = verdict(0.6, Some(0.5));
        match router.after_verdict(TierName::Cpu, &unsure, &en(), &complexity(0.2), PLENTY) {
            Route::HandOver { next: Stage::Rules, skipped: Some(why), .. } => {
                assert!(why.to_string().contains("free memory"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
}
