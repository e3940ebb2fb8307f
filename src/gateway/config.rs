//! The gateway's own config sections (`[admission]`, `[shadow]`), and [`GatewayConfig`], every
//! section the gateway starts from, borrowed from the loaded config.

use crate::policy::PoliciesConfig;
use crate::signals::SignalsConfig;
use crate::tier::{GpuConfig, ModelConfig};
use serde::Deserialize;
use std::path::PathBuf;

/// What [`super::Gateway::start`] needs: the model, gpu, policy, signals, admission, shadow,
/// audit and drift sections, and the policy directories that proxy routes name.
#[derive(Debug, Clone)]
pub struct GatewayConfig<'a> {
    pub model: &'a ModelConfig,
    pub gpu: &'a GpuConfig,
    pub policies: &'a PoliciesConfig,
    pub signals: &'a SignalsConfig,
    pub admission: &'a AdmissionConfig,
    pub shadow: &'a ShadowConfig,
    pub drift: &'a crate::drift::DriftConfig,
    /// Policy directories named by `[routes.screen] policy`, in route order (duplicates allowed).
    pub route_policies: Vec<PathBuf>,
    /// `[audit]`: the gateway opens the trail and records every decision; `None`: no trail
    /// (also for one-off runs such as `explain` and `check-policy`).
    pub audit: Option<&'a crate::audit::AuditConfig>,
}

/// `[shadow]`: a candidate policy evaluated beside the live one without affecting answers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowConfig {
    /// The candidate's policy directory; unset: no shadow evaluation.
    pub dir: Option<PathBuf>,
    /// Share of requests also decided by the candidate, [0, 1].
    pub share: f64,
    /// JSON-lines file for disagreements (both decisions); unset: only counted in metrics.
    pub log: Option<PathBuf>,
}

/// `[admission]`: per-tenant rate limits (GCRA, crate `governor`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Sustained requests per second per tenant; 0 turns tenant limits off.
    pub tenant_rps: u32,
    /// Burst size per tenant.
    pub tenant_burst: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig { tenant_rps: 0, tenant_burst: 50 }
    }
}
