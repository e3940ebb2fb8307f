//! After a model tier answered: when its verdict stands, escalates or goes to rules
//! (`after_cpu`, `after_gpu`), including `accept_risk_below`.

use super::tests::{complexity, en, policy, verdict};
use super::*;

#[test]
fn confident_cpu_verdict_is_accepted() {
    let p = policy("");
    assert_eq!(after_cpu(&verdict(0.95, Some(0.5)), &en(), &complexity(0.2), &p, &Ok(())), Next::Accept { note: None });
}

#[test]
fn unsure_cpu_verdict_escalates_when_gpu_is_eligible() {
    let p = policy("");
    match after_cpu(&verdict(0.8, Some(0.5)), &en(), &complexity(0.2), &p, &Ok(())) {
        Next::Escalate { outcome, reason } => {
            assert_eq!(outcome, Outcome::LowConfidence);
            assert_eq!(reason, "confidence 0.800 below escalate_below 0.9");
        }
        other => panic!("{other:?}"),
    }
    match after_cpu(&verdict(0.99, Some(0.97)), &en(), &complexity(0.2), &p, &Ok(())) {
        Next::Escalate { outcome, .. } => assert_eq!(outcome, Outcome::OutOfDistribution, "OOD beats confidence"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsure_cpu_verdict_without_gpu_stands_or_goes_to_rules_by_accept_below() {
    let p = policy("");
    let no_gpu = Err(Ineligible::NotConfigured("no gpu tier configured".into()));
    match after_cpu(&verdict(0.8, Some(0.5)), &en(), &complexity(0.2), &p, &no_gpu) {
        Next::Accept { note: Some(note) } => assert!(note.contains("not escalated: gpu ineligible"), "{note}"),
        other => panic!("{other:?}"),
    }
    match after_cpu(&verdict(0.6, Some(0.5)), &en(), &complexity(0.2), &p, &no_gpu) {
        Next::Rules { outcome, reason } => {
            assert_eq!(outcome, Outcome::LowConfidence);
            assert!(reason.starts_with("confidence 0.600 below accept_below 0.7"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match after_cpu(&verdict(0.99, Some(0.99)), &en(), &complexity(0.2), &p, &no_gpu) {
        Next::Rules { outcome, .. } => assert_eq!(outcome, Outcome::OutOfDistribution),
        other => panic!("{other:?}"),
    }
}

#[test]
fn escalation_needs_gpu_min_complexity() {
    let p = policy("[routing]\ngpu_min_complexity = 0.4\n");
    match after_cpu(&verdict(0.8, Some(0.5)), &en(), &complexity(0.2), &p, &Ok(())) {
        Next::Accept { note: Some(note) } => assert!(note.contains("below gpu_min_complexity 0.4"), "{note}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(after_cpu(&verdict(0.8, Some(0.5)), &en(), &complexity(0.5), &p, &Ok(())), Next::Escalate { .. }));
}

/// A verdict of ok at p(risk) = 1 - confidence.
fn ok_verdict(confidence: f64) -> ModelVerdict {
    ModelVerdict { risk_score: 1.0 - confidence, ..verdict(confidence, Some(0.5)) }
}

#[test]
fn a_risk_verdict_needs_accept_risk_below_to_stand_an_ok_one_does_not() {
    let mut p = policy("");
    p.cascade.accept_risk_below = Some(0.97);
    let no_gpu = Err(Ineligible::NotConfigured("no gpu tier configured".into()));
    // risk at 0.95: above escalate_below (0.9) and accept_below (0.7), below accept_risk_below
    match after_cpu(&verdict(0.95, Some(0.5)), &en(), &complexity(0.2), &p, &no_gpu) {
        Next::Rules { outcome, reason } => {
            assert_eq!(outcome, Outcome::LowConfidence);
            assert!(reason.starts_with("confidence 0.950 below accept_risk_below 0.97"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match after_cpu(&verdict(0.95, Some(0.5)), &en(), &complexity(0.2), &p, &Ok(())) {
        Next::Escalate { outcome, reason } => {
            assert_eq!(outcome, Outcome::LowConfidence);
            assert_eq!(reason, "confidence 0.950 below accept_risk_below 0.97");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(after_cpu(&verdict(0.98, Some(0.5)), &en(), &complexity(0.2), &p, &no_gpu), Next::Accept { note: None });
    // the same confidence for ok stands: only blocking verdicts need the higher bar
    assert_eq!(after_cpu(&ok_verdict(0.95), &en(), &complexity(0.2), &p, &no_gpu), Next::Accept { note: None });
    // the gpu tier's verdicts too
    assert!(matches!(after_gpu(&verdict(0.95, None), &p), Next::Rules { outcome: Outcome::LowConfidence, .. }));
    assert_eq!(after_gpu(&ok_verdict(0.95), &p), Next::Accept { note: None });
    // unset: accept_below for both
    p.cascade.accept_risk_below = None;
    assert_eq!(after_cpu(&verdict(0.95, Some(0.5)), &en(), &complexity(0.2), &p, &no_gpu), Next::Accept { note: None });
}

#[test]
fn gpu_verdict_below_accept_goes_to_rules() {
    let p = policy("");
    assert_eq!(after_gpu(&verdict(0.75, None), &p), Next::Accept { note: None });
    assert!(matches!(after_gpu(&verdict(0.6, None), &p), Next::Rules { outcome: Outcome::LowConfidence, .. }));
    // An unsure gpu answer (even odds) never stands, even under a permissive accept_below.
    let mut lax = policy("");
    lax.cascade.accept_below = 0.0;
    assert_eq!(after_gpu(&verdict(0.51, None), &lax), Next::Accept { note: None });
    match after_gpu(&verdict(0.5, None), &lax) {
        Next::Rules { outcome: Outcome::LowConfidence, reason } => assert!(reason.contains("unsure"), "{reason}"),
        other => panic!("{other:?}"),
    }
}
