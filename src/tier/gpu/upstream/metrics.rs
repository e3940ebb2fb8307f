//! Load readings scraped from a model server's Prometheus `/metrics`.

/// vLLM's KV-cache usage (max over series, clamped to [0, 1]) and waiting requests (sum over
/// series) from Prometheus text. Unparsable lines and non-finite values are skipped.
pub fn parse_vllm_metrics(text: &str) -> (Option<f64>, Option<f64>) {
    let (mut usage, mut waiting): (Option<f64>, Option<f64>) = (None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(name_end) = line.find(|c: char| c == '{' || c.is_whitespace()) else { continue };
        let (name, mut rest) = line.split_at(name_end);
        if rest.starts_with('{') {
            let Some(close) = rest.rfind('}') else { continue };
            rest = &rest[close + 1..];
        }
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if !value.is_finite() {
            continue;
        }
        match name {
            "vllm:gpu_cache_usage_perc" | "vllm:kv_cache_usage_perc" => {
                let value = value.clamp(0.0, 1.0);
                usage = Some(usage.map_or(value, |u| u.max(value)));
            }
            "vllm:num_requests_waiting" => waiting = Some(waiting.unwrap_or(0.0) + value.max(0.0)),
            _ => {}
        }
    }
    (usage, waiting)
}
