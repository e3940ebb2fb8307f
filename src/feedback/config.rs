//! `[feedback]`: live quality windows and, in a fleet, the replicas a label is forwarded to when
//! its record is not in this one's store. Labels need the audit trail (`[audit]`): without it
//! `POST /v1/feedback` answers 404.
//!
//! ```toml
//! [feedback]
//! windows = ["1h", "24h", "7d"]          # live quality over the decisions of each window
//! refresh_interval_ms = 15000            # how often the quality gauges are recomputed
//! peers = ["http://10.0.0.12:9091"]      # the other replicas' admin listeners
//! ```

use serde::Deserialize;
use std::time::Duration;

/// Most windows (each is a label value of every quality series).
const MAX_WINDOWS: usize = 6;
/// Most peers a label is offered to.
const MAX_PEERS: usize = 64;

/// The `[feedback]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeedbackConfig {
    /// Sliding windows of decision time that live quality is counted over (humantime: `1h`,
    /// `7d`), shortest first in the metrics' `window` label as written here.
    pub windows: Vec<String>,
    /// How often the `tiergate_quality_*` gauges are recomputed from the store, ms (also soon
    /// after labels arrive, at most once a second).
    pub refresh_interval_ms: u64,
    /// The admin listeners (`http://host:port`) of the fleet's other replicas. A label whose
    /// record this replica does not hold is offered to each in turn, with this replica's
    /// `[admin] token` (a fleet shares it), so that a label sent to any replica counts.
    pub peers: Vec<String>,
    /// How long one peer may take to answer a forwarded label, ms.
    pub forward_timeout_ms: u64,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        FeedbackConfig {
            windows: vec!["1h".into(), "24h".into(), "7d".into()],
            refresh_interval_ms: 15_000,
            peers: Vec::new(),
            forward_timeout_ms: 2_000,
        }
    }
}

impl FeedbackConfig {
    /// The windows as durations, in the order written. Errors name the key and the value.
    pub fn window_durations(&self) -> Result<Vec<(String, Duration)>, String> {
        if self.windows.is_empty() || self.windows.len() > MAX_WINDOWS {
            return Err(format!("feedback.windows: give 1 to {MAX_WINDOWS} windows, got {}", self.windows.len()));
        }
        self.windows
            .iter()
            .map(|w| match humantime::parse_duration(w) {
                Ok(d) if d >= Duration::from_secs(60) => Ok((w.clone(), d)),
                Ok(_) => Err(format!("feedback.windows: `{w}` is under a minute")),
                Err(e) => Err(format!("feedback.windows: `{w}` is not a duration such as 1h or 7d: {e}")),
            })
            .collect()
    }

    /// Checks ranges; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        self.window_durations()?;
        if self.refresh_interval_ms < 1_000 {
            return Err("feedback.refresh_interval_ms: at least 1000".into());
        }
        if !(100..=60_000).contains(&self.forward_timeout_ms) {
            return Err("feedback.forward_timeout_ms: 100 to 60000".into());
        }
        if self.peers.len() > MAX_PEERS {
            return Err(format!("feedback.peers: at most {MAX_PEERS}"));
        }
        for peer in &self.peers {
            let uri: http::Uri = peer.parse().map_err(|e| format!("feedback.peers: `{peer}` is not a URL: {e}"))?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                return Err(format!("feedback.peers: `{peer}`: give http://host:port of a replica's admin listener"));
            }
        }
        Ok(())
    }
}
