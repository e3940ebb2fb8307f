//! `tiergate features-model pack`: a risk team's own model over transaction features — a
//! feature schema, the model exported to ONNX and a labelled validation CSV — into a directory
//! the features model serves (`[features_model] dir`): the temperature fitted on the validation
//! set (`calibration.json`), `manifest.json` (name, output kind, sha256 of every file, the
//! validation numbers) and a model card stub. With `--trees` (the ensemble's nodes with their
//! covers, as models/recipe/features/train.py writes them) contributions are exact TreeSHAP;
//! without, occlusion against the schema's baseline.
//!
//! Refused before anything is written, with what was found: a schema that does not parse, a
//! model whose input is not `[N, features]` float or whose output is neither a margin `[N, 1]`
//! nor probabilities `[N, 2]`, a CSV without a required feature's column or the label's, a
//! value the schema cannot read (row and column named), fewer than 20 rows or one class only.

use super::model::{prepare_out, MIN_VALIDATION_ROWS};
use anyhow::{bail, ensure, Context as _};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use tiergate::calibrate::{confidences, ece, fit_temperature};
use tiergate::features_model::{FeaturesModel, Schema};
use tiergate::tier::manifest::sha256_hex;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Turn a feature schema, an ONNX model and a labelled validation CSV into a features model
    /// directory, calibrated on the validation set. Writes into --out: model.onnx, schema.toml,
    /// calibration.json, manifest.json, MODEL_CARD.md (and trees.json with --trees).
    Pack(PackArgs),
}

#[derive(clap::Args)]
pub struct PackArgs {
    /// The feature schema (TOML `[[feature]]` tables: name, kind, unit, required, missing,
    /// standardize, description), in the model's input order.
    #[arg(long)]
    pub schema: PathBuf,
    /// The model in ONNX: input float [N, features]; output [N, 1] margin (log-odds) or
    /// [N, 2] probabilities (risk second).
    #[arg(long)]
    pub onnx: PathBuf,
    /// Labelled validation CSV with a header: a column per schema feature (an empty cell is
    /// absent) and the label column (0 ok, 1 risk); at least 20 rows of both classes.
    #[arg(long)]
    pub validation: PathBuf,
    /// The label's column.
    #[arg(long, default_value = "label")]
    pub label_column: String,
    /// The tree ensemble with node covers (JSON: base_margin, features, trees) for exact TreeSHAP.
    #[arg(long)]
    pub trees: Option<PathBuf>,
    /// Directory to write (created; refused if it exists and is not empty, unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// The model's name (decisions' `model`, the card). Default: the ONNX file's stem.
    #[arg(long)]
    pub name: Option<String>,
    /// Write into a non-empty --out (its files of the same names are replaced).
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Pack(args) => pack(&args),
    }
}

fn pack(a: &PackArgs) -> anyhow::Result<()> {
    let schema_text = std::fs::read_to_string(&a.schema).with_context(|| format!("--schema {}", a.schema.display()))?;
    let schema = Schema::parse(&schema_text).map_err(|e| anyhow::anyhow!("--schema {}: {e}", a.schema.display()))?;
    let (rows, labels) = read_validation(&a.validation, &a.label_column, &schema)?;
    let positives = labels.iter().filter(|&&l| l == 1).count();
    ensure!(
        rows.len() >= MIN_VALIDATION_ROWS,
        "--validation: {} rows; at least {MIN_VALIDATION_ROWS} are needed",
        rows.len()
    );
    ensure!(
        positives > 0 && positives < rows.len(),
        "--validation: both labels are needed, got {positives} risk of {}",
        rows.len()
    );
    prepare_out(&a.out, a.force)?;
    let name = a.name.clone().unwrap_or_else(|| a.onnx.file_stem().unwrap_or_default().to_string_lossy().into_owned());
    std::fs::copy(&a.onnx, a.out.join("model.onnx")).with_context(|| format!("--onnx {}", a.onnx.display()))?;
    std::fs::write(a.out.join("schema.toml"), &schema_text)?;
    if let Some(trees) = &a.trees {
        std::fs::copy(trees, a.out.join("trees.json")).with_context(|| format!("--trees {}", trees.display()))?;
    }
    let env = tiergate::ort_lib::environment(None).map_err(anyhow::Error::msg)?;
    // Load once at T = 1 to learn the output kind and read margins; every load check runs here.
    let output = output_kind(env, &a.onnx, schema.features.len())?;
    std::fs::write(a.out.join("manifest.json"), json!({"name": name, "output": output}).to_string())?;
    std::fs::write(a.out.join("calibration.json"), json!({"temperature": 1.0}).to_string())?;
    let model = FeaturesModel::load(&a.out, env).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let margins: Vec<f64> = rows.iter().map(|r| model.score(r).map(|s| s.margin)).collect::<Result<_, _>>()?;
    let logits: Vec<Vec<f32>> = margins.iter().map(|&m| vec![0.0, m as f32]).collect();
    let t = fit_temperature(&logits, &labels);
    let ece_at = |t: f64| {
        let (conf, correct) = confidences(&logits, &labels, t);
        ece(&conf, &correct, 15)
    };
    let (before, after, auc) = (ece_at(1.0), ece_at(t), roc_auc(&margins, &labels));
    std::fs::write(
        a.out.join("calibration.json"),
        serde_json::to_string_pretty(&json!({"method": "temperature", "temperature": t, "n": rows.len(),
            "ece_before": before, "ece_after": after}))?
            + "\n",
    )?;
    let files =
        ["model.onnx", "schema.toml", "calibration.json"].into_iter().chain(a.trees.as_ref().map(|_| "trees.json"));
    let sha: Map<String, Value> = files
        .map(|f| Ok((f.to_string(), Value::from(sha256_hex(&std::fs::read(a.out.join(f))?)))))
        .collect::<anyhow::Result<_>>()?;
    let validation = json!({"n": rows.len(), "risk": positives, "auc": auc, "ece": after, "ece_uncalibrated": before});
    let manifest = json!({"name": name, "output": output, "features": schema.features.len(), "validation": validation, "sha256": sha});
    std::fs::write(a.out.join("manifest.json"), serde_json::to_string_pretty(&manifest)? + "\n")?;
    std::fs::write(a.out.join("MODEL_CARD.md"), card(&name, &schema, &validation, t, a.trees.is_some()))?;
    FeaturesModel::load(&a.out, env).map_err(|e| anyhow::anyhow!("the written directory does not load: {e:#}"))?;
    println!(
        "packed {name} into {}: {} validation rows ({positives} risk), AUC {auc:.4}, temperature {t:.4}, ECE {before:.4} -> {after:.4}",
        a.out.display(),
        rows.len()
    );
    Ok(())
}

/// Each CSV row as the model's input row, with its label. Errors name the row and column.
fn read_validation(path: &Path, label: &str, schema: &Schema) -> anyhow::Result<(Vec<Vec<f32>>, Vec<usize>)> {
    let mut reader = csv::Reader::from_path(path).with_context(|| format!("--validation {}", path.display()))?;
    let header = reader.headers()?.clone();
    let column = |name: &str| header.iter().position(|h| h == name);
    let label_at = column(label).with_context(|| format!("--validation: no `{label}` column (--label-column)"))?;
    let missing: Vec<&str> =
        schema.features.iter().filter(|f| f.required && column(&f.name).is_none()).map(|f| f.name.as_str()).collect();
    ensure!(missing.is_empty(), "--validation: no column for required feature(s) {}", missing.join(", "));
    let (mut rows, mut labels) = (Vec::new(), Vec::new());
    for (i, record) in reader.records().enumerate() {
        let record = record.with_context(|| format!("--validation row {}", i + 2))?;
        let mut features = Map::new();
        for f in &schema.features {
            if let Some(cell) = column(&f.name).and_then(|c| record.get(c)).filter(|c| !c.trim().is_empty()) {
                let value: f64 = cell
                    .trim()
                    .parse()
                    .with_context(|| format!("--validation row {}, `{}`: {cell:?}", i + 2, f.name))?;
                features.insert(f.name.clone(), Value::from(value));
            }
        }
        let row = schema.vector(&features).map_err(|e| anyhow::anyhow!("--validation row {}: {e:?}", i + 2))?;
        let y = match record.get(label_at).map(str::trim) {
            Some("0") => 0,
            Some("1") => 1,
            other => bail!("--validation row {}: `{label}` must be 0 or 1, got {other:?}", i + 2),
        };
        rows.push(row);
        labels.push(y);
    }
    Ok((rows, labels))
}

/// `margin` or `probability`, from the output's width on the schema's baseline row.
fn output_kind(env: &'static ort::environment::Environment, onnx: &Path, n: usize) -> anyhow::Result<&'static str> {
    let mut session = ort::session::Session::builder(env)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .commit_from_file(onnx)
        .map_err(|e| anyhow::anyhow!("--onnx {}: ONNX Runtime cannot load it: {e}", onnx.display()))?;
    let input = ort::value::Tensor::from_array(([1usize, n], vec![0f32; n]))?;
    let outputs = session.run(ort::inputs![input]).map_err(|e| {
        anyhow::anyhow!("--onnx: running it on one row of {n} floats failed (is its input [N, {n}] float?): {e}")
    })?;
    let (_, values) = outputs[0]
        .try_extract_tensor::<f32>()
        .map_err(|e| anyhow::anyhow!("--onnx: its first output is not a float tensor: {e}"))?;
    match values.len() {
        1 => Ok("margin"),
        2 => Ok("probability"),
        k => bail!("--onnx: its first output has {k} values per row; tiergate reads 1 (margin) or 2 (probabilities, risk second)"),
    }
}

/// The probability that a random risk row outranks a random ok row (ties count half).
fn roc_auc(scores: &[f64], labels: &[usize]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut i) = (0.0, 0);
    while i < order.len() {
        let j = (i..order.len()).find(|&j| scores[order[j]] != scores[order[i]]).unwrap_or(order.len());
        let mid = (i + j + 1) as f64 / 2.0; // average 1-based rank of the tie group
        rank_sum += order[i..j].iter().filter(|&&k| labels[k] == 1).count() as f64 * mid;
        i = j;
    }
    let pos = labels.iter().filter(|&&l| l == 1).count() as f64;
    let neg = labels.len() as f64 - pos;
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}

fn card(name: &str, schema: &Schema, validation: &Value, t: f64, trees: bool) -> String {
    let mut s = format!(
        "# {name}\n\nA features model packed by `tiergate features-model pack`. Fill in what the data is, \
        how it was collected and split, and what the model must not be used for.\n\n## Features\n\n\
        | feature | kind | unit | required | missing |\n|---|---|---|---|---|\n"
    );
    for f in &schema.features {
        let missing = f.missing.map_or(String::new(), |m| m.to_string());
        s += &format!("| `{}` | {:?} | {} | {} | {missing} |\n", f.name, f.kind, f.unit, f.required);
    }
    s += &format!(
        "\n## Validation (the --validation file)\n\n{validation}\n\nTemperature {t:.4} (temperature scaling of the margin). \
         Contributions in `explain`: {}.\n",
        if trees { "exact TreeSHAP (trees.json)" } else { "occlusion against the schema's baseline row" }
    );
    s
}
