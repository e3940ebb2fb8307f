//! Why a model tier gave no verdict.

/// Why a model tier gave no verdict. Recorded in `path`, never sent as an error response.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TierError {
    /// The tier's bounded queue is full: shed to the next stage instead of queueing.
    #[error("queue full ({capacity} waiting)")]
    Overloaded { capacity: usize },
    /// The request's deadline (or the tier's own timeout) passed before the tier answered.
    #[error("deadline passed after {waited_us} µs")]
    DeadlineExceeded { waited_us: u64 },
    /// A worker did not start the job: its remaining deadline was shorter than the expected
    /// service time, so the answer would have come after its caller gave up.
    #[error("not started: {remaining_us} µs left, expected service {expected_us} µs")]
    Doomed { remaining_us: u64, expected_us: u64 },
    /// The tier is not configured or not present on this machine.
    #[error("{0}")]
    Unavailable(String),
    /// The tier's circuit breaker is open after repeated failures.
    #[error("circuit open after repeated failures")]
    CircuitOpen,
    /// Tokenisation or inference failed.
    #[error("inference failed: {0}")]
    Inference(String),
}
