//! Live quality as one snapshot per refresh: per window, the labelled decisions by action and
//! truth over all dimensions, the four rates docs/operations.md "Live quality" defines over them,
//! and the served models' ECE — the same numbers the `tiergate_quality_*` gauges carry, read in
//! process by the review console's panel, so that it needs no Prometheus.

use super::Truth;
use serde::Serialize;
use std::sync::RwLock;

/// Labelled decisions of one action: how many were labelled `risk` and `ok`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Split {
    pub risk: u64,
    pub ok: u64,
}

impl Split {
    pub fn total(self) -> u64 {
        self.risk + self.ok
    }
}

/// One window's numbers. Rates are fractions in `[0, 1]`, `None` when their denominator is 0.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WindowQuality {
    /// As written in `[feedback] windows` (`1h`, `7d`): the gauges' `window` label.
    pub window: String,
    /// Labelled decisions decided in the window (one label counts per decision).
    pub labelled: u64,
    pub allow: Split,
    pub review: Split,
    pub block: Split,
    /// block∧risk / block.
    pub block_precision: Option<f64>,
    /// block∧ok / ok: the share of legitimate labelled traffic blocked.
    pub false_block_rate: Option<f64>,
    /// allow∧risk / risk.
    pub risk_allowed_rate: Option<f64>,
    /// review∧risk / review: the share of reviews that were risk.
    pub review_precision: Option<f64>,
    /// ECE (10 bins) of the labelled cpu/gpu decisions; `None` without any.
    pub model_ece: Option<f64>,
    /// The labelled cpu/gpu decisions the ECE is over.
    pub model_labelled: u64,
}

impl WindowQuality {
    /// The window's numbers from its counts per (action, truth) (`unscreened` and other actions
    /// count in `labelled` only) and its models' ECE over `model_labelled` decisions.
    pub fn new(
        window: String,
        counts: impl IntoIterator<Item = (String, Truth, u64)>,
        model_ece: Option<f64>,
        model_labelled: u64,
    ) -> WindowQuality {
        let (mut allow, mut review, mut block, mut labelled) =
            (Split::default(), Split::default(), Split::default(), 0);
        for (action, truth, n) in counts {
            labelled += n;
            let split = match action.as_str() {
                "allow" => &mut allow,
                "review" => &mut review,
                "block" => &mut block,
                _ => continue,
            };
            match truth {
                Truth::Risk => split.risk += n,
                Truth::Ok => split.ok += n,
            }
        }
        let ratio = |num: u64, den: u64| (den > 0).then(|| num as f64 / den as f64);
        let (risk, ok) = (allow.risk + review.risk + block.risk, allow.ok + review.ok + block.ok);
        WindowQuality {
            window,
            labelled,
            allow,
            review,
            block,
            block_precision: ratio(block.risk, block.total()),
            false_block_rate: ratio(block.ok, ok),
            risk_allowed_rate: ratio(allow.risk, risk),
            review_precision: ratio(review.risk, review.total()),
            model_ece,
            model_labelled,
        }
    }
}

/// What the last refresh found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Snapshot {
    /// When it was computed, ms since the Unix epoch.
    pub refreshed_ms: u64,
    /// In `[feedback] windows`' order.
    pub windows: Vec<WindowQuality>,
}

/// The latest snapshot, shared by the refresher (writes) and readers.
#[derive(Debug, Default)]
pub struct Latest(RwLock<Option<Snapshot>>);

impl Latest {
    pub fn set(&self, snapshot: Snapshot) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
    }

    /// `None` until the first refresh.
    pub fn get(&self) -> Option<Snapshot> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_follow_their_definitions_and_are_none_without_a_denominator() {
        let counts = [
            ("block".to_string(), Truth::Risk, 8),
            ("block".to_string(), Truth::Ok, 2),
            ("review".to_string(), Truth::Risk, 3),
            ("review".to_string(), Truth::Ok, 2),
            ("allow".to_string(), Truth::Risk, 1),
            ("allow".to_string(), Truth::Ok, 14),
            ("unscreened".to_string(), Truth::Ok, 4),
        ];
        let w = WindowQuality::new("1h".into(), counts, Some(0.125), 20);
        assert_eq!(
            (w.labelled, w.block, w.review, w.allow),
            (34, Split { risk: 8, ok: 2 }, Split { risk: 3, ok: 2 }, Split { risk: 1, ok: 14 })
        );
        assert_eq!(w.block_precision, Some(0.8));
        assert_eq!(w.false_block_rate, Some(2.0 / 18.0));
        assert_eq!(w.risk_allowed_rate, Some(1.0 / 12.0));
        assert_eq!(w.review_precision, Some(0.6));
        assert_eq!((w.model_ece, w.model_labelled), (Some(0.125), 20));

        let reviews_only = WindowQuality::new("24h".into(), [("review".to_string(), Truth::Ok, 2)], None, 0);
        assert_eq!(reviews_only.block_precision, None);
        assert_eq!(reviews_only.false_block_rate, Some(0.0));
        assert_eq!(reviews_only.risk_allowed_rate, None);
        assert_eq!(reviews_only.review_precision, Some(0.0));
    }

    #[test]
    fn the_latest_snapshot_is_none_until_set() {
        let latest = Latest::default();
        assert_eq!(latest.get(), None);
        let s = Snapshot { refreshed_ms: 7, windows: vec![] };
        latest.set(s.clone());
        assert_eq!(latest.get(), Some(s));
    }
}
