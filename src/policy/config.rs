//! `[policies]` in the config file: where the policy lives and how it is watched.

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoliciesConfig {
    /// Directory of policy files (`*.toml`), merged in file-name order.
    pub dir: PathBuf,
    /// Reload when a file in `dir` changes (SIGHUP and `POST /admin/reload` always work).
    pub watch: bool,
    /// Quiet time after the last change before reloading, ms.
    pub debounce_ms: u64,
}

impl Default for PoliciesConfig {
    fn default() -> Self {
        PoliciesConfig { dir: PathBuf::from("policies"), watch: true, debounce_ms: 100 }
    }
}
