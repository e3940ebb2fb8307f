//! The gateway's own config sections (`[admission]`, `[shadow]`; `[tenants]` is the tenant module's), and [`GatewayConfig`], every
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
    /// `[tenants]`: identity sources, known tenants, classes and their limits.
    pub tenants: &'a crate::tenant::TenantsConfig,
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

/// `[admission]`: the older, single tenant rate. Kept working: it is the rate of `[tenants]`'s
/// default class (every unknown tenant together), unless that class sets its own `rate` (then
/// it is a config error to set both). Per-tenant rates belong in `[tenants.classes]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Sustained requests per second; 0 turns this limit off.
    pub tenant_rps: u32,
    /// Burst size (0: the same as `tenant_rps`).
    pub tenant_burst: u32,
}

impl AdmissionConfig {
    /// The quota it sets, if any.
    pub fn quota(&self) -> Option<crate::tenant::Quota> {
        (self.tenant_rps > 0).then(|| crate::tenant::Quota {
            per_second: self.tenant_rps,
            burst: if self.tenant_burst == 0 { self.tenant_rps } else { self.tenant_burst },
        })
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig { tenant_rps: 0, tenant_burst: 50 }
    }
}
