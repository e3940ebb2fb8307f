//! Load readings scraped from a model server's Prometheus `/metrics` (vLLM and llama.cpp).

use serde::Serialize;

/// What one scrape says; each `None` when the server does not expose it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerMetrics {
    /// KV-cache usage in [0, 1] (max over series): `vllm:gpu_cache_usage_perc`,
    /// `vllm:kv_cache_usage_perc`, `llamacpp:kv_cache_usage_ratio`.
    pub kv_cache_usage: Option<f64>,
    /// Requests queued, not yet running (sum over series): `vllm:num_requests_waiting`,
    /// `llamacpp:requests_deferred`.
    pub requests_waiting: Option<f64>,
    /// Requests running (sum over series): `vllm:num_requests_running`,
    /// `llamacpp:requests_processing`.
    pub requests_running: Option<f64>,
}

/// Reads [`ServerMetrics`] from Prometheus text. Unparsable lines and non-finite values are
/// skipped; other metrics are ignored.
pub fn parse_server_metrics(text: &str) -> ServerMetrics {
    let mut m = ServerMetrics::default();
    let add = |slot: &mut Option<f64>, value: f64| *slot = Some(slot.unwrap_or(0.0) + value.max(0.0));
    for line in text.lines() {
        let Some((name, value)) = sample(line) else { continue };
        match name {
            "vllm:gpu_cache_usage_perc" | "vllm:kv_cache_usage_perc" | "llamacpp:kv_cache_usage_ratio" => {
                let value = value.clamp(0.0, 1.0);
                m.kv_cache_usage = Some(m.kv_cache_usage.map_or(value, |u| u.max(value)));
            }
            "vllm:num_requests_waiting" | "llamacpp:requests_deferred" => add(&mut m.requests_waiting, value),
            "vllm:num_requests_running" | "llamacpp:requests_processing" => add(&mut m.requests_running, value),
            _ => {}
        }
    }
    m
}

/// The metric name and finite value of one sample line (labels and timestamp dropped).
fn sample(line: &str) -> Option<(&str, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let (name, mut rest) = line.split_at(name_end);
    if rest.starts_with('{') {
        rest = &rest[rest.rfind('}')? + 1..];
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    value.is_finite().then_some((name, value))
}
