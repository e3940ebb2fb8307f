//! The served models on labelled traffic: calibration (reliability bins and ECE, as the
//! `tiergate_quality_model_ece` gauge computes it) and the precision/recall curve over the risk
//! score with the policy's thresholds read off it. Only model-tier decisions (`cpu`, `gpu`) count:
//! their risk score is a calibrated probability and the policy's thresholds turned it into the
//! action; a rule's score is declared, not predicted.

use serde::Serialize;
use std::collections::BTreeMap;
use tiergate::calibrate::{ece, reliability, ReliabilityBin};
use tiergate::feedback::store::Labelled;
use tiergate::feedback::Truth;

/// Equal-width confidence bins, as live quality's ECE.
pub const BINS: usize = 10;

/// Most points kept of the PR curve (one per distinct score would be megabytes for a week).
const MAX_POINTS: usize = 200;

/// The model-tier decisions of `labelled`: (risk score, truth was risk, scenario).
pub fn scored(labelled: &[Labelled]) -> Vec<(f64, bool, Option<&str>)> {
    labelled
        .iter()
        .filter(|r| matches!(r.tier.as_str(), "cpu" | "gpu"))
        .filter_map(|r| {
            r.risk_score.filter(|p| p.is_finite()).map(|p| (p, r.truth == Truth::Risk, r.scenario.as_deref()))
        })
        .collect()
}

/// Calibration of the model tiers on labelled traffic.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Calibration {
    /// Labelled model-tier decisions.
    pub decisions: u64,
    /// Expected calibration error over [`BINS`] bins of the predicted label's probability;
    /// `None` without decisions.
    pub ece: Option<f64>,
    pub bins: Vec<ReliabilityBin>,
}

/// The predicted label's probability is `max(p, 1 − p)`; it was right when `p ≥ 0.5` agrees
/// with the truth.
pub fn calibration(scored: &[(f64, bool, Option<&str>)]) -> Calibration {
    let confidence: Vec<f64> = scored.iter().map(|(p, _, _)| p.max(1.0 - p)).collect();
    let correct: Vec<bool> = scored.iter().map(|(p, risk, _)| (*p >= 0.5) == *risk).collect();
    Calibration {
        decisions: scored.len() as u64,
        ece: (!scored.is_empty()).then(|| ece(&confidence, &correct, BINS)),
        bins: reliability(&confidence, &correct, BINS),
    }
}

/// A point of the curve: flag every decision scored at or above `threshold`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PrPoint {
    pub threshold: f64,
    /// Flagged ∧ risk ÷ risk.
    pub recall: f64,
    /// Flagged ∧ risk ÷ flagged.
    pub precision: f64,
}

/// A threshold of the policy read off its decisions.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AtThreshold {
    /// `all` (every model-tier decision, at the policy's own thresholds) or a scenario's name
    /// (its decisions, at its thresholds).
    pub scope: String,
    /// `review_at` or `block_at`.
    pub name: &'static str,
    pub threshold: f64,
    /// Model-tier decisions in the scope.
    pub decisions: u64,
    /// Of them, scored at or above the threshold.
    pub flagged: u64,
    pub recall: Option<f64>,
    pub precision: Option<f64>,
}

/// The curve and the policy's thresholds on it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Pr {
    pub decisions: u64,
    /// Of them, labelled risk.
    pub risk: u64,
    /// Thresholds descending (recall ascending); empty without risk labels.
    pub points: Vec<PrPoint>,
    pub at: Vec<AtThreshold>,
}

/// The policy's thresholds: its own, and each scenario's (review_at, block_at).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Thresholds {
    pub dir: String,
    pub version: String,
    pub review_at: f64,
    pub block_at: f64,
    pub scenarios: BTreeMap<String, (f64, f64)>,
}

/// The curve of `scored`, with `thresholds` read off it when given.
pub fn pr(scored: &[(f64, bool, Option<&str>)], thresholds: Option<&Thresholds>) -> Pr {
    let mut sorted: Vec<(f64, bool)> = scored.iter().map(|(p, risk, _)| (*p, *risk)).collect();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let risk = sorted.iter().filter(|(_, r)| *r).count();
    let mut points = Vec::new();
    let (mut tp, mut flagged) = (0usize, 0usize);
    for (i, (p, is_risk)) in sorted.iter().enumerate() {
        tp += *is_risk as usize;
        flagged += 1;
        // A point where the score changes: every decision with this score is flagged together.
        if risk > 0 && sorted.get(i + 1).is_none_or(|next| next.0 < *p) {
            points.push(PrPoint {
                threshold: *p,
                recall: tp as f64 / risk as f64,
                precision: tp as f64 / flagged as f64,
            });
        }
    }
    let stride = points.len().div_ceil(MAX_POINTS).max(1);
    let last = points.last().copied();
    let mut points: Vec<PrPoint> = points.into_iter().step_by(stride).collect();
    if points.last() != last.as_ref() {
        points.extend(last);
    }
    let mut at = Vec::new();
    if let Some(t) = thresholds {
        let all: Vec<(f64, bool)> = sorted.clone();
        at.extend(read_off("all", &all, t.review_at, t.block_at));
        for (name, (review_at, block_at)) in &t.scenarios {
            let own: Vec<(f64, bool)> =
                scored.iter().filter(|(_, _, s)| *s == Some(name.as_str())).map(|(p, r, _)| (*p, *r)).collect();
            if !own.is_empty() {
                at.extend(read_off(name, &own, *review_at, *block_at));
            }
        }
    }
    Pr { decisions: sorted.len() as u64, risk: risk as u64, points, at }
}

fn read_off(scope: &str, scored: &[(f64, bool)], review_at: f64, block_at: f64) -> [AtThreshold; 2] {
    let risk = scored.iter().filter(|(_, r)| *r).count() as u64;
    let at = |name: &'static str, threshold: f64| {
        let flagged = scored.iter().filter(|(p, _)| *p >= threshold).count() as u64;
        let hits = scored.iter().filter(|(p, r)| *p >= threshold && *r).count() as u64;
        AtThreshold {
            scope: scope.to_string(),
            name,
            threshold,
            decisions: scored.len() as u64,
            flagged,
            recall: (risk > 0).then(|| hits as f64 / risk as f64),
            precision: (flagged > 0).then(|| hits as f64 / flagged as f64),
        }
    };
    [at("review_at", review_at), at("block_at", block_at)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_steps_at_each_distinct_score_and_thresholds_read_off_it() {
        let scored = [(0.9, true, None), (0.9, false, None), (0.6, true, Some("payments")), (0.2, false, None)];
        let t = Thresholds {
            dir: "p".into(),
            version: "v".into(),
            review_at: 0.5,
            block_at: 0.95,
            scenarios: [("payments".to_string(), (0.3, 0.6))].into(),
        };
        let pr = pr(&scored, Some(&t));
        assert_eq!((pr.decisions, pr.risk), (4, 2));
        let pts: Vec<(f64, f64, f64)> = pr.points.iter().map(|p| (p.threshold, p.recall, p.precision)).collect();
        assert_eq!(pts, vec![(0.9, 0.5, 0.5), (0.6, 1.0, 2.0 / 3.0), (0.2, 1.0, 0.5)]);
        let review = &pr.at[0];
        assert_eq!((review.scope.as_str(), review.flagged, review.recall), ("all", 3, Some(1.0)));
        let block = &pr.at[1];
        assert_eq!((block.flagged, block.recall, block.precision), (0, Some(0.0), None));
        let payments_block = &pr.at[3];
        assert_eq!((payments_block.scope.as_str(), payments_block.name), ("payments", "block_at"));
        assert_eq!((payments_block.decisions, payments_block.flagged, payments_block.precision), (1, 1, Some(1.0)));
    }

    #[test]
    fn calibration_matches_the_live_gauge_formula() {
        let scored = [(0.9, true, None), (0.2, true, None), (0.1, false, None)];
        let c = calibration(&scored);
        assert_eq!(c.decisions, 3);
        // Confidences 0.9 (right), 0.8 (wrong), 0.9 (right): bin [0.8, 0.9) holds 0.8, the last 0.9s.
        let expected = (1.0 / 3.0) * (0.0f64 - 0.8).abs() + (2.0 / 3.0) * (1.0f64 - 0.9).abs();
        assert!((c.ece.unwrap() - expected).abs() < 1e-12, "{:?}", c.ece);
        assert_eq!(calibration(&[]).ece, None);
    }
}
