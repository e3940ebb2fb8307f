//! Model tiers. The cpu tier runs the INT8 classifier in-process ([`cpu::CpuTier`]) on a
//! pool of blocking workers; [`model::Classifier`] is the model itself (tokenizer, ONNX
//! Runtime session, calibration, out-of-distribution scorer), usable without the pool.

pub mod cpu;
pub mod model;

/// A calibrated verdict from a model tier.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelVerdict {
    /// Raw logits `[ok, risk]` before temperature scaling.
    pub logits: [f32; 2],
    /// Calibrated probability of the risk class, `softmax(logits / T)[1]`.
    pub risk_score: f64,
    /// Calibrated probability of the predicted class, `max(softmax(logits / T))`.
    pub confidence: f64,
    /// Out-of-distribution score in [0, 1]: the share of in-domain validation inputs that lie
    /// closer to the training data than this one (see `model::OodScorer`).
    pub ood_score: f64,
    /// Tokens the model saw (after truncation, with `[CLS]`/`[SEP]`).
    pub tokens: usize,
    /// Time in the queue before a worker took the request, µs.
    pub queue_us: u64,
    /// Tokenisation + inference time of the batch this request ran in, µs.
    pub infer_us: u64,
    /// Requests in that batch.
    pub batch_size: usize,
}
