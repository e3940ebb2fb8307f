//! One comparison of observed decisions with the reference, per signal: the KS statistic for
//! the numeric signals, the total variation distance for the language. The live monitor and
//! `tiergate drift` both use it, so the gauges and the report agree.

use super::ks::{ks_p_value, ks_statistic, total_variation};
use super::reference::Reference;
use serde::Deserialize;
use std::collections::BTreeMap;

/// What the drift monitor reads of one decision (the audit record's fields of the same names;
/// other fields of a record are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Observation {
    /// The decision's risk score.
    pub risk_score: f64,
    /// The model stage's OOD score; `None` when no model stage ran.
    #[serde(default)]
    pub ood_score: Option<f64>,
    /// Request text length in chars.
    pub text_chars: u64,
    /// Language code (ISO 639-3 or "und"); `None` when unknown.
    #[serde(default)]
    pub lang: Option<String>,
}

/// How a signal's distance is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Two-sample Kolmogorov–Smirnov statistic (numeric signals).
    Ks,
    /// Total variation distance (categorical: the language).
    Tvd,
}

/// One signal's distance between the observed decisions and the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalDrift {
    /// `risk_score`, `ood_score`, `text_chars` or `language`.
    pub signal: &'static str,
    pub measure: Measure,
    /// Observed values (decisions with this signal).
    pub live: usize,
    /// Reference values.
    pub reference: usize,
    /// The distance in [0, 1]; `None` when no observed decision has this signal.
    pub distance: Option<f64>,
    /// The KS test's asymptotic p-value (`None` for TVD or no data).
    pub p_value: Option<f64>,
}

/// Compares `live` with the reference, one entry per signal: the numeric ones in
/// [`Reference::numeric`] order, then `language`. Non-finite observed values are left out.
pub fn compare(reference: &Reference, live: &[Observation]) -> Vec<SignalDrift> {
    let mut columns: [Vec<f64>; 3] = Default::default();
    let mut langs = BTreeMap::<String, u64>::new();
    for o in live {
        columns[0].push(o.risk_score);
        if let Some(ood) = o.ood_score {
            columns[1].push(ood);
        }
        columns[2].push(o.text_chars as f64);
        *langs.entry(o.lang.clone().unwrap_or_else(|| "und".into())).or_default() += 1;
    }
    let mut out = Vec::with_capacity(4);
    for ((signal, sample), mut column) in reference.numeric().into_iter().zip(columns) {
        column.retain(|x| x.is_finite());
        column.sort_by(f64::total_cmp);
        let distance = ks_statistic(&column, sample);
        out.push(SignalDrift {
            signal,
            measure: Measure::Ks,
            live: column.len(),
            reference: sample.len(),
            distance,
            p_value: distance.map(|d| ks_p_value(d, column.len(), sample.len())),
        });
    }
    out.push(SignalDrift {
        signal: "language",
        measure: Measure::Tvd,
        live: live.len(),
        reference: reference.language.values().sum::<u64>() as usize,
        distance: total_variation(&langs, &reference.language),
        p_value: None,
    });
    out
}
