//! `[model]` (the cpu tier) and `[gpu]` (the gpu tier) in the config file.

use super::gpu::upstream::config::UpstreamConfig;
use crate::breaker::BreakerConfig;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Directory holding `model.json`, the ONNX file, `tokenizer.json`, `calibration.json`, `ood.json`.
    pub dir: PathBuf,
    /// Path of `libonnxruntime.so`; unset: `ORT_DYLIB_PATH`, then the cache, then fetched from PyPI.
    pub onnxruntime: Option<PathBuf>,
    /// ONNX Runtime intra-op threads per session.
    pub intra_threads: usize,
    /// Whether ONNX Runtime's intra-op threads spin while waiting for work. Spinning cuts
    /// latency on an idle machine and steals CPU from everything else on a busy one.
    pub intra_op_spinning: bool,
    /// Sessions, each driven by its own blocking worker thread.
    pub sessions: usize,
    /// Most requests run together in one inference call.
    pub max_batch: usize,
    /// How long the first request of a batch may wait for more to join, µs (0: only requests
    /// already waiting join; nothing is held back).
    pub max_queue_delay_us: u64,
    /// Bounded queue in front of the workers; a full queue sheds the request to the next stage.
    pub queue_capacity: usize,
    /// ONNX Runtime execution provider: `cpu` or `cuda`.
    pub provider: Provider,
    /// CUDA device ordinal (provider `cuda`).
    pub device_id: i32,
    /// How texts longer than the model's window are read.
    pub windows: super::windows::Windows,
}

/// An ONNX Runtime execution provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    #[default]
    Cpu,
    Cuda,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            dir: PathBuf::from("models"),
            onnxruntime: None,
            // Two single-threaded sessions beat one two-threaded session on 2 cores, raw and end to
            // end (docs/BENCHMARKS.md). One request per inference unless configured: a dynamic-INT8
            // model's activation scales span the batch, so a batch-mate moves its scores (0.17 for
            // the earlier bundled model); the bundled config sets `max_batch = 4` for the static
            // (QDQ) model it ships, whose scores do not move (models/MODEL_CARD.md).
            intra_threads: 1,
            intra_op_spinning: false,
            sessions: 2,
            max_batch: 1,
            max_queue_delay_us: 0,
            queue_capacity: 256,
            provider: Provider::Cpu,
            device_id: 0,
            windows: Default::default(),
        }
    }
}

/// `[gpu]`. Unknown keys are refused at validation (`gpu::validate`): every key
/// that is not a field here must be a registered backend's section.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct GpuConfig {
    /// The gpu tier's backend by its registered name: `none`, `onnx` (in-process), `upstream`
    /// (model servers), or one added with `gpu::register`.
    pub backend: String,
    /// Per-request timeout on the gpu tier, ms (the request's deadline may cut it shorter).
    pub timeout_ms: u64,
    /// Most requests on the gpu tier at once; more are refused (`shed`) and route down.
    pub max_concurrency: usize,
    pub circuit: BreakerConfig,
    /// `backend = "onnx"`: a larger or full-precision classifier with its own calibration.
    pub onnx: ModelConfig,
    /// `backend = "upstream"`: OpenAI-compatible model servers.
    pub upstream: UpstreamConfig,
    /// Other backends' sections (`[gpu.<name>]`), read by their own code with [`GpuConfig::section`].
    #[serde(flatten)]
    pub sections: BTreeMap<String, toml::Value>,
}

/// The gpu tier is off.
pub const NO_GPU: &str = "none";

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            backend: NO_GPU.into(),
            timeout_ms: 2000,
            max_concurrency: 32,
            circuit: BreakerConfig::default(),
            onnx: ModelConfig { provider: Provider::Cuda, sessions: 1, max_batch: 32, ..ModelConfig::default() },
            upstream: UpstreamConfig::default(),
            sections: BTreeMap::new(),
        }
    }
}

impl GpuConfig {
    /// Whether a gpu tier is configured (`backend` is not `none`).
    pub fn enabled(&self) -> bool {
        self.backend != NO_GPU
    }

    /// A registered backend's own section, `[gpu.<name>]` (empty when absent), as `T`.
    ///
    /// Errors: the section does not deserialize as `T`; the message names `gpu.<name>`.
    pub fn section<T: DeserializeOwned>(&self, name: &str) -> Result<T, String> {
        let value = self.sections.get(name).cloned().unwrap_or_else(|| toml::Value::Table(Default::default()));
        value.try_into().map_err(|e| format!("[gpu.{name}]: {e}"))
    }
}
