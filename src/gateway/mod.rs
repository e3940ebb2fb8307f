//! The gateway: one request through admission, complexity assessment and the confidence cascade
//! (cpu -> gpu -> rules, in the order routing picks), with a shadow policy on the side.
//!
//! A decision is always produced unless the policy says to shed: a tier that is unsure, out of
//! its domain, overloaded, failing, circuit-broken or out of time hands over to the next stage,
//! and the rules engine never fails. Every stage tried lands in `path` with its outcome and reason.
//!
//! Files by concern: this one (the orchestrator: scenario, admission, assessment, snapshot,
//! finishing), [`cascade`] (the stage loop), [`shadow`] (the candidate policy replayed beside the
//! live one), [`ab`] (the candidate deciding a share of live traffic, and its rollback),
//! `lifecycle` (start, reload, watchers, housekeeping), `audit` (each decision's audit record),
//! [`config`] (the gateway's config sections).

pub mod ab;
mod audit;
pub mod cache;
pub mod cascade;
mod config;
mod explain;
mod features;
mod guard;
mod lifecycle;
pub mod overflow;
pub mod shadow;
pub mod shadow_model;
mod trace;

pub use cache::CacheConfig;
pub use cascade::TenantGate;
pub use config::{AbConfig, AdmissionConfig, GatewayConfig, ShadowConfig, Sticky};

use crate::breaker::CircuitState;
use crate::complexity;
use crate::decision::{Arm, Decision, Explain, Subject, TierName};
use crate::error::ApiError;
use crate::metrics::{DecisionLabels, Metrics, StepLabels};
use crate::policy::{Policy, PolicyStore};
use crate::readings::cpu::{CpuSource, ProcStat};
use crate::readings::gpu::{CudaDriver, GpuSource};
use crate::readings::{Readings, ReadingsHub};
use crate::request::ClassifyRequest;
use crate::rules::TextFacts;
use crate::select::{self, Below, CpuLoad, GpuLoad, GpuMemory, KvCache, LoadSnapshot, TenantLoad};
use crate::tenant::config::OTHER;
use crate::tenant::metrics::{TenantLabels, TenantMetrics};
use crate::tenant::{Identity, Limit, QuotaStore, Tenants};
use crate::tier::gpu::GpuTier;
use crate::tier::onnx::OnnxPool;
use crate::tier::windows::Tokens;
use crate::tier::TierLoad;
use cascade::{Assessment, Inputs, LiveTiers, Recorded, Tiers};
use opentelemetry::KeyValue;
use shadow::Shadow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// Where live readings come from. Tests replace them with doubles (a GPU on a CPU-only machine).
pub struct Sources {
    pub cpu: Arc<dyn CpuSource>,
    pub gpu: Arc<dyn GpuSource>,
}

impl Default for Sources {
    fn default() -> Self {
        Sources { cpu: Arc::new(ProcStat::default()), gpu: Arc::new(CudaDriver::default()) }
    }
}

pub struct Gateway {
    pub cpu: OnnxPool,
    /// The confirm model (`[confirm]`): a second opinion on unsure cpu risk verdicts.
    pub confirm: Option<OnnxPool>,
    pub gpu: Option<GpuTier>,
    pub policies: PolicyStore,
    /// Policies that proxy routes name (`[routes.screen] policy`), by directory; watched and
    /// reloaded like the live one.
    pub route_policies: BTreeMap<PathBuf, PolicyStore>,
    pub metrics: Metrics,
    pub readings: Arc<ReadingsHub>,
    /// `[tenants]`: resolves who a request is for (the front doors call
    /// [`ClassifyRequest::identify`] with it) and holds each limit key's gpu slots.
    pub tenants: Arc<Tenants>,
    /// Where rate and daily-budget state lives: this process ([`crate::tenant::LocalQuotas`])
    /// or a store shared by replicas.
    pub quotas: Arc<dyn QuotaStore>,
    pub tenant_metrics: TenantMetrics,
    /// Keeps the policy directory watches (live, route, shadow, A/B candidate) alive.
    watchers: Mutex<Vec<crate::policy::watch::Watch>>,
    pub shadow: Option<Shadow>,
    /// The candidate model scored beside the cpu tier (`[shadow.model]`), when configured.
    pub shadow_model: Option<shadow_model::ShadowModel>,
    /// The A/B candidate (`[ab]`), when configured.
    pub ab: Option<ab::Ab>,
    /// The live drift monitor, fed every finished decision (`None`: off).
    pub drift: Option<Arc<crate::drift::Monitor>>,
    /// The gpu limits the last snapshot was below (their hysteresis, [`select::gpu_below`]).
    gpu_below: Mutex<Below>,
    /// The audit trail (`[audit]`), when configured: every decision's record goes through it.
    pub audit: Option<Arc<crate::audit::Audit>>,
    /// `[tracing]`: every front door begins a request's trace with it (off: no-op traces).
    pub tracer: crate::trace::Tracer,
    /// `[features_model]`: scores requests' `features` beside the text (`None`: none configured).
    pub features_model: Option<Arc<crate::features_model::FeaturesModel>>,
    /// `[cache]`: the model tiers' verdicts for exact repeats (`None`: off).
    pub verdicts: Option<cache::VerdictCache>,
    /// `[campaign]`: campaign and entity velocity, when on.
    pub campaigns: Option<Arc<crate::campaign::Campaigns>>,
    /// Labels' peers and live quality (`crate::feedback`); with the audit trail only.
    pub feedback: Option<Arc<crate::feedback::Feedback>>,
    /// Paces the rules' answers for requests the saturated model tiers had no room for.
    pub overflow: overflow::OverflowPacer,
}

impl Gateway {
    /// The policy a route names (its directory), or the live one for `None`.
    pub fn policy_store(&self, dir: Option<&Path>) -> &PolicyStore {
        dir.and_then(|d| self.route_policies.get(d)).unwrap_or(&self.policies)
    }

    /// One consistent view of load for routing, as of `now`, with the hysteresis state of
    /// `policy`'s gpu limits.
    pub fn snapshot(&self, now: Instant, policy: &Policy) -> LoadSnapshot {
        let Readings { cpu_utilization, gpu_devices, gpu_stale } = self.readings.at(now);
        let memory = match &gpu_devices {
            Err(reason) => GpuMemory::NotPresent(reason.clone()),
            Ok(_) if gpu_stale => GpuMemory::Unknown,
            Ok(d) if d.is_empty() => GpuMemory::NotPresent("no CUDA device".into()),
            Ok(d) => GpuMemory::FreeMb(d.iter().map(|d| d.free_bytes >> 20).min().unwrap_or(0)),
        };
        let utilization =
            gpu_devices.as_ref().ok().and_then(|d| d.iter().filter_map(|d| d.utilization).reduce(f64::max));
        let cpu = CpuLoad {
            utilization: cpu_utilization,
            queue_depth: self.cpu.queue_depth(),
            in_flight: self.cpu.in_flight(),
            service_us: self.cpu.service_us(),
            queue_wait_us: self.cpu.queue_wait_us(),
        };
        let gpu = match &self.gpu {
            None => GpuLoad {
                unavailable: Some(match &memory {
                    GpuMemory::NotPresent(why) => format!("no gpu tier configured (gpu.backend = \"none\"); {why}"),
                    _ => "no gpu tier configured (gpu.backend = \"none\")".into(),
                }),
                memory,
                utilization,
                in_flight: 0,
                p95_us: None,
                queue_wait_us: None,
                ewma_us: None,
                circuit: CircuitState::Closed,
                kv_cache: KvCache::NotExposed,
                was_below: Below::default(),
                endpoints_available: None,
            },
            Some(g) => {
                let TierLoad { kv_cache, endpoints_available, queue_wait_us } = g.load();
                GpuLoad {
                    unavailable: None,
                    memory,
                    utilization,
                    in_flight: g.in_flight(),
                    p95_us: g.latency.p95_us(),
                    queue_wait_us,
                    ewma_us: g.latency.ewma_us(),
                    circuit: g.circuit(now),
                    kv_cache,
                    was_below: *self.gpu_below.lock().unwrap_or_else(|e| e.into_inner()),
                    endpoints_available,
                }
            }
        };
        // The limits' hysteresis: what this snapshot is below is the next one's `was_below`.
        *self.gpu_below.lock().unwrap_or_else(|e| e.into_inner()) = select::gpu_below(&gpu, &policy.gpu);
        let confirm = self.confirm.as_ref().is_some_and(|c| c.workers_alive() > 0);
        LoadSnapshot { cpu, gpu, tenant: TenantLoad::default(), confirm }
    }

    /// Decides one request. Errors only for admission: `RateLimited` (tenant over its rate)
    /// and `Shed` (both model tiers saturated under `when_saturated = "shed"`). With a shadow
    /// policy configured, a share of requests is also decided by the candidate, which never
    /// changes the answer (see [`Gateway::compare`]).
    pub async fn classify(&self, req: ClassifyRequest, request_id: String) -> Result<Decision, ApiError> {
        let (decision, _) = self.classify_and_shadow(&self.policies, req, request_id, false, None).await?;
        Ok(decision)
    }

    /// `POST /v1/classify`: [`Gateway::classify`], with the A/B arm chosen from the request's
    /// sticky key (its tenant, or the `[ab] key_header` among `headers`) when an A/B test runs;
    /// the outcome is counted for its arm and may roll the candidate back. Errors as
    /// [`Gateway::classify`].
    pub async fn classify_public(
        &self,
        req: ClassifyRequest,
        request_id: String,
        headers: &http::HeaderMap,
    ) -> Result<Decision, ApiError> {
        let Some(ab) = &self.ab else { return self.classify(req, request_id).await };
        let arm = ab.arm(&req, headers);
        let store = if arm == Arm::Candidate { &ab.policies } else { &self.policies };
        let result = self.classify_and_shadow(store, req, request_id, false, Some(arm)).await.map(|(mut d, _)| {
            d.arm = Some(arm);
            d
        });
        ab.record(arm, &result);
        result
    }

    /// [`Gateway::classify`] under the policy a proxy route names (`None`: the live policy).
    /// The shadow candidate shadows the live policy only.
    pub async fn classify_under(
        &self,
        policy: Option<&Path>,
        req: ClassifyRequest,
        request_id: String,
    ) -> Result<Decision, ApiError> {
        let (decision, _) = self.classify_and_shadow(self.policy_store(policy), req, request_id, false, None).await?;
        Ok(decision)
    }

    /// Decides one request with the live policy and, when a shadow policy is configured, with
    /// the candidate too (always, not by share); returns both. For `check-policy --against`.
    pub async fn compare(
        &self,
        req: ClassifyRequest,
        request_id: String,
    ) -> Result<(Decision, Option<Decision>), ApiError> {
        self.classify_and_shadow(&self.policies, req, request_id, true, None).await
    }

    async fn classify_and_shadow(
        &self,
        store: &PolicyStore,
        mut req: ClassifyRequest,
        request_id: String,
        always_shadow: bool,
        arm: Option<Arm>,
    ) -> Result<(Decision, Option<Decision>), ApiError> {
        let started = Instant::now();
        let policy = store.snapshot();
        let scenario = policy
            .scenario(req.scenario.as_deref())
            .map_err(|u| ApiError::UnknownScenario { name: u.name, known: u.known })?;
        if let Some(s) = scenario {
            req.deadline = s.deadline_for(req.deadline, req.deadline_requested);
        }
        // Bad features are the client's error: refused before they count against its rate.
        let features = self.score_features(&req)?;
        let trace = req.trace.clone();
        let span = trace.start("admission");
        let facts = policy.rules.read(&req.text);
        let (admitted, campaign) = tokio::join!(self.admit(&req), self.campaign(&facts.text, &req));
        trace.end(span, || admission_attributes(&admitted), admitted.as_ref().err().map(ToString::to_string));
        let identity = admitted?;
        let snapshot = self.tenant_snapshot(started, &policy, &identity);
        let recorded = Mutex::new(Recorded { features: features.clone(), ..Recorded::default() });
        let inputs =
            Inputs { policy: &policy, scenario, req: &req, snapshot: &snapshot, started, features: features.as_ref() };
        let assessed_at = std::time::SystemTime::now();
        let mut assessment = self.assess(&policy, facts, &req, &snapshot);
        assessment.campaign = campaign;
        let canonical_span = trace::Canonical {
            start: assessed_at,
            end: std::time::SystemTime::now(),
            complexity: assessment.complexity.score,
        };
        let tiers = Tiers::Live(LiveTiers {
            cpu: &self.cpu,
            gpu: self.gpu.as_ref(),
            confirm: self.confirm.as_ref().map(|c| c as &dyn crate::tier::ModelTier),
            metrics: &self.metrics,
            recorded: &recorded,
            trace: &trace,
            tenant: cascade::TenantGate { identity: &identity, quotas: &*self.quotas, metrics: &self.tenant_metrics },
            cache: self.cache_scope(&inputs, &assessment.facts.text, &identity, store, arm),
        });
        let canonical = Arc::clone(&assessment.facts.text);
        // Shares the cell: the guards, which run on every request, have detected it by the end.
        let lang = assessment.facts.lang.clone();
        let (decision, mut explain) = cascade::run(&inputs, assessment, &tiers).await?;
        self.overflow.pace(&decision.path, decision.overloaded, started + req.deadline).await;
        if let Some(e) = &mut explain {
            self.explain_models(e, &decision, &canonical, features.as_ref(), &policy).await;
        }
        let mut decision = self.finish(decision, request_id, &policy, explain, started);
        decision.scenario = scenario.map(|s| s.name.clone());
        decision.subject = Subject {
            text: Arc::clone(&req.text),
            tenant: req.tenant.clone(),
            lang: lang.get().code,
            trace_id: trace.trace_id(),
        };
        trace::decided(&trace, &decision, req.deadline, canonical_span);
        self.observe_drift(&decision, &policy, &req.text, &lang);
        let live_store = std::ptr::eq(store, &self.policies);
        let recorded = recorded.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = self.shadow_model.as_ref().filter(|m| live_store && m.sampled()) {
            m.score(canonical, shadow_model::Live::new(&recorded, &decision));
        }
        let shadow = match &self.shadow {
            Some(s) if live_store && (always_shadow || s.sampled()) => {
                s.decide(self, &req, &snapshot, &recorded, &decision).await
            }
            _ => None,
        };
        Ok((decision, shadow))
    }

    /// Feeds the drift monitor (when on) a finished decision, its risk score at the cpu model's
    /// own temperature: the drift reference was scored at it, and a policy's `[calibration]`
    /// moves the scores on purpose, not the traffic.
    fn observe_drift(&self, decision: &Decision, policy: &Policy, text: &str, lang: &crate::text::LanguageCell) {
        let Some(drift) = &self.drift else { return };
        let risk = match (decision.tier, policy.calibration.cpu_temperature) {
            (TierName::Cpu, Some(t)) => crate::calibrate::retemper(decision.risk_score, t, self.cpu.info().temperature),
            _ => decision.risk_score,
        };
        drift.observe(decision, risk, text, lang);
    }

    /// [`Gateway::snapshot`] with `identity`'s tenant load (a tenant at its gpu limit counted).
    fn tenant_snapshot(&self, now: Instant, policy: &Policy, identity: &Identity) -> LoadSnapshot {
        let mut snapshot = self.snapshot(now, policy);
        snapshot.tenant = tenant_load(identity);
        if let (None, Err(why)) =
            (&snapshot.gpu.unavailable, select::tenant_gpu_eligibility(&snapshot.tenant, policy.gpu.max_in_flight))
        {
            self.tenant_metrics.limited(&identity.state.label, why.limit_name());
        }
        snapshot
    }

    /// `explain`'s model parts: the cpu model's word attributions (when it gave the first
    /// verdict; at `policy`'s cpu temperature, as that verdict) and the features model's
    /// contributions.
    async fn explain_models(
        &self,
        e: &mut Explain,
        decision: &Decision,
        canonical: &Arc<str>,
        features: Option<&crate::features_model::Scored>,
        policy: &Policy,
    ) {
        if let Some(risk) = decision.path.first().filter(|s| s.tier == TierName::Cpu).and_then(|s| s.risk_score) {
            let at = policy.calibration.cpu_temperature_or(self.cpu.info().temperature);
            e.attributions = self.attributions(canonical, risk, at, std::time::Duration::from_secs(2)).await;
        }
        e.features_model = features.and_then(|scored| self.features_contributions(scored));
    }

    /// This request's key in the verdict cache, when there is one: everything a model verdict
    /// depends on ([`cache::key::Scope`]).
    fn cache_scope(
        &self,
        x: &Inputs<'_>,
        canonical: &str,
        identity: &Identity,
        store: &PolicyStore,
        arm: Option<Arm>,
    ) -> Option<cache::Cached<'_>> {
        let cache = self.verdicts.as_ref()?;
        Some(cache.scope(cache::key::Scope {
            text: canonical,
            features: &x.req.features,
            tenant: x.req.tenant.as_deref(),
            limit_key: &identity.state.label,
            scenario: x.scenario.map(|s| s.name.as_str()),
            route_policy: store.dir(),
            arm,
            policy_version: &x.policy.version,
            models: "",
        }))
    }

    /// Tenant admission: the request's limit key (its known tenant, or the one key every unknown
    /// tenant shares) against its class's GCRA rate in the quota store. Returns who it counts as.
    ///
    /// Errors: `RateLimited` (429, `Retry-After`, the limit named) over the rate, or when a
    /// shared store is out of reach under `on_outage = "closed"`.
    async fn admit(&self, req: &ClassifyRequest) -> Result<Identity, ApiError> {
        let identity = req.identity.clone().unwrap_or_else(|| self.tenants.unknown());
        let state = &identity.state;
        if let Some(quota) = state.class.rate {
            if let Err(denied) = self.quotas.check_rate(&state.key, quota).await {
                self.metrics.rate_limited.inc();
                self.tenant_metrics.limited(&state.label, denied.limit.as_str());
                let detail = match denied.limit {
                    Limit::Rate => format!(
                        "class `{}`: {} per second, burst {}{}",
                        state.class.name,
                        quota.per_second,
                        quota.burst,
                        if state.label == OTHER { ", shared by every unknown tenant" } else { "" }
                    ),
                    other => format!("the quota store refused: {}", other.as_str()),
                };
                return Err(ApiError::RateLimited {
                    tenant: state.label.clone(),
                    limit: denied.limit.as_str(),
                    detail,
                    retry_after_s: denied.retry_after.as_secs_f64().ceil().max(1.0) as u64,
                });
            }
        }
        self.tenant_metrics.requests.get_or_create(&TenantLabels { tenant: state.label.clone() }).inc();
        Ok(identity)
    }

    /// What the cascade reads of a request: its `facts` (the canonical text — look-alike letters
    /// folded, invisible characters out, entities decoded, defanged links restored — and its
    /// language, read before admission for the campaign lookup), then the complexity: cheap
    /// text statistics, tokens, signal hits from the policy, and the number of request features.
    ///
    /// Complexity only steers a request between the two model tiers, so tokens are counted with
    /// the real tokenizer (and the encoding kept for the cpu tier) only where a gpu tier exists
    /// or the caller asked to see the complexity (`explain`); otherwise they are the word count (a lower bound)
    /// and the cpu worker tokenises — off the async runtime, and never for a request that
    /// admission sends past the cpu tier.
    fn assess(&self, policy: &Policy, facts: TextFacts, req: &ClassifyRequest, snapshot: &LoadSnapshot) -> Assessment {
        let spec = &policy.complexity;
        let tokens = if snapshot.gpu.unavailable.is_none() || req.explain {
            self.cpu.tokens(&facts.text, spec.tokens_full)
        } else {
            Tokens::lower_bound(&facts.text, spec.tokens_full)
        };
        let mut stats = complexity::scan(&facts.text);
        stats.tokens = tokens.count;
        stats.signal_hits = facts.signals.values().sum::<i64>().max(0) as usize;
        stats.features = req.features.len();
        let complexity = complexity::assess(&stats, spec);
        Assessment { facts, stats, complexity, encoded: tokens.encoded, campaign: None }
    }

    /// The request's campaign velocity over its canonical `text` (`None`: `[campaign]` off).
    /// Run beside the quota check, so the text is read before admission: on the one multiplexed
    /// Redis connection the two requests share a round trip. A request the rate then refuses
    /// still counts toward its campaign: it was sent.
    async fn campaign(&self, text: &str, req: &ClassifyRequest) -> Option<crate::campaign::Velocity> {
        let campaigns = self.campaigns.as_ref()?;
        Some(campaigns.lookup(text, req.tenant.as_deref(), &req.features).await)
    }

    /// Stamps the request id, policy version, model and latency; counts the decision.
    fn finish(
        &self,
        mut d: Decision,
        request_id: String,
        policy: &Policy,
        explain: Option<Explain>,
        started: Instant,
    ) -> Decision {
        let elapsed = started.elapsed();
        d.request_id = request_id;
        d.policy_version = policy.version.clone();
        d.model = self.model_name(&d);
        d.explain = explain;
        d.latency_us = elapsed.as_micros() as u64;
        let m = &self.metrics;
        m.decision_latency.observe(elapsed.as_secs_f64());
        m.decisions.get_or_create(&DecisionLabels { tier: d.tier.as_str(), action: d.action.as_str() }).inc();
        for step in &d.path {
            m.steps.get_or_create(&StepLabels { tier: step.tier.as_str(), outcome: step.outcome.as_str() }).inc();
        }
        d
    }

    /// The model a decision names: the gpu model (or the model server that answered) when the
    /// gpu tier decided, else the cpu model (rules and guards decide beside it).
    pub(super) fn model_name(&self, d: &Decision) -> String {
        match (d.tier, self.gpu.as_ref().and_then(|g| g.model_info())) {
            (TierName::Gpu, Some(info)) => info.name.clone(),
            (TierName::Gpu, None) => {
                d.path.last().and_then(|s| s.endpoint.clone()).unwrap_or_else(|| "upstream".into())
            }
            (TierName::Features, _) if self.features_model.is_some() => {
                self.features_model.as_ref().map(|m| m.manifest.name.clone()).unwrap_or_default()
            }
            _ => self.cpu.info().name.clone(),
        }
    }

    /// The gpu backend's registered name, `none` without a gpu tier (for `/readyz`).
    pub fn gpu_backend(&self) -> &str {
        self.gpu.as_ref().map_or(crate::tier::config::NO_GPU, |g| g.name())
    }
}

/// The admission span's attributes: the tenant's label, and the limit that refused it.
fn admission_attributes(admitted: &Result<Identity, ApiError>) -> Vec<KeyValue> {
    match admitted {
        Ok(identity) => vec![KeyValue::new(crate::trace::attr::TENANT, identity.state.label.clone())],
        Err(e) => vec![KeyValue::new(crate::trace::attr::ERROR_TYPE, e.code())],
    }
}

/// What routing knows of `identity`'s tenant now: its gpu slots held, its class's share,
/// whether its daily gpu budget is known spent.
pub fn tenant_load(identity: &Identity) -> TenantLoad {
    let state = &identity.state;
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    TenantLoad {
        tenant: state.label.clone(),
        gpu_in_flight: state.gpu.in_flight(),
        gpu_share: state.class.gpu_share,
        gpu_budget_spent: state.class.gpu_daily_budget.filter(|_| state.budget_spent(now_s)),
    }
}

#[cfg(test)]
mod tests;
