//! The cpu tier's model: tokenizer + ONNX Runtime session + temperature + OOD scorer.
//!
//! Files in the model directory (written by `models/recipe`):
//! - `MANIFEST.sha256`: the sha256 of every file below, checked on every load ([`super::manifest`]);
//! - `model.json`: manifest (ONNX file name and its sha256, tokenizer, `max_seq_len`, labels,
//!   input/output names);
//! - the INT8 ONNX model: inputs `input_ids`, `attention_mask` (int64 `[batch, seq]`), outputs
//!   `logits` (f32 `[batch, 2]`) and `embedding` (f32 `[batch, dim]`, mean-pooled, L2-normalised);
//! - `tokenizer.json` (Hugging Face tokenizers format);
//! - `calibration.json`: the fitted temperature;
//! - `ood.json`: k-means centroids of training embeddings and the quantiles of the validation
//!   split's distance to them;
//! - optionally `lexical.json` and its weights, named by `model.json`'s `"lexical"`: a lexical
//!   model combined with the encoder's verdict ([`super::lexical`]).

pub use super::config::Provider;
use super::lexical::Lexical;
use super::manifest;
use super::ood::{OodFile, OodScorer};
use super::windows::{encode, Encoded, TokenCounter, Windows};
use super::WindowRef;
use crate::calibrate::{softmax_t, CalibrationFile};
use anyhow::{bail, Context as _};
use ort::environment::Environment;
use ort::session::builder::{GraphOptimizationLevel, PrepackedWeights, SessionBuilder};
use ort::session::Session;
use ort::value::Tensor;
use serde::Deserialize;
use std::borrow::Borrow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use tokenizers::{Encoding, Tokenizer};

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
    /// The lexical model's file (`lexical.json`), if the model has one.
    #[serde(default)]
    pub lexical: Option<String>,
}

/// Facts about the loaded model, for `/readyz`, logs and the model card check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelInfo {
    pub name: String,
    /// sha256 of the ONNX file (lower-case hex), as `model.json` pins it.
    pub sha256: String,
    /// sha256 of `MANIFEST.sha256`, which pins every file the loader read (see
    /// [`super::manifest`]): one digest for the whole model, temperature and tokenizer included.
    pub manifest_sha256: String,
    pub max_seq_len: usize,
    pub temperature: f64,
    pub onnx_path: PathBuf,
}

/// What a configured tokenizer depends on: its file and the windows it cuts.
#[derive(PartialEq, Eq)]
struct TokenizerKey {
    /// The tokenizer file's sha256, as the model directory's manifest verified it.
    sha256: String,
    max_seq_len: usize,
    overlap: usize,
}

/// The tokenizers this process loaded, held weakly: a multilingual tokenizer is tens of MB
/// (~65 MB resident for the bundled 70,895-piece Unigram one, docs/BENCHMARKS.md "RSS"), too
/// much to hold twice for a confirm or shadow model that reads the same vocabulary.
static TOKENIZERS: Mutex<Vec<(TokenizerKey, Weak<Tokenizer>)>> = Mutex::new(Vec::new());

/// The tokenizer for `key`: one already loaded and still in use, else `load`'s, kept for the
/// next model with the same key.
fn shared_tokenizer(
    key: TokenizerKey,
    load: impl FnOnce() -> anyhow::Result<Tokenizer>,
) -> anyhow::Result<Arc<Tokenizer>> {
    let mut loaded = TOKENIZERS.lock().unwrap_or_else(|e| e.into_inner());
    loaded.retain(|(_, t)| t.strong_count() > 0);
    if let Some(t) = loaded.iter().find(|(k, _)| *k == key).and_then(|(_, t)| t.upgrade()) {
        return Ok(t);
    }
    let t = Arc::new(load()?);
    loaded.push((key, Arc::downgrade(&t)));
    Ok(t)
}

/// Everything a worker needs to classify, except the session (one per worker).
#[derive(Clone)]
pub struct ModelAssets {
    pub info: ModelInfo,
    /// The model's tokenizer: windows of `max_seq_len` tokens (see [`Windows`]). Shared: a
    /// multilingual vocabulary's tokenizer is tens of MB, and every session and the token
    /// counter read the same one.
    tokenizer: Arc<Tokenizer>,
    /// The id padding gets in a batch: the tokenizer's `[PAD]` or `<pad>` (0 if it has neither).
    pad_id: i64,
    windows: Windows,
    ood: OodScorer,
    /// Combined with the encoder's verdict of every text ([`super::lexical`]).
    lexical: Option<Arc<Lexical>>,
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
    /// Checks every file against `MANIFEST.sha256` (see [`super::manifest`]) and the ONNX file
    /// against `model.json`'s sha256, then loads tokenizer, calibration and OOD data.
    ///
    /// Errors: a file missing, changed (named, with the expected and the actual digest) or
    /// read by the loader but not listed in the manifest; a file that does not parse.
    pub fn load(dir: &Path) -> anyhow::Result<ModelAssets> {
        ModelAssets::load_windows(dir, Windows::default())
    }

    /// [`ModelAssets::load`], reading long texts in `windows`. The tokenizer is shared with every
    /// model already loaded in this process from the same tokenizer file for the same window
    /// length and overlap ([`shared_tokenizer`]): a confirm or shadow model cut to the served
    /// vocabulary holds no copy of its own. Errors: as [`ModelAssets::load`], and `windows` out
    /// of range ([`Windows::configure`]).
    pub fn load_windows(dir: &Path, windows: Windows) -> anyhow::Result<ModelAssets> {
        let verified = manifest::verify(dir)?;
        verified.require(dir, &["model.json"])?;
        let manifest_path = dir.join("model.json");
        let manifest: Manifest = serde_json::from_slice(
            &std::fs::read(&manifest_path).with_context(|| format!("reading {}", manifest_path.display()))?,
        )
        .with_context(|| format!("parsing {}", manifest_path.display()))?;
        if manifest.labels.len() != 2 {
            bail!("{}: expected 2 labels [ok, risk], got {:?}", manifest_path.display(), manifest.labels);
        }
        verified.require(dir, &[&manifest.onnx, &manifest.tokenizer, "calibration.json", "ood.json"])?;
        let onnx_path = dir.join(&manifest.onnx);
        let actual = verified.files[&manifest.onnx].clone();
        if !actual.eq_ignore_ascii_case(&manifest.sha256) {
            bail!(
                "model file {} has sha256 {actual}, but {} expects {}: the file is corrupt or not the one the manifest describes",
                onnx_path.display(),
                manifest_path.display(),
                manifest.sha256
            );
        }
        let tokenizer_path = dir.join(&manifest.tokenizer);
        windows.check(manifest.max_seq_len)?;
        let key = TokenizerKey {
            sha256: verified.files[&manifest.tokenizer].clone(),
            max_seq_len: manifest.max_seq_len,
            overlap: windows.overlap,
        };
        let tokenizer = shared_tokenizer(key, || {
            let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
                .map_err(|e| anyhow::anyhow!("loading tokenizer {}: {e}", tokenizer_path.display()))?;
            tokenizer.with_padding(None);
            windows.configure(&mut tokenizer, manifest.max_seq_len)?;
            Ok(tokenizer)
        })?;
        let pad_id = ["[PAD]", "<pad>"].iter().find_map(|t| tokenizer.token_to_id(t)).map_or(0, i64::from);

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
        let ood = OodScorer::new(ood, manifest.embedding_dim).with_context(|| ood_path.display().to_string())?;
        let lexical = match &manifest.lexical {
            Some(file) => {
                verified.require(dir, &[file])?;
                let (lexical, weights) = Lexical::load(dir, file)?;
                verified.require(dir, &[&weights])?;
                Some(Arc::new(lexical))
            }
            None => None,
        };

        Ok(ModelAssets {
            info: ModelInfo {
                name: manifest.name,
                sha256: actual,
                manifest_sha256: verified.manifest_sha256,
                max_seq_len: manifest.max_seq_len,
                temperature: calibration.temperature,
                onnx_path,
            },
            tokenizer,
            pad_id,
            windows,
            ood,
            lexical,
        })
    }

    /// Length of the model's `embedding` output.
    pub fn embedding_dim(&self) -> usize {
        self.ood.dim
    }

    /// A token counter with this model's tokenizer (for the complexity rater), whose encodings
    /// are the model's own input.
    pub fn token_counter(&self) -> TokenCounter {
        TokenCounter::new(Arc::clone(&self.tokenizer), self.info.max_seq_len, self.windows)
    }

    /// `text` as the model reads it (see [`super::windows::encode`]), with its lexical logit.
    pub fn encode(&self, text: &str) -> anyhow::Result<Encoded> {
        self.encode_reusing(text, None)
    }

    /// As [`ModelAssets::encode`], reusing `counted`, the token counter's encoding of the same
    /// `text` when the request path made one; the lexical logit is added here, on the worker.
    pub fn encode_reusing(&self, text: &str, counted: Option<Encoded>) -> anyhow::Result<Encoded> {
        let mut encoded = match counted {
            Some(encoded) => encoded,
            None => encode(&self.tokenizer, text, self.info.max_seq_len, self.windows)?,
        };
        encoded.lexical = self.lexical.as_ref().map(|l| l.logit(text));
        Ok(encoded)
    }

    /// A text's verdict from its windows' outputs: the riskiest window's, combined with the
    /// text's lexical logit when the model has a lexical model ([`super::lexical`]).
    pub(crate) fn verdict(&self, windows: &[Output], unread: bool, lexical_logit: Option<f64>) -> Output {
        let out = riskiest(windows, unread);
        match (&self.lexical, lexical_logit) {
            (Some(lexical), Some(z)) => {
                let p = lexical.combine(out.risk_score, z);
                Output { risk_score: p, confidence: p.max(1.0 - p), ..out }
            }
            _ => out,
        }
    }

    /// A classifier with its own ONNX Runtime session (see `ort_lib::environment`). Sessions
    /// given the same `prepacked` container share the weights ONNX Runtime re-lays out for its
    /// integer kernels (`CreateSessionWithPrepackedWeightsContainer`) instead of one copy each.
    pub fn classifier(
        &self,
        env: &Environment,
        options: SessionOptions,
        prepacked: Option<&PrepackedWeights>,
    ) -> anyhow::Result<Classifier> {
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
        if let Some(prepacked) = prepacked {
            builder = builder.with_prepacked_weights(prepacked).map_err(configure)?;
        }
        let session = builder
            .commit_from_file(&self.info.onnx_path)
            .map_err(|e| anyhow::anyhow!("loading {} into ONNX Runtime: {e}", self.info.onnx_path.display()))?;
        Ok(Classifier { assets: self.clone(), session })
    }
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
    /// For a text read in several windows: the one that decided (the riskiest).
    pub window: Option<WindowRef>,
    /// Text past the last window was not read.
    pub unread: bool,
}

/// A text's output: its riskiest window's, named when there were several.
fn riskiest(windows: &[Output], unread: bool) -> Output {
    let (index, best) = windows
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.risk_score.total_cmp(&b.1.risk_score))
        .expect("every encoded text has at least one window");
    let of = windows.len();
    Output { window: (of > 1).then_some(WindowRef { index, of }), unread, ..*best }
}

impl Classifier {
    pub fn info(&self) -> &ModelInfo {
        &self.assets.info
    }

    pub(crate) fn assets(&self) -> &ModelAssets {
        &self.assets
    }

    /// `text` as the model reads it: windows of `max_seq_len` tokens.
    pub fn encode(&self, text: &str) -> anyhow::Result<Encoded> {
        self.assets.encode(text)
    }

    /// Tokenises and classifies a batch of texts: for each, the riskiest of its windows.
    pub fn classify(&mut self, texts: &[&str]) -> anyhow::Result<Vec<Output>> {
        let encoded = texts.iter().map(|t| self.encode(t)).collect::<anyhow::Result<Vec<_>>>()?;
        self.classify_encoded(&encoded)
    }

    /// Classifies encoded texts, all their windows in one run: for each, its verdict
    /// ([`ModelAssets::verdict`]: the riskiest window, with the lexical model if any).
    pub fn classify_encoded(&mut self, texts: &[Encoded]) -> anyhow::Result<Vec<Output>> {
        // References, not clones: an `Encoding` clone copies its tokens' strings and offsets.
        let windows: Vec<&Encoding> = texts.iter().flat_map(|t| t.windows.iter()).collect();
        let outputs = self.run(&windows)?;
        let mut rest = outputs.as_slice();
        Ok(texts
            .iter()
            .map(|t| {
                let (mine, tail) = rest.split_at(t.windows.len());
                rest = tail;
                self.assets.verdict(mine, t.unread, t.lexical)
            })
            .collect())
    }

    /// Classifies a batch of encodings, padding to the longest sequence in the batch (not to
    /// `max_seq_len`). Blocking: call from a worker thread, never from the async runtime.
    pub fn run<E: Borrow<Encoding>>(&mut self, encodings: &[E]) -> anyhow::Result<Vec<Output>> {
        let (assets, t, dim) = (&self.assets, self.assets.info.temperature, self.assets.ood.dim);
        infer(&mut self.session, assets.pad_id, dim, encodings, |logits, embeddings| {
            (0..encodings.len())
                .map(|i| {
                    let z = [logits[2 * i], logits[2 * i + 1]];
                    let p = softmax_t(&z, t);
                    Output {
                        logits: z,
                        risk_score: p[1],
                        confidence: p[0].max(p[1]),
                        ood_score: assets.ood.score(&embeddings[i * dim..(i + 1) * dim]),
                        tokens: encodings[i].borrow().get_ids().len(),
                        window: None,
                        unread: false,
                    }
                })
                .collect()
        })
    }

    /// The model's `embedding` output for each encoding (L2-normalised, length
    /// [`ModelAssets::embedding_dim`]), as [`Classifier::run`] sees it before the OOD score
    /// (`tiergate model pack` fits `ood.json` on these).
    pub fn embed(&mut self, encodings: &[Encoding]) -> anyhow::Result<Vec<Vec<f32>>> {
        let dim = self.assets.ood.dim;
        infer(&mut self.session, self.assets.pad_id, dim, encodings, |_, embeddings| {
            embeddings.chunks_exact(dim).map(<[f32]>::to_vec).collect()
        })
    }
}

/// One ONNX Runtime run; `read` gets `(logits [batch * 2], embeddings [batch * dim])`,
/// row-major, in ONNX Runtime's own buffers (no copy on the request path).
fn infer<T, E: Borrow<Encoding>>(
    session: &mut Session,
    pad_id: i64,
    dim: usize,
    encodings: &[E],
    read: impl FnOnce(&[f32], &[f32]) -> T,
) -> anyhow::Result<T> {
    if encodings.is_empty() {
        return Ok(read(&[], &[]));
    }
    let batch = encodings.len();
    let seq = encodings.iter().map(|e| e.borrow().get_ids().len()).max().unwrap_or(1).max(1);
    // Padding never reaches a score (the mask hides it); the tokenizer's own pad id keeps the
    // input what the model was exported with.
    let mut ids = vec![pad_id; batch * seq];
    let mut mask = vec![0i64; batch * seq];
    for (row, e) in encodings.iter().enumerate() {
        let e = e.borrow();
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
    let outputs = session.run(inputs)?;
    let (_, logits) = outputs["logits"].try_extract_tensor::<f32>()?;
    let (_, embeddings) = outputs["embedding"].try_extract_tensor::<f32>()?;
    if logits.len() != batch * 2 || embeddings.len() != batch * dim {
        bail!(
            "model returned {} logits and {} embedding values for a batch of {batch}",
            logits.len(),
            embeddings.len()
        );
    }
    Ok(read(logits, embeddings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models")
    }

    /// Two models from the same tokenizer file and window overlap hold one tokenizer; another
    /// overlap gets its own, configured for it.
    #[test]
    fn models_with_the_same_tokenizer_share_one() {
        let w = Windows::default();
        let a = ModelAssets::load_windows(&models(), w).unwrap();
        let b = ModelAssets::load_windows(&models(), Windows { max: 2, ..w }).unwrap();
        assert!(Arc::ptr_eq(&a.tokenizer, &b.tokenizer), "the window count is not the tokenizer's");
        let d = ModelAssets::load_windows(&models(), Windows { overlap: 8, ..w }).unwrap();
        assert!(!Arc::ptr_eq(&a.tokenizer, &d.tokenizer));
        // About 300 tokens: 3 windows at overlap 32, 3 at overlap 8 too, but fewer tokens repeated.
        let text = "a text long enough to be cut into more than one window of tokens ".repeat(24);
        let (wa, wd) = (a.encode(&text).unwrap().windows, d.encode(&text).unwrap().windows);
        let tokens = |w: &[Encoding]| w.iter().map(|e| e.get_ids().len()).sum::<usize>();
        assert!(wa.len() > 1 && tokens(&wd) < tokens(&wa), "less overlap, fewer tokens read twice");
        assert!(ModelAssets::load_windows(&models(), Windows { max: 0, ..w }).is_err(), "checked though shared");
    }
}
