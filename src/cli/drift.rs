//! `tiergate drift`: decisions (from the audit store, or audit records as JSON lines) against the model's drift
//! reference, per signal, with an optional ECDF plot; and `tiergate drift reference`, which
//! makes the reference from a labelled validation file through the real gateway.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tiergate::drift::{compare, reference, Measure, Observation, Reference};
use tiergate::gateway::Sources;
use tiergate::plot::{ecdf_svg, EcdfPanel};
use tiergate::Gateway;

/// The threshold risk teams commonly alert on (deploy/prometheus/alerts.yml uses the same).
pub const KS_ALERT: f64 = 0.1;

/// A KS statistic over [`KS_ALERT`] is called drift only when its p-value is below this: on a
/// few dozen decisions a large KS arises by chance alone (with 20 against the 300-row reference,
/// D = 0.3 has p ≈ 0.07), so a small sample reads "too few to tell" instead of raising a false
/// alarm.
pub const KS_SIGNIFICANCE: f64 = 0.01;

/// `tiergate drift` and its `reference` subcommand.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DriftArgs {
    #[command(subcommand)]
    pub command: Option<DriftCommand>,
    /// Audit records as JSON lines (fields `unix_ms`, `risk_score`, `ood_score`, `text_chars`,
    /// `lang`; `kind: "shadow"` records are left out: they repeat a live decision).
    #[arg(long, short, conflicts_with = "dir")]
    pub input: Option<PathBuf>,
    /// The audit trail's directory (`[audit] dir`): its records are read from the store.
    #[arg(long, visible_alias = "audit-dir")]
    pub dir: Option<PathBuf>,
    /// Only records at or after this time: RFC 3339, unix ms, or a duration ago (`90s`, `15m`,
    /// `1.5h`, `7d`), as `tiergate audit --since` reads it.
    #[arg(long)]
    pub since: Option<String>,
    /// The reference file. Default: `reference.json` in the config's model directory.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Draw the ECDFs of the records against the reference, per numeric signal, into this SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[arg(long, env = "TIERGATE_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum DriftCommand {
    /// Make the drift reference: decide every row of a labelled JSONL file (`{"text", ...}`)
    /// with the configured model and policy (no deadline pressure) and keep the signals.
    Reference {
        /// The validation split, e.g. tests/data/val_ml_sample.jsonl.
        #[arg(long)]
        data: PathBuf,
        /// Where to write it, e.g. models/reference.json.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, env = "TIERGATE_CONFIG")]
        config: Option<PathBuf>,
    },
}

pub fn run(args: DriftArgs) -> anyhow::Result<()> {
    if let Some(DriftCommand::Reference { data, out, config }) = args.command {
        return make_reference(&data, &out, config);
    }
    let since = args.since.as_deref().map(|t| super::time::parse("--since", t, SystemTime::now())).transpose()?;
    let (live, source) = match (&args.input, &args.dir) {
        (Some(input), _) => (read_records(input, since)?, input.display().to_string()),
        (None, Some(dir)) => (read_store(dir, since)?, format!("the audit store in {}", dir.display())),
        (None, None) => {
            anyhow::bail!("--dir (the audit trail's directory) or --input (audit records as JSON lines) is required")
        }
    };
    let path = match args.reference {
        Some(p) => p,
        None => crate::load_config(args.config)?.model.dir.join("reference.json"),
    };
    let reference = Reference::load(&path)?;
    println!(
        "{} decisions from {} against {} ({} rows of {})",
        live.len(),
        source,
        path.display(),
        reference.samples.risk_score.len(),
        reference.made_from
    );
    println!("{:<11} {:>4} {:>7} {:>7} {:>9} {:>10}", "signal", "", "n", "n ref", "distance", "p-value");
    for s in compare(&reference, &live) {
        let (what, d) = (if s.measure == Measure::Ks { "KS" } else { "TVD" }, s.distance.unwrap_or(f64::NAN));
        let p = s.p_value.map(|p| format!("{p:.3e}")).unwrap_or_else(|| "-".into());
        let flag = match s.p_value {
            _ if d.is_nan() || d <= KS_ALERT => String::new(),
            Some(p) if p >= KS_SIGNIFICANCE => format!("  > 0.1 but too few to tell (p >= {KS_SIGNIFICANCE})"),
            _ => "  > 0.1: drift".into(),
        };
        let distance = s.distance.map_or_else(|| "-".to_string(), |d| format!("{d:.4}"));
        println!("{:<11} {what:>4} {:>7} {:>7} {distance:>9} {p:>10}{flag}", s.signal, s.live, s.reference);
    }
    if let Some(svg) = args.plot {
        plot(&svg, &reference, &live)?;
        println!("plot: {}", svg.display());
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct Record {
    unix_ms: u64,
    #[serde(default)]
    kind: Option<String>,
    #[serde(flatten)]
    observation: Observation,
}

/// One audit record's observation if it counts: at or after `since`, not a shadow record (it
/// repeats a live decision) and not an unscreened request (no score). Errors: not a record.
fn observation(line: &str, since: Option<u64>) -> anyhow::Result<Option<Observation>> {
    let value: serde_json::Value = serde_json::from_str(line)?;
    if value["risk_score"].is_null() && value["tier"] == "unscreened" {
        return Ok(None);
    }
    let r: Record = serde_json::from_value(value)?;
    Ok((r.kind.as_deref() != Some("shadow") && since.is_none_or(|s| r.unix_ms >= s)).then_some(r.observation))
}

/// The records of a JSON-lines file that count ([`observation`]). Errors name the line.
fn read_records(path: &Path, since: Option<u64>) -> anyhow::Result<Vec<Observation>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let seen = observation(line, since).with_context(|| {
            format!(
                "{}:{}: expected an audit record (unix_ms, risk_score, ood_score, text_chars, lang)",
                path.display(),
                i + 1
            )
        })?;
        out.extend(seen);
    }
    Ok(out)
}

/// The records of the audit store in `dir` that count ([`observation`]), oldest first.
fn read_store(dir: &Path, since: Option<u64>) -> anyhow::Result<Vec<Observation>> {
    use tiergate::audit::query::{for_each, Filter};
    let conn = tiergate::audit::store::Store::open_read_only(dir)?;
    let mut out = Vec::new();
    for_each(&conn, &Filter { since_ms: since, ..Filter::default() }, |json| {
        out.extend(observation(json, since)?);
        Ok(())
    })?;
    Ok(out)
}

fn plot(svg: &Path, reference: &Reference, live: &[Observation]) -> anyhow::Result<()> {
    let mut columns: [Vec<f64>; 3] = Default::default();
    for o in live {
        columns[0].push(o.risk_score);
        columns[1].extend(o.ood_score);
        columns[2].push(o.text_chars as f64);
    }
    let drift = compare(reference, live);
    let labels = ["risk score", "OOD score", "text length (chars)"];
    let panels: Vec<EcdfPanel<'_>> = reference
        .numeric()
        .into_iter()
        .zip(columns.iter_mut())
        .zip(labels.into_iter().zip(&drift))
        .map(|(((signal, sample), column), (x_label, d))| {
            column.retain(|x| x.is_finite());
            column.sort_by(f64::total_cmp);
            EcdfPanel {
                title: format!("{signal}: KS {:.3}", d.distance.unwrap_or(f64::NAN)),
                x_label,
                reference: sample,
                live: column,
                log_x: signal == "text_chars",
            }
        })
        .collect();
    ecdf_svg(svg, &panels)
}

/// Decides every row of `data` through the gateway and writes the signals as a reference.
fn make_reference(data: &Path, out: &Path, config: Option<PathBuf>) -> anyhow::Result<()> {
    let mut config = crate::load_config(config)?;
    config.policies.watch = false;
    config.admission.tenant_rps = 0;
    config.tenants.without_limits();
    config.shadow = Default::default();
    // The reference being remade may be stale or absent: the monitor is not needed here.
    config.drift.enabled = false;
    // The reference's decisions are not traffic: no audit trail. Opening `[audit]` here would
    // make this command a second writer (and, with `[audit.kafka]`, a second shipper) of the live
    // server's store, running retention and shipping its records twice.
    config.audit = None;
    let text = std::fs::read_to_string(data).with_context(|| format!("reading {}", data.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let reference = runtime.block_on(async {
        let gateway = Gateway::start(&config.gateway(), Sources::default())?;
        let mut samples = reference::Samples::default();
        let mut language = std::collections::BTreeMap::<String, u64>::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let row: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{}:{}", data.display(), i + 1))?;
            let t = row["text"].as_str().with_context(|| format!("{}:{}: no \"text\"", data.display(), i + 1))?;
            // Without time pressure: the reference is what the model says, not this machine's load.
            let deadline = Duration::from_millis(config.server.max_deadline_ms);
            let req = tiergate::ClassifyRequest::new(t.to_string(), Default::default(), None, deadline, &config.server)
                .with_context(|| format!("{}:{}", data.display(), i + 1))?;
            let d = gateway.classify(req, format!("reference-{}", i + 1)).await?;
            samples.risk_score.push(d.risk_score);
            samples.ood_score.extend(d.path.iter().find_map(|s| s.ood_score));
            samples.text_chars.push(t.chars().count() as f64);
            // The language of the canonical text, as the gateway detects it.
            let code = tiergate::text::detect(&tiergate::text::canonicalize(t).text).code;
            *language.entry(code.to_string()).or_default() += 1;
        }
        for v in [&mut samples.risk_score, &mut samples.ood_score, &mut samples.text_chars] {
            v.sort_by(f64::total_cmp);
        }
        let info = gateway.cpu.info();
        anyhow::Ok(Reference {
            format: reference::FORMAT,
            made_from: data.display().to_string(),
            model: reference::ModelPin { name: info.name.clone(), manifest_sha256: info.manifest_sha256.clone() },
            policy_version: gateway.policies.snapshot().version.clone(),
            samples,
            language,
        })
    })?;
    reference.write(out)?;
    println!(
        "wrote {} ({} rows, {} with an OOD score)",
        out.display(),
        reference.samples.risk_score.len(),
        reference.samples.ood_score.len()
    );
    Ok(())
}
