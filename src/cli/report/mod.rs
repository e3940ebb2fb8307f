//! `tiergate report`: the feedback report — one self-contained HTML page over a window of
//! decisions and their labels, read from the audit store through a read-only connection (a
//! running tiergate keeps writing): summary counts, quality rates per tier, deciding rule,
//! scenario, language, record kind, tenant (and class), label source and reviewer, the model
//! tiers' calibration and precision/recall with today's thresholds, confusion heatmaps, review
//! load and drift over time (docs/operations.md "Feedback report").

mod figures;
mod inputs;
mod model;
mod page;
mod rates;
mod read;
mod timeline;

use anyhow::Context as _;
use inputs::{Inputs, Rescore};
use model::{Calibration, Pr, Thresholds};
use rates::{ByTruth, Row};
use read::Span;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use tiergate::feedback::store::{labelled, labels, Labelled};
use tiergate::tenant::Tenants;
use timeline::Bucket;

/// The actions a decision record can have, in the order tables and heatmaps show them.
pub const ACTIONS: [&str; 4] = ["allow", "review", "block", "unscreened"];

/// The report's version in its JSON block.
const FORMAT: u32 = 1;

/// More buckets than this make an unreadable time axis (and a page of megabytes).
const MAX_BUCKETS: usize = 2_000;

/// `tiergate report`'s flags (its help text is the `Report` command's, in main.rs).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config (TOML): its `[audit] dir` is the store, its `[policies] dir` the policy whose
    /// thresholds are marked, its `[tenants]` map tenants to classes, and its model directory's
    /// `reference.json` (or `[drift] reference`) is the drift reference. Default:
    /// config/tiergate.toml when present.
    #[arg(long, env = "TIERGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// The audit data directory (`[audit] dir`, holding audit.db), overriding the config's.
    #[arg(long, visible_alias = "dir")]
    pub audit_dir: Option<PathBuf>,
    /// Decisions made at or after this time: RFC 3339, unix ms, or a duration back from now
    /// (90s, 15m, 1.5h, 7d).
    #[arg(long, default_value = "7d")]
    pub since: String,
    /// Decisions made before this time (as --since). Default: now.
    #[arg(long)]
    pub until: Option<String>,
    /// The policy directory whose review and block thresholds (and scenarios') are marked,
    /// overriding the config's `[policies] dir`.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// The drift reference (`tiergate drift reference`), overriding the config's.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Time buckets of the review-load and drift plots. Default: hour for windows up to two
    /// days, else day (UTC).
    #[arg(long, value_enum)]
    pub bucket: Option<BucketSize>,
    /// The HTML file to write (e.g. report.html).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace `--out` if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BucketSize {
    Hour,
    Day,
}

impl BucketSize {
    fn ms(self) -> u64 {
        match self {
            BucketSize::Hour => 3_600_000,
            BucketSize::Day => 86_400_000,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BucketSize::Hour => "hour",
            BucketSize::Day => "day",
        }
    }
}

/// Everything the page shows; also its JSON block.
#[derive(Debug, Serialize)]
pub struct Report {
    pub format: u32,
    pub since_ms: u64,
    pub until_ms: u64,
    pub generated_ms: u64,
    /// `hour` or `day`.
    pub bucket: &'static str,
    pub store: String,
    pub thresholds: Option<Thresholds>,
    /// The drift reference's path; `None`: no drift plot.
    pub reference: Option<String>,
    /// Whose cpu scores the drift plot read back at the model's temperature.
    pub drift_rescored: Option<Rescore>,
    pub summary: Summary,
    /// By dimension (tier, rule, scenario, lang, kind, tenant, tenant_class, policy_version, source,
    /// reviewer).
    pub rates: BTreeMap<&'static str, Vec<Row>>,
    pub calibration: Calibration,
    pub pr: Pr,
    pub timeline: Vec<Bucket>,
}

/// The window's counts.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// Served decisions (records of kind classify, screen, stream_cut).
    pub decisions: u64,
    pub by_kind: BTreeMap<String, u64>,
    pub by_action: BTreeMap<String, u64>,
    /// Reviews with a label.
    pub reviews_labelled: u64,
    /// Labelled decisions (one truth each).
    pub labelled: u64,
    pub labelled_truth: ByTruth,
    /// Label rows (one per decision and source).
    pub labels: u64,
    pub labels_by_source: BTreeMap<String, ByTruth>,
    /// Distinct reviewers named by labels.
    pub reviewers: u64,
    /// Labelled decisions by the model and the policy version that made them.
    pub models: BTreeMap<String, u64>,
    pub policy_versions: BTreeMap<String, u64>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.out.exists() && !args.force {
        anyhow::bail!("{} exists: give --force to replace it", args.out.display());
    }
    let now = std::time::SystemTime::now();
    let since_ms = super::time::parse("--since", &args.since, now)?;
    let until_ms = match &args.until {
        Some(t) => super::time::parse("--until", t, now)?,
        None => tiergate::audit::record::now_ms(),
    };
    super::time::ensure_ordered(since_ms, until_ms)?;
    let size =
        args.bucket.unwrap_or(if until_ms - since_ms <= 2 * 86_400_000 { BucketSize::Hour } else { BucketSize::Day });
    let span = Span { since_ms, until_ms, bucket_ms: size.ms() };
    anyhow::ensure!(
        span.buckets() <= MAX_BUCKETS,
        "the window has {} {}s, over {MAX_BUCKETS}: give --bucket day or a shorter window",
        span.buckets(),
        size.name()
    );
    let inputs = inputs::read(&args)?;
    let report = build(&inputs, span, size.name())?;
    let figures = figures::draw(&report)?;
    let html = page::render(&report, &figures);
    write_atomically(&args.out, html.as_bytes())?;
    eprintln!(
        "report: {} decisions, {} labelled ({} labels); wrote {} ({} KiB)",
        report.summary.decisions,
        report.summary.labelled,
        report.summary.labels,
        args.out.display(),
        html.len().div_ceil(1024)
    );
    Ok(())
}

/// Reads the store and counts everything.
fn build(inputs: &Inputs, span: Span, bucket: &'static str) -> anyhow::Result<Report> {
    let conn = tiergate::audit::store::Store::open_read_only(&inputs.store)?;
    // One read transaction: every query below sees the same snapshot of a store a running
    // tiergate keeps writing (WAL readers never block its writer), so labels and decisions agree.
    conn.execute_batch("BEGIN").context("starting a read transaction")?;
    read::check_schema(&conn, &inputs.store)?;
    eprintln!("report: reading labels of decisions made {} to {}", time_text(span.since_ms), time_text(span.until_ms));
    let decided = labelled(&conn, span.since_ms, span.until_ms).context("reading the labelled decisions")?;
    let every = labels(&conn, span.since_ms, span.until_ms).context("reading the labels")?;
    let kinds = read::labelled_kinds(&conn, &span)?;
    eprintln!("report: {} labelled decisions, {} labels; reading decisions", decided.len(), every.len());
    let ids: HashSet<String> = decided.iter().map(|r| r.record_id.clone()).collect();
    let mut line = timeline::Timeline::new(span, inputs.reference.as_ref().map(|(_, r)| r), &ids);
    let mut seen = 0u64;
    read::for_each_decision(&conn, &span, |mut d| {
        if let Some(r) = &inputs.rescore {
            r.apply(&mut d);
        }
        line.add(d);
        seen += 1;
        if seen % 500_000 == 0 {
            eprintln!("report: {seen} decisions read");
        }
        Ok(())
    })?;
    let (buckets, totals) = line.finish();
    let scored = model::scored(&decided);
    let mut report = Report {
        format: FORMAT,
        since_ms: span.since_ms,
        until_ms: span.until_ms,
        generated_ms: tiergate::audit::record::now_ms(),
        bucket,
        store: inputs.store.display().to_string(),
        thresholds: inputs.thresholds.clone(),
        reference: inputs.reference.as_ref().map(|(p, _)| p.display().to_string()),
        drift_rescored: inputs.rescore.clone(),
        summary: summary(totals, &decided, &every),
        rates: dimensions(&decided, &every, &kinds, inputs.tenants.as_ref()),
        calibration: model::calibration(&scored),
        pr: model::pr(&scored, inputs.thresholds.as_ref()),
        timeline: buckets,
    };
    report.summary.reviews_labelled = report.timeline.iter().map(|b| b.reviews_labelled).sum();
    Ok(report)
}

fn summary(totals: timeline::Totals, decided: &[Labelled], every: &[Labelled]) -> Summary {
    let mut s = Summary {
        decisions: totals.decisions,
        by_kind: totals.by_kind,
        by_action: totals.by_action,
        labelled: decided.len() as u64,
        labels: every.len() as u64,
        ..Summary::default()
    };
    for r in decided {
        s.labelled_truth.add(r.truth);
        *s.models.entry(r.model.clone()).or_default() += 1;
        *s.policy_versions.entry(r.policy_version.clone()).or_default() += 1;
    }
    for r in every {
        s.labels_by_source.entry(r.source.clone()).or_default().add(r.truth);
    }
    s.reviewers = every.iter().filter_map(|r| r.reviewer.as_deref()).collect::<HashSet<_>>().len() as u64;
    s
}

fn dimensions(
    decided: &[Labelled],
    every: &[Labelled],
    kinds: &std::collections::HashMap<String, String>,
    tenants: Option<&Tenants>,
) -> BTreeMap<&'static str, Vec<Row>> {
    let by = |f: &dyn Fn(&Labelled) -> String, of: &[Labelled]| {
        rates::rows(of.iter().map(|r| (f(r), r.action.as_str(), r.truth)))
    };
    let or = |v: &Option<String>, none: &str| v.clone().unwrap_or_else(|| none.to_string());
    let mut out = BTreeMap::new();
    out.insert("tier", by(&|r| r.tier.clone(), decided));
    out.insert("rule", by(&|r| or(&r.rule, "none"), decided));
    out.insert("scenario", by(&|r| or(&r.scenario, "default"), decided));
    out.insert("lang", by(&|r| or(&r.lang, "und"), decided));
    out.insert("kind", by(&|r| kinds.get(&r.record_id).cloned().unwrap_or_else(|| "unknown".into()), decided));
    out.insert("tenant", by(&|r| or(&r.tenant, "none"), decided));
    if let Some(t) = tenants {
        out.insert("tenant_class", by(&|r| t.class_of(r.tenant.as_deref()).to_string(), decided));
    }
    // An [ab] candidate's decisions carry its version: this table compares the arms.
    out.insert("policy_version", by(&|r| r.policy_version.clone(), decided));
    out.insert("source", by(&|r| r.source.clone(), every));
    out.insert("reviewer", by(&|r| or(&r.reviewer, "none"), every));
    out
}

/// `unix_ms` as `2026-12-04 13:00 UTC`.
pub fn time_text(unix_ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(unix_ms.min(i64::MAX as u64) as i64)
        .map_or_else(|| format!("{unix_ms} unix ms"), |t| t.format("%Y-%m-%d %H:%M UTC").to_string())
}

/// Each bucket's name on a time axis: `12-04` by day, `12-04 13h` by hour.
pub fn bucket_names(report: &Report) -> Vec<String> {
    let format = if report.bucket == "day" { "%m-%d" } else { "%m-%d %Hh" };
    report
        .timeline
        .iter()
        .map(|b| {
            chrono::DateTime::from_timestamp_millis(b.start_ms.min(i64::MAX as u64) as i64)
                .map_or_else(|| b.start_ms.to_string(), |t| t.format(format).to_string())
        })
        .collect()
}

/// Writes `bytes` to a temporary file beside `path`, then renames it into place: a page served
/// from `path` is never half written.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let name = path.file_name().with_context(|| format!("--out {} names no file", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("moving {} to {}", tmp.display(), path.display())
    })
}
