//! Labelled decisions counted by action and truth per value of a dimension (tier, deciding rule,
//! scenario, language, tenant, reviewer, ...), and the four rates the report shows for each row —
//! the same ratios as live quality's PromQL (`tiergate::feedback::quality`):
//!
//! - block precision = blocked ∧ risk ÷ blocked
//! - false-block rate = blocked ∧ ok ÷ ok
//! - risk-allowed rate = allowed ∧ risk ÷ risk
//! - review precision = reviewed ∧ risk ÷ reviewed (the share of reviews that were risk)

use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use tiergate::feedback::Truth;

/// Most rows in one table; the values with the fewest labels beyond it are folded into one
/// `other` row (tenants and reviewers are not bounded by the policy).
pub const MAX_ROWS: usize = 40;

/// Decisions by truth.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ByTruth {
    pub risk: u64,
    pub ok: u64,
}

impl ByTruth {
    pub fn add(&mut self, truth: Truth) {
        match truth {
            Truth::Risk => self.risk += 1,
            Truth::Ok => self.ok += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.risk + self.ok
    }

    fn merge(&mut self, other: ByTruth) {
        self.risk += other.risk;
        self.ok += other.ok;
    }
}

/// One value of a dimension: its labelled decisions by action and truth, and the rates.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Row {
    pub value: String,
    /// Labelled decisions (or labels, in the per-source and per-reviewer tables).
    pub labelled: u64,
    pub truth: ByTruth,
    /// By the decision's action (allow, review, block, unscreened): its truths.
    pub actions: BTreeMap<String, ByTruth>,
    /// blocked ∧ risk ÷ blocked; `None` when nothing was blocked.
    pub block_precision: Option<f64>,
    /// blocked ∧ ok ÷ ok; `None` when nothing was labelled ok.
    pub false_block_rate: Option<f64>,
    /// allowed ∧ risk ÷ risk; `None` when nothing was labelled risk.
    pub risk_allowed_rate: Option<f64>,
    /// reviewed ∧ risk ÷ reviewed; `None` when nothing was reviewed.
    pub review_precision: Option<f64>,
}

fn ratio(n: u64, d: u64) -> Option<f64> {
    (d > 0).then(|| n as f64 / d as f64)
}

impl Row {
    /// The truths of decisions with `action`.
    pub fn cell(&self, action: &str) -> ByTruth {
        self.actions.get(action).copied().unwrap_or_default()
    }

    fn add(&mut self, action: &str, truth: Truth) {
        self.labelled += 1;
        self.truth.add(truth);
        self.actions.entry(action.to_string()).or_default().add(truth);
    }

    fn merge(&mut self, other: &Row) {
        self.labelled += other.labelled;
        self.truth.merge(other.truth);
        for (action, t) in &other.actions {
            self.actions.entry(action.clone()).or_default().merge(*t);
        }
    }

    fn with_rates(mut self) -> Row {
        let (block, allow, review) = (self.cell("block"), self.cell("allow"), self.cell("review"));
        self.block_precision = ratio(block.risk, block.total());
        self.false_block_rate = ratio(block.ok, self.truth.ok);
        self.risk_allowed_rate = ratio(allow.risk, self.truth.risk);
        self.review_precision = ratio(review.risk, review.total());
        self
    }
}

/// The rows of `items` — (value, the decision's action, the truth) — most labelled first (ties by
/// value); past [`MAX_ROWS`], the rest in one row `other (N values)`.
pub fn rows<'a>(items: impl IntoIterator<Item = (String, &'a str, Truth)>) -> Vec<Row> {
    let mut by_value: HashMap<String, Row> = HashMap::new();
    for (value, action, truth) in items {
        by_value.entry(value).or_insert_with_key(|v| Row { value: v.clone(), ..Row::default() }).add(action, truth);
    }
    let mut rows: Vec<Row> = by_value.into_values().collect();
    rows.sort_by(|a, b| b.labelled.cmp(&a.labelled).then_with(|| a.value.cmp(&b.value)));
    if rows.len() > MAX_ROWS {
        let rest = rows.split_off(MAX_ROWS - 1);
        let mut other = Row { value: format!("other ({} values)", rest.len()), ..Row::default() };
        rest.iter().for_each(|r| other.merge(r));
        rows.push(other);
    }
    rows.into_iter().map(Row::with_rates).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Truth::{Ok as Fine, Risk};

    #[test]
    fn rates_are_the_documented_ratios() {
        let items = [
            ("cpu", "block", Risk),
            ("cpu", "block", Risk),
            ("cpu", "block", Fine),
            ("cpu", "allow", Risk),
            ("cpu", "allow", Fine),
            ("cpu", "review", Fine),
            ("rules", "review", Risk),
        ];
        let rows = rows(items.iter().map(|(v, a, t)| (v.to_string(), *a, *t)));
        assert_eq!(rows.len(), 2);
        let cpu = &rows[0];
        assert_eq!((cpu.value.as_str(), cpu.labelled, cpu.truth), ("cpu", 6, ByTruth { risk: 3, ok: 3 }));
        assert_eq!(cpu.cell("block"), ByTruth { risk: 2, ok: 1 });
        assert_eq!(cpu.block_precision, Some(2.0 / 3.0));
        assert_eq!(cpu.false_block_rate, Some(1.0 / 3.0));
        assert_eq!(cpu.risk_allowed_rate, Some(1.0 / 3.0));
        assert_eq!(cpu.review_precision, Some(0.0));
        let rules = &rows[1];
        assert_eq!((rules.block_precision, rules.false_block_rate), (None, None), "nothing blocked, nothing ok");
        assert_eq!((rules.risk_allowed_rate, rules.review_precision), (Some(0.0), Some(1.0)));
    }

    #[test]
    fn values_past_the_limit_fold_into_one_row() {
        let items: Vec<(String, &str, Truth)> =
            (0..MAX_ROWS + 5).map(|i| (format!("tenant-{i:03}"), "allow", Truth::Ok)).collect();
        let rows = rows(items);
        assert_eq!(rows.len(), MAX_ROWS);
        let other = rows.last().unwrap();
        assert_eq!((other.value.as_str(), other.labelled), ("other (6 values)", 6));
        assert_eq!(rows.iter().map(|r| r.labelled).sum::<u64>(), (MAX_ROWS + 5) as u64);
    }
}
