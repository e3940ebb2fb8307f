//! `tiergate model pack`: a risk team's own classifier — an ONNX export, its `tokenizer.json`
//! and a labelled validation JSONL — into a model directory the cpu tier serves: `model.json`,
//! the temperature fitted on the validation set (`calibration.json`), the out-of-distribution
//! reference (`ood.json`), `MANIFEST.sha256` and a model card stub with the validation numbers.
//!
//! What tiergate cannot serve is refused before anything is written, with what it found and what
//! it needs: the inputs (`input_ids`, `attention_mask`, int64 `[batch, sequence]`, nothing else),
//! the outputs (`logits` float `[batch, 2]` and `embedding` float `[batch, dim]`), the classes
//! (two, risk second), a tokenizer that does not load, validation rows that do not parse.

use anyhow::{bail, ensure, Context as _};
use std::path::{Path, PathBuf};
use tiergate::calibrate::{confidences, ece, fit_temperature, nll, CalibrationFile};
use tiergate::tier::manifest::{self, sha256_hex, MANIFEST};
use tiergate::tier::model::{ModelAssets, Provider, SessionOptions};
use tiergate::tier::ood;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
pub enum Command {
    /// Turn an ONNX classifier export, its tokenizer.json and a labelled validation JSONL into a
    /// model directory tiergate serves (`[model] dir`), calibrated on the validation set.
    ///
    /// The ONNX graph must take `input_ids` and `attention_mask` (int64, [batch, sequence]) and
    /// return `logits` (float, [batch, 2], ok then risk) and `embedding` (float, [batch, dim],
    /// e.g. the L2-normalised mean of the last hidden states). Writes into --out: the two files,
    /// model.json, calibration.json, ood.json, MANIFEST.sha256 and MODEL_CARD.md.
    Pack(PackArgs),
    /// Agreement figures of a shadow model (`[shadow.model]`) with the live one, from the shadow
    /// log (`[shadow] log`): overall and by language, against the live cpu verdict (agreement,
    /// Cohen's kappa, both kinds of disagreement) and, where the live cpu tier gave no verdict,
    /// what the candidate would say.
    Agreement(super::agreement::AgreementArgs),
}

#[derive(clap::Args)]
pub struct PackArgs {
    /// The classifier exported to ONNX.
    #[arg(long)]
    pub onnx: PathBuf,
    /// Its Hugging Face `tokenizer.json` (the one it was trained with, special tokens included).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Labelled validation JSON lines `{"text": str, "label": 0|1 or a class name}` the model
    /// never trained on: at least 20 rows, both classes. Fits the temperature and `ood.json`.
    #[arg(long)]
    pub validation: PathBuf,
    /// Directory to write (created; refused if it exists and is not empty, unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// The model's name (model.json, /readyz, metrics). Default: the ONNX file's stem.
    #[arg(long)]
    pub name: Option<String>,
    /// Tokens per window, special tokens included (the model's maximum sequence length or less).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(16..=4096))]
    pub max_seq_len: u32,
    /// The classes of the logits, in order (comma-separated). tiergate reads the first as ok and
    /// the second as risk.
    #[arg(long, default_value = "ok,risk", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Which class of --labels is the risk class.
    #[arg(long, default_value = "risk")]
    pub risk_label: String,
    /// Write into a non-empty --out (its files of the same names are replaced).
    #[arg(long)]
    pub force: bool,
}

/// Least validation rows: fewer cannot fit a temperature and an OOD reference worth serving.
pub const MIN_VALIDATION_ROWS: usize = 20;

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        Command::Pack(args) => pack(&args),
        Command::Agreement(args) => super::agreement::run(&args),
    }
}

fn pack(args: &PackArgs) -> anyhow::Result<()> {
    check_labels(&args.labels, &args.risk_label)?;
    let rows = read_validation(&args.validation, &args.labels)?;
    let tokenizer = tokenizers::Tokenizer::from_file(&args.tokenizer).map_err(|e| {
        anyhow::anyhow!("--tokenizer {}: not a tokenizer.json tiergate can load: {e}", args.tokenizer.display())
    })?;
    let env = tiergate::ort_lib::environment(None).map_err(anyhow::Error::msg)?;
    let dim = check_graph(env, &args.onnx, &tokenizer)?;
    prepare_out(&args.out, args.force)?;

    let stem = args.onnx.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    let name = args.name.clone().unwrap_or_else(|| stem.to_string());
    let onnx_file = format!("{stem}.onnx");
    let copy = |from: &Path, to: &str| {
        std::fs::copy(from, args.out.join(to))
            .with_context(|| format!("copying {} into {}", from.display(), args.out.display()))
    };
    copy(&args.onnx, &onnx_file)?;
    copy(&args.tokenizer, "tokenizer.json")?;
    let onnx_sha = sha256_hex(&std::fs::read(args.out.join(&onnx_file))?);
    write_json(
        &args.out.join("model.json"),
        &serde_json::json!({
            "name": name, "onnx": onnx_file, "sha256": onnx_sha, "tokenizer": "tokenizer.json",
            "max_seq_len": args.max_seq_len, "labels": ["ok", "risk"], "classes": args.labels,
            "inputs": ["input_ids", "attention_mask"], "outputs": ["logits", "embedding"], "embedding_dim": dim,
        }),
    )?;
    // Provisional calibration and OOD files, so that the validation set is scored by the loader
    // and classifier the server uses (windows, riskiest window), then replaced by the fits.
    let unit: Vec<f32> = (0..dim).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect();
    write_json(&args.out.join("calibration.json"), &serde_json::json!({"temperature": 1.0}))?;
    write_json(&args.out.join("ood.json"), &ood::OodFile { centroids: vec![unit], quantiles: vec![0.0, 1.0] })?;
    write_manifest(&args.out, &onnx_file)?;

    let scored = score(env, &args.out, &rows)?;
    let labels: Vec<usize> = rows.iter().map(|r| r.1).collect();
    let t = fit_temperature(&scored.logits, &labels);
    ensure!(
        (0.02..50.0).contains(&t),
        "the fitted temperature {t:.3} is at the edge of its range: the validation set is too small, or the \
         model's logits do not separate its labels (are the classes in --labels in the model's order?)"
    );
    let (reference, held_out) = halves(&scored.embeddings);
    let k = (reference.len() / 10).clamp(1, 32);
    let ood_file = ood::fit(&reference, &held_out, k)?;
    let report = Report::new(&scored.logits, &labels, t);
    let mut extra = serde_json::Map::new();
    extra.insert("fitted_on".into(), format!("{} ({} rows)", args.validation.display(), rows.len()).into());
    extra.insert("ece_15_before".into(), report.ece_before.into());
    extra.insert("ece_15_after".into(), report.ece_after.into());
    let method = "temperature scaling (Guo et al. 2017), NLL minimised by `tiergate model pack`".to_string();
    write_json(&args.out.join("calibration.json"), &CalibrationFile { temperature: t, method: Some(method), extra })?;
    let mut ood_json = serde_json::to_value(&ood_file)?;
    ood_json["method"] =
        "1 - max cosine similarity to k-means centroids; score = empirical CDF over held-out rows".into();
    ood_json["fitted_on"] = format!(
        "{k} centroids on a seeded half of {} ({} rows), quantiles over the other half ({} rows); refit on the \
         training split's embeddings where you have them",
        args.validation.display(),
        reference.len(),
        held_out.len()
    )
    .into();
    write_json(&args.out.join("ood.json"), &ood_json)?;
    write_manifest(&args.out, &onnx_file)?;
    std::fs::write(args.out.join("MODEL_CARD.md"), report.card(&name, args, &labels, &onnx_sha, dim))?;
    ModelAssets::load(&args.out).context("the packed directory does not load")?;
    println!("{}", report.summary(&name, &args.out, rows.len()));
    Ok(())
}

fn check_labels(labels: &[String], risk: &str) -> anyhow::Result<()> {
    ensure!(
        labels.len() == 2,
        "--labels names {} classes ({}): tiergate serves two-class classifiers (ok, risk); a multi-class model \
         needs a two-class head exported, or its classes merged before export",
        labels.len(),
        labels.join(", ")
    );
    match labels.iter().position(|l| l == risk) {
        Some(1) => Ok(()),
        Some(_) => bail!(
            "--labels puts the risk class {risk:?} first: tiergate reads logit 1 as risk. Export the head with its \
             two rows swapped (or pass the classes in the model's true order if they were mistyped)"
        ),
        None => bail!("--risk-label {risk:?} is not one of --labels ({})", labels.join(", ")),
    }
}

/// Validation rows `(text, label)`: label 0/1 or one of the class names.
fn read_validation(path: &Path, classes: &[String]) -> anyhow::Result<Vec<(String, usize)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading --validation {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("{}:{}", path.display(), i + 1);
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let Some(t) = v.get("text").and_then(|t| t.as_str()) else {
            bail!("{}: expected {{\"text\": str, \"label\": 0|1 or a class name}}, no string `text`", at());
        };
        let label = match v.get("label") {
            Some(serde_json::Value::Number(n)) if n.as_u64().is_some_and(|n| n <= 1) => {
                n.as_u64().unwrap_or(0) as usize
            }
            Some(serde_json::Value::String(s)) if classes.contains(s) => {
                classes.iter().position(|c| c == s).unwrap_or(0)
            }
            other => bail!("{}: `label` must be 0, 1 or one of {}, got {other:?}", at(), classes.join(", ")),
        };
        rows.push((t.to_string(), label));
    }
    let risk = rows.iter().filter(|r| r.1 == 1).count();
    ensure!(
        rows.len() >= MIN_VALIDATION_ROWS && risk > 0 && risk < rows.len(),
        "--validation {}: {} rows, {risk} of them risk; need at least {MIN_VALIDATION_ROWS} with both classes",
        path.display(),
        rows.len()
    );
    Ok(rows)
}

/// Checks the graph's inputs and outputs, then runs it once on a short text: returns the
/// embedding's length.
fn check_graph(
    env: &ort::environment::Environment,
    onnx: &Path,
    tokenizer: &tokenizers::Tokenizer,
) -> anyhow::Result<usize> {
    use ort::value::TensorElementType as E;
    use ort::value::ValueType;
    let mut session = ort::session::Session::builder(env)
        .map_err(|e| anyhow::anyhow!("creating an ONNX Runtime session: {e}"))?
        .commit_from_file(onnx)
        .map_err(|e| anyhow::anyhow!("--onnx {}: ONNX Runtime cannot load it: {e}", onnx.display()))?;
    let describe = |o: &ort::value::Outlet| format!("{} {}", o.name(), describe_type(o.dtype()));
    let inputs: Vec<String> = session.inputs().iter().map(describe).collect();
    let outputs: Vec<String> = session.outputs().iter().map(describe).collect();
    let is = |t: &ValueType, ty: E| matches!(t, ValueType::Tensor { ty: x, shape, .. } if *x == ty && shape.len() == 2);
    let names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
    let inputs_ok = names.len() == 2
        && session
            .inputs()
            .iter()
            .all(|i| matches!(i.name(), "input_ids" | "attention_mask") && is(i.dtype(), E::Int64));
    ensure!(
        inputs_ok,
        "--onnx {}: inputs are [{}]; tiergate feeds exactly `input_ids` and `attention_mask`, int64 [batch, \
         sequence] (export without token_type_ids, or with it folded to zeros inside the graph)",
        onnx.display(),
        inputs.join(", ")
    );
    let output = |name: &str| session.outputs().iter().find(|o| o.name() == name).map(|o| o.dtype().clone());
    let logits_ok = output("logits").is_some_and(|t| is(&t, E::Float32) && last_dim(&t).is_none_or(|d| d == 2));
    let embedding_ok = output("embedding").is_some_and(|t| is(&t, E::Float32));
    ensure!(
        logits_ok && embedding_ok,
        "--onnx {}: outputs are [{}]; tiergate needs `logits` float [batch, 2] (ok, risk) and `embedding` float \
         [batch, dim] (e.g. the L2-normalised mean of the last hidden states, for the out-of-distribution score)",
        onnx.display(),
        outputs.join(", ")
    );
    let probe = tokenizer.encode("hello", true).map_err(|e| anyhow::anyhow!("--tokenizer: cannot encode: {e}"))?;
    let ids: Vec<i64> = probe.get_ids().iter().map(|&i| i64::from(i)).collect();
    let shape = [1i64, ids.len() as i64];
    let run = session.run(ort::inputs![
        "input_ids" => ort::value::Tensor::from_array((shape, ids.clone()))?,
        "attention_mask" => ort::value::Tensor::from_array((shape, vec![1i64; ids.len()]))?,
    ]);
    let outputs = run.map_err(|e| anyhow::anyhow!("--onnx {}: running it on one text failed: {e}", onnx.display()))?;
    let (logits_shape, _) = outputs["logits"].try_extract_tensor::<f32>()?;
    let (embedding_shape, embedding) = outputs["embedding"].try_extract_tensor::<f32>()?;
    ensure!(
        logits_shape.len() == 2 && logits_shape[1] == 2,
        "--onnx {}: `logits` has shape {logits_shape:?} for one text; tiergate needs [1, 2]",
        onnx.display()
    );
    let dim = embedding.len();
    ensure!(
        embedding_shape.len() == 2 && dim > 0,
        "--onnx {}: `embedding` has shape {embedding_shape:?} for one text; tiergate needs [1, dim]",
        onnx.display()
    );
    let norm = embedding.iter().map(|x| x * x).sum::<f32>().sqrt();
    ensure!(
        (norm - 1.0).abs() < 1e-2,
        "--onnx {}: `embedding` has norm {norm:.3}; tiergate's out-of-distribution score needs it L2-normalised \
         (divide by its norm inside the graph)",
        onnx.display()
    );
    Ok(dim)
}

fn last_dim(t: &ort::value::ValueType) -> Option<usize> {
    t.tensor_shape().and_then(|s| s.last().copied()).and_then(|d| usize::try_from(d).ok())
}

fn describe_type(t: &ort::value::ValueType) -> String {
    match t {
        ort::value::ValueType::Tensor { ty, shape, .. } => {
            let dims: Vec<String> = shape.iter().map(|&d| if d < 0 { "?".into() } else { d.to_string() }).collect();
            format!("{ty} [{}]", dims.join(", "))
        }
        other => format!("{other}"),
    }
}

/// Creates `out`; refuses one that is not empty unless `force` (both pack commands).
pub fn prepare_out(out: &Path, force: bool) -> anyhow::Result<()> {
    let non_empty = std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(false);
    ensure!(!non_empty || force, "--out {} exists and is not empty (pass --force to write into it)", out.display());
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// `MANIFEST.sha256` over every file the loader reads, written anew by the manifest's own writer.
fn write_manifest(dir: &Path, onnx_file: &str) -> anyhow::Result<()> {
    std::fs::write(dir.join(MANIFEST), "").with_context(|| format!("writing {}", dir.join(MANIFEST).display()))?;
    for f in ["model.json", onnx_file, "tokenizer.json", "calibration.json", "ood.json"] {
        manifest::record(&dir.join(f))?;
    }
    Ok(())
}

/// The validation set as the server scores it: each text's logits (the riskiest window's at
/// T = 1) and the embedding of its first window.
struct Scored {
    logits: Vec<Vec<f32>>,
    embeddings: Vec<Vec<f32>>,
}

fn score(env: &ort::environment::Environment, dir: &Path, rows: &[(String, usize)]) -> anyhow::Result<Scored> {
    let assets = ModelAssets::load(dir)?;
    let options = SessionOptions { intra_threads: 2, intra_op_spinning: false, provider: Provider::Cpu, device_id: 0 };
    let mut classifier = assets.classifier(env, options, None)?;
    let (mut logits, mut embeddings) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    for (i, chunk) in rows.chunks(16).enumerate() {
        let texts: Vec<&str> = chunk.iter().map(|r| r.0.as_str()).collect();
        logits.extend(classifier.classify(&texts)?.into_iter().map(|o| o.logits.to_vec()));
        let firsts = texts
            .iter()
            .map(|t| Ok(classifier.encode(t)?.windows.swap_remove(0)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        embeddings.extend(classifier.embed(&firsts)?);
        if i % 20 == 19 {
            eprintln!("scored {} of {} validation rows", logits.len(), rows.len());
        }
    }
    Ok(Scored { logits, embeddings })
}

/// A seeded half for the OOD centroids and the other for its quantiles.
fn halves(embeddings: &[Vec<f32>]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut order: Vec<usize> = (0..embeddings.len()).collect();
    fastrand::Rng::with_seed(20261202).shuffle(&mut order);
    let (a, b) = order.split_at(order.len() / 2);
    let pick = |idx: &[usize]| idx.iter().map(|&i| embeddings[i].clone()).collect();
    (pick(a), pick(b))
}

/// Validation numbers at T = 1 and at the fitted temperature.
struct Report {
    temperature: f64,
    accuracy: f64,
    auroc: f64,
    ece_before: f64,
    ece_after: f64,
    nll_before: f64,
    nll_after: f64,
}

impl Report {
    fn new(logits: &[Vec<f32>], labels: &[usize], t: f64) -> Report {
        let (conf1, correct) = confidences(logits, labels, 1.0);
        let (conf_t, _) = confidences(logits, labels, t);
        let margin: Vec<f64> = logits.iter().map(|z| f64::from(z[1] - z[0])).collect();
        Report {
            temperature: t,
            accuracy: correct.iter().filter(|&&c| c).count() as f64 / labels.len() as f64,
            auroc: auroc(&margin, labels),
            ece_before: ece(&conf1, &correct, 15),
            ece_after: ece(&conf_t, &correct, 15),
            nll_before: nll(logits, labels, 1.0),
            nll_after: nll(logits, labels, t),
        }
    }

    fn summary(&self, name: &str, out: &Path, n: usize) -> String {
        format!(
            "packed {name} into {}: {n} validation rows, accuracy {:.4}, AUROC {:.4}, temperature {:.4} \
             (ECE(15) {:.4} -> {:.4}, NLL {:.4} -> {:.4})\nserve it with `tiergate serve --models {}`",
            out.display(),
            self.accuracy,
            self.auroc,
            self.temperature,
            self.ece_before,
            self.ece_after,
            self.nll_before,
            self.nll_after,
            out.display()
        )
    }

    fn card(&self, name: &str, args: &PackArgs, labels: &[usize], sha: &str, dim: usize) -> String {
        let risk = labels.iter().filter(|&&l| l == 1).count();
        format!(
            "# Model card: {name}\n\n\
             Packed by `tiergate model pack` from `{}` (sha256 `{sha}`), `{}` and the validation set `{}`.\n\
             Fill in what only you know: the training data (sources, languages, kinds, dates), the intended use, \
             the languages and scripts measured to be served (`[cascade] model_languages`, `model_scripts`), and \
             known failures.\n\n\
             ## Interface\n\n- inputs `input_ids`, `attention_mask` (int64 [batch, sequence]); windows of {} tokens\n\
             - outputs `logits` [batch, 2] (classes {}), `embedding` [batch, {dim}]\n\n\
             ## Validation ({} rows, {risk} risk)\n\n\
             | | T | accuracy | AUROC | ECE (15 bins) | NLL |\n|---|---|---|---|---|---|\n\
             | uncalibrated | 1.0000 | {:.4} | {:.4} | {:.4} | {:.4} |\n\
             | served | {:.4} | {:.4} | {:.4} | {:.4} | {:.4} |\n\n\
             The temperature and the out-of-distribution reference were fitted on this set: these numbers are not a \
             blind measure. Measure a set the model and its makers never saw before serving it to decide, and \
             shadow it first.\n",
            args.onnx.display(),
            args.tokenizer.display(),
            args.validation.display(),
            args.max_seq_len,
            args.labels.join(", "),
            labels.len(),
            self.accuracy,
            self.auroc,
            self.ece_before,
            self.nll_before,
            self.temperature,
            self.accuracy,
            self.auroc,
            self.ece_after,
            self.nll_after,
        )
    }
}

/// Area under the ROC curve of `score` for `labels` (1 = positive): the Mann–Whitney U statistic
/// over all positive/negative pairs, ties counting one half.
fn auroc(score: &[f64], labels: &[usize]) -> f64 {
    let mut idx: Vec<usize> = (0..score.len()).collect();
    idx.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
    let (mut rank_sum, mut i) = (0.0, 0);
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && score[idx[j + 1]] == score[idx[i]] {
            j += 1;
        }
        let mid = (i + j) as f64 / 2.0 + 1.0; // average 1-based rank of the tie group
        rank_sum += idx[i..=j].iter().filter(|&&k| labels[k] == 1).count() as f64 * mid;
        i = j + 1;
    }
    let pos = labels.iter().filter(|&&l| l == 1).count() as f64;
    let neg = labels.len() as f64 - pos;
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auroc_counts_pairs_and_ties() {
        assert_eq!(auroc(&[0.1, 0.2, 0.8, 0.9], &[0, 0, 1, 1]), 1.0);
        assert_eq!(auroc(&[0.9, 0.8, 0.2, 0.1], &[0, 0, 1, 1]), 0.0);
        assert_eq!(auroc(&[0.5, 0.5], &[0, 1]), 0.5);
    }

    #[test]
    fn labels_must_be_two_with_risk_second() {
        let l = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(check_labels(&l(&["ok", "risk"]), "risk").is_ok());
        assert!(check_labels(&l(&["ham", "spam"]), "spam").is_ok());
        assert!(check_labels(&l(&["risk", "ok"]), "risk").unwrap_err().to_string().contains("first"));
        assert!(check_labels(&l(&["a", "b", "c"]), "c").unwrap_err().to_string().contains("3 classes"));
        assert!(check_labels(&l(&["ok", "risk"]), "fraud").unwrap_err().to_string().contains("not one of"));
    }
}
