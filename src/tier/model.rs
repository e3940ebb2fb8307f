//! The cpu tier's model: tokenizer + ONNX Runtime session + temperature + OOD scorer.
//!
//! Files in the model directory (written by `models/recipe`):
//! - `model.json`: manifest (ONNX file name and its sha256, tokenizer, `max_seq_len`, labels,
//!   input/output names);
//! - the INT8 ONNX model: inputs `input_ids`, `attention_mask` (int64 `[batch, seq]`), outputs
//!   `logits` (f32 `[batch, 2]`) and `embedding` (f32 `[batch, dim]`, mean-pooled, L2-normalised);
//! - `tokenizer.json` (Hugging Face tokenizers format);
//! - `calibration.json`: the fitted temperature;
//! - `ood.json`: k-means centroids of training embeddings and the quantiles of the validation
//!   split's distance to them.

pub use super::config::Provider;
use crate::calibrate::{softmax_t, CalibrationFile};
use anyhow::{bail, Context as _};
use ort::environment::Environment;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;
use ort::value::Tensor;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use tokenizers::{Encoding, Tokenizer, TruncationParams};

/// `model.json`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub onnx: String,
    pub sha256: String,
    pub tokenizer: String,
    pub max_seq_len: usize,
    pub labels: Vec<String>,
    #[serde(default)]
    pub embedding_dim: Option<usize>,
}

/// `ood.json`.
#[derive(Debug, Clone, Deserialize)]
struct OodFile {
    centroids: Vec<Vec<f32>>,
    quantiles: Vec<f64>,
}

/// Out-of-distribution score from the distance to the training data in embedding space:
/// `d = 1 - max_c cos(e, c)` over k-means centroids `c` of the training embeddings, turned
/// into the empirical CDF of `d` over the validation split, interpolated linearly between its
/// 101 quantiles (0 below the first, 1 above the last; as `ood.json` states). 0.5 is a typical
/// in-domain input; 1.0 is farther than every validation input.
#[derive(Debug, Clone)]
pub struct OodScorer {
    dim: usize,
    centroids: Vec<f32>,
    /// Ascending quantiles of `d` at probabilities `i / (len - 1)`.
    quantiles: Vec<f64>,
}

impl OodScorer {
    /// `embedding` must be L2-normalised, length `dim`.
    pub fn score(&self, embedding: &[f32]) -> f64 {
        let best = self
            .centroids
            .chunks_exact(self.dim)
            .map(|c| c.iter().zip(embedding).map(|(a, b)| a * b).sum::<f32>())
            .fold(f32::MIN, f32::max);
        ecdf(&self.quantiles, 1.0 - best as f64)
    }
}

/// The empirical CDF at `x` from ascending quantiles at probabilities `i / (n - 1)`.
fn ecdf(quantiles: &[f64], x: f64) -> f64 {
    let n = quantiles.len();
    let i = quantiles.partition_point(|&q| q <= x);
    if i == 0 {
        return 0.0;
    }
    if i == n || n == 1 {
        return 1.0;
    }
    let (lo, hi) = (quantiles[i - 1], quantiles[i]);
    let frac = if hi > lo { (x - lo) / (hi - lo) } else { 0.0 };
    ((i - 1) as f64 + frac) / (n - 1) as f64
}

/// Facts about the loaded model, for `/readyz`, logs and the model card check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelInfo {
    pub name: String,
    pub sha256: String,
    pub max_seq_len: usize,
    pub temperature: f64,
    pub onnx_path: PathBuf,
}

/// Everything a worker needs to classify, except the session (one per worker).
#[derive(Clone)]
pub struct ModelAssets {
    pub info: ModelInfo,
    tokenizer: Tokenizer,
    ood: OodScorer,
}

/// Session options (from `[model]` or `[gpu.onnx]` in config).
#[derive(Debug, Clone, Copy)]
pub struct SessionOptions {
    pub intra_threads: usize,
    pub intra_op_spinning: bool,
    pub provider: Provider,
    /// CUDA device ordinal (CUDA provider only).
    pub device_id: i32,
}

impl From<&super::config::ModelConfig> for SessionOptions {
    fn from(c: &super::config::ModelConfig) -> Self {
        SessionOptions {
            intra_threads: c.intra_threads,
            intra_op_spinning: c.intra_op_spinning,
            provider: c.provider,
            device_id: c.device_id,
        }
    }
}

impl ModelAssets {
    /// Reads the manifest, checks the ONNX file's sha256, loads tokenizer, calibration and OOD data.
    pub fn load(dir: &Path) -> anyhow::Result<ModelAssets> {
        let manifest_path = dir.join("model.json");
        let manifest: Manifest = serde_json::from_slice(
            &std::fs::read(&manifest_path).with_context(|| format!("reading {}", manifest_path.display()))?,
        )
        .with_context(|| format!("parsing {}", manifest_path.display()))?;
        if manifest.labels.len() != 2 {
            bail!("{}: expected 2 labels [ok, risk], got {:?}", manifest_path.display(), manifest.labels);
        }
        let onnx_path = dir.join(&manifest.onnx);
        let bytes = std::fs::read(&onnx_path).with_context(|| format!("reading model {}", onnx_path.display()))?;
        let actual = format!("{:x}", Sha256::digest(&bytes));
        if !actual.eq_ignore_ascii_case(&manifest.sha256) {
            bail!(
                "model file {} has sha256 {actual}, but {} expects {}: the file is corrupt or not the one the manifest describes",
                onnx_path.display(),
                manifest_path.display(),
                manifest.sha256
            );
        }
        let tokenizer_path = dir.join(&manifest.tokenizer);
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", tokenizer_path.display()))?;
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: manifest.max_seq_len, ..Default::default() }))
            .map_err(|e| anyhow::anyhow!("setting truncation: {e}"))?;
        tokenizer.with_padding(None);

        let calibration_path = dir.join("calibration.json");
        let calibration: CalibrationFile = serde_json::from_slice(
            &std::fs::read(&calibration_path).with_context(|| format!("reading {}", calibration_path.display()))?,
        )
        .with_context(|| format!("parsing {}", calibration_path.display()))?;
        if !(calibration.temperature > 0.0 && calibration.temperature.is_finite()) {
            bail!("{}: temperature must be a positive number", calibration_path.display());
        }

        let ood_path = dir.join("ood.json");
        let ood: OodFile = serde_json::from_slice(
            &std::fs::read(&ood_path).with_context(|| format!("reading {}", ood_path.display()))?,
        )
        .with_context(|| format!("parsing {}", ood_path.display()))?;
        let dim = manifest.embedding_dim.or_else(|| ood.centroids.first().map(|c| c.len())).unwrap_or(0);
        if dim == 0 || ood.centroids.iter().any(|c| c.len() != dim) || ood.quantiles.is_empty() {
            bail!("{}: centroids must all have length {dim} and quantiles must not be empty", ood_path.display());
        }
        let ood = OodScorer { dim, centroids: ood.centroids.concat(), quantiles: ood.quantiles };

        Ok(ModelAssets {
            info: ModelInfo {
                name: manifest.name,
                sha256: actual,
                max_seq_len: manifest.max_seq_len,
                temperature: calibration.temperature,
                onnx_path,
            },
            tokenizer,
            ood,
        })
    }

    /// A token counter with this model's tokenizer (for the complexity rater), whose encodings
    /// are the model's own input.
    pub fn token_counter(&self) -> TokenCounter {
        TokenCounter { tokenizer: self.tokenizer.clone(), max_seq_len: self.info.max_seq_len }
    }

    /// A classifier with its own ONNX Runtime session (see `ort_lib::environment`).
    pub fn classifier(&self, env: &Environment, options: SessionOptions) -> anyhow::Result<Classifier> {
        let configure = |e: ort::Error<SessionBuilder>| anyhow::anyhow!("configuring the ONNX Runtime session: {e}");
        let builder = Session::builder(env)
            .map_err(|e| anyhow::anyhow!("creating an ONNX Runtime session: {e}"))?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(configure)?
            .with_intra_threads(options.intra_threads)
            .map_err(configure)?
            .with_intra_op_spinning(options.intra_op_spinning)
            .map_err(configure)?;
        let mut builder = match options.provider {
            Provider::Cpu => builder,
            // error_on_failure: a config that asks for CUDA must get CUDA, not a silent CPU fallback.
            Provider::Cuda => builder
                .with_execution_providers([ort::ep::CUDA::default()
                    .with_device_id(options.device_id)
                    .build()
                    .error_on_failure()])
                .map_err(|e| {
                    anyhow::anyhow!(
                        "registering the CUDA execution provider: {e}. The loaded ONNX Runtime must be a CUDA build \
                         (PyPI onnxruntime-gpu, its onnxruntime/capi/libonnxruntime.so.*; set ORT_DYLIB_PATH) with CUDA \
                         and cuDNN libraries on the library path"
                    )
                })?,
        };
        let session = builder
            .commit_from_file(&self.info.onnx_path)
            .map_err(|e| anyhow::anyhow!("loading {} into ONNX Runtime: {e}", self.info.onnx_path.display()))?;
        Ok(Classifier { assets: self.clone(), session })
    }
}

/// Counts tokens with the model's own tokenizer, at a bounded cost, keeping the encoding so the
/// model does not tokenise the same text again.
#[derive(Clone)]
pub struct TokenCounter {
    /// The model's tokenizer, truncating at `max_seq_len`.
    tokenizer: Tokenizer,
    max_seq_len: usize,
}

/// Tokens counted for the complexity rater.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Tokens in the text (with `[CLS]`/`[SEP]`), exact below `min(cap, max_seq_len)`; `cap`
    /// means "`cap` or more".
    pub count: usize,
    /// The model's input for this text, when counting made it (see [`TokenCounter::count`]).
    pub encoding: Option<Encoding>,
}

impl TokenCounter {
    /// Counts the tokens of `text` up to `cap`.
    ///
    /// The cost is bounded whatever the text's length (the complexity rater calls this on the
    /// request path): every whitespace-separated word is at least one WordPiece token, so a text
    /// of `cap` words is at `cap` without tokenising (and the model tokenises it later). Otherwise
    /// the text is encoded exactly as [`Classifier::encode`] does, and the encoding travels to the
    /// model with the request, so no text is tokenised twice.
    pub fn count(&self, text: &str, cap: usize) -> Tokens {
        if text.split_whitespace().take(cap).count() >= cap {
            return Tokens { count: cap, encoding: None };
        }
        let head = prefix(text, model_bytes(self.max_seq_len));
        let Ok(encoding) = self.tokenizer.encode_fast(head, true) else {
            return Tokens { count: 0, encoding: None };
        };
        let cut = head.len() < text.len() || encoding.len() >= self.max_seq_len;
        let count = if cut { cap } else { encoding.len().min(cap) };
        Tokens { count, encoding: Some(encoding) }
    }
}

/// Tokens past `max_seq_len` are cut anyway; a WordPiece token is rarely longer than 16 bytes,
/// so cutting the text first spares tokenising up to `max_text_bytes` for nothing.
fn model_bytes(max_seq_len: usize) -> usize {
    max_seq_len * 16
}

/// The model, ready to run on the calling thread (blocking).
pub struct Classifier {
    assets: ModelAssets,
    session: Session,
}

/// One input's model output, before queue timings are known.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub logits: [f32; 2],
    pub risk_score: f64,
    pub confidence: f64,
    pub ood_score: f64,
    pub tokens: usize,
}

impl Classifier {
    pub fn info(&self) -> &ModelInfo {
        &self.assets.info
    }

    /// The model's input for `text`: its first `max_seq_len` tokens, `[SEP]` kept last.
    pub fn encode(&self, text: &str) -> anyhow::Result<Encoding> {
        let head = prefix(text, model_bytes(self.assets.info.max_seq_len));
        self.assets.tokenizer.encode_fast(head, true).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))
    }

    /// Tokenises and classifies a batch (see [`Classifier::run`]).
    pub fn classify(&mut self, texts: &[&str]) -> anyhow::Result<Vec<Output>> {
        let encodings = texts.iter().map(|t| self.encode(t)).collect::<anyhow::Result<Vec<_>>>()?;
        self.run(&encodings)
    }

    /// Classifies a batch of encodings, padding to the longest sequence in the batch (not to
    /// `max_seq_len`). Blocking: call from a worker thread, never from the async runtime.
    pub fn run(&mut self, encodings: &[Encoding]) -> anyhow::Result<Vec<Output>> {
        if encodings.is_empty() {
            return Ok(Vec::new());
        }
        let batch = encodings.len();
        let seq = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(1).max(1);
        let mut ids = vec![0i64; batch * seq];
        let mut mask = vec![0i64; batch * seq];
        for (row, e) in encodings.iter().enumerate() {
            for (col, (&id, &m)) in e.get_ids().iter().zip(e.get_attention_mask()).enumerate() {
                ids[row * seq + col] = id as i64;
                mask[row * seq + col] = m as i64;
            }
        }
        let shape = [batch as i64, seq as i64];
        let inputs = ort::inputs![
            "input_ids" => Tensor::from_array((shape, ids))?,
            "attention_mask" => Tensor::from_array((shape, mask))?,
        ];
        let outputs = self.session.run(inputs)?;
        let (_, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
        let (_, embeddings) = outputs["embedding"].try_extract_tensor::<f32>()?;
        let dim = self.assets.ood.dim;
        if logits.len() != batch * 2 || embeddings.len() != batch * dim {
            bail!(
                "model returned {} logits and {} embedding values for a batch of {batch}",
                logits.len(),
                embeddings.len()
            );
        }
        let t = self.assets.info.temperature;
        Ok((0..batch)
            .map(|i| {
                let z = [logits[2 * i], logits[2 * i + 1]];
                let p = softmax_t(&z, t);
                Output {
                    logits: z,
                    risk_score: p[1],
                    confidence: p[0].max(p[1]),
                    ood_score: self.assets.ood.score(&embeddings[i * dim..(i + 1) * dim]),
                    tokens: encodings[i].get_ids().len(),
                }
            })
            .collect())
    }
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a char boundary.
pub(crate) fn prefix(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::{ecdf, prefix};

    #[test]
    fn ecdf_interpolates_between_quantiles() {
        let q = [0.0, 0.1, 0.2, 0.4, 1.0];
        assert_eq!(ecdf(&q, -1.0), 0.0);
        assert_eq!(ecdf(&q, 0.1), 0.25);
        assert!((ecdf(&q, 0.3) - 0.625).abs() < 1e-12);
        assert_eq!(ecdf(&q, 1.0), 1.0);
        assert_eq!(ecdf(&q, 2.0), 1.0);
    }

    #[test]
    fn prefix_respects_char_boundaries() {
        assert_eq!(prefix("hello", 10), "hello");
        assert_eq!(prefix("hello", 3), "hel");
        assert_eq!(prefix("héllo", 2), "h", "é is two bytes");
        assert_eq!(prefix("日本", 4), "日");
    }
}
