//! `[drift]`: the live drift monitor's window, schedule and reference file.

use serde::Deserialize;
use std::path::PathBuf;

/// `[drift]` config section. The window holds the last `window` decisions that are at most
/// `max_age_ms` old; every `interval_ms` a background task compares it with the reference.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DriftConfig {
    /// Whether the monitor runs. With the default reference path, a model directory without
    /// `reference.json` turns it off with a warning; a `reference` set here must exist.
    pub enabled: bool,
    /// The reference distribution (`tiergate drift reference` writes it); unset:
    /// `reference.json` in the model directory.
    pub reference: Option<PathBuf>,
    /// Most decisions in the window (the newest ones), at least 1.
    pub window: usize,
    /// Decisions older than this leave the window, ms (at most one day).
    pub max_age_ms: u64,
    /// How often the statistics are computed, ms (at least 10).
    pub interval_ms: u64,
    /// Fewer decisions in the window and the gauges read NaN: a KS statistic of a few dozen
    /// samples is mostly noise (its 95 % critical value is about 1.36·√(1/n + 1/m)).
    pub min_window: usize,
}

impl Default for DriftConfig {
    fn default() -> Self {
        DriftConfig {
            enabled: true,
            reference: None,
            window: 2000,
            max_age_ms: 3_600_000,
            interval_ms: 15_000,
            min_window: 500,
        }
    }
}

impl DriftConfig {
    /// Range checks; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.window == 0 {
            return Err("`drift.window` must be at least 1".into());
        }
        if self.min_window > self.window {
            return Err(format!(
                "`drift.min_window` ({}) must not exceed `drift.window` ({})",
                self.min_window, self.window
            ));
        }
        if self.interval_ms < 10 {
            return Err(format!("`drift.interval_ms` must be at least 10, got {}", self.interval_ms));
        }
        if self.max_age_ms == 0 {
            return Err("`drift.max_age_ms` must be at least 1".into());
        }
        Ok(())
    }
}
