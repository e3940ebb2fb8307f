//! Tier selection: pure functions of (model verdict, policy, gpu state) -> what happens next,
//! with the reason in words. No threads, clocks or I/O here, so every branch is unit-tested.

use crate::policy::Cascade;
use crate::tier::ModelVerdict;

/// What the cascade does with a cpu-tier verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterModel {
    /// The verdict stands.
    Accept,
    /// Not trusted: the next stage decides. `outcome` names why for `path`.
    Fallback { outcome: &'static str, reason: String },
}

/// Accept a model verdict only if it is confident and in distribution.
/// Out-of-distribution is checked first: on inputs unlike the training data a high
/// confidence is a guess, not evidence.
pub fn after_model(v: &ModelVerdict, cascade: &Cascade) -> AfterModel {
    if let Some(ood) = v.ood_score.filter(|&o| o > cascade.ood_above) {
        return AfterModel::Fallback {
            outcome: "out_of_distribution",
            reason: format!("ood_score {ood:.3} above ood_above {}", cascade.ood_above),
        };
    }
    if v.confidence < cascade.accept_below {
        return AfterModel::Fallback {
            outcome: "low_confidence",
            reason: format!("confidence {:.3} below accept_below {}", v.confidence, cascade.accept_below),
        };
    }
    AfterModel::Accept
}

/// Why the gpu tier cannot take a request, or `None` when it could.
/// `configured`: whether config names a gpu backend; `probe_reason`: why no CUDA device is usable.
pub fn gpu_unavailable(configured: bool, probe_reason: Option<&str>) -> Option<String> {
    match (configured, probe_reason) {
        (false, None) => Some("no gpu tier configured (gpu.backend = \"none\")".into()),
        (false, Some(why)) => Some(format!("no gpu tier configured (gpu.backend = \"none\"); {why}")),
        (true, Some(why)) => Some(why.to_string()),
        (true, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(confidence: f64, ood_score: f64) -> ModelVerdict {
        ModelVerdict {
            risk_score: confidence,
            confidence,
            ood_score: Some(ood_score),
            tokens: Some(10),
            queue_us: 0,
            infer_us: 0,
            batch_size: 1,
            endpoint: None,
        }
    }

    const CASCADE: Cascade = Cascade { accept_below: 0.9, ood_above: 0.99 };

    #[test]
    fn confident_in_distribution_verdict_is_accepted() {
        assert_eq!(after_model(&verdict(0.95, 0.5), &CASCADE), AfterModel::Accept);
        assert_eq!(after_model(&verdict(0.9, 0.99), &CASCADE), AfterModel::Accept, "bounds are inclusive");
    }

    #[test]
    fn low_confidence_falls_back_with_reason() {
        match after_model(&verdict(0.7, 0.5), &CASCADE) {
            AfterModel::Fallback { outcome, reason } => {
                assert_eq!(outcome, "low_confidence");
                assert_eq!(reason, "confidence 0.700 below accept_below 0.9");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn out_of_distribution_wins_over_high_confidence() {
        match after_model(&verdict(0.999, 0.995), &CASCADE) {
            AfterModel::Fallback { outcome, .. } => assert_eq!(outcome, "out_of_distribution"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gpu_reasons() {
        assert!(gpu_unavailable(false, None).unwrap().contains("no gpu tier configured"));
        let both = gpu_unavailable(false, Some("no CUDA driver (libcuda not found)")).unwrap();
        assert!(both.contains("libcuda") && both.contains("gpu.backend"));
        assert_eq!(gpu_unavailable(true, Some("x")).as_deref(), Some("x"));
        assert_eq!(gpu_unavailable(true, None), None);
    }
}
