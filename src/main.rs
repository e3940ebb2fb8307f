//! The `tiergate` command line.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiergate::config::Config;
use tiergate::gateway::{GatewayConfig, Sources};
use tiergate::policy::Policy;
use tiergate::{App, Gateway};

/// mimalloc for Rust's allocations: the request path allocates many small short-lived objects
/// on every thread (HTTP, JSON, CEL values, tokenizer encodings), and glibc's malloc/free were
/// the largest single cost of the async runtime under load (docs/BENCHMARKS.md, issue 28).
/// ONNX Runtime's own allocations still go through glibc (`tiergate::malloc` bounds its arenas).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;

const DEFAULT_CONFIG: &str = "config/tiergate.toml";

/// Tiered model router and proxy for risk-control inference: each request is rated and routed,
/// by complexity and live CPU/GPU load, to an in-process INT8 model on the CPU or a large-model
/// path on the GPU, with calibrated confidence; a CEL rules engine decides when the models are
/// unsure, out of their domain, overloaded or out of time.
#[derive(Parser)]
#[command(name = "tiergate", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve `POST /v1/classify`, `/healthz` and `/readyz` on the public listener; `/metrics`,
    /// `/admin/*` and the same endpoints on the admin listener (`[admin] public_metrics = true`
    /// puts `/metrics` on the public one too). Policies reload on file change, SIGHUP or
    /// `POST /admin/reload`.
    Serve {
        /// Config file (TOML). Default: config/tiergate.toml if present, else built-in defaults.
        #[arg(long, env = "TIERGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Listen address, overriding `server.listen`.
        #[arg(long, env = "TIERGATE_LISTEN")]
        listen: Option<SocketAddr>,
        /// Policy directory, overriding `policies.dir`.
        #[arg(long, env = "TIERGATE_POLICIES")]
        policies: Option<PathBuf>,
        /// Model directory, overriding `model.dir`.
        #[arg(long, env = "TIERGATE_MODELS")]
        models: Option<PathBuf>,
        /// Admin listen address (`/admin/*`), overriding `admin.listen`.
        #[arg(long, env = "TIERGATE_ADMIN_LISTEN")]
        admin_listen: Option<SocketAddr>,
    },
    /// Fit a tier's temperature on labelled data and print ECE before and after.
    ///
    /// Input: JSON lines `{"text": str, "label": 0|1}` (1 = risk). Prints accuracy, NLL and
    /// ECE at T=1, at the tier's current T and at the fitted T, with a reliability table.
    /// `--tier gpu` with `gpu.backend = "upstream"` asks the configured model servers (the
    /// policy's `[prompt]`) and prints the `[gpu.upstream] temperature` to set.
    Calibrate {
        /// Labelled JSONL file.
        #[arg(long, short)]
        input: PathBuf,
        #[arg(long, env = "TIERGATE_CONFIG")]
        config: Option<PathBuf>,
        /// The calibrated model's directory, overriding `model.dir` (`gpu.onnx.dir` with `--tier gpu`).
        #[arg(long)]
        models: Option<PathBuf>,
        /// The tier to calibrate: the cpu model, or the gpu tier (upstream servers or onnx model).
        #[arg(long, value_enum, default_value = "cpu")]
        tier: cli::calibrate::Tier,
        /// Equal-width confidence bins for ECE.
        #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u16).range(1..=1000))]
        bins: u16,
        /// Write the fitted temperature to this calibration file (e.g. models/calibration.json).
        /// Refused when, on a held-out 30 % of the input, the fit improves neither ECE nor NLL
        /// over the current temperature.
        #[arg(long)]
        write: Option<PathBuf>,
        /// Write even a fit that does not improve on the current temperature.
        #[arg(long, requires = "write")]
        force: bool,
        /// Draw the reliability diagram before (T = 1) and after (fitted T) scaling into this SVG.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Decide one text without a server and explain the routing: complexity contributions, the
    /// signals snapshot, and the reason for every tier choice. Prints the decision as JSON.
    Explain {
        /// The text to classify.
        #[arg(long)]
        text: String,
        /// Request features as a JSON object, e.g. '{"amount": 12000}'.
        #[arg(long)]
        features: Option<String>,
        #[arg(long)]
        tenant: Option<String>,
        /// The policy scenario to decide in (`[scenarios.NAME]`), as `x-tiergate-scenario`.
        #[arg(long)]
        scenario: Option<String>,
        #[arg(long, env = "TIERGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Policy directory, overriding `policies.dir`.
        #[arg(long)]
        policies: Option<PathBuf>,
    },
    /// Query the audit trail (`[audit] dir`): records as JSON lines, oldest first, filtered by
    /// request id, time, tenant, route, action, tier, rule or kind; or `--count`.
    Audit(cli::audit::Args),
    /// Compare decisions (the audit store's, or audit records as JSON lines) with the model's drift reference: the
    /// two-sample Kolmogorov–Smirnov statistic per numeric signal (risk score, OOD score, text
    /// length) and the total variation distance of the language shares; `--plot` draws the
    /// ECDFs. `tiergate drift reference` makes the reference from a validation file.
    Drift(cli::drift::DriftArgs),
    /// The feedback report: one self-contained HTML page of decision quality over a window of
    /// decisions and their labels (`POST /v1/feedback`).
    ///
    /// Reads the audit store read-only, in one snapshot (a running tiergate keeps writing). The
    /// window (--since, --until) selects decisions by when they were made, not when their labels
    /// arrived. Each decision counts once, with the label that counts (a chargeback over an
    /// analyst's, an analyst's over any other source's, the latest of a source); the per-source
    /// and per-reviewer tables count every label with its labeller's truth.
    ///
    /// The page (plain HTML, inline SVG plots, nothing fetched): summary counts; per deciding
    /// tier, rule or guard, scenario, language, record kind, tenant, tenant class, policy version,
    /// label source and reviewer, the labelled decisions by action and truth and four rates —
    /// block precision (blocked ∧ risk ÷ blocked), false-block rate (blocked ∧ ok ÷ ok),
    /// risk-allowed rate (allowed ∧ risk ÷ risk) and review precision (reviewed ∧ risk ÷
    /// reviewed: the share of reviews that were risk); the model tiers' reliability diagram and
    /// ECE; precision/recall over the risk score with the policy's review_at and block_at marked;
    /// action × truth heatmaps by record kind and by language; review load and drift (KS against
    /// the model's reference) per hour or day. Every number is also in the page's JSON block
    /// (`<script type="application/json" id="report-data">`). How to read it:
    /// docs/operations.md, "Feedback report".
    Report(cli::report::Args),
    /// Model directories: `tiergate model pack` turns your own ONNX classifier, its
    /// tokenizer.json and a labelled validation JSONL into a directory the cpu tier serves.
    Model(cli::model::Args),
    /// Features models: `tiergate features-model pack` turns your own ONNX model over
    /// transaction features, its feature schema and a labelled validation CSV into a directory
    /// `[features_model] dir` serves.
    FeaturesModel(cli::features::Args),
    /// Re-fit the cpu temperature and the block / review thresholds (per scenario) on labelled
    /// decisions (`POST /v1/feedback`), judged on held-out labels, into a candidate policy
    /// directory for `[ab]`; refuses a fit that is not better.
    ///
    /// Reads the audit store read-only (a running tiergate keeps writing). Fits on a split and
    /// judges on the held-out rest: the temperature must lower the held-out NLL; a block
    /// threshold (the lowest on a 0.01 grid whose false-block rate on the fit split is within
    /// --max-false-block) must keep the held-out false-block rate within it and block at least as
    /// much risk; a review threshold (the lowest whose review share is within --max-review-share)
    /// must allow no more risk. What is better is written to --out: the live policy directory
    /// with only those values changed (comments and layout kept), and TUNE.md with the rates
    /// before and after and the diff. Runbook: docs/operations.md, "Feedback loop".
    Tune(cli::tune::Args),
    /// Labels for recorded decisions: `tiergate feedback import FILE --admin URL` sends a CSV or
    /// JSONL of late labels (chargebacks) to a replica's `POST /v1/feedback` in batches.
    Feedback(cli::feedback::Args),
    /// Print the JSON Schema of a policy file (for editors; also in docs/policy.schema.json).
    PolicySchema,
    /// Validate a policy directory: compiles every regex and CEL rule, checks every threshold.
    /// Exits 1 and lists every problem (file and rule) if the policy is invalid.
    CheckPolicy {
        /// Policy directory.
        dir: PathBuf,
        /// Also replay labelled requests (JSON lines `{"text", "label": 0|1, "features"?, "tenant"?}`)
        /// through the real model and report how decisions and actions would change compared
        /// with the running policy (`policies.dir` of the config).
        #[arg(long)]
        against: Option<PathBuf>,
        #[arg(long, env = "TIERGATE_CONFIG")]
        config: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    tiergate::malloc::bound_arenas();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Serve { config, listen, policies, models, admin_listen } => {
            serve(config, listen, policies, models, admin_listen)
        }
        Command::Calibrate { input, config, models, tier, bins, write, force, plot } => {
            cli::calibrate::run(cli::calibrate::Args {
                input,
                config,
                models,
                bins: bins as usize,
                write: write.map(|p| (p, force)),
                tier,
                plot,
            })
        }
        Command::Audit(args) => cli::audit::run(args),
        Command::Drift(args) => cli::drift::run(args),
        Command::Report(args) => cli::report::run(args),
        Command::Model(args) => cli::model::run(args),
        Command::FeaturesModel(args) => cli::features::run(args),
        Command::Tune(args) => cli::tune::run(args),
        Command::Feedback(args) => cli::feedback::run(args),
        Command::PolicySchema => {
            println!("{}", serde_json::to_string_pretty(&tiergate::policy::json_schema()).unwrap_or_default());
            Ok(())
        }
        Command::CheckPolicy { dir, against, config } => check_policy(&dir, against.as_deref(), config),
        Command::Explain { text, features, tenant, scenario, config, policies } => {
            explain(text, features, tenant, scenario, config, policies)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

pub(crate) fn load_config(path: Option<PathBuf>) -> anyhow::Result<Config> {
    match path {
        Some(p) => Ok(Config::load(&p)?),
        None if Path::new(DEFAULT_CONFIG).is_file() => Ok(Config::load(Path::new(DEFAULT_CONFIG))?),
        None => {
            tracing::warn!(
                "no {DEFAULT_CONFIG} in the current directory and no --config: using built-in defaults, \
                 with models/ and policies/ relative to the current directory"
            );
            Ok(Config::default())
        }
    }
}

fn serve(
    config: Option<PathBuf>,
    listen: Option<SocketAddr>,
    policies: Option<PathBuf>,
    models: Option<PathBuf>,
    admin_listen: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let mut config = load_config(config)?;
    if let Some(a) = admin_listen {
        config.admin.listen = a;
    }
    if let Ok(token) = std::env::var("TIERGATE_ADMIN_TOKEN") {
        config.admin.token = Some(token);
    }
    // An empty token would read as "protected" to an operator and protect nothing.
    anyhow::ensure!(
        config.admin.token.as_deref() != Some(""),
        "the admin token is set but empty (admin.token or TIERGATE_ADMIN_TOKEN): set a value or unset it"
    );
    if !config.admin.listen.ip().is_loopback() && config.admin.token.is_none() {
        tracing::warn!(addr = %config.admin.listen, "the admin listener is not on loopback and has no token");
    }
    if let Some(l) = listen {
        config.server.listen = l;
    }
    if let Some(p) = policies {
        config.policies.dir = p;
    }
    if let Some(m) = models {
        config.model.dir = m;
    }
    // The model workers start inside `block_on`, on this thread, at the process's priority.
    let runtime = tiergate::ingress::runtime(&config.server)?;
    runtime.block_on(async move {
        let gateway = Gateway::start(&config.gateway(), Sources::default())?;
        let listener = tokio::net::TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("binding {}", config.server.listen))?;
        tracing::info!(addr = %listener.local_addr()?, "tiergate listening");
        let admin_listener = tokio::net::TcpListener::bind(config.admin.listen)
            .await
            .with_context(|| format!("binding the admin listener {}", config.admin.listen))?;
        tracing::info!(addr = %admin_listener.local_addr()?, token = config.admin.token.is_some(), "admin listening");
        // SIGHUP reloads the policy directory.
        #[cfg(unix)]
        {
            let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
            let g = Arc::clone(&gateway);
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    let g = Arc::clone(&g);
                    let _ = tokio::task::spawn_blocking(move || g.reload_all("sighup")).await;
                }
            });
        }
        let audit = gateway.audit.clone();
        let tracer = gateway.tracer.clone();
        let (app, admin) = App::pair(gateway, &config.server, &config.admin, config.proxy()?);
        let (app, admin) = (Arc::new(app), Arc::new(admin));
        let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin_task = tokio::spawn(tiergate::serve(admin_listener, admin, async {
            let _ = admin_stopped.await;
        }));
        tiergate::serve(listener, app, shutdown_signal()).await?;
        let _ = stop_admin.send(());
        let _ = admin_task.await;
        // The last requests' traces, before the process exits.
        tracer.shutdown(std::time::Duration::from_secs(5)).await;
        // The listeners are drained: commit every queued audit record before exiting.
        // Then the Kafka shipper ships what is left.
        if let Some(audit) = audit {
            let writer = Arc::clone(&audit);
            let _ = tokio::task::spawn_blocking(move || writer.close()).await;
            audit.stop_sink().await;
        }
        Ok(())
    })
}

/// SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn explain(
    text: String,
    features: Option<String>,
    tenant: Option<String>,
    scenario: Option<String>,
    config: Option<PathBuf>,
    policies: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut config = load_config(config)?;
    if let Some(p) = policies {
        config.policies.dir = p;
    }
    let features = match features {
        None => serde_json::Map::new(),
        Some(f) => match serde_json::from_str(&f).context("--features must be a JSON object")? {
            serde_json::Value::Object(map) => map,
            _ => anyhow::bail!("--features must be a JSON object"),
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        // A one-off decision, not served traffic: no audit record.
        let gateway = Gateway::start(&GatewayConfig { audit: None, ..config.gateway() }, Sources::default())?;
        // Let the samplers take their first readings, as a running server would have them.
        tokio::time::sleep(std::time::Duration::from_millis(2 * config.readings.cpu_interval_ms + 50)).await;
        let deadline = std::time::Duration::from_millis(config.server.default_deadline_ms);
        let mut request = tiergate::ClassifyRequest::new(text, features, tenant, deadline, &config.server)?;
        request.explain = true;
        request.scenario = scenario;
        let decision = gateway.classify(request, "explain".into()).await?;
        println!("{}", serde_json::to_string_pretty(&decision)?);
        Ok(())
    })
}

/// One labelled request for `check-policy --against`.
#[derive(serde::Deserialize)]
struct Sample {
    text: String,
    label: usize,
    #[serde(default)]
    features: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    tenant: Option<String>,
}

/// Decisions of one policy over the samples.
#[derive(Default)]
struct Tally {
    correct: usize,
    actions: std::collections::BTreeMap<String, usize>,
    tiers: std::collections::BTreeMap<String, usize>,
}

/// How the candidate's decisions differ from the running policy's.
#[derive(Default)]
struct Changes {
    labels: usize,
    tiers: usize,
    actions: std::collections::BTreeMap<(String, String), usize>,
    examples: Vec<String>,
}

fn check_policy(dir: &Path, against: Option<&Path>, config: Option<PathBuf>) -> anyhow::Result<()> {
    let policy = Policy::load_dir(dir)?;
    println!("policy {} is valid: version {}, {} rules", dir.display(), policy.version, policy.rules.rule_count());
    let Some(samples) = against else { return Ok(()) };
    let rows = read_samples(samples)?;
    let mut config = load_config(config)?;
    config.policies.watch = false;
    config.admission.tenant_rps = 0;
    config.tenants.without_limits();
    config.shadow =
        tiergate::gateway::ShadowConfig { dir: Some(dir.to_path_buf()), share: 1.0, log: None, model: None };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let gateway = Gateway::start(&GatewayConfig { audit: None, ..config.gateway() }, Sources::default())?;
        let (mut live_t, mut cand_t, mut changes) = (Tally::default(), Tally::default(), Changes::default());
        for (i, s) in rows.iter().enumerate() {
            // Replay without time pressure: compare policies, not this machine's load.
            let deadline = std::time::Duration::from_millis(config.server.max_deadline_ms);
            let req = tiergate::ClassifyRequest::new(
                s.text.clone(),
                s.features.clone(),
                s.tenant.clone(),
                deadline,
                &config.server,
            )
            .with_context(|| format!("{}:{}", samples.display(), i + 1))?;
            let (live, cand) = gateway.compare(req, format!("sample-{}", i + 1)).await?;
            let cand = cand.context("the candidate policy gave no decision")?;
            for (t, d) in [(&mut live_t, &live), (&mut cand_t, &cand)] {
                t.correct += ((d.label == tiergate::decision::Label::Risk) == (s.label == 1)) as usize;
                *t.actions.entry(d.action.as_str().into()).or_default() += 1;
                *t.tiers.entry(d.tier.as_str().into()).or_default() += 1;
            }
            changes.record(i, s, &live, &cand);
        }
        let running = gateway.policies.snapshot().version.clone();
        let candidate = gateway.shadow.as_ref().expect("configured above").policies.snapshot().version.clone();
        println!("\nreplayed {} labelled requests from {}", rows.len(), samples.display());
        print_comparison(rows.len(), (&running, &live_t), (&candidate, &cand_t), &changes);
        Ok(())
    })
}

fn read_samples(samples: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = std::fs::read_to_string(samples).with_context(|| format!("reading {}", samples.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let s: Sample = serde_json::from_str(line).with_context(|| {
            format!(
                "{}:{}: expected {{\"text\", \"label\": 0|1, \"features\"?, \"tenant\"?}}",
                samples.display(),
                i + 1
            )
        })?;
        anyhow::ensure!(s.label <= 1, "{}:{}: `label` must be 0 or 1", samples.display(), i + 1);
        rows.push(s);
    }
    Ok(rows)
}

impl Changes {
    fn record(
        &mut self,
        i: usize,
        s: &Sample,
        live: &tiergate::decision::Decision,
        cand: &tiergate::decision::Decision,
    ) {
        self.labels += (live.label != cand.label) as usize;
        self.tiers += (live.tier != cand.tier) as usize;
        if live.action == cand.action {
            return;
        }
        *self.actions.entry((live.action.as_str().into(), cand.action.as_str().into())).or_default() += 1;
        if self.examples.len() < 10 {
            let head: String = s.text.chars().take(70).collect();
            self.examples.push(format!(
                "  line {:>4}  label {}  {} -> {}  ({} -> {})  {head:?}",
                i + 1,
                s.label,
                live.action.as_str(),
                cand.action.as_str(),
                live.rule.as_deref().unwrap_or(live.tier.as_str()),
                cand.rule.as_deref().unwrap_or(cand.tier.as_str()),
            ));
        }
    }
}

fn print_comparison(
    n: usize,
    (running, live_t): (&str, &Tally),
    (candidate, cand_t): (&str, &Tally),
    changes: &Changes,
) {
    let n = n.max(1) as f64;
    println!("{:<22} {:>14} {:>14}", "", format!("running {running}"), format!("candidate {candidate}"));
    println!("{:<22} {:>14.4} {:>14.4}", "label accuracy", live_t.correct as f64 / n, cand_t.correct as f64 / n);
    for action in ["allow", "review", "block"] {
        let (a, b) =
            (live_t.actions.get(action).copied().unwrap_or(0), cand_t.actions.get(action).copied().unwrap_or(0));
        println!("{:<22} {a:>14} {b:>14}", format!("action {action}"));
    }
    for tier in ["cpu", "gpu", "rules"] {
        let (a, b) = (live_t.tiers.get(tier).copied().unwrap_or(0), cand_t.tiers.get(tier).copied().unwrap_or(0));
        println!("{:<22} {a:>14} {b:>14}", format!("decided by {tier}"));
    }
    println!(
        "\nchanged: label {}, action {}, deciding tier {}",
        changes.labels,
        changes.actions.values().sum::<usize>(),
        changes.tiers
    );
    for ((from, to), count) in &changes.actions {
        println!("  action {from} -> {to}: {count}");
    }
    if !changes.examples.is_empty() {
        println!("\nfirst changed actions:\n{}", changes.examples.join("\n"));
    }
}
