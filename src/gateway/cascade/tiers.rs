//! Where the cascade's tier verdicts come from: the live tiers (called, recorded for a shadow
//! replay, counted in metrics, through the verdict cache) or a replay of what a live run obtained.

use crate::decision::TierName;
use crate::metrics::{Metrics, TierLabels};
use crate::policy::Policy;
use crate::select::Ineligible;
use crate::tenant::metrics::TenantMetrics;
use crate::tenant::{fair_share_slots, GpuSlot, Identity, Limit, QuotaStore};
use crate::text::LanguageCell;
use crate::tier::gpu::GpuTier;
use crate::tier::{ModelTier, ModelVerdict, Prepared, TierError, TierInput};
use crate::trace::Trace;
use opentelemetry::context::FutureExt;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// The tier verdicts a live run obtained, for replaying under a shadow policy.
#[derive(Debug, Default, Clone)]
pub struct Recorded {
    pub cpu: Option<Result<ModelVerdict, TierError>>,
    pub gpu: Option<Result<ModelVerdict, TierError>>,
    /// The confirm model's second opinion, where the live policy asked for one.
    pub confirm: Option<Result<ModelVerdict, TierError>>,
    /// The features model's score (it never runs again for a replay).
    pub features: Option<crate::features_model::Scored>,
    /// The temperature `cpu` came calibrated at (the served model's), so that a replay under
    /// another policy reads it at that policy's own ([`cpu_verdict`]).
    pub cpu_temperature: Option<f64>,
}

/// The live tiers and where a live run records what it sees.
pub struct LiveTiers<'a> {
    pub cpu: &'a dyn ModelTier,
    pub gpu: Option<&'a GpuTier>,
    /// The confirm model (`[confirm]`; `None`: none loaded).
    pub confirm: Option<&'a dyn ModelTier>,
    pub metrics: &'a Metrics,
    pub recorded: &'a Mutex<Recorded>,
    /// The request's tenant, whose gpu share and daily budget gate each gpu call.
    pub tenant: TenantGate<'a>,
    /// The request's trace: a span per stage.
    pub trace: &'a Trace,
    /// The verdict cache under this request's key (`[cache]`; `None`: off).
    pub cache: Option<crate::gateway::cache::Cached<'a>>,
}

/// The tenant limits a live gpu call passes: a slot of the tenant's fair share (taken
/// atomically, so racing requests cannot overshoot what the snapshot saw) and one call from its
/// daily budget. Refused: the call is not made, the tier answers `Unavailable` with the reason,
/// and routing goes on down the cascade.
pub struct TenantGate<'a> {
    pub identity: &'a Identity,
    pub quotas: &'a dyn QuotaStore,
    pub metrics: &'a TenantMetrics,
}

impl TenantGate<'_> {
    /// Takes the slot and the budget call; the slot is held until the returned guard drops.
    async fn enter_gpu(&self, policy: &Policy) -> Result<Option<GpuSlot>, TierError> {
        let state = &self.identity.state;
        let class = &state.class;
        let slot = match class.gpu_share {
            None => None,
            Some(share) => {
                let slots = fair_share_slots(share, policy.gpu.max_in_flight);
                let Some(slot) = state.gpu.try_acquire(slots) else {
                    self.metrics.limited(&state.label, "gpu_share");
                    let in_flight = state.gpu.in_flight();
                    let why = Ineligible::TenantGpuShare { tenant: state.label.clone(), in_flight, share, slots };
                    return Err(TierError::Unavailable(why.to_string()));
                };
                Some(slot)
            }
        };
        if let Some(per_day) = class.gpu_daily_budget {
            if let Err(denied) = self.quotas.take_daily(&state.key, per_day).await {
                self.metrics.limited(&state.label, denied.limit.as_str());
                if denied.limit != Limit::GpuDailyBudget {
                    return Err(TierError::Unavailable(format!(
                        "tenant gpu budget: quota store refused ({})",
                        denied.limit.as_str()
                    )));
                }
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                state.mark_budget_spent((now + denied.retry_after).as_secs());
                let why = Ineligible::TenantGpuBudget { tenant: state.label.clone(), per_day };
                return Err(TierError::Unavailable(why.to_string()));
            }
        }
        Ok(slot)
    }
}

impl LiveTiers<'_> {
    /// The batch a model tier ran this request in, into the batch-size histogram.
    fn observe_batch(&self, tier: TierName, r: &Result<ModelVerdict, TierError>) {
        if let Ok(v) = r {
            self.metrics.batch_size.get_or_create(&TierLabels { tier: tier.as_str() }).observe(v.batch_size as f64);
        }
    }

    /// `tier`'s verdict through the verdict cache when there is one, else `call`ed; `true` with
    /// a reused verdict (no model call). Recorded for a shadow replay either way.
    async fn through(
        &self,
        tier: TierName,
        deadline: Instant,
        lang: Option<&LanguageCell>,
        call: impl std::future::Future<Output = Result<ModelVerdict, TierError>>,
    ) -> Answer {
        let (r, cached) = match &self.cache {
            Some(cache) => cache.through(tier, deadline, lang, call).await,
            None => (call.await, false),
        };
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        if tier == TierName::Cpu {
            recorded.cpu_temperature = self.cpu.model().map(|m| m.temperature);
        }
        *(match tier {
            TierName::Gpu => &mut recorded.gpu,
            TierName::Confirm => &mut recorded.confirm,
            _ => &mut recorded.cpu,
        }) = Some(r.clone());
        (r, cached)
    }
}

/// A model tier's result, and whether it was reused from the verdict cache.
type Answer = (Result<ModelVerdict, TierError>, bool);

/// Where a cascade's tier verdicts come from.
pub enum Tiers<'a> {
    /// Call the tiers, record what they answer, count in metrics.
    Live(LiveTiers<'a>),
    /// Replay what a live run obtained; a tier it did not call is unavailable. Counts nothing.
    Replay(&'a Recorded),
}

const NOT_RUN: &str = "not called by the live policy (shadow evaluation never calls a model)";

impl Tiers<'_> {
    pub(super) fn metrics(&self) -> Option<&Metrics> {
        match self {
            Tiers::Live(live) => Some(live.metrics),
            Tiers::Replay(_) => None,
        }
    }

    /// Where stage spans go: the live request's trace; a replay records none.
    pub(super) fn trace(&self) -> &Trace {
        match self {
            Tiers::Live(live) => live.trace,
            Tiers::Replay(_) => &Trace::OFF,
        }
    }

    pub(super) async fn cpu(&self, text: &Arc<str>, prepared: Prepared, deadline: Instant) -> Answer {
        match self {
            Tiers::Live(live) => {
                let lang = prepared.lang.clone();
                let call = async {
                    let input = TierInput::Text { text: Arc::clone(text), prepared, prompt: None };
                    let r = live.cpu.classify(input, deadline).await;
                    live.observe_batch(TierName::Cpu, &r);
                    r
                };
                live.through(TierName::Cpu, deadline, lang.as_ref(), call).await
            }
            Tiers::Replay(rec) => {
                (rec.cpu.clone().unwrap_or_else(|| Err(TierError::Unavailable(NOT_RUN.into()))), false)
            }
        }
    }

    /// The confirm model's verdict on the text (it tokenises with its own tokenizer).
    pub(super) async fn confirm(&self, text: &Arc<str>, lang: LanguageCell, deadline: Instant) -> Answer {
        match self {
            Tiers::Live(live) => {
                let Some(confirm) = live.confirm else {
                    return (Err(TierError::Unavailable("no confirm model loaded".into())), false);
                };
                let call = async {
                    let prepared = Prepared { encoded: None, lang: Some(lang.clone()) };
                    let input = TierInput::Text { text: Arc::clone(text), prepared, prompt: None };
                    let r = confirm.classify(input, deadline).await;
                    live.observe_batch(TierName::Confirm, &r);
                    r
                };
                live.through(TierName::Confirm, deadline, Some(&lang), call).await
            }
            Tiers::Replay(rec) => {
                (rec.confirm.clone().unwrap_or_else(|| Err(TierError::Unavailable(NOT_RUN.into()))), false)
            }
        }
    }

    pub(super) async fn gpu(
        &self,
        policy: &Policy,
        text: &Arc<str>,
        deadline: Instant,
        context: opentelemetry::Context,
    ) -> Answer {
        match self {
            Tiers::Live(live) => {
                let Some(gpu) = live.gpu else {
                    return (Err(TierError::Unavailable("no gpu tier configured".into())), false);
                };
                // A reused verdict takes no gpu slot and nothing from the tenant's daily budget.
                let call = async {
                    let _slot = live.tenant.enter_gpu(policy).await?;
                    // The model server's request carries the gpu span's context (`inject_current`).
                    let r =
                        gpu.classify(policy.prompt.as_ref(), Arc::clone(text), deadline).with_context(context).await;
                    live.observe_batch(TierName::Gpu, &r);
                    r
                };
                live.through(TierName::Gpu, deadline, None, call).await
            }
            Tiers::Replay(rec) => {
                (rec.gpu.clone().unwrap_or_else(|| Err(TierError::Unavailable(NOT_RUN.into()))), false)
            }
        }
    }

    /// The temperature the cpu tier's verdicts come calibrated at: the served model's (`None`:
    /// a backend without an in-process model, or a replay of a run that did not call it).
    pub(super) fn cpu_temperature(&self) -> Option<f64> {
        match self {
            Tiers::Live(live) => live.cpu.model().map(|m| m.temperature),
            Tiers::Replay(rec) => rec.cpu_temperature,
        }
    }

    /// Time spent in a stage, as the request saw it (queue included), into the histogram; a
    /// verdict reused from the cache is not a model call and is counted by the cache instead.
    pub(super) fn observe(&self, tier: TierName, us: u64, cached: bool) {
        if let Some(m) = self.metrics().filter(|_| !cached) {
            m.tier_latency.get_or_create(&TierLabels { tier: tier.as_str() }).observe(us as f64 / 1e6);
        }
    }
}
