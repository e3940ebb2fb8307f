//! The complexity rater: how hard a request is for the cpu tier, in [0, 1], with the
//! contribution of each feature so a decision can say *why* it counted as complex.
//!
//! Cheap by construction (no model call; the bench `request_path` measures it): every feature
//! is a count scaled to [0, 1] by the count at which it saturates (`*_full` in the policy's
//! `[complexity]`), and the score is the weighted sum, clamped to [0, 1]. The cpu tier's
//! out-of-distribution score is known only after the cpu tier ran; [`Complexity::with_ood`]
//! adds it then.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `[complexity]` in the policy: feature weights and saturation points.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ComplexitySpec {
    /// Weight per feature: `tokens`, `sentences`, `links`, `numbers`, `non_ascii`, `scripts`,
    /// `signals`, `features`, `ood`. A missing weight is 0.
    pub weights: BTreeMap<String, f64>,
    /// Token count (from the cpu model's tokenizer) at which `tokens` reaches 1. Also bounds the
    /// cost of counting (see `OnnxPool::count_tokens`).
    pub tokens_full: usize,
    pub sentences_full: usize,
    pub links_full: usize,
    pub numbers_full: usize,
    /// Total signal matches at which `signals` reaches 1.
    pub signals_full: usize,
    /// Number of request `features` at which `features` reaches 1.
    pub features_full: usize,
}

/// The feature names a weight may use.
pub const FEATURES: [&str; 9] =
    ["tokens", "sentences", "links", "numbers", "non_ascii", "scripts", "signals", "features", "ood"];

impl Default for ComplexitySpec {
    fn default() -> Self {
        let weights = [
            ("tokens", 0.3),
            ("sentences", 0.1),
            ("links", 0.1),
            ("numbers", 0.05),
            ("non_ascii", 0.1),
            ("scripts", 0.1),
            ("signals", 0.1),
            ("features", 0.05),
            ("ood", 0.4),
        ];
        ComplexitySpec {
            weights: weights.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            tokens_full: 64,
            sentences_full: 12,
            links_full: 3,
            numbers_full: 8,
            signals_full: 6,
            features_full: 16,
        }
    }
}

impl ComplexitySpec {
    /// Problems with the spec, for policy validation.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, w) in &self.weights {
            if !FEATURES.contains(&name.as_str()) {
                out.push(format!("unknown feature `{name}` in weights; known: {}", FEATURES.join(", ")));
            }
            if !(0.0..=1.0).contains(w) {
                out.push(format!("weight of `{name}` must be in [0, 1], got {w}"));
            }
        }
        let fulls = [
            ("tokens_full", self.tokens_full),
            ("sentences_full", self.sentences_full),
            ("links_full", self.links_full),
            ("numbers_full", self.numbers_full),
            ("signals_full", self.signals_full),
            ("features_full", self.features_full),
        ];
        out.extend(fulls.iter().filter(|(_, v)| *v == 0).map(|(n, _)| format!("`{n}` must be at least 1")));
        out
    }

    fn weight(&self, name: &str) -> f64 {
        self.weights.get(name).copied().unwrap_or(0.0)
    }
}

/// Raw counts measured on one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TextStats {
    /// Tokens, counted up to the saturation point only (longer texts are not tokenised further).
    pub tokens: usize,
    pub sentences: usize,
    pub links: usize,
    pub numbers: usize,
    /// Share of non-ASCII characters, [0, 1].
    pub non_ascii: f64,
    /// Distinct scripts among letters (Latin, Cyrillic, Greek, CJK, Arabic, other): 1 is normal.
    pub scripts: usize,
    /// Total matches of the policy's signals.
    pub signal_hits: usize,
    /// Keys in the request's `features`.
    pub features: usize,
}

/// A complexity score with each feature's weighted contribution (they sum to the score before clamping).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Complexity {
    pub score: f64,
    pub contributions: BTreeMap<&'static str, f64>,
}

impl Complexity {
    /// The score once the cpu tier's OOD score is known.
    pub fn with_ood(&self, spec: &ComplexitySpec, ood_score: f64) -> Complexity {
        let mut contributions = self.contributions.clone();
        contributions.insert("ood", spec.weight("ood") * ood_score.clamp(0.0, 1.0));
        Complexity { score: contributions.values().sum::<f64>().clamp(0.0, 1.0), contributions }
    }
}

/// Rates `stats` under `spec`. Zero contributions are left out.
pub fn assess(stats: &TextStats, spec: &ComplexitySpec) -> Complexity {
    let sat = |count: usize, full: usize| (count as f64 / full as f64).min(1.0);
    let features = [
        ("tokens", sat(stats.tokens, spec.tokens_full)),
        ("sentences", sat(stats.sentences, spec.sentences_full)),
        ("links", sat(stats.links, spec.links_full)),
        ("numbers", sat(stats.numbers, spec.numbers_full)),
        ("non_ascii", stats.non_ascii.clamp(0.0, 1.0)),
        // One script is the normal case; each extra one is a step towards "mixed".
        ("scripts", (stats.scripts.saturating_sub(1) as f64 / 2.0).min(1.0)),
        ("signals", sat(stats.signal_hits, spec.signals_full)),
        ("features", sat(stats.features, spec.features_full)),
    ];
    let contributions: BTreeMap<&'static str, f64> =
        features.iter().map(|(n, v)| (*n, spec.weight(n) * v)).filter(|(_, c)| *c > 0.0).collect();
    Complexity { score: contributions.values().sum::<f64>().clamp(0.0, 1.0), contributions }
}

/// Counts sentences, links, numbers, non-ASCII share and scripts in one pass over the text.
/// Tokens, signal hits and features are filled in by the caller (they need the tokenizer,
/// the policy and the request).
pub fn scan(text: &str) -> TextStats {
    let mut stats = TextStats::default();
    let (mut chars, mut non_ascii) = (0usize, 0usize);
    let mut scripts = [false; 6];
    let mut in_number = false;
    let mut prev_terminal = false;
    let mut saw_word = false;
    let mut iter = text.chars().peekable();
    while let Some(c) = iter.next() {
        chars += 1;
        if !c.is_ascii() {
            non_ascii += 1;
        }
        if c.is_alphabetic() {
            scripts[script_of(c)] = true;
            saw_word = true;
        }
        let digit = c.is_ascii_digit();
        if digit && !in_number {
            stats.numbers += 1;
        }
        in_number = digit || (in_number && matches!(c, '.' | ','));
        // A full stop ends a sentence only before whitespace or the end ("x.io", "1.50" do not).
        let terminal = matches!(c, '.' | '!' | '?' | '。' | '！' | '？')
            && iter.peek().is_none_or(|n| n.is_whitespace() || matches!(n, '.' | '!' | '?'));
        if terminal && !prev_terminal && saw_word {
            stats.sentences += 1;
            saw_word = false;
        }
        prev_terminal = terminal;
    }
    if saw_word {
        stats.sentences += 1; // a last sentence without a full stop
    }
    stats.links = text.match_indices("://").count() + text.match_indices("www.").count();
    stats.non_ascii = if chars > 0 { non_ascii as f64 / chars as f64 } else { 0.0 };
    stats.scripts = scripts.iter().filter(|&&s| s).count();
    stats
}

fn script_of(c: char) -> usize {
    match c as u32 {
        0x0000..=0x024F => 0,                                     // Latin
        0x0370..=0x03FF => 1,                                     // Greek
        0x0400..=0x052F => 2,                                     // Cyrillic
        0x0600..=0x06FF | 0x0750..=0x077F => 3,                   // Arabic
        0x3040..=0x30FF | 0x3400..=0x9FFF | 0xAC00..=0xD7AF => 4, // Kana, CJK, Hangul
        _ => 5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_counts_what_it_says() {
        let s = scan("Hello there. Visit https://x.io now! Pay 1,200.50 or 30 today");
        assert_eq!(s.sentences, 3);
        assert_eq!(s.links, 1);
        assert_eq!(s.numbers, 2);
        assert_eq!(s.scripts, 1);
        assert_eq!(s.non_ascii, 0.0);
        let s = scan("Привет, это bank. 你好");
        assert_eq!(s.scripts, 3);
        assert!(s.non_ascii > 0.4);
    }

    #[test]
    fn contributions_sum_to_the_score_and_saturate() {
        let spec = ComplexitySpec::default();
        let stats = TextStats { tokens: 128, sentences: 1, links: 0, features: 0, ..Default::default() };
        let c = assess(&stats, &spec);
        assert_eq!(c.contributions["tokens"], 0.3, "tokens saturate at tokens_full");
        assert!((c.score - c.contributions.values().sum::<f64>()).abs() < 1e-12);
        assert!(!c.contributions.contains_key("links"), "zero contributions are left out");
        let with = c.with_ood(&spec, 1.0);
        assert!((with.score - (c.score + 0.4)).abs() < 1e-12);
        assert_eq!(with.contributions["ood"], 0.4);
    }

    #[test]
    fn score_is_clamped_to_one() {
        let mut spec = ComplexitySpec::default();
        spec.weights = FEATURES.iter().map(|f| (f.to_string(), 1.0)).collect();
        let stats = TextStats {
            tokens: 999,
            sentences: 99,
            links: 9,
            numbers: 99,
            non_ascii: 1.0,
            scripts: 4,
            signal_hits: 99,
            features: 99,
        };
        assert_eq!(assess(&stats, &spec).score, 1.0);
    }

    #[test]
    fn spec_problems_are_reported() {
        let mut spec = ComplexitySpec::default();
        spec.weights.insert("tokenz".into(), 0.2);
        spec.weights.insert("links".into(), 1.5);
        spec.tokens_full = 0;
        let p = spec.problems();
        assert_eq!(p.len(), 3, "{p:?}");
    }
}
