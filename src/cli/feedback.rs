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
    /// The labels: `.csv` (header: record_id or request_id, label, source?, reviewer?, note?;
    /// cells trimmed) or `.jsonl` / `.ndjson` (one label object per line, the fields
    /// POST /v1/feedback takes).
    pub file: PathBuf,
    /// A replica's admin listener, e.g. http://127.0.0.1:9090.
    #[arg(long, env = "TIERGATE_ADMIN_URL")]
    pub admin: String,
    /// The admin listener's bearer token (`[admin] token`).
    #[arg(long, env = "TIERGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The source of rows that name none, e.g. `chargeback` for a card network's file; without
    /// it every row must name its own (a chargeback outranks an analyst's label).
    #[arg(long)]
    pub source: Option<String>,
    /// Most labels per request.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u16).range(1..=MAX_BATCH as i64))]
    pub batch: u16,
    /// Most bytes per request body: the replica's `[server] max_body_bytes` (64 KiB by
    /// default); a batch is cut short before it.
    #[arg(long, default_value_t = 64 * 1024, value_parser = clap::value_parser!(u32).range(256..))]
    pub max_body_bytes: u32,
    /// How long to wait for each answer, ms.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// How often a batch answered 503 (a replica busy, or a peer that may hold a record not
    /// answering) is sent again, after the `Retry-After` it names (labels are idempotent).
    #[arg(long, default_value_t = 5)]
    pub retries: u32,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Import(a) => import(a),
    }
}

/// Reads `path` into label objects, each checked as the endpoint checks it; errors name the
/// file's line (where the row starts) and the field.
fn read(path: &Path, default_source: Option<&str>) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let rows = match extension.as_str() {
        "csv" => csv_rows(path, text)?,
        "jsonl" | "ndjson" => json_rows(path, text)?,
        other => bail!("{}: `.{other}`: give a .csv or a .jsonl file", path.display()),
    };
    let mut labels = Vec::with_capacity(rows.len());
    for (line, mut row) in rows {
        if let Some(source) = default_source {
            row.entry("source").or_insert_with(|| Value::from(source));
        } else if !row.contains_key("source") {
            bail!(
                "{}: line {line}: no `source`: name it in the row, or give --source for rows without one",
                path.display()
            );
        }
        let value = Value::Object(row);
        match parse_labels(value.clone()) {
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

type Rows = Vec<(u64, Map<String, Value>)>;

fn csv_rows(path: &Path, text: &str) -> anyhow::Result<Rows> {
    let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::All).from_reader(text.as_bytes());
    let header = reader.headers().with_context(|| format!("{}: no header row", path.display()))?.clone();
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.with_context(|| format!("reading {}", path.display()))?;
        let line = record.position().map_or(0, csv::Position::line);
        let fields = header.iter().zip(record.iter()).filter(|(_, v)| !v.is_empty());
        rows.push((line, fields.map(|(k, v)| (k.to_string(), Value::from(v))).collect()));
    }
    Ok(rows)
}

fn json_rows(path: &Path, text: &str) -> anyhow::Result<Rows> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let line_no = i as u64 + 1;
        match serde_json::from_str(line) {
            Ok(Value::Object(map)) => rows.push((line_no, map)),
            Ok(_) => bail!("{}: line {line_no}: not a JSON object (one label per line)", path.display()),
            Err(e) => bail!("{}: line {line_no}: {e}", path.display()),
        }
    }
    Ok(rows)
}

/// `labels` cut into request bodies of at most `most` labels and `max_bytes` bytes each (a
/// label bigger than `max_bytes` alone is an error naming it).
fn batches(labels: &[Value], most: usize, max_bytes: usize) -> anyhow::Result<Vec<(usize, String)>> {
    let mut out = Vec::new();
    let (mut body, mut count, mut first) = (String::from("["), 0, 0);
    for (i, label) in labels.iter().enumerate() {
        let text = label.to_string();
        anyhow::ensure!(
            text.len() + 2 <= max_bytes,
            "label {} is {} bytes as JSON, over --max-body-bytes {max_bytes}",
            i + 1,
            text.len()
        );
        if count == most || body.len() + text.len() + 2 > max_bytes {
            body.push(']');
            out.push((first, std::mem::replace(&mut body, String::from("["))));
            (count, first) = (0, i);
        }
        if count > 0 {
            body.push(',');
        }
        body.push_str(&text);
        count += 1;
    }
    body.push(']');
    out.push((first, body));
    Ok(out)
}

fn import(a: ImportArgs) -> anyhow::Result<()> {
    let labels = read(&a.file, a.source.as_deref())?;
    let uri: http::Uri = a
        .admin
        .parse()
        .ok()
        .filter(|u: &http::Uri| u.scheme_str() == Some("http") && u.host().is_some())
        .with_context(|| {
            format!("--admin `{}`: give the admin listener as an http URL, e.g. http://127.0.0.1:9090", a.admin)
        })?;
    let url = format!("{}/v1/feedback", uri.to_string().trim_end_matches('/'));
    let bodies = batches(&labels, a.batch as usize, a.max_body_bytes as usize)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let send = |body: &str| {
        let mut req = http::Request::post(&url).header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = &a.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req.body(Full::new(Bytes::from(body.to_string())))?;
        runtime.block_on(async {
            let answer = tokio::time::timeout(std::time::Duration::from_millis(a.timeout_ms), async {
                let response = client.request(req).await.with_context(|| format!("sending labels to {url}"))?;
                let (status, retry_after) = (response.status(), retry_after(response.headers()));
                anyhow::Ok((status, retry_after, response.into_body().collect().await?.to_bytes()))
            });
            answer
                .await
                .map_err(|_| anyhow::anyhow!("{url} did not answer within {} ms (--timeout-ms)", a.timeout_ms))?
        })
    };
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut unknown: Vec<String> = Vec::new();
    for (n, (first, body)) in bodies.iter().enumerate() {
        let batch = &labels[*first..bodies.get(n + 1).map_or(labels.len(), |(next, _)| *next)];
        let mut tries = 0;
        let answer = loop {
            let (status, wait_s, answer) = send(body)?;
            if status == http::StatusCode::SERVICE_UNAVAILABLE && tries < a.retries {
                tries += 1;
                eprintln!(
                    "\n{url} answered 503 ({}); retry {tries} of {} in {wait_s} s",
                    String::from_utf8_lossy(&answer),
                    a.retries
                );
                std::thread::sleep(std::time::Duration::from_secs(wait_s));
                continue;
            }
            if !status.is_success() {
                bail!(
                    "{url} answered {status} after {first} of {} labels (labels are idempotent: run the import again){}: {}",
                    labels.len(),
                    if status == http::StatusCode::PAYLOAD_TOO_LARGE { "; lower --max-body-bytes to the replica's [server] max_body_bytes" } else { "" },
                    String::from_utf8_lossy(&answer)
                );
            }
            break answer;
        };
        let answer: Value = serde_json::from_slice(&answer).context("the answer is not JSON")?;
        for (label, result) in batch.iter().zip(answer["results"].as_array().into_iter().flatten()) {
            let outcome = result["outcome"].as_str().unwrap_or("?").to_string();
            if outcome == "unknown" {
                let id = label.get("record_id").or_else(|| label.get("request_id"));
                unknown.push(id.and_then(Value::as_str).unwrap_or_default().to_string());
            }
            *outcomes.entry(outcome).or_default() += 1;
        }
        eprint!("\rimported {}/{} labels", first + batch.len(), labels.len());
    }
    eprintln!();
    let summary: Vec<String> = outcomes.iter().map(|(k, v)| format!("{v} {k}")).collect();
    println!("{} labels from {}: {}", labels.len(), a.file.display(), summary.join(", "));
    if !unknown.is_empty() {
        println!("unknown (never decided here, or past the audit retention): {}", unknown.join(" "));
    }
    Ok(())
}

/// The seconds a 503's `Retry-After` asks for (1 when absent; at most 60).
fn retry_after(headers: &http::HeaderMap) -> u64 {
    let named = headers.get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    named.unwrap_or(1).clamp(1, 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_stop_at_the_count_or_the_byte_limit_whichever_comes_first() {
        let labels: Vec<Value> =
            (0..10).map(|i| serde_json::json!({"record_id": format!("r{i}"), "label": "ok"})).collect();
        let one = labels[0].to_string().len();
        let by_count = batches(&labels, 4, 1 << 20).unwrap();
        assert_eq!(by_count.iter().map(|(first, _)| *first).collect::<Vec<_>>(), [0, 4, 8]);
        let by_bytes = batches(&labels, 100, 2 + 3 * one + 2).unwrap();
        assert_eq!(by_bytes.iter().map(|(first, _)| *first).collect::<Vec<_>>(), [0, 3, 6, 9]);
        for (_, body) in &by_bytes {
            assert!(body.len() <= 2 + 3 * one + 2 && serde_json::from_str::<Vec<Value>>(body).is_ok(), "{body}");
        }
        assert!(batches(&labels, 100, one).is_err(), "a label over the limit alone is named");
    }
}
