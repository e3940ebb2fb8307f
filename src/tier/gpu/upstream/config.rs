//! `[gpu.upstream]` in the config file.

use super::EndpointUris;
use serde::Deserialize;

/// Static configuration of the pool (`[gpu.upstream]` in the config file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Base URLs, e.g. `http://127.0.0.1:8000` (plain HTTP: these are local servers).
    pub endpoints: Vec<String>,
    /// Model name sent in each request (vLLM and SGLang check it; llama.cpp ignores it).
    pub model: String,
    /// Health path; vLLM, TGI and llama.cpp server all serve `/health`.
    pub health_path: String,
    /// Interval of the active health checks, per endpoint.
    pub health_interval_ms: u64,
    /// Prometheus text to scrape for load, e.g. `/metrics`: KV-cache usage (vLLM's
    /// `vllm:gpu_cache_usage_perc` or `vllm:kv_cache_usage_perc`, llama.cpp's
    /// `llamacpp:kv_cache_usage_ratio`, 0..1) and queue depth (`vllm:num_requests_waiting` /
    /// `llamacpp:requests_deferred` waiting, `vllm:num_requests_running` /
    /// `llamacpp:requests_processing` running). `None`: no scraping, no headroom.
    pub metrics_path: Option<String>,
    /// Consecutive failures (requests or health checks) that eject an endpoint.
    pub eject_after_failures: u32,
    /// How long an ejected endpoint stays out before a passing health check may re-admit it.
    pub eject_ms: u64,
    /// TCP connect timeout.
    pub connect_timeout_ms: u64,
    /// Time constant of the latency EWMA (linkerd's PeakEWMA decays in time, not in samples).
    pub ewma_decay_ms: u64,
    /// The gpu tier's own temperature, applied to the log-odds of the label probability:
    /// `risk = sigmoid(logit(p_risk) / temperature)`. Fitted by `tiergate calibrate --tier gpu`.
    pub temperature: f64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            endpoints: Vec::new(),
            model: String::new(),
            health_path: "/health".into(),
            health_interval_ms: 2000,
            metrics_path: None,
            eject_after_failures: 3,
            eject_ms: 5000,
            connect_timeout_ms: 500,
            ewma_decay_ms: 10_000,
            temperature: 1.0,
        }
    }
}

impl UpstreamConfig {
    /// Checks what [`UpstreamPool::start`] needs; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("`endpoints` must list at least one base URL".into());
        }
        for url in &self.endpoints {
            EndpointUris::parse(url, &self.health_path, self.metrics_path.as_deref())?;
        }
        if self.model.trim().is_empty() {
            return Err("`model` must not be empty".into());
        }
        for (field, value) in [
            ("health_interval_ms", self.health_interval_ms),
            ("eject_after_failures", u64::from(self.eject_after_failures)),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("ewma_decay_ms", self.ewma_decay_ms),
        ] {
            if value == 0 {
                return Err(format!("`{field}` must be at least 1"));
            }
        }
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(format!("`temperature` must be a positive number, got {}", self.temperature));
        }
        Ok(())
    }
}
