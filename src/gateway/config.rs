//! The gateway's own config sections (`[admission]`, `[shadow]`, `[ab]`; `[tenants]` is the
//! tenant module's), and [`GatewayConfig`], every
//! section the gateway starts from, borrowed from the loaded config.

use crate::policy::PoliciesConfig;
use crate::readings::ReadingsConfig;
use crate::tier::{GpuConfig, ModelConfig};
use serde::Deserialize;
use std::path::PathBuf;

/// What [`super::Gateway::start`] needs: the model, gpu, policy, load readings, admission, shadow,
/// audit and drift sections, and the policy directories that proxy routes name.
#[derive(Debug, Clone)]
pub struct GatewayConfig<'a> {
    pub model: &'a ModelConfig,
    /// `[confirm]`: the confirm model, when there is one.
    pub confirm: Option<&'a ModelConfig>,
    pub gpu: &'a GpuConfig,
    pub policies: &'a PoliciesConfig,
    pub readings: &'a ReadingsConfig,
    pub admission: &'a AdmissionConfig,
    /// `[tenants]`: identity sources, known tenants, classes and their limits.
    pub tenants: &'a crate::tenant::TenantsConfig,
    pub shadow: &'a ShadowConfig,
    /// `[ab]`: the candidate policy that decides a share of live traffic.
    pub ab: &'a AbConfig,
    /// The server's limits every policy is checked against (`[server] max_deadline_ms`).
    pub limits: crate::policy::Limits,
    pub drift: &'a crate::drift::DriftConfig,
    /// Policy directories named by `[routes.screen] policy`, in route order (duplicates allowed).
    pub route_policies: Vec<PathBuf>,
    /// `[audit]`: the gateway opens the trail and records every decision; `None`: no trail
    /// (also for one-off runs such as `explain` and `check-policy`).
    pub audit: Option<&'a crate::audit::AuditConfig>,
    /// `[tracing]`: the gateway holds the tracer every front door begins a request's trace with.
    pub tracing: &'a crate::trace::TracingConfig,
    /// `[features_model]`: the features model's directory, when there is one.
    pub features_model: Option<&'a crate::features_model::FeaturesModelConfig>,
    /// `[cache]`: the verdict cache.
    pub cache: &'a super::CacheConfig,
    /// `[campaign]`: campaign and entity velocity (shared through `[tenants.redis]` when set).
    pub campaign: &'a crate::campaign::CampaignConfig,
    /// `[feedback]`: live quality windows and the fleet's peers (with `[audit]` only).
    pub feedback: &'a crate::feedback::FeedbackConfig,
    /// `[admin] token`: what this replica presents to its peers when it forwards a label.
    pub admin_token: Option<&'a str>,
}

/// `[shadow]`: a candidate policy, and/or a candidate model, evaluated beside the live ones on a
/// share of requests without affecting answers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowConfig {
    /// The candidate's policy directory; unset: no shadow evaluation.
    pub dir: Option<PathBuf>,
    /// Share of requests also decided by the candidate, [0, 1].
    pub share: f64,
    /// JSON-lines file for the candidate policy's disagreements (both decisions) and the
    /// candidate model's scores (every one); unset: only counted in metrics.
    pub log: Option<PathBuf>,
    /// `[shadow.model]`: a candidate cpu model (the `[model]` keys; `dir` as `tiergate model
    /// pack` writes it) scored beside the live one on the same share; unset: none.
    pub model: Option<ModelConfig>,
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
    /// Overflow pacing (`super::overflow`): the rules' answers for requests the saturated model
    /// tiers had no room for are released at most this many per model answer (GCRA); 0: off.
    pub overflow_per_model_answer: f64,
    /// The pacing's burst tolerance, ms (0: none; at most a day, as every `_ms` key).
    pub overflow_burst_ms: u64,
    /// The paced rate's floor, answers/s (while the model has answered little).
    pub overflow_min_rps: f64,
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

impl AdmissionConfig {
    /// Overflow pacing's keys.
    pub fn overflow(&self) -> super::overflow::OverflowConfig {
        super::overflow::OverflowConfig {
            per_model_answer: self.overflow_per_model_answer,
            burst_ms: self.overflow_burst_ms,
            min_rps: self.overflow_min_rps,
        }
    }

    /// Errors name the key and its range.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1000.0).contains(&self.overflow_per_model_answer) {
            return Err(format!(
                "[admission] overflow_per_model_answer must be within 0 (off) ..= 1000, got {}",
                self.overflow_per_model_answer
            ));
        }
        if !(1.0..=1e6).contains(&self.overflow_min_rps) {
            return Err(format!(
                "[admission] overflow_min_rps must be within 1 ..= 1000000, got {}",
                self.overflow_min_rps
            ));
        }
        Ok(())
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            tenant_rps: 0,
            tenant_burst: 50,
            overflow_per_model_answer: 1.5,
            overflow_burst_ms: 50,
            overflow_min_rps: 50.0,
        }
    }
}

/// Where an A/B test's sticky key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sticky {
    /// The request's authenticated tenant (API key, trusted header); a claimed or unknown
    /// tenant has no key and is decided by the live policy.
    Tenant,
    /// The value of `[ab] key_header` within the authenticated tenant (its app spreading its own
    /// users over the arms); without an authenticated tenant, no key.
    Header,
}

/// `[ab]`: a candidate policy that decides a share of live traffic for real, sticky per key,
/// rolled back automatically when its block, fallback or error rate leaves a band around the
/// live policy's (docs/operations.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AbConfig {
    /// The candidate's policy directory; unset: no A/B test.
    pub dir: Option<PathBuf>,
    /// Share of sticky keys the candidate decides, [0, 1]. Requests without a key (no
    /// authenticated tenant: a client must not pick its arm) go to the live policy.
    pub share: f64,
    /// Where the sticky key comes from: `tenant` or `header`.
    pub sticky: Sticky,
    /// The key header when `sticky = "header"`.
    pub key_header: String,
    /// Largest allowed |candidate - live| block rate, [0, 1].
    pub block_band: f64,
    /// Largest allowed |candidate - live| rate of decisions rules made because no model verdict
    /// stood, [0, 1].
    pub fallback_band: f64,
    /// Largest allowed |candidate - live| server-error rate, [0, 1].
    pub error_band: f64,
    /// Largest allowed |candidate - live| block rate as a share of the live block rate (0.5:
    /// half of it, either way), judged only when the difference is beyond chance (three
    /// standard errors); 0: off. Catches what an absolute band cannot: 0.12 -> 0.03 is inside
    /// a band of 0.1 but a quarter of the live rate.
    pub block_relative_band: f64,
    /// The same for the rate of decisions rules made because no model verdict stood.
    pub fallback_relative_band: f64,
    /// The same for the server-error rate.
    pub error_relative_band: f64,
    /// Requests each arm needs in the window before its rates are compared (at least 1).
    pub min_samples: u64,
    /// The window the rates are counted over, seconds (at least 1).
    pub window_s: u64,
    /// How long the candidate must stay out of band before it is rolled back, seconds (0: at
    /// the first breach).
    pub breach_for_s: u64,
}

impl Default for AbConfig {
    fn default() -> Self {
        AbConfig {
            dir: None,
            share: 0.0,
            sticky: Sticky::Tenant,
            key_header: "x-tiergate-ab-key".into(),
            block_band: 0.05,
            fallback_band: 0.1,
            error_band: 0.01,
            block_relative_band: 0.5,
            fallback_relative_band: 0.5,
            error_relative_band: 0.0,
            min_samples: 200,
            window_s: 300,
            breach_for_s: 60,
        }
    }
}

/// Bound on an `[ab]` relative band: ten times the live rate.
pub const MAX_RELATIVE_BAND: f64 = 10.0;

impl AbConfig {
    /// Checks ranges; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        let unit = [
            ("ab.share", self.share),
            ("ab.block_band", self.block_band),
            ("ab.fallback_band", self.fallback_band),
            ("ab.error_band", self.error_band),
        ];
        if let Some((key, v)) = unit.iter().find(|(_, v)| !(0.0..=1.0).contains(v)) {
            return Err(format!("`{key}` must be in [0, 1], got {v}"));
        }
        // Relative to the live rate, so above 1 is meaningful (a rate may triple); a bound keeps
        // a typo such as 50 (meant as 50 %) from turning the band off in effect.
        let relative = [
            ("ab.block_relative_band", self.block_relative_band),
            ("ab.fallback_relative_band", self.fallback_relative_band),
            ("ab.error_relative_band", self.error_relative_band),
        ];
        if let Some((key, v)) = relative.iter().find(|(_, v)| !(0.0..=MAX_RELATIVE_BAND).contains(v)) {
            return Err(format!(
                "`{key}` must be in [0, {MAX_RELATIVE_BAND}] (a share of the live rate; 0: off), got {v}"
            ));
        }
        if self.min_samples == 0 {
            return Err("`ab.min_samples` must be at least 1".into());
        }
        if self.window_s == 0 {
            return Err("`ab.window_s` must be at least 1".into());
        }
        if http::HeaderName::from_bytes(self.key_header.as_bytes()).is_err() {
            return Err(format!("`ab.key_header` is not a valid header name: `{}`", self.key_header));
        }
        Ok(())
    }
}
