//! The gpu tier: a local large-model path behind the same verdict type as the cpu tier.
//!
//! Two backends, chosen in config: `onnx` (a larger or full-precision classifier run in-process
//! by ONNX Runtime, CUDA execution provider, or CPU where there is no GPU) and `upstream` (a
//! pool of local OpenAI-compatible model servers). Both sit behind the same guards: an
//! admission limit (`max_concurrency`; over it the request routes down), a per-request
//! timeout, a circuit breaker, and latency tracking for the deadline check.

pub mod upstream;

use super::config::{GpuBackend, GpuConfig};
use super::model::ModelInfo;
use super::onnx::{OnnxPool, Prepared};
use super::ModelVerdict;
use crate::breaker::{CircuitBreaker, CircuitState};
use crate::policy::PromptSpec;
use crate::signals::latency::LatencyTracker;
use crate::tier::TierError;
use ort::environment::Environment;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use upstream::UpstreamPool;

pub enum Backend {
    Onnx(OnnxPool),
    Upstream(Arc<UpstreamPool>),
}

pub struct GpuTier {
    backend: Backend,
    breaker: CircuitBreaker,
    in_flight: AtomicUsize,
    max_concurrency: usize,
    timeout: Duration,
    pub latency: LatencyTracker,
}

impl GpuTier {
    /// Starts the configured backend; `None` for `backend = "none"`. The upstream backend needs
    /// a tokio runtime (it spawns health checks).
    pub fn start(env: &Environment, config: &GpuConfig) -> anyhow::Result<Option<GpuTier>> {
        let backend = match config.backend {
            GpuBackend::None => return Ok(None),
            GpuBackend::Onnx => Backend::Onnx(OnnxPool::start(env, &config.onnx, "tiergate-gpu")?),
            GpuBackend::Upstream => Backend::Upstream(UpstreamPool::start(&config.upstream)?),
        };
        Ok(Some(GpuTier {
            backend,
            breaker: CircuitBreaker::new(config.circuit.clone()),
            in_flight: AtomicUsize::new(0),
            max_concurrency: config.max_concurrency,
            timeout: Duration::from_millis(config.timeout_ms),
            latency: LatencyTracker::default(),
        }))
    }

    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The in-process model, for the onnx backend.
    pub fn model_info(&self) -> Option<&ModelInfo> {
        match &self.backend {
            Backend::Onnx(pool) => Some(pool.info()),
            Backend::Upstream(_) => None,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn circuit(&self, now: Instant) -> CircuitState {
        self.breaker.state(now)
    }

    /// Classifies `text`, giving up at `deadline` or after the tier's timeout, whichever is first.
    ///
    /// Errors: `Overloaded` past `max_concurrency`, `CircuitOpen` while the breaker is open,
    /// `DeadlineExceeded`, and the backend's own (`Inference`, `Unavailable`).
    pub async fn classify(
        &self,
        prompt: Option<&PromptSpec>,
        text: Arc<str>,
        deadline: Instant,
    ) -> Result<ModelVerdict, TierError> {
        // Admission before the breaker, so a refused request never takes the half-open probe.
        let _slot = Slot::take(&self.in_flight, self.max_concurrency)
            .ok_or(TierError::Overloaded { capacity: self.max_concurrency })?;
        let started = Instant::now();
        if !self.breaker.try_acquire(started) {
            return Err(TierError::CircuitOpen);
        }
        // Dropped mid-call (the client went away), the call judges nothing: the breaker only
        // frees its probe slot, so a half-open probe never stays in flight forever.
        let mut outcome = BreakerRecord { breaker: &self.breaker, verdict: None };
        let own_timeout = started + self.timeout;
        let caller_binds = deadline < own_timeout;
        let deadline = deadline.min(own_timeout);
        let result = match &self.backend {
            Backend::Onnx(pool) => pool.classify(text, Prepared::default(), deadline).await,
            Backend::Upstream(pool) => match prompt {
                Some(p) => match tokio::time::timeout_at(deadline, pool.classify(p, &text, deadline)).await {
                    Ok(r) => r,
                    Err(_) => Err(TierError::DeadlineExceeded { waited_us: started.elapsed().as_micros() as u64 }),
                },
                None => Err(TierError::Unavailable("the policy has no [prompt] for the upstream backend".into())),
            },
        };
        // Only the backend's own faults count against it: a full queue, a job not started for
        // lack of time, or the *caller's* deadline running out before the tier's own timeout
        // say nothing about its health (a caller choosing 5 ms must not open the circuit).
        outcome.verdict = match &result {
            Ok(_) => Some(true),
            Err(TierError::Overloaded { .. } | TierError::Doomed { .. }) => None,
            Err(TierError::DeadlineExceeded { .. }) if caller_binds => None,
            Err(_) => Some(false),
        };
        if result.is_ok() {
            self.latency.record(started.elapsed().as_micros() as u64);
        }
        result
    }
}

/// An admission slot, released on drop.
struct Slot<'a>(&'a AtomicUsize);

impl<'a> Slot<'a> {
    fn take(counter: &'a AtomicUsize, max: usize) -> Option<Slot<'a>> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Slot(counter))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Records the call's outcome with the breaker on drop: `Some(success)`, or `None` for a call
/// that judged nothing ([`CircuitBreaker::release`]).
struct BreakerRecord<'a> {
    breaker: &'a CircuitBreaker,
    verdict: Option<bool>,
}

impl Drop for BreakerRecord<'_> {
    fn drop(&mut self) {
        match self.verdict {
            Some(success) => self.breaker.record(success, Instant::now()),
            None => self.breaker.release(),
        }
    }
}
