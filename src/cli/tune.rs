//! `tiergate tune`: re-fits a policy on labelled traffic (the audit store's `feedback` joined to
//! its decisions, read-only): the cpu temperature, and per scenario (and the policy as written)
//! the block and review thresholds, each fitted on one split and judged against the current
//! value on the held-out rest. A fit that is not better on the held-out rows is refused; what
//! is better is written as a candidate policy directory (a copy of the live one with only those
//! values changed) with `TUNE.md`: the expected rates before and after, and the diff. The
//! candidate is for `[ab]` (docs/operations.md, "Feedback loop").

mod fit;
mod report;
mod write;

use super::time;
use anyhow::{bail, Context as _};
use fit::{Judgement, Margins, Rates, Row, Setting};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tiergate::feedback::store::Labelled;
use tiergate::feedback::Truth;
use tiergate::policy::Policy;

/// What `--fit` may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Part {
    /// The cpu temperature (`[calibration] cpu_temperature`), by held-out NLL.
    Temperature,
    /// `block_at` of `[actions]` and of each scenario, by the false-block budget.
    Block,
    /// `review_at` of `[actions]` and of each scenario, by the review budget.
    Review,
}

/// `tiergate tune`'s flags (its help text is the `Tune` command's, in main.rs).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The audit data directory holding audit.db. Default: `[audit] dir` of the config.
    #[arg(long, visible_alias = "dir", env = "TIERGATE_AUDIT_DIR")]
    pub audit_dir: Option<PathBuf>,
    /// The live policy directory to start from. Default: `policies.dir` of the config.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// The config file (for the audit dir, the policy dir, and the model's own temperature).
    #[arg(long, env = "TIERGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Decisions decided at or after this time: RFC 3339, unix ms, or a duration ago (30d, 12h).
    #[arg(long, default_value = "30d")]
    pub since: String,
    /// Decisions decided before this time (default: now).
    #[arg(long)]
    pub until: Option<String>,
    /// The most ok-labelled model decisions a block threshold may block, as a share, (0, 1).
    /// Each split needs at least 1 / this many ok-labelled decisions (100 at 0.01).
    #[arg(long, default_value_t = 0.01)]
    pub max_false_block: f64,
    /// The most model decisions a review threshold may send to review, as a share. Default:
    /// the current policy's share on the fit split (the reviewers' load stays).
    #[arg(long)]
    pub max_review_share: Option<f64>,
    /// The share of labelled decisions held out to judge the fits, (0, 1); split by record id.
    #[arg(long, default_value_t = 0.3)]
    pub holdout: f64,
    /// The split's seed: the same labels and seed, the same split.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// What to fit (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["temperature", "block", "review"])]
    pub fit: Vec<Part>,
    /// Also use decisions made under other policy versions than --policy-dir's, reading their
    /// cpu scores as if at its temperature (only right if that did not change).
    #[arg(long)]
    pub any_version: bool,
    /// The candidate policy directory to write (new, or empty).
    #[arg(long)]
    pub out: PathBuf,
}

/// What the fit reads: the live policy, its temperatures and the labelled model decisions.
pub(super) struct Input {
    pub policy_dir: PathBuf,
    pub policy: Policy,
    /// The served model's temperature (its `calibration.json`).
    pub model_t: f64,
    /// The cpu temperature the rows were served at: the policy's, else the model's.
    pub current_t: f64,
    /// Each labelled model decision with its scenario (`None`: the policy as written).
    pub rows: Vec<(Option<String>, Row)>,
    /// What was read and what was left out, in words, for the report.
    pub counts: Vec<String>,
}

/// The temperature part of a proposal.
pub(super) struct TemperatureFit {
    pub current: f64,
    pub proposed: f64,
    pub judgement: Judgement,
    /// Fit / held-out cpu decisions.
    pub n: (usize, usize),
}

/// One group's thresholds: current and proposed, and their held-out rates.
pub(super) struct GroupFit {
    pub scenario: Option<String>,
    pub current: Setting,
    pub proposed: Setting,
    pub before: Rates,
    pub after: Rates,
    pub block: Judgement,
    pub review: Judgement,
    /// Fit / held-out rows.
    pub n: (usize, usize),
}

/// A part that could not be fitted, and why (too few labels).
pub(super) type Skipped = Vec<String>;

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.max_false_block > 0.0 && args.max_false_block < 1.0,
        "--max-false-block must be in (0, 1), got {}",
        args.max_false_block
    );
    anyhow::ensure!(args.holdout > 0.0 && args.holdout < 1.0, "--holdout must be in (0, 1), got {}", args.holdout);
    if let Some(r) = args.max_review_share {
        anyhow::ensure!((0.0..=1.0).contains(&r), "--max-review-share must be in [0, 1], got {r}");
    }
    let input = read(&args)?;
    eprintln!("tune: {}", input.counts.join("; "));
    let mut skipped = Skipped::new();
    let temperature = fit_temperature(&args, &input, &mut skipped);
    let proposed_t = temperature.as_ref().map_or(input.current_t, |t| t.proposed);
    let groups = fit_groups(&args, &input, proposed_t, &mut skipped);
    let summary = report::summary(&args, &input, temperature.as_ref(), &groups, &skipped);
    println!("{summary}");
    let judgements: Vec<&Judgement> =
        temperature.iter().map(|t| &t.judgement).chain(groups.iter().flat_map(|g| [&g.block, &g.review])).collect();
    let worse: Vec<&str> = judgements
        .iter()
        .filter_map(|j| match j {
            Judgement::Worse(why) => Some(why.as_str()),
            _ => None,
        })
        .collect();
    if !worse.is_empty() {
        bail!(
            "refused: {} fit(s) not better on the held-out decisions ({}); nothing written. Fit fewer parts \
             (--fit), label more, or widen --since",
            worse.len(),
            worse.join("; ")
        );
    }
    if !judgements.iter().any(|j| matches!(j, Judgement::Improves(_))) {
        if temperature.is_none() && groups.is_empty() {
            bail!("refused: too few labels to fit anything: {}", skipped.join("; "));
        }
        bail!("refused: nothing to change, the current values are the best fit; nothing written");
    }
    let changes = report::changes(&input, temperature.as_ref(), &groups);
    let comment = "# Fitted by `tiergate tune` on labelled decisions (TUNE.md).\n";
    let diff = write::candidate(&input.policy_dir, &args.out, &changes, comment)?;
    let candidate = Policy::load_dir(&args.out)
        .map_err(|e| anyhow::anyhow!("the written candidate does not load (a bug; nothing to promote): {e}"))?;
    let tune_md = report::tune_md(&args, &summary, &diff, &candidate.version);
    std::fs::write(args.out.join("TUNE.md"), tune_md).context("writing TUNE.md")?;
    println!("{diff}");
    eprintln!(
        "tune: wrote the candidate policy {} (version {}) and its TUNE.md; next: `tiergate check-policy {0}`, \
         then [ab] dir = \"{0}\"",
        args.out.display(),
        candidate.version
    );
    Ok(())
}

/// The live policy, its temperatures and the labelled model decisions of the window.
fn read(args: &Args) -> anyhow::Result<Input> {
    let config = (args.config.is_some() || args.audit_dir.is_none() || args.policy_dir.is_none())
        .then(|| crate::load_config(args.config.clone()))
        .transpose()?;
    let audit_dir = match (&args.audit_dir, config.as_ref().and_then(|c| c.audit.as_ref())) {
        (Some(dir), _) => dir.clone(),
        (None, Some(audit)) => audit.dir.clone(),
        (None, None) => bail!("--audit-dir is required: the config has no [audit] section"),
    };
    let policy_dir = match (&args.policy_dir, &config) {
        (Some(dir), _) => dir.clone(),
        (None, Some(c)) => c.policies.dir.clone(),
        (None, None) => unreachable!("the config is read when --policy-dir is not given"),
    };
    let policy = Policy::load_dir(&policy_dir)?;
    let model_dir = config.as_ref().map_or_else(|| PathBuf::from("models"), |c| c.model.dir.clone());
    let model_t = model_temperature(&model_dir)?;
    let current_t = policy.calibration.cpu_temperature_or(model_t);
    let now = std::time::SystemTime::now();
    let since_ms = time::parse("--since", &args.since, now)?;
    let until_ms = args.until.as_deref().map_or(Ok(u64::MAX), |t| time::parse("--until", t, now))?;
    time::ensure_ordered(since_ms, until_ms)?;
    eprintln!("tune: reading labelled decisions from {} (read-only)", audit_dir.display());
    let conn = tiergate::audit::store::Store::open_read_only(&audit_dir)?;
    let labelled = tiergate::feedback::store::labelled(&conn, since_ms, until_ms)?;
    let (rows, counts) = select(labelled, &policy, args);
    Ok(Input { policy_dir, policy, model_t, current_t, rows, counts })
}

/// The served model's temperature, from `calibration.json` in `dir`.
pub(crate) fn model_temperature(dir: &Path) -> anyhow::Result<f64> {
    let path = dir.join("calibration.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the model's temperature from {} (set --config)", path.display()))?;
    let file: tiergate::calibrate::CalibrationFile =
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    anyhow::ensure!(file.temperature.is_finite() && file.temperature > 0.0, "{}: a bad temperature", path.display());
    Ok(file.temperature)
}

/// The labelled decisions the fit reads: made by a model tier (cpu, gpu) with a score, under
/// the live policy's version (unless `any_version`), in a scenario the policy defines; and
/// what was left out, in words.
fn select(labelled: Vec<Labelled>, policy: &Policy, args: &Args) -> (Vec<(Option<String>, Row)>, Vec<String>) {
    let total = labelled.len();
    let (mut other_version, mut not_model, mut unknown) = (0, 0, BTreeMap::<String, usize>::new());
    let mut rows = Vec::new();
    for l in labelled {
        let score = l.risk_score.filter(|s| s.is_finite() && (0.0..=1.0).contains(s));
        let Some(score) = score.filter(|_| l.tier == "cpu" || l.tier == "gpu") else {
            not_model += 1;
            continue;
        };
        if !args.any_version && l.policy_version != policy.version {
            other_version += 1;
            continue;
        }
        if let Some(s) = l.scenario.as_ref().filter(|s| !policy.scenarios.contains_key(*s)) {
            *unknown.entry(s.clone()).or_default() += 1;
            continue;
        }
        let held_out = fit::held_out(&l.record_id, args.seed, args.holdout);
        rows.push((l.scenario, Row { score, cpu: l.tier == "cpu", risk: l.truth == Truth::Risk, held_out }));
    }
    let mut counts = vec![format!("{total} labelled decisions in the window, {} made by a model tier", rows.len())];
    if not_model > 0 {
        counts.push(format!("{not_model} decided by rules, guards or the features model (thresholds do not apply)"));
    }
    if other_version > 0 {
        counts.push(format!(
            "{other_version} under other policy versions than {} (left out; --any-version uses them)",
            policy.version
        ));
    }
    for (s, n) in unknown {
        counts.push(format!("{n} in scenario `{s}`, which the policy no longer defines (left out)"));
    }
    (rows, counts)
}

/// The temperature, fitted on the cpu decisions of the fit split (`None`: not asked for, or too
/// few labels, said in `skipped`).
fn fit_temperature(args: &Args, input: &Input, skipped: &mut Skipped) -> Option<TemperatureFit> {
    if !args.fit.contains(&Part::Temperature) {
        return None;
    }
    let fit = Margins::of(input.rows.iter().map(|(_, r)| r).filter(|r| !r.held_out), input.current_t);
    let held = Margins::of(input.rows.iter().map(|(_, r)| r).filter(|r| r.held_out), input.current_t);
    let (least_fit, least_held) = (fit.least_class(), held.least_class());
    if least_fit.min(least_held) < fit::MIN_PER_CLASS_T {
        skipped.push(format!(
            "temperature: needs {} cpu decisions of each label in each split, has {least_fit} (fit) and \
             {least_held} (held out) of the rarer",
            fit::MIN_PER_CLASS_T
        ));
        return None;
    }
    eprintln!("tune: fitting the temperature on {} cpu decisions", fit.labels.len());
    let proposed = fit.fit();
    let proposed = if (proposed - input.current_t).abs() < 0.005 { input.current_t } else { proposed };
    let judgement = match fit::judge_temperature(input.current_t, proposed, &held) {
        // At the edge of the search the score alone separates the labels (or they are too few):
        // such a temperature would push every score to 0 or 1.
        Judgement::Improves(_) if !(0.05..20.0).contains(&proposed) => Judgement::Worse(format!(
            "the fitted temperature {proposed} is at the edge of its range: the labels are separated by the \
             score alone, or too few to fit a temperature"
        )),
        other => other,
    };
    Some(TemperatureFit { current: input.current_t, proposed, judgement, n: (fit.labels.len(), held.labels.len()) })
}

/// Each group's thresholds (the policy as written, then each scenario) fitted at `proposed_t`;
/// a group with too few labels is said in `skipped`.
fn fit_groups(args: &Args, input: &Input, proposed_t: f64, skipped: &mut Skipped) -> Vec<GroupFit> {
    let mut names: Vec<Option<String>> = vec![None];
    names.extend(input.policy.scenarios.keys().cloned().map(Some));
    names.into_iter().filter_map(|name| fit_group(args, input, proposed_t, name, skipped)).collect()
}

fn fit_group(
    args: &Args,
    input: &Input,
    proposed_t: f64,
    scenario: Option<String>,
    skipped: &mut Skipped,
) -> Option<GroupFit> {
    let rows: Vec<&Row> = input.rows.iter().filter(|(s, _)| *s == scenario).map(|(_, r)| r).collect();
    let (held, fitted): (Vec<&Row>, Vec<&Row>) = rows.iter().partition(|r| r.held_out);
    let count = |rows: &[&Row], risk: bool| rows.iter().filter(|r| r.risk == risk).count();
    let need_ok = fit::min_ok(args.max_false_block);
    let (ok, risk) = (count(&fitted, false).min(count(&held, false)), count(&fitted, true).min(count(&held, true)));
    let name = report::group_name(scenario.as_deref());
    if ok < need_ok || risk < fit::MIN_RISK {
        skipped.push(format!(
            "{name}: needs {need_ok} ok- and {} risk-labelled model decisions in each split (for a false-block \
             budget of {}), has {ok} and {risk} in the smaller",
            fit::MIN_RISK,
            args.max_false_block
        ));
        return None;
    }
    let actions = scenario.as_ref().map_or(&input.policy.actions, |s| &input.policy.scenarios[s].actions);
    let current = Setting { temperature: input.current_t, review_at: actions.review_at, block_at: actions.block_at };
    let mut proposed = Setting { temperature: proposed_t, ..current };
    eprintln!("tune: fitting {name} on {} decisions ({} held out)", fitted.len(), held.len());
    if args.fit.contains(&Part::Block) {
        proposed.block_at = fit::fit_block(&fitted, input.current_t, proposed_t, args.max_false_block);
    }
    let review_budget = args
        .max_review_share
        .unwrap_or_else(|| fit::rates(fitted.iter().copied(), input.current_t, &current).review_share);
    proposed.review_at = match args.fit.contains(&Part::Review) {
        true => fit::fit_review(&fitted, input.current_t, proposed_t, proposed.block_at, review_budget),
        // A lower block threshold carries an unfitted review threshold down with it (review <= block).
        false => current.review_at.min(proposed.block_at),
    };
    let before = fit::rates(held.iter().copied(), input.current_t, &current);
    let after = fit::rates(held.iter().copied(), input.current_t, &proposed);
    Some(GroupFit {
        block: fit::judge_block(&before, &after, proposed.block_at != current.block_at, args.max_false_block),
        review: fit::judge_review(&before, &after, proposed.review_at != current.review_at, review_budget),
        scenario,
        current,
        proposed,
        before,
        after,
        n: (fitted.len(), held.len()),
    })
}
