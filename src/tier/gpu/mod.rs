//! The gpu tier: a local large-model path behind the same verdict type as the cpu tier.
//!
//! The backend is chosen in config by its registered name (see [`crate::tier::backend`]): `onnx`
//! (a larger or full-precision classifier run in-process by ONNX Runtime, CUDA execution
//! provider, or CPU where there is no GPU), `upstream` (a pool of local OpenAI-compatible model
//! servers), or one added later. All sit behind the same guards: an admission limit
//! (`max_concurrency`; over it the request routes down), a per-request timeout, a circuit
//! breaker, and latency tracking for the deadline check.

pub mod upstream;

use super::backend::{ModelTier, Prepared, TierInput, TierLoad};
use super::config::{GpuConfig, NO_GPU};
use super::model::ModelInfo;
use super::onnx::OnnxPool;
use super::ModelVerdict;
use crate::breaker::{CircuitBreaker, CircuitState};
use crate::policy::PromptSpec;
use crate::readings::latency::LatencyTracker;
use crate::tier::TierError;
use ort::environment::Environment;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::time::Duration;
use tokio::time::Instant;
use upstream::UpstreamPool;

/// What the registry knows of a backend.
#[derive(Clone, Copy)]
pub struct BackendSpec {
    /// Its `gpu.backend` name, which is also its config section's (`[gpu.<name>]`).
    pub name: &'static str,
    /// Checks its config section at config load; the message names the field.
    pub validate: fn(&GpuConfig) -> Result<(), String>,
    /// Starts it. Called inside a tokio runtime.
    pub start: fn(&Environment, &GpuConfig) -> anyhow::Result<Arc<dyn ModelTier>>,
}

/// The built-in backends.
pub fn builtin() -> [BackendSpec; 2] {
    [
        BackendSpec {
            name: "onnx",
            validate: |_| Ok(()),
            start: |env, c| Ok(Arc::new(OnnxPool::start(env, &c.onnx, "tiergate-gpu")?)),
        },
        BackendSpec {
            name: "upstream",
            validate: |c| c.upstream.validate().map_err(|e| format!("[gpu.upstream]: {e}")),
            start: |_, c| Ok(UpstreamPool::start(&c.upstream)?),
        },
    ]
}

static REGISTRY: LazyLock<RwLock<BTreeMap<&'static str, BackendSpec>>> =
    LazyLock::new(|| RwLock::new(builtin().into_iter().map(|s| (s.name, s)).collect()));

/// Adds a backend, for `gpu.backend = "<name>"`. Call before the config is loaded.
///
/// Errors: the name is `none` (no gpu tier) or already registered.
pub fn register(spec: BackendSpec) -> Result<(), String> {
    let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    if spec.name == NO_GPU {
        return Err(format!("{NO_GPU:?} means no gpu tier; a backend needs another name"));
    }
    if registry.contains_key(spec.name) {
        return Err(format!("a gpu backend named {:?} exists already", spec.name));
    }
    registry.insert(spec.name, spec);
    Ok(())
}

/// The backend registered as `name`.
pub fn spec(name: &str) -> Option<BackendSpec> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).get(name).copied()
}

/// Every registered backend's name, sorted.
pub fn names() -> Vec<&'static str> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
}

/// `[gpu]` at config load: the backend is `none` or registered, every key that is not a
/// `GpuConfig` field is a registered backend's section, and the chosen backend's own check
/// passes. Errors name the key.
pub fn validate(config: &GpuConfig) -> Result<(), String> {
    if config.max_concurrency == 0 {
        return Err("`gpu.max_concurrency` must be at least 1".into());
    }
    if let Some(key) = config.sections.keys().find(|k| spec(k).is_none()) {
        return Err(format!("unknown key `gpu.{key}` (backend sections: {})", names().join(", ")));
    }
    if !config.enabled() {
        return Ok(());
    }
    match spec(&config.backend) {
        None => {
            Err(format!("`gpu.backend` is {:?}; registered backends: {NO_GPU}, {}", config.backend, names().join(", ")))
        }
        Some(spec) => (spec.validate)(config),
    }
}

pub struct GpuTier {
    /// The registered name it was started as (`gpu.backend`).
    name: String,
    backend: Arc<dyn ModelTier>,
    breaker: CircuitBreaker,
    in_flight: AtomicUsize,
    max_concurrency: usize,
    timeout: Duration,
    pub latency: LatencyTracker,
}

impl GpuTier {
    /// Starts the configured backend; `None` for `backend = "none"`. Call inside a tokio
    /// runtime (the upstream backend spawns health checks).
    ///
    /// Errors: the backend is not registered, or fails to start.
    pub fn start(env: &Environment, config: &GpuConfig) -> anyhow::Result<Option<GpuTier>> {
        if !config.enabled() {
            return Ok(None);
        }
        let spec = spec(&config.backend)
            .ok_or_else(|| anyhow::anyhow!("gpu.backend {:?} is not a registered backend", config.backend))?;
        Ok(Some(GpuTier {
            name: config.backend.clone(),
            backend: (spec.start)(env, config)?,
            breaker: CircuitBreaker::new(config.circuit.clone()),
            in_flight: AtomicUsize::new(0),
            max_concurrency: config.max_concurrency,
            timeout: Duration::from_millis(config.timeout_ms),
            latency: LatencyTracker::default(),
        }))
    }

    /// The backend's registered name (`gpu.backend`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The in-process model, for backends with one.
    pub fn model_info(&self) -> Option<&ModelInfo> {
        self.backend.model()
    }

    /// The backend's own load readings for routing.
    pub fn load(&self) -> TierLoad {
        self.backend.load()
    }

    /// The backend's details for `/readyz`.
    pub fn status(&self) -> serde_json::Value {
        self.backend.status()
    }

    /// Whether the backend needs the policy's `[prompt]`.
    pub fn needs_prompt(&self) -> bool {
        self.backend.needs_prompt()
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
        let input = TierInput::Text { text, prepared: Prepared::default(), prompt };
        let result = self.backend.classify(input, deadline).await;
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
