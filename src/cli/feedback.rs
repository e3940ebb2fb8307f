//! `tiergate feedback import`: late labels in bulk — a chargeback file weeks after the decisions
//! — sent to a running replica's `POST /v1/feedback` (admin listener) in batches, so that they
//! go through the audit writer like any label, reach the replica holding each record in a fleet,
//! and count in the windows of their decisions' time, not the import's.
//!
//! The whole file is read and checked first (the line and the field named): a bad row sends
//! nothing. Rows are CSV with a header (`record_id` or `request_id`, `label`, and optionally
//! `source`, `reviewer`, `note`) or JSON lines of the same fields.

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tiergate::feedback::{parse_labels, MAX_BATCH};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Send the labels in a CSV or JSONL file to a replica's admin listener, in batches.
    /// Prints what became of them (accepted, duplicate, updated, unknown) and the unknown ids.
    Import(ImportArgs),
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The labels: `.csv` (header: record_id or request_id, label, source?, reviewer?, note?)
    /// or `.jsonl` (one label object per line, as POST /v1/feedback takes).
    pub file: PathBuf,
    /// A replica's admin listener, e.g. http://127.0.0.1:9091.
    #[arg(long, env = "TIERGATE_ADMIN_URL")]
    pub admin: String,
    /// The admin listener's bearer token (`[admin] token`).
    #[arg(long, env = "TIERGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The source of rows that name none (a chargeback file: `chargeback`).
    #[arg(long, default_value = "chargeback")]
    pub source: String,
    /// Labels per request.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u16).range(1..=MAX_BATCH as i64))]
    pub batch: u16,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Import(a) => import(a),
    }
}

/// Reads `path` into label objects, each checked as the endpoint checks it.
fn read(path: &Path, default_source: &str) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let csv = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let mut rows: Vec<(usize, Map<String, Value>)> = Vec::new();
    if csv {
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let header = reader.headers().with_context(|| format!("{}: no header row", path.display()))?.clone();
        for (i, record) in reader.records().enumerate() {
            let record = record.with_context(|| format!("{}: row {}", path.display(), i + 2))?;
            let fields = header.iter().zip(record.iter()).filter(|(_, v)| !v.is_empty());
            rows.push((i + 2, fields.map(|(k, v)| (k.to_string(), Value::from(v))).collect()));
        }
    } else {
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            match serde_json::from_str(line) {
                Ok(Value::Object(map)) => rows.push((i + 1, map)),
                Ok(_) => bail!("{}: line {}: not a JSON object", path.display(), i + 1),
                Err(e) => bail!("{}: line {}: {e}", path.display(), i + 1),
            }
        }
    }
    let mut labels = Vec::with_capacity(rows.len());
    for (line, mut row) in rows {
        row.entry("source").or_insert_with(|| Value::from(default_source));
        let value = Value::Object(row);
        match parse_labels(value.to_string().as_bytes()) {
            Err(tiergate::error::ApiError::InvalidField { field, message }) => {
                bail!("{}: line {line}: `{field}`: {message}", path.display())
            }
            Err(e) => bail!("{}: line {line}: {e}", path.display()),
            Ok(_) => {}
        }
        labels.push(value);
    }
    anyhow::ensure!(!labels.is_empty(), "{} has no labels", path.display());
    Ok(labels)
}

fn import(a: ImportArgs) -> anyhow::Result<()> {
    let labels = read(&a.file, &a.source)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let url = format!("{}/v1/feedback", a.admin.trim_end_matches('/'));
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut unknown: Vec<String> = Vec::new();
    let mut sent = 0;
    for batch in labels.chunks(a.batch as usize) {
        let mut req = http::Request::post(&url).header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = &a.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req.body(Full::new(Bytes::from(Value::Array(batch.to_vec()).to_string())))?;
        let (status, body) = runtime.block_on(async {
            let response = client.request(req).await.with_context(|| format!("sending labels to {url}"))?;
            let status = response.status();
            anyhow::Ok((status, response.into_body().collect().await?.to_bytes()))
        })?;
        if !status.is_success() {
            bail!(
                "{url} answered {status} after {sent} of {} labels (labels are idempotent: run the import again): {}",
                labels.len(),
                String::from_utf8_lossy(&body)
            );
        }
        let answer: Value = serde_json::from_slice(&body).context("the answer is not JSON")?;
        for (label, result) in batch.iter().zip(answer["results"].as_array().into_iter().flatten()) {
            let outcome = result["outcome"].as_str().unwrap_or("?").to_string();
            if outcome == "unknown" {
                let id = label.get("record_id").or_else(|| label.get("request_id"));
                unknown.push(id.and_then(Value::as_str).unwrap_or_default().to_string());
            }
            *outcomes.entry(outcome).or_default() += 1;
        }
        sent += batch.len();
        eprint!("\rimported {sent}/{} labels", labels.len());
    }
    eprintln!();
    let summary: Vec<String> = outcomes.iter().map(|(k, v)| format!("{v} {k}")).collect();
    println!("{} labels from {}: {}", labels.len(), a.file.display(), summary.join(", "));
    if !unknown.is_empty() {
        println!("unknown (never decided here, or past the audit retention): {}", unknown.join(" "));
    }
    Ok(())
}
