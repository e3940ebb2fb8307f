//! What `tiergate tune` fits, as pure functions of labelled model scores: the held-out split, the
//! rates a policy would give, the temperature, the block and review thresholds on a grid, and the
//! judgement of a proposal against the current values on the held-out rows.
//!
//! Definitions (per group: a scenario, or the policy as written; over the labelled decisions a
//! model tier made, the ones thresholds apply to):
//! - *false-block rate*: ok-labelled decisions blocked / ok-labelled decisions;
//! - *block recall*: risk-labelled blocked / risk-labelled; *block precision*: risk among blocked;
//! - *risk-allowed rate*: risk-labelled allowed (score below `review_at`) / risk-labelled;
//! - *review share*: decisions in review (`review_at <= score < block_at`) / decisions.
//!
//! The block threshold is the lowest grid point whose false-block rate is within the budget (the
//! most risk blocked the budget allows); the review threshold is the lowest grid point, at or
//! below the block threshold, whose review share is within the review budget (the fewest risks
//! allowed for the reviewers' load).

use tiergate::calibrate::{fit_temperature, logit, nll, retemper};

/// Thresholds are fitted on multiples of this.
pub const GRID_STEP: f64 = 0.01;
/// Least risk-labelled model decisions in each split of a group for a threshold fit.
pub const MIN_RISK: usize = 10;
/// Least labelled cpu decisions of each class in each split for a temperature fit.
pub const MIN_PER_CLASS_T: usize = 20;

/// One labelled model decision as the fit reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Its risk score as served (cpu rows: at the current cpu temperature).
    pub score: f64,
    /// Made by the cpu tier (whose scores a temperature moves), not the gpu tier.
    pub cpu: bool,
    pub risk: bool,
    /// In the held-out split.
    pub held_out: bool,
}

/// Whether `record_id` is held out under `seed`: the first 8 bytes of SHA-256(seed, id) as a
/// share of 2^64 below `share`. Depends on the row alone, not on its position or what else was
/// read, so the same labels split the same way on every run.
pub fn held_out(record_id: &str, seed: u64, share: f64) -> bool {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new().chain_update(seed.to_le_bytes()).chain_update(record_id.as_bytes()).finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    (u64::from_le_bytes(head) as f64 / 2f64.powi(64)) < share
}

/// Least ok-labelled decisions in each split for a false-block budget: one false block must fit
/// in it (`ceil(1 / budget)`), and never fewer than 20.
pub fn min_ok(max_false_block: f64) -> usize {
    if max_false_block <= 0.0 {
        return usize::MAX;
    }
    ((1.0 / max_false_block) - 1e-9).ceil().max(20.0) as usize
}

/// A policy's reading of scores: the cpu temperature and the two thresholds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    pub temperature: f64,
    pub review_at: f64,
    pub block_at: f64,
}

/// What a [`Setting`] does to a set of rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Rates {
    pub rows: usize,
    pub ok: usize,
    pub risk: usize,
    pub false_block_rate: f64,
    pub block_recall: f64,
    /// `None` when nothing is blocked.
    pub block_precision: Option<f64>,
    pub risk_allowed_rate: f64,
    pub review_share: f64,
}

/// `row`'s score under `temperature`, from the `current` one it was served at.
pub fn score_at(row: &Row, current: f64, temperature: f64) -> f64 {
    if row.cpu {
        retemper(row.score, current, temperature)
    } else {
        row.score
    }
}

/// The rates of `setting` over `rows` (served at cpu temperature `current`).
pub fn rates<'a>(rows: impl IntoIterator<Item = &'a Row>, current: f64, setting: &Setting) -> Rates {
    let (mut r, mut ok_blocked, mut risk_blocked, mut risk_allowed, mut review) = (Rates::default(), 0, 0, 0, 0);
    for row in rows {
        let s = score_at(row, current, setting.temperature);
        let (blocked, reviewed) = (s >= setting.block_at, s >= setting.review_at && s < setting.block_at);
        r.rows += 1;
        review += reviewed as usize;
        if row.risk {
            r.risk += 1;
            risk_blocked += blocked as usize;
            risk_allowed += (s < setting.review_at) as usize;
        } else {
            r.ok += 1;
            ok_blocked += blocked as usize;
        }
    }
    let share = |n: usize, of: usize| if of == 0 { 0.0 } else { n as f64 / of as f64 };
    r.false_block_rate = share(ok_blocked, r.ok);
    r.block_recall = share(risk_blocked, r.risk);
    r.block_precision = (ok_blocked + risk_blocked > 0).then(|| share(risk_blocked, ok_blocked + risk_blocked));
    r.risk_allowed_rate = share(risk_allowed, r.risk);
    r.review_share = share(review, r.rows);
    r
}

/// The grid: 0, 0.01, ..., 1 (exact decimals, as they are written into the policy).
fn grid() -> impl Iterator<Item = f64> {
    (0..=100).map(|i| i as f64 / 100.0)
}

/// The lowest grid threshold whose false-block rate over `rows` (at `temperature`) is within
/// `max_false_block`: the most risk blocked that the budget allows. 1.0 blocks only a score of 1.
pub fn fit_block(rows: &[&Row], current: f64, temperature: f64, max_false_block: f64) -> f64 {
    let scores: Vec<(f64, bool)> = rows.iter().map(|r| (score_at(r, current, temperature), r.risk)).collect();
    let ok = scores.iter().filter(|(_, risk)| !risk).count().max(1) as f64;
    grid()
        .find(|&t| scores.iter().filter(|&&(s, risk)| !risk && s >= t).count() as f64 / ok <= max_false_block)
        .unwrap_or(1.0)
}

/// The lowest grid threshold at or below `block_at` whose review share over `rows` (at
/// `temperature`) is within `max_review_share`: the fewest risks allowed for the reviewers' load.
pub fn fit_review(rows: &[&Row], current: f64, temperature: f64, block_at: f64, max_review_share: f64) -> f64 {
    let scores: Vec<f64> = rows.iter().map(|r| score_at(r, current, temperature)).collect();
    let n = scores.len().max(1) as f64;
    grid()
        .filter(|&t| t <= block_at)
        .find(|&t| scores.iter().filter(|&&s| s >= t && s < block_at).count() as f64 / n <= max_review_share)
        .unwrap_or(block_at)
}

/// The temperature fit of cpu rows: the logit margins `current · logit(score)` (exact for two
/// classes) and their labels, as [`fit_temperature`] and [`nll`] read them.
pub struct Margins {
    pub logits: Vec<Vec<f32>>,
    pub labels: Vec<usize>,
}

impl Margins {
    /// The cpu rows of `rows`; a score of exactly 0 or 1 (no finite margin) is left out.
    pub fn of<'a>(rows: impl IntoIterator<Item = &'a Row>, current: f64) -> Margins {
        let (logits, labels) = rows
            .into_iter()
            .filter(|r| r.cpu && r.score > 0.0 && r.score < 1.0)
            .map(|r| (vec![0.0, (current * logit(r.score)) as f32], r.risk as usize))
            .unzip();
        Margins { logits, labels }
    }

    /// The fewer of its two classes.
    pub fn least_class(&self) -> usize {
        let risk = self.labels.iter().sum::<usize>();
        risk.min(self.labels.len() - risk)
    }

    /// The NLL-minimising temperature, rounded to 0.01 (as it is written into the policy).
    pub fn fit(&self) -> f64 {
        (fit_temperature(&self.logits, &self.labels) * 100.0).round().max(1.0) / 100.0
    }

    pub fn nll(&self, temperature: f64) -> f64 {
        nll(&self.logits, &self.labels, temperature)
    }
}

/// How a proposal compares with the current value on the held-out rows.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    /// Different, and better on the held-out rows, as the reason says.
    Improves(String),
    /// The fit gives the current value.
    Unchanged,
    /// Different, and not better on the held-out rows: the reason, in words.
    Worse(String),
}

/// The temperature: better when its held-out NLL is lower.
pub fn judge_temperature(current: f64, proposed: f64, held_out: &Margins) -> Judgement {
    if (current - proposed).abs() < 1e-9 {
        return Judgement::Unchanged;
    }
    let (before, after) = (held_out.nll(current), held_out.nll(proposed));
    let said = format!("held-out NLL {before:.4} -> {after:.4} over {} cpu decisions", held_out.labels.len());
    if after < before {
        Judgement::Improves(said)
    } else {
        Judgement::Worse(said)
    }
}

/// The block threshold (under its temperature): better when its held-out false-block rate is
/// within the budget and it blocks at least the current share of risk, or, when the current
/// one is over the budget, when it brings the rate down within it.
pub fn judge_block(before: &Rates, after: &Rates, changed: bool, max_false_block: f64) -> Judgement {
    if !changed {
        return Judgement::Unchanged;
    }
    let said = format!(
        "held-out false-block rate {:.4} -> {:.4} (budget {max_false_block}), block recall {:.4} -> {:.4}",
        before.false_block_rate, after.false_block_rate, before.block_recall, after.block_recall
    );
    let within = after.false_block_rate <= max_false_block;
    let fixes = before.false_block_rate > max_false_block && after.false_block_rate < before.false_block_rate;
    if within && (fixes || after.block_recall >= before.block_recall) {
        Judgement::Improves(said)
    } else {
        Judgement::Worse(said)
    }
}

/// The review threshold (under the proposed block threshold and temperature): better when no
/// more risk is allowed on the held-out rows and the review share stays within its budget (or
/// below the current share).
pub fn judge_review(before: &Rates, after: &Rates, changed: bool, max_review_share: f64) -> Judgement {
    if !changed {
        return Judgement::Unchanged;
    }
    let said = format!(
        "held-out risk-allowed rate {:.4} -> {:.4}, review share {:.4} -> {:.4} (budget {max_review_share:.4})",
        before.risk_allowed_rate, after.risk_allowed_rate, before.review_share, after.review_share
    );
    let load = after.review_share <= max_review_share.max(before.review_share);
    if load && after.risk_allowed_rate <= before.risk_allowed_rate {
        Judgement::Improves(said)
    } else {
        Judgement::Worse(said)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(score: f64, risk: bool) -> Row {
        Row { score, cpu: true, risk, held_out: false }
    }

    #[test]
    fn the_block_threshold_is_the_lowest_within_the_budget() {
        // 100 ok rows at 0.00..0.99 step 0.01, 20 risk rows at 0.9.
        let mut rows: Vec<Row> = (0..100).map(|i| row(i as f64 / 100.0, false)).collect();
        rows.extend((0..20).map(|_| row(0.9, true)));
        let refs: Vec<&Row> = rows.iter().collect();
        // Budget 0.02: at most 2 of 100 ok rows at or above t: t = 0.98.
        assert_eq!(fit_block(&refs, 1.0, 1.0, 0.02), 0.98);
        assert_eq!(fit_block(&refs, 1.0, 1.0, 0.0), 1.0);
        assert_eq!(fit_block(&refs, 1.0, 1.0, 0.5), 0.5);
        let r = rates(rows.iter(), 1.0, &Setting { temperature: 1.0, review_at: 0.5, block_at: 0.98 });
        assert_eq!((r.ok, r.risk, r.false_block_rate, r.block_recall), (100, 20, 0.02, 0.0));
        assert_eq!((r.risk_allowed_rate, r.review_share), (0.0, (48.0 + 20.0) / 120.0));
    }

    #[test]
    fn the_review_threshold_keeps_the_reviewers_load() {
        let rows: Vec<Row> = (0..100).map(|i| row(i as f64 / 100.0, i >= 50)).collect();
        let refs: Vec<&Row> = rows.iter().collect();
        // Below block_at 0.9, a review share of 0.2 reaches down to 0.70.
        assert_eq!(fit_review(&refs, 1.0, 1.0, 0.9, 0.2), 0.7);
        assert_eq!(fit_review(&refs, 1.0, 1.0, 0.9, 0.0), 0.9, "no review band at all");
    }

    #[test]
    fn the_split_is_a_property_of_the_record() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("record-{i}")).collect();
        let out = ids.iter().filter(|id| held_out(id, 7, 0.3)).count();
        assert!((2800..3200).contains(&out), "{out}");
        assert_eq!(held_out("record-1", 7, 0.3), held_out("record-1", 7, 0.3));
        assert_ne!(
            ids.iter().map(|id| held_out(id, 7, 0.3)).collect::<Vec<_>>(),
            ids.iter().map(|id| held_out(id, 8, 0.3)).collect::<Vec<_>>(),
            "another seed, another split"
        );
        assert_eq!(min_ok(0.01), 100);
        assert_eq!(min_ok(0.1), 20);
    }

    #[test]
    fn the_temperature_fit_recovers_the_labels_temperature() {
        // Scores served at T = 1 from margins m; labels drawn at T = 2 (a deterministic draw).
        let mut rows = Vec::new();
        let mut state = 12345u64;
        for i in 0..4000 {
            let m = (i % 200) as f64 / 20.0 - 5.0;
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let p_true = 1.0 / (1.0 + (-m / 2.0).exp());
            rows.push(row(1.0 / (1.0 + (-m).exp()), u < p_true));
        }
        let m = Margins::of(rows.iter(), 1.0);
        let t = m.fit();
        assert!((t - 2.0).abs() < 0.15, "{t}");
        assert!(matches!(judge_temperature(1.0, t, &m), Judgement::Improves(_)));
        assert_eq!(judge_temperature(t, t, &m), Judgement::Unchanged);
        assert!(matches!(judge_temperature(t, 1.0, &m), Judgement::Worse(_)));
    }

    #[test]
    fn a_block_fit_is_judged_by_the_budget_then_the_recall() {
        let r = |fb: f64, recall: f64| Rates { false_block_rate: fb, block_recall: recall, ..Rates::default() };
        assert!(matches!(judge_block(&r(0.0, 0.5), &r(0.01, 0.7), true, 0.01), Judgement::Improves(_)));
        assert!(matches!(judge_block(&r(0.0, 0.5), &r(0.02, 0.9), true, 0.01), Judgement::Worse(_)));
        assert!(matches!(judge_block(&r(0.0, 0.5), &r(0.0, 0.4), true, 0.01), Judgement::Worse(_)));
        assert!(matches!(judge_block(&r(0.05, 0.9), &r(0.01, 0.6), true, 0.01), Judgement::Improves(_)));
        assert_eq!(judge_block(&r(0.0, 0.5), &r(0.0, 0.5), false, 0.01), Judgement::Unchanged);
    }
}
