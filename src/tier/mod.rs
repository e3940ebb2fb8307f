//! Model tiers. The cpu tier runs the INT8 classifier in-process on a pool of blocking workers
//! ([`onnx::OnnxPool`]); [`model::Classifier`] is the model itself (tokenizer, ONNX Runtime
//! session, calibration, out-of-distribution scorer), usable without the pool. The gpu tier
//! ([`gpu::GpuTier`]) wraps a registered backend — an in-process ONNX pool, a pool of upstream
//! model servers, or one added later — with a timeout, an admission limit and a circuit breaker.
//! Every backend implements [`backend::ModelTier`].

pub mod backend;
pub mod config;
mod error;
pub mod gpu;
pub mod lexical;
pub mod manifest;
pub mod model;
pub mod onnx;
pub mod ood;
mod parallel;
pub mod service;
pub mod windows;

pub use backend::{ModelTier, Prepared, TierInput, TierLoad};
pub use config::{GpuConfig, ModelConfig, Provider};
pub use error::TierError;

/// A calibrated verdict from a model tier (cpu, or either gpu backend).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelVerdict {
    /// Calibrated probability of the risk class, `softmax(logits / T)[1]`; for a cpu model with a
    /// lexical model, that combined with the text's lexical logit (`lexical::Lexical::combine`).
    pub risk_score: f64,
    /// Calibrated probability of the predicted class, `max(risk_score, 1 - risk_score)`.
    pub confidence: f64,
    /// Out-of-distribution score in [0, 1]: the share of in-domain validation inputs that lie
    /// closer to the training data than this one (see `model::OodScorer`). `None` for backends
    /// without an embedding (upstream model servers).
    pub ood_score: Option<f64>,
    /// Tokens the model saw (after truncation, with `[CLS]`/`[SEP]`), where known.
    pub tokens: Option<usize>,
    /// Time in the queue before a worker took the request, µs.
    pub queue_us: u64,
    /// Tokenisation + inference time of the batch this request ran in, µs.
    pub infer_us: u64,
    /// Requests in that batch (1 for upstream backends).
    pub batch_size: usize,
    /// Which upstream endpoint answered (upstream backend only).
    pub endpoint: Option<String>,
    /// For a text read in several windows: the one that decided (the riskiest).
    pub window: Option<WindowRef>,
    /// Text past the last window was not read (see `windows::Windows`).
    pub unread: bool,
}

/// Which of a long text's windows decided, and how many were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WindowRef {
    /// 0-based.
    pub index: usize,
    pub of: usize,
}

/// `fut`'s output if it is ready by `deadline`, else `None` (the caller abandons the model and
/// rules decide: README, `x-tiergate-deadline-ms`). tokio's `timeout_at` polls the future before
/// its timer, so a runtime thread that was busy past the deadline would take a late output for an
/// on-time one; the clock is read again to tell them apart.
pub(crate) async fn by_deadline<F: std::future::Future>(deadline: tokio::time::Instant, fut: F) -> Option<F::Output> {
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(_) if tokio::time::Instant::now() > deadline => None,
        Ok(out) => Some(out),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// An output that is ready only after the deadline (the runtime thread was busy meanwhile)
    /// is late, though tokio's timeout would hand it over; one ready in time passes through.
    #[tokio::test]
    async fn an_output_read_after_the_deadline_is_late() {
        let now = tokio::time::Instant::now();
        assert_eq!(super::by_deadline(now - Duration::from_millis(1), async { 7 }).await, None);
        assert_eq!(super::by_deadline(now + Duration::from_secs(10), async { 7 }).await, Some(7));
    }
}
