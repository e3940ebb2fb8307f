//! `[tracing]`: where tiergate's OpenTelemetry traces go, how many are kept, and the export
//! queue's bounds. Absent or `enabled = false` (the default): no trace is made, no header is
//! read or written, nothing is exported.

use serde::Deserialize;
use std::collections::BTreeMap;

/// `[tracing]`. Defaults follow the OpenTelemetry SDK's batch span processor
/// (`OTEL_BSP_*`: queue 2048 spans, batch 512, delay 5 s, export timeout 30 s) except the
/// delay (1 s: a decision's trace should be visible while someone is looking for it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// Make and export traces.
    pub enabled: bool,
    /// The OTLP/HTTP traces URL of a collector, `http://host:port/v1/traces` (protobuf body;
    /// OTLP's default port for HTTP is 4318). Plain HTTP: put a collector or agent beside
    /// tiergate and let it speak TLS onwards.
    pub endpoint: String,
    /// Headers sent with every export (e.g. a collector's `authorization`); values may use
    /// `${VAR}` like every config string.
    pub headers: BTreeMap<String, String>,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Share of new traces sampled, [0, 1], parent-based: a client's `traceparent` with its
    /// sampled flag decides for the client's own trace. Blocked, errored and over-deadline
    /// decisions are exported whatever this says (a tail decision at the end of the request).
    pub sampling_ratio: f64,
    /// Spans waiting for export at most; past it new spans are dropped and counted
    /// (`tiergate_trace_spans_dropped_total{reason="queue_full"}`).
    pub max_queue_size: usize,
    /// Spans per OTLP export request at most.
    pub max_export_batch_size: usize,
    /// Longest a span waits in the queue for a batch to fill, ms.
    pub scheduled_delay_ms: u64,
    /// Longest one export request may take, ms; past it its spans are dropped and counted
    /// (`reason="export_failed"`).
    pub export_timeout_ms: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            enabled: false,
            endpoint: "http://127.0.0.1:4318/v1/traces".into(),
            headers: BTreeMap::new(),
            service_name: "tiergate".into(),
            sampling_ratio: 0.01,
            max_queue_size: 2048,
            max_export_batch_size: 512,
            scheduled_delay_ms: 1000,
            export_timeout_ms: 10_000,
        }
    }
}

impl TracingConfig {
    /// Checks ranges; errors name the key.
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(format!("tracing.sampling_ratio must be in [0, 1], got {}", self.sampling_ratio));
        }
        for (key, value) in [
            ("tracing.max_queue_size", self.max_queue_size as u64),
            ("tracing.max_export_batch_size", self.max_export_batch_size as u64),
            ("tracing.export_timeout_ms", self.export_timeout_ms),
        ] {
            if value == 0 {
                return Err(format!("{key} must be positive"));
            }
        }
        if self.max_export_batch_size > self.max_queue_size {
            return Err(format!(
                "tracing.max_export_batch_size ({}) must not exceed tracing.max_queue_size ({})",
                self.max_export_batch_size, self.max_queue_size
            ));
        }
        if self.enabled {
            let uri: http::Uri =
                self.endpoint.parse().map_err(|e| format!("tracing.endpoint: not a URL ({e}): {:?}", self.endpoint))?;
            if uri.scheme_str() != Some("http") || uri.host().is_none() {
                return Err(format!(
                    "tracing.endpoint must be an http:// URL with a host (e.g. http://127.0.0.1:4318/v1/traces; \
                     for TLS, export to a local collector), got {:?}",
                    self.endpoint
                ));
            }
            for (name, value) in &self.headers {
                http::HeaderName::try_from(name.as_str())
                    .map_err(|_| format!("tracing.headers: `{name}` is not a valid header name"))?;
                http::HeaderValue::try_from(value.as_str())
                    .map_err(|_| format!("tracing.headers.{name}: not a valid header value"))?;
            }
        }
        Ok(())
    }
}
