//! The model-tier interface: what every model backend implements — the cpu tier's in-process
//! pool (`onnx::OnnxPool`), the gpu tier's `onnx` and `upstream` backends, and any backend added
//! later (registered by name in the `gpu` module) — and what it reads and reports: [`TierInput`]
//! in, a calibrated [`ModelVerdict`] out, [`TierLoad`] for routing.

use super::model::ModelInfo;
use super::windows::Encoded;
use super::{ModelVerdict, TierError};
use crate::policy::PromptSpec;
use crate::text::LanguageCell;
use futures_util::future::BoxFuture;
use serde::Serialize;
use std::sync::Arc;
use tokio::time::Instant;

/// What a model tier reads for one request.
pub enum TierInput<'a> {
    /// A message's canonical text (see `crate::text::canonical`), with what the cpu stage
    /// already computed of it (`prepared`: its tokens and language, when this backend's
    /// tokenizer made them) and the policy's `[prompt]`, for backends that ask a generative model.
    Text { text: Arc<str>, prepared: Prepared, prompt: Option<&'a PromptSpec> },
}

impl TierInput<'_> {
    /// The text, for backends that read only that.
    pub fn text(&self) -> &Arc<str> {
        match self {
            TierInput::Text { text, .. } => text,
        }
    }
}

/// What a backend tells routing about its own load, beside the gpu tier's in-flight count and
/// latency.
#[derive(Debug, Clone, Default)]
pub struct TierLoad {
    /// EWMA of the time a request waits for a worker, µs, for backends with a queue.
    pub queue_wait_us: Option<u64>,
    /// KV-cache headroom of the model servers behind it, where they expose it.
    pub kv_cache: KvCache,
    /// Model servers in rotation, for backends that balance over several.
    pub endpoints_available: Option<usize>,
}

/// A model backend: a calibrated verdict for a typed input, by a deadline.
pub trait ModelTier: Send + Sync + 'static {
    /// Classifies `input`, giving up at `deadline`. The verdict's `risk_score` and `confidence`
    /// must already be calibrated (temperature scaling, or the backend's own calibration).
    ///
    /// Errors: `Overloaded` when the backend's own queue is full (not counted against its
    /// health), `DeadlineExceeded`, `Inference` and `Unavailable` (counted by the circuit breaker).
    fn classify<'a>(
        &'a self,
        input: TierInput<'a>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<ModelVerdict, TierError>>;

    /// The in-process model (name, reference, calibration), where there is one.
    fn model(&self) -> Option<&ModelInfo> {
        None
    }

    /// Load readings for routing.
    fn load(&self) -> TierLoad {
        TierLoad::default()
    }

    /// Backend details for `/readyz` (a JSON object merged into the tier's entry).
    fn status(&self) -> serde_json::Value {
        serde_json::json!({})
    }

    /// Whether the backend needs the policy's `[prompt]`: a policy without one is refused at
    /// start and on reload.
    fn needs_prompt(&self) -> bool {
        false
    }
}

/// What the request path prepared of a text for the model, carried with the job so that
/// nothing is done twice and the text analysis the verdict needs runs on the worker, off the
/// async runtime.
#[derive(Debug, Default)]
pub struct Prepared {
    /// The model's input when the complexity rater already made it (tokenised once).
    pub encoded: Option<Encoded>,
    /// The text's language, detected by the worker beside tokenisation unless it already was.
    pub lang: Option<LanguageCell>,
}

/// Upstream KV-cache headroom as routing sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCache {
    /// Nothing to read: not the upstream backend, no `metrics_path`, or servers that publish no
    /// KV-cache gauge. No limit applies.
    #[default]
    NotExposed,
    /// The servers' scrapes fail or are stale: counts as `unknown_signals` says.
    Unknown,
    /// Best `1 - usage` over the available endpoints, [0, 1].
    Headroom(f64),
}
