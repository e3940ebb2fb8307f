//! The window's decisions per time bucket, counted as they stream from the store (oldest first):
//! decisions, reviews and how many were labelled, and — against the model's drift reference —
//! each bucket's distance per signal, computed by `tiergate::drift::compare` as the live monitor
//! and `tiergate drift` compute it. Also the window's totals by kind and action.

use super::read::{Decided, Span};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use tiergate::drift::{compare, Measure, Observation, Reference};

/// One bucket of the window.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Bucket {
    /// Its start, ms since the Unix epoch (a whole hour or day, UTC).
    pub start_ms: u64,
    pub decisions: u64,
    /// Decisions whose action was review.
    pub reviews: u64,
    /// Of the reviews, those labelled.
    pub reviews_labelled: u64,
    /// Decisions labelled (any action).
    pub labelled: u64,
    /// Against the reference; `None` without one or without scored decisions.
    pub drift: Option<Drift>,
}

/// One bucket's distances from the reference (`None`: no decision has the signal).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Drift {
    /// Decisions with a risk score in the bucket.
    pub decisions: u64,
    /// Two-sample KS statistic of the risk score, and its asymptotic p-value.
    pub risk_score: Option<f64>,
    pub risk_score_p: Option<f64>,
    /// KS of the cpu model's OOD score.
    pub ood_score: Option<f64>,
    /// KS of the text length (chars).
    pub text_chars: Option<f64>,
    /// Total variation distance of the language shares.
    pub language: Option<f64>,
}

/// The window's totals.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Totals {
    pub decisions: u64,
    pub by_kind: BTreeMap<String, u64>,
    pub by_action: BTreeMap<String, u64>,
    pub reviews_labelled: u64,
}

/// Counts decisions into buckets; [`Timeline::finish`] hands them over.
pub struct Timeline<'a> {
    span: Span,
    reference: Option<&'a Reference>,
    labelled: &'a HashSet<String>,
    buckets: Vec<Bucket>,
    totals: Totals,
    /// The bucket whose observations are being gathered.
    open: usize,
    observations: Vec<Observation>,
}

impl<'a> Timeline<'a> {
    /// Empty buckets over `span`; `labelled`: the ids of the labelled records.
    pub fn new(span: Span, reference: Option<&'a Reference>, labelled: &'a HashSet<String>) -> Timeline<'a> {
        let buckets = (0..span.buckets()).map(|i| Bucket { start_ms: span.start_of(i), ..Bucket::default() }).collect();
        Timeline { span, reference, labelled, buckets, totals: Totals::default(), open: 0, observations: Vec::new() }
    }

    /// Counts one decision of the span (decisions arrive oldest first).
    pub fn add(&mut self, d: Decided) {
        let i = self.span.bucket_of(d.unix_ms).min(self.buckets.len().saturating_sub(1));
        if i != self.open {
            self.close();
            self.open = i;
        }
        let Some(bucket) = self.buckets.get_mut(i) else { return };
        let labelled = d.record_id.as_ref().is_some_and(|id| self.labelled.contains(id));
        let review = d.action == "review";
        bucket.decisions += 1;
        bucket.labelled += labelled as u64;
        bucket.reviews += review as u64;
        bucket.reviews_labelled += (review && labelled) as u64;
        self.totals.decisions += 1;
        self.totals.reviews_labelled += (review && labelled) as u64;
        *self.totals.by_kind.entry(d.kind).or_default() += 1;
        *self.totals.by_action.entry(d.action).or_default() += 1;
        if self.reference.is_some() {
            self.observations.extend(d.observation);
        }
    }

    /// The open bucket's drift, from its observations.
    fn close(&mut self) {
        let (Some(reference), Some(bucket)) = (self.reference, self.buckets.get_mut(self.open)) else { return };
        if self.observations.is_empty() {
            return;
        }
        let mut drift = Drift { decisions: self.observations.len() as u64, ..Drift::default() };
        for s in compare(reference, &self.observations) {
            match (s.measure, s.signal) {
                (Measure::Ks, "risk_score") => (drift.risk_score, drift.risk_score_p) = (s.distance, s.p_value),
                (Measure::Ks, "ood_score") => drift.ood_score = s.distance,
                (Measure::Ks, "text_chars") => drift.text_chars = s.distance,
                (Measure::Tvd, _) => drift.language = s.distance,
                _ => {}
            }
        }
        bucket.drift = Some(drift);
        self.observations.clear();
    }

    pub fn finish(mut self) -> (Vec<Bucket>, Totals) {
        self.close();
        (self.buckets, self.totals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decided(unix_ms: u64, action: &str, id: &str, risk_score: f64) -> Decided {
        let observation = Observation { risk_score, ood_score: None, text_chars: 10, lang: Some("eng".into()) };
        Decided {
            unix_ms,
            kind: "classify".into(),
            action: action.into(),
            tier: "cpu".into(),
            policy_version: Some("v".into()),
            record_id: Some(id.into()),
            observation: Some(observation),
        }
    }

    #[test]
    fn decisions_land_in_their_buckets_with_their_drift() {
        let span = Span { since_ms: 0, until_ms: 3_000, bucket_ms: 1_000 };
        let labelled: HashSet<String> = ["b".to_string()].into();
        let reference: Reference = serde_json::from_value(serde_json::json!({
            "format": 1, "made_from": "test", "model": {"name": "m", "manifest_sha256": "x"},
            "policy_version": "v", "samples": {"risk_score": [0.1, 0.2], "ood_score": [], "text_chars": [10.0]},
            "language": {"eng": 2}
        }))
        .unwrap();
        let mut t = Timeline::new(span, Some(&reference), &labelled);
        t.add(decided(10, "allow", "a", 0.1));
        t.add(decided(20, "review", "b", 0.9));
        t.add(decided(2_500, "review", "c", 0.9));
        let (buckets, totals) = t.finish();
        let counts: Vec<_> =
            buckets.iter().map(|b| (b.start_ms, b.decisions, b.reviews, b.reviews_labelled, b.labelled)).collect();
        assert_eq!(counts, vec![(0, 2, 1, 1, 1), (1_000, 0, 0, 0, 0), (2_000, 1, 1, 0, 0)]);
        assert_eq!((totals.decisions, totals.reviews_labelled, totals.by_action["review"]), (3, 1, 2));
        let first = buckets[0].drift.as_ref().unwrap();
        assert_eq!(
            (first.decisions, first.risk_score, first.ood_score, first.language),
            (2, Some(0.5), None, Some(0.0))
        );
        assert_eq!(buckets[1].drift, None, "no decisions, nothing to compare");
        assert_eq!(buckets[2].drift.as_ref().unwrap().risk_score, Some(1.0));
    }
}
