//! A live A/B test (`[ab]` in config): a candidate policy decides a share of `/v1/classify`
//! traffic for real, sticky per key (the authenticated tenant, or a request header within it,
//! hashed: [`band::sticky_key`], [`band::arm_of`]),
//! with both arms' outcomes counted apart (`tiergate_ab_*{arm="live"|"candidate"}`). When the
//! candidate's block, fallback or error rate stays out of its band around the live policy's
//! (absolute, or relative to the live rate) for
//! `breach_for_s`, it is rolled back: it takes no more traffic, the event is logged (warn),
//! counted (`tiergate_ab_rollbacks_total`) and shown in `GET /admin/policy`. A reload that
//! changes the candidate's version starts it again with fresh counts.
//!
//! Unlike `[shadow]`, whose candidate replays beside the live policy and never answers, the
//! candidate here answers its share; the decision names its `arm`.

pub mod band;

use super::AbConfig;
use crate::decision::Arm;
use crate::decision::{Decision, TierName};
use crate::error::ApiError;
use crate::policy::{Limits, Policy, PolicyStore};
use crate::request::ClassifyRequest;
use band::{Bands, Breach, Check, Outcome, Window};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ArmActionLabels {
    arm: &'static str,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ArmLabels {
    arm: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MeasureLabels {
    measure: &'static str,
}

/// The A/B metrics (names with the registry's `tiergate` prefix).
#[derive(Clone, Debug, Default)]
struct AbMetrics {
    /// `tiergate_ab_decisions_total{arm, action}`.
    decisions: Family<ArmActionLabels, Counter>,
    /// `tiergate_ab_fallbacks_total{arm}`: decisions rules made because no model verdict stood.
    fallbacks: Family<ArmLabels, Counter>,
    /// `tiergate_ab_errors_total{arm}`: server errors instead of a decision.
    errors: Family<ArmLabels, Counter>,
    /// `tiergate_ab_rollbacks_total{measure}`: automatic rollbacks, by the rate that left its band.
    rollbacks: Family<MeasureLabels, Counter>,
    /// `tiergate_ab_candidate_active`: 1 while the candidate takes its share.
    active: Gauge,
}

impl AbMetrics {
    fn register(registry: &mut Registry) -> AbMetrics {
        let m = AbMetrics::default();
        registry.register("ab_decisions", "A/B decisions by arm and action", m.decisions.clone());
        registry.register(
            "ab_fallbacks",
            "A/B decisions rules made because no model verdict stood, by arm",
            m.fallbacks.clone(),
        );
        registry.register("ab_errors", "A/B requests answered with a server error, by arm", m.errors.clone());
        registry.register(
            "ab_rollbacks",
            "A/B candidates rolled back automatically, by the rate that left its band",
            m.rollbacks.clone(),
        );
        registry.register("ab_candidate_active", "1 while the A/B candidate takes its share", m.active.clone());
        m
    }
}

/// Why and when the candidate was rolled back.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Rollback {
    /// In words: `block rate 1.000 vs live 0.120 over 40 / 38 requests, band 0.100, for 0 s`, or
    /// `..., relative band 0.500 of the live rate, ...`.
    pub reason: String,
    /// Seconds since the Unix epoch.
    pub at_unix: f64,
    pub candidate_version: String,
    #[serde(flatten)]
    pub breach: Breach,
}

/// The mutable part: the window, the breach clock, the rollback.
struct State {
    window: Window,
    /// When the candidate was first seen out of band, ms since `origin` (see [`band::hold`]).
    out_since_ms: Option<u64>,
    rollback: Option<Rollback>,
    /// The candidate version the state is about; a reload to another one starts afresh.
    version: String,
}

pub struct Ab {
    pub policies: PolicyStore,
    config: AbConfig,
    bands: Bands,
    /// Read on every request without the lock: `false` once rolled back.
    active: AtomicBool,
    state: Mutex<State>,
    metrics: AbMetrics,
    origin: std::time::Instant,
}

impl Ab {
    /// Loads the candidate (within the server's `limits`) and registers the metrics; `None`
    /// without `[ab] dir`.
    pub(super) fn start(config: &AbConfig, limits: Limits, registry: &mut Registry) -> anyhow::Result<Option<Ab>> {
        let Some(dir) = &config.dir else { return Ok(None) };
        let policy = Policy::load_dir_within(dir, &limits).map_err(|e| anyhow::anyhow!("ab candidate policy: {e}"))?;
        tracing::info!(version = %policy.version, share = config.share, "A/B candidate policy loaded");
        let metrics = AbMetrics::register(registry);
        metrics.active.set(1);
        let state = State {
            window: Window::new(config.window_s),
            out_since_ms: None,
            rollback: None,
            version: policy.version.clone(),
        };
        Ok(Some(Ab {
            policies: PolicyStore::within(policy, limits),
            bands: Bands {
                block: config.block_band,
                fallback: config.fallback_band,
                error: config.error_band,
                block_relative: config.block_relative_band,
                fallback_relative: config.fallback_relative_band,
                error_relative: config.error_relative_band,
                min_samples: config.min_samples,
            },
            config: config.clone(),
            active: AtomicBool::new(true),
            state: Mutex::new(state),
            metrics,
            origin: std::time::Instant::now(),
        }))
    }

    /// The arm of a request: the candidate for sticky keys in its share ([`band::sticky_key`]:
    /// the authenticated tenant, with the key header under `sticky = "header"`) while it is
    /// active and defines the request's scenario; the live policy otherwise, and for requests
    /// without a key (unauthenticated or only claimed tenants: a client must not pick its arm).
    pub(super) fn arm(&self, req: &ClassifyRequest, headers: &http::HeaderMap) -> Arm {
        if !self.active.load(Ordering::Relaxed) {
            return Arm::Live;
        }
        let tenant = req.identity.as_ref().and_then(|i| i.authenticated());
        let header = headers.get(self.config.key_header.as_str()).map(|v| v.as_bytes());
        let key = band::sticky_key(self.config.sticky, tenant, header);
        match key.map(|k| band::arm_of(&k, self.config.share)) {
            Some(Arm::Candidate) if self.policies.snapshot().scenario(req.scenario.as_deref()).is_ok() => {
                Arm::Candidate
            }
            _ => Arm::Live,
        }
    }

    /// Counts what a request of `arm` came to, then judges the candidate (and rolls it back when
    /// it has been out of band long enough). Client errors (4xx) count for neither arm.
    pub(super) fn record(&self, arm: Arm, result: &Result<Decision, ApiError>) {
        let outcome = match result {
            Ok(d) => Outcome::Decided {
                block: d.action == crate::action::Action::Block,
                fallback: d.tier == TierName::Rules,
            },
            Err(e) if e.status().is_server_error() => Outcome::Error,
            Err(_) => return,
        };
        let label = ArmLabels { arm: arm.as_str() };
        match result {
            Ok(d) => {
                let labels = ArmActionLabels { arm: arm.as_str(), action: d.action.as_str() };
                self.metrics.decisions.get_or_create(&labels).inc();
                if d.tier == TierName::Rules {
                    self.metrics.fallbacks.get_or_create(&label).inc();
                }
            }
            Err(_) => {
                self.metrics.errors.get_or_create(&label).inc();
            }
        }
        let now_ms = self.now_ms();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.window.record(now_ms, arm, outcome);
        self.judge(&mut state, now_ms);
    }

    /// Judges the candidate without a new outcome (housekeeping), so a breach that lasts rolls
    /// back even while traffic is sparse.
    pub(super) fn tick(&self) {
        let now_ms = self.now_ms();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.judge(&mut state, now_ms);
    }

    fn judge(&self, state: &mut State, now_ms: u64) {
        if state.rollback.is_some() {
            return;
        }
        let (live, candidate) = state.window.totals(now_ms);
        let check = band::check(&live, &candidate, &self.bands);
        let (since, fire) = band::hold(state.out_since_ms, &check, now_ms, self.config.breach_for_s * 1000);
        state.out_since_ms = since;
        let (true, Check::OutOfBand(breach)) = (fire, check) else { return };
        let held_s = now_ms.saturating_sub(since.unwrap_or(now_ms)) / 1000;
        let band = match breach.band_kind {
            band::BandKind::Absolute => format!("band {:.3}", breach.band),
            band::BandKind::Relative => format!("relative band {:.3} of the live rate", breach.band),
        };
        let reason = format!(
            "{} rate {:.3} vs live {:.3} over {} / {} requests, {band}, for {held_s} s",
            breach.measure.as_str(),
            breach.candidate_rate,
            breach.live_rate,
            breach.candidate_samples,
            breach.live_samples,
        );
        self.active.store(false, Ordering::Relaxed);
        self.metrics.active.set(0);
        self.metrics.rollbacks.get_or_create(&MeasureLabels { measure: breach.measure.as_str() }).inc();
        tracing::warn!(candidate_version = %state.version, %reason, "A/B candidate rolled back; the live policy decides all traffic");
        let at_unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        state.rollback = Some(Rollback { reason, at_unix, candidate_version: state.version.clone(), breach });
    }

    /// After a reload of the candidate: a new version takes its share again with fresh counts.
    pub(super) fn rearm_if_changed(&self) {
        let version = self.policies.snapshot().version.clone();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.version == version {
            return;
        }
        tracing::info!(%version, previous = %state.version, "A/B candidate changed; it takes its share again");
        *state = State { window: Window::new(self.config.window_s), out_since_ms: None, rollback: None, version };
        self.active.store(true, Ordering::Relaxed);
        self.metrics.active.set(1);
    }

    /// What `GET /admin/policy` shows under `ab`.
    pub fn status(&self) -> serde_json::Value {
        let now_ms = self.now_ms();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (live, candidate) = state.window.totals(now_ms);
        let rates = |c: &band::Counts| {
            json!({"counts": c, "block_rate": c.rate(band::Measure::Block),
                   "fallback_rate": c.rate(band::Measure::Fallback), "error_rate": c.rate(band::Measure::Error)})
        };
        json!({
            "state": if state.rollback.is_some() { "rolled_back" } else { "active" },
            "share": self.config.share,
            "sticky": self.config.sticky,
            "bands": {"block": self.bands.block, "fallback": self.bands.fallback, "error": self.bands.error,
                      "block_relative": self.bands.block_relative,
                      "fallback_relative": self.bands.fallback_relative,
                      "error_relative": self.bands.error_relative,
                      "min_samples": self.bands.min_samples, "window_s": self.config.window_s,
                      "breach_for_s": self.config.breach_for_s},
            "out_of_band_since_s": state.out_since_ms.map(|s| now_ms.saturating_sub(s) / 1000),
            "window": {"live": rates(&live), "candidate": rates(&candidate)},
            "rollback": state.rollback,
            "candidate": self.policies.status(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }
}
