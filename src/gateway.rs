//! The gateway: one request through admission, complexity rating, tier selection and the
//! confidence cascade (cpu -> gpu -> rules, in the order routing picks).
//!
//! A decision is always produced unless the policy says to shed: a tier that is unsure, out of
//! its domain, overloaded, failing, circuit-broken or out of time hands over to the next stage,
//! and the rules engine never fails. Every stage tried lands in `path` with its outcome and reason.

use crate::complexity::{self, Complexity, TextStats};
use crate::config::{Config, GpuBackend};
use crate::decision::{Decision, Explain, Label, Step, TierName};
use crate::error::{ApiError, TierError};
use crate::metrics::{Metrics, ReasonLabels, RuleLabels, StepLabels, TierLabels};
use crate::policy::{Policy, PolicyStore};
use crate::route::{self, CpuSignals, GpuMemory, GpuSignals, Next, SignalsSnapshot, Stage};
use crate::rules::{ModelView, RulesInput};
use crate::signals::cpu::{CpuSource, ProcStat};
use crate::signals::gpu::{CudaDriver, GpuSource};
use crate::signals::latency::LatencyTracker;
use crate::signals::{Readings, SignalsHub};
use crate::tier::breaker::CircuitState;
use crate::tier::gpu::{Backend, GpuTier};
use crate::tier::onnx::OnnxPool;
use crate::tier::ModelVerdict;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A validated classification request (see `ingress::extract`).
#[derive(Debug, Clone)]
pub struct ClassifyRequest {
    pub text: Arc<str>,
    pub features: serde_json::Map<String, serde_json::Value>,
    pub tenant: Option<String>,
    /// Time budget for the decision; past it model tiers are abandoned and rules decide.
    pub deadline: Duration,
    /// Add the complexity contributions, the signals snapshot and the routing reasons.
    pub explain: bool,
}

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
    pub cpu_latency: LatencyTracker,
    pub gpu: Option<GpuTier>,
    pub policies: PolicyStore,
    /// Policies that proxy routes name (`[routes.screen] policy`), by directory; watched and
    /// reloaded like the live one.
    pub route_policies: std::collections::BTreeMap<std::path::PathBuf, PolicyStore>,
    pub metrics: Metrics,
    pub signals: Arc<SignalsHub>,
    tenants: Option<DefaultKeyedRateLimiter<String>>,
    gpu_backend: GpuBackend,
    /// Keeps the policy directory watches (live and shadow) alive.
    watchers: std::sync::Mutex<Vec<crate::policy::watch::Watch>>,
    pub shadow: Option<Shadow>,
}

impl Gateway {
    /// Loads ONNX Runtime, the models and the policy, and starts the background samplers.
    /// Call inside a tokio runtime (blocking work at start-up is fine there).
    pub fn start(config: &Config, sources: Sources) -> anyhow::Result<Arc<Gateway>> {
        let policy = Policy::load_dir(&config.policies.dir)?;
        let mut route_policies = std::collections::BTreeMap::new();
        for dir in config.routes.iter().filter_map(|r| r.screen.as_ref()?.policy.clone()) {
            if dir != config.policies.dir && !route_policies.contains_key(&dir) {
                let loaded =
                    Policy::load_dir(&dir).map_err(|e| anyhow::anyhow!("route policy {}: {e}", dir.display()))?;
                route_policies.insert(dir, loaded);
            }
        }
        let env = crate::ort_lib::environment(config.model.onnxruntime.as_deref()).map_err(anyhow::Error::msg)?;
        let cpu = OnnxPool::start(env, &config.model, "tiergate-cpu")?;
        let gpu = GpuTier::start(env, &config.gpu)?;
        for p in std::iter::once(&policy).chain(route_policies.values()) {
            if config.gpu.backend == GpuBackend::Upstream && p.prompt.is_none() {
                anyhow::bail!(
                    "gpu.backend = \"upstream\" needs a [prompt] section in the policy ({})",
                    p.dir.display()
                );
            }
        }
        let tenants = NonZeroU32::new(config.admission.tenant_rps).map(|rps| {
            let burst = NonZeroU32::new(config.admission.tenant_burst).unwrap_or(rps);
            RateLimiter::keyed(Quota::per_second(rps).allow_burst(burst))
        });
        let signals = SignalsHub::new(&config.signals);
        signals.spawn_samplers(&config.signals, sources.cpu, sources.gpu);
        tracing::info!(policy_version = %policy.version, rules = policy.rules.rule_count(), gpu = ?config.gpu.backend, "gateway ready");
        let gateway = Arc::new(Gateway {
            cpu,
            cpu_latency: LatencyTracker::default(),
            gpu,
            policies: PolicyStore::new(policy),
            route_policies: route_policies.into_iter().map(|(dir, p)| (dir, PolicyStore::new(p))).collect(),
            metrics: Metrics::new(),
            signals,
            tenants,
            gpu_backend: config.gpu.backend,
            watchers: std::sync::Mutex::new(Vec::new()),
            shadow: Shadow::start(&config.shadow)?,
        });
        if config.policies.watch {
            let weak = Arc::downgrade(&gateway);
            let debounce = Duration::from_millis(config.policies.debounce_ms);
            let poll = Duration::from_secs(1);
            let watcher = crate::policy::watch::watch(&config.policies.dir, debounce, poll, move || {
                if let Some(g) = weak.upgrade() {
                    let _ = g.reload_policy("file");
                }
            })?;
            gateway.watchers.lock().unwrap_or_else(|e| e.into_inner()).push(watcher);
            for dir in gateway.route_policies.keys() {
                let weak = Arc::downgrade(&gateway);
                let owned = dir.clone();
                let watcher = crate::policy::watch::watch(dir, debounce, poll, move || {
                    if let Some(g) = weak.upgrade() {
                        g.reload_route_policy(&owned, "file");
                    }
                })?;
                gateway.watchers.lock().unwrap_or_else(|e| e.into_inner()).push(watcher);
            }
            if let Some(shadow) = &gateway.shadow {
                let weak = Arc::downgrade(&gateway);
                let watcher = crate::policy::watch::watch(shadow.policies.dir(), debounce, poll, move || {
                    if let Some(g) = weak.upgrade() {
                        g.reload_shadow();
                    }
                })?;
                gateway.watchers.lock().unwrap_or_else(|e| e.into_inner()).push(watcher);
            }
        }
        tokio::spawn(housekeeping(
            Arc::downgrade(&gateway),
            Duration::from_millis(config.signals.cpu_interval_ms.max(10)),
        ));
        Ok(gateway)
    }

    /// Reloads the shadow candidate's directory, if there is one; logs the result.
    fn reload_shadow(&self) {
        if let Some(s) = &self.shadow {
            match s.policies.reload() {
                Ok(Some(version)) => tracing::info!(%version, "shadow policy reloaded"),
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "shadow policy refused; the last good one stays"),
            }
        }
    }

    /// An operator's reload (`trigger`: `sighup`, `admin`): the shadow candidate, then the live
    /// policy, whose result is returned.
    pub fn reload_all(&self, trigger: &'static str) -> Result<Option<String>, crate::policy::PolicyError> {
        self.reload_shadow();
        for dir in self.route_policies.keys() {
            self.reload_route_policy(dir, trigger);
        }
        self.reload_policy(trigger)
    }

    /// Reloads one route's policy directory; logs and counts the result like the live policy's.
    fn reload_route_policy(&self, dir: &std::path::Path, trigger: &'static str) {
        let Some(store) = self.route_policies.get(dir) else { return };
        let outcome = match store.reload() {
            Ok(Some(version)) => {
                tracing::info!(trigger, dir = %dir.display(), %version, "route policy reloaded");
                "ok"
            }
            Ok(None) => "unchanged",
            Err(e) => {
                tracing::error!(trigger, dir = %dir.display(), error = %e, "route policy refused; the last good one keeps serving");
                "refused"
            }
        };
        self.metrics.policy_reloads.get_or_create(&crate::metrics::ReloadLabels { trigger, result: outcome }).inc();
    }

    /// The policy a route names (its directory), or the live one for `None`.
    pub fn policy_store(&self, dir: Option<&std::path::Path>) -> &PolicyStore {
        dir.and_then(|d| self.route_policies.get(d)).unwrap_or(&self.policies)
    }

    /// Reloads the live policy directory (`trigger`: `file`, `sighup`, `admin`), logs and counts
    /// the result. A refused policy changes nothing but the error report.
    pub fn reload_policy(&self, trigger: &'static str) -> Result<Option<String>, crate::policy::PolicyError> {
        let result = self.policies.reload();
        let outcome = match &result {
            Ok(Some(version)) => {
                tracing::info!(trigger, %version, "policy reloaded");
                "ok"
            }
            Ok(None) => "unchanged",
            Err(e) => {
                tracing::error!(trigger, error = %e, "policy refused; the last good policy keeps serving");
                "refused"
            }
        };
        self.metrics.policy_reloads.get_or_create(&crate::metrics::ReloadLabels { trigger, result: outcome }).inc();
        result
    }

    /// One consistent view of load for routing, as of `now`.
    pub fn snapshot(&self, now: Instant) -> SignalsSnapshot {
        let Readings { cpu_utilization, gpu_devices, gpu_stale } = self.signals.readings(now);
        let memory = match &gpu_devices {
            Err(reason) => GpuMemory::NotPresent(reason.clone()),
            Ok(_) if gpu_stale => GpuMemory::Unknown,
            Ok(d) if d.is_empty() => GpuMemory::NotPresent("no CUDA device".into()),
            Ok(d) => GpuMemory::FreeMb(d.iter().map(|d| d.free_bytes >> 20).min().unwrap_or(0)),
        };
        let utilization =
            gpu_devices.as_ref().ok().and_then(|d| d.iter().filter_map(|d| d.utilization).reduce(f64::max));
        let cpu = CpuSignals {
            utilization: cpu_utilization,
            queue_depth: self.cpu.queue_depth(),
            in_flight: self.cpu.in_flight(),
            p95_us: self.cpu_latency.p95_us(),
        };
        let gpu = match &self.gpu {
            None => GpuSignals {
                unavailable: Some(match &memory {
                    GpuMemory::NotPresent(why) => format!("no gpu tier configured (gpu.backend = \"none\"); {why}"),
                    _ => "no gpu tier configured (gpu.backend = \"none\")".into(),
                }),
                memory,
                utilization,
                in_flight: 0,
                p95_us: None,
                ewma_us: None,
                circuit: CircuitState::Closed,
                kv_cache_headroom: None,
                endpoints_available: None,
            },
            Some(g) => {
                let (kv_cache_headroom, endpoints_available) = match g.backend() {
                    Backend::Upstream(pool) => (pool.kv_cache_headroom(), Some(pool.available())),
                    Backend::Onnx(_) => (None, None),
                };
                GpuSignals {
                    unavailable: None,
                    memory,
                    utilization,
                    in_flight: g.in_flight(),
                    p95_us: g.latency.p95_us(),
                    ewma_us: g.latency.ewma_us(),
                    circuit: g.circuit(now),
                    kv_cache_headroom,
                    endpoints_available,
                }
            }
        };
        SignalsSnapshot { cpu, gpu }
    }

    /// Decides one request. Errors only for admission: `RateLimited` (tenant over its rate)
    /// and `Shed` (both model tiers saturated under `when_saturated = "shed"`). With a shadow
    /// policy configured, a share of requests is also decided by the candidate, which never
    /// changes the answer (see [`Gateway::compare`]).
    pub async fn classify(&self, req: ClassifyRequest, request_id: String) -> Result<Decision, ApiError> {
        let (decision, _) = self.classify_and_shadow(&self.policies, req, request_id, false).await?;
        Ok(decision)
    }

    /// [`Gateway::classify`] under the policy a proxy route names (`None`: the live policy).
    /// The shadow candidate shadows the live policy only.
    pub async fn classify_under(
        &self,
        policy: Option<&std::path::Path>,
        req: ClassifyRequest,
        request_id: String,
    ) -> Result<Decision, ApiError> {
        let (decision, _) = self.classify_and_shadow(self.policy_store(policy), req, request_id, false).await?;
        Ok(decision)
    }

    /// Decides one request with the live policy and, when a shadow policy is configured, with
    /// the candidate too (always, not by share); returns both. For `check-policy --against`.
    pub async fn compare(
        &self,
        req: ClassifyRequest,
        request_id: String,
    ) -> Result<(Decision, Option<Decision>), ApiError> {
        self.classify_and_shadow(&self.policies, req, request_id, true).await
    }

    async fn classify_and_shadow(
        &self,
        store: &PolicyStore,
        req: ClassifyRequest,
        request_id: String,
        always_shadow: bool,
    ) -> Result<(Decision, Option<Decision>), ApiError> {
        let started = Instant::now();
        let policy = store.snapshot();
        let shadowed = std::ptr::eq(store, &self.policies);
        if let Some(limiter) = &self.tenants {
            let key = req.tenant.clone().unwrap_or_default();
            if let Err(not_until) = limiter.check_key(&key) {
                self.metrics.rate_limited.inc();
                let wait =
                    not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
                return Err(ApiError::RateLimited {
                    tenant: key,
                    retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
                });
            }
        }
        let snapshot = self.snapshot(started);
        let recorded = std::sync::Mutex::new(Recorded::default());
        let (decision, explain) = self.decide(&policy, &req, &snapshot, started, &Tiers::Live(&recorded)).await?;
        let decision = self.finish(decision, request_id, &policy, explain, started);
        let shadow = match &self.shadow {
            Some(s) if shadowed && (always_shadow || fastrand::f64() < s.share) => {
                let recorded = recorded.into_inner().unwrap_or_else(|e| e.into_inner());
                self.shadow(s, &req, &snapshot, &recorded, &decision).await
            }
            _ => None,
        };
        Ok((decision, shadow))
    }

    /// The candidate policy's decision on the same request, from the tier verdicts the live
    /// run obtained (a tier the live run did not call counts as unavailable: shadowing never
    /// calls a model). Disagreements are counted by kind and logged with both decisions.
    async fn shadow(
        &self,
        s: &Shadow,
        req: &ClassifyRequest,
        snapshot: &SignalsSnapshot,
        recorded: &Recorded,
        live: &Decision,
    ) -> Option<Decision> {
        let policy = s.policies.snapshot();
        let started = Instant::now();
        let (candidate, _) = self.decide(&policy, req, snapshot, started, &Tiers::Replay(recorded)).await.ok()?;
        let mut candidate = candidate;
        candidate.request_id = live.request_id.clone();
        candidate.policy_version = policy.version.clone();
        self.metrics.shadow_evaluations.inc();
        let kinds: Vec<&'static str> = [
            ("label", live.label != candidate.label),
            ("action", live.action != candidate.action),
            ("tier", live.tier != candidate.tier),
        ]
        .into_iter()
        .filter_map(|(kind, differs)| differs.then_some(kind))
        .collect();
        for kind in &kinds {
            self.metrics.shadow_disagreements.get_or_create(&crate::metrics::KindLabels { kind }).inc();
        }
        if !kinds.is_empty() {
            if let Some(log) = &s.log {
                let line = serde_json::json!({
                    "request_id": live.request_id,
                    "disagree": kinds,
                    "live": {"policy_version": live.policy_version, "label": live.label, "action": live.action,
                             "tier": live.tier, "rule": live.rule, "risk_score": live.risk_score},
                    "candidate": {"policy_version": candidate.policy_version, "label": candidate.label, "action": candidate.action,
                                  "tier": candidate.tier, "rule": candidate.rule, "risk_score": candidate.risk_score,
                                  "path": candidate.path},
                });
                let _ = log.send(line.to_string());
            }
        }
        Some(candidate)
    }

    /// The cascade under `policy`: rate, pick a tier, run tiers (live, or replayed for a shadow
    /// policy), escalate or fall back, decide. Metrics are recorded for live runs only.
    async fn decide(
        &self,
        policy: &Policy,
        req: &ClassifyRequest,
        snapshot: &SignalsSnapshot,
        started: Instant,
        tiers: &Tiers<'_>,
    ) -> Result<(Decision, Option<Explain>), ApiError> {
        let live = matches!(tiers, Tiers::Live(_));
        let deadline = started + req.deadline;
        let signal_counts = policy.rules.count_signals(&req.text);
        let (stats, mut complexity) = self.rate(policy, req, &signal_counts);
        let start = route::start(&complexity, policy, snapshot, req.deadline);
        let mut run = Run {
            path: Vec::with_capacity(4),
            model: None,
            escalated: None,
            cpu_tried: false,
            gpu_tried: false,
            metrics: live.then_some(&self.metrics),
        };
        let mut stage = start.stage;
        let decision = loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            stage = match stage {
                Stage::Shed => {
                    if live {
                        self.metrics.shed.inc();
                    }
                    return Err(ApiError::Shed {
                        reason: start.reason.clone(),
                        retry_after_s: policy.routing.retry_after_s,
                    });
                }
                Stage::Cpu => {
                    run.cpu_tried = true;
                    let t = Instant::now();
                    let result = tiers.cpu(self, &req.text, deadline).await;
                    let us = t.elapsed().as_micros() as u64;
                    if live {
                        self.observe(TierName::Cpu, us);
                        // Routing's p95 is the tier's service time: the wait in its queue is
                        // gated by `max_queue_depth` and the deadline, and counting it here too
                        // would keep an idle tier "slow" after a burst.
                        if let Ok(v) = &result {
                            self.cpu_latency.record(v.infer_us);
                        }
                    }
                    let v = match result {
                        Ok(v) => v,
                        Err(e) => {
                            let gpu = || route::gpu_eligibility(policy, snapshot, remaining);
                            stage = run.tier_failed(TierName::Cpu, e, us, gpu);
                            continue;
                        }
                    };
                    if let Some(ood) = v.ood_score {
                        complexity = complexity.with_ood(&policy.complexity, ood);
                    }
                    let gpu = match run.gpu_tried {
                        true => Err("already tried".to_string()),
                        false => route::gpu_eligibility(policy, snapshot, remaining),
                    };
                    let next = route::after_cpu(&v, &complexity, policy, &gpu);
                    match run.model_step(TierName::Cpu, &v, us, next) {
                        None => break run.decide(TierName::Cpu, &v, policy),
                        Some(Stage::Rules) if !run.gpu_tried => {
                            run.skip_gpu(gpu.err());
                            Stage::Rules
                        }
                        Some(next) => next,
                    }
                }
                Stage::Gpu => {
                    run.gpu_tried = true;
                    let t = Instant::now();
                    let result = tiers.gpu(self, policy, &req.text, deadline).await;
                    let us = t.elapsed().as_micros() as u64;
                    if live {
                        self.observe(TierName::Gpu, us);
                    }
                    match (result, run.escalated.take()) {
                        (Ok(v), _) => match run.model_step(TierName::Gpu, &v, us, route::after_gpu(&v, policy)) {
                            None => break run.decide(TierName::Gpu, &v, policy),
                            Some(next) => next,
                        },
                        // An escalation failed: the cpu verdict stands if it would have stood
                        // without a gpu tier, else rules decide.
                        (Err(e), Some(v)) => {
                            run.failed(TierName::Gpu, &e, us);
                            let gpu = Err(format!("gpu tier {}", e.outcome()));
                            match route::after_cpu(&v, &complexity, policy, &gpu) {
                                Next::Accept { note } => {
                                    let mut step = Step::new(TierName::Cpu, "accepted", 0);
                                    step.confidence = Some(v.confidence);
                                    step.risk_score = Some(v.risk_score);
                                    step.reason = note;
                                    run.path.push(step);
                                    break run.decide(TierName::Cpu, &v, policy);
                                }
                                _ => Stage::Rules,
                            }
                        }
                        (Err(e), None) => {
                            let cpu = || route::cpu_eligibility(policy, snapshot, remaining);
                            run.tier_failed(TierName::Gpu, e, us, cpu)
                        }
                    }
                }
                Stage::Rules => {
                    if run.path.is_empty() {
                        // Neither model tier was tried: say why.
                        run.path.push(Step::new(TierName::Cpu, "skipped", 0).reason(start.reason.clone()));
                    }
                    break self.rules(policy, req, &signal_counts, run);
                }
            };
        };
        let explain = req.explain.then(|| Explain { complexity, stats, signals: snapshot.clone(), start });
        Ok((decision, explain))
    }

    /// Complexity of a request: cheap text statistics, tokens from the real tokenizer, signal
    /// hits from the policy, and the number of request features.
    fn rate(
        &self,
        policy: &Policy,
        req: &ClassifyRequest,
        signal_counts: &std::collections::BTreeMap<String, i64>,
    ) -> (TextStats, Complexity) {
        let spec = &policy.complexity;
        let mut stats = complexity::scan(&req.text);
        stats.tokens = self.cpu.count_tokens(&req.text, spec.tokens_full);
        stats.signal_hits = signal_counts.values().sum::<i64>().max(0) as usize;
        stats.features = req.features.len();
        let c = complexity::rate(&stats, spec);
        (stats, c)
    }

    fn rules(
        &self,
        policy: &Policy,
        req: &ClassifyRequest,
        signals: &std::collections::BTreeMap<String, i64>,
        mut run: Run<'_>,
    ) -> Decision {
        let t = Instant::now();
        let verdict = policy.rules.evaluate(&RulesInput {
            text: &req.text,
            signals,
            features: &req.features,
            tenant: req.tenant.as_deref(),
            model: run.model,
        });
        let us = t.elapsed().as_micros() as u64;
        if let Some(m) = run.metrics {
            for (rule, error) in &verdict.errors {
                m.rule_errors.get_or_create(&RuleLabels { rule: rule.clone() }).inc();
                tracing::warn!(%rule, %error, "rule evaluation failed; counted as no match");
            }
            self.observe(TierName::Rules, us);
        }
        let mut step = Step::new(TierName::Rules, if verdict.rule.is_some() { "matched" } else { "default" }, us);
        step.risk_score = Some(verdict.risk_score);
        step.rule = verdict.rule.clone();
        if verdict.rule.is_none() {
            step.reason = Some("no rule matched; policy default applies".into());
        }
        run.path.push(step);
        Decision {
            request_id: String::new(),
            label: Label::from_risk_score(verdict.risk_score),
            risk_score: verdict.risk_score,
            confidence: None,
            action: verdict.action,
            tier: TierName::Rules,
            rule: verdict.rule,
            signals: Some(verdict.signals),
            path: run.path,
            policy_version: String::new(),
            model: String::new(),
            latency_us: 0,
            explain: None,
        }
    }

    /// Time spent in a stage, as the request saw it (queue included), into the histogram. The
    /// routing latencies are recorded by the cpu stage (service time) and the gpu tier itself.
    fn observe(&self, tier: TierName, us: u64) {
        self.metrics.tier_latency.get_or_create(&TierLabels { tier: tier.as_str() }).observe(us as f64 / 1e6);
    }

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
        d.model = match (d.tier, self.gpu.as_ref().and_then(|g| g.model_info())) {
            (TierName::Gpu, Some(info)) => info.name.clone(),
            (TierName::Gpu, None) => {
                d.path.last().and_then(|s| s.endpoint.clone()).unwrap_or_else(|| "upstream".into())
            }
            _ => self.cpu.info().name.clone(),
        };
        d.explain = explain;
        d.latency_us = elapsed.as_micros() as u64;
        let m = &self.metrics;
        m.decision_latency.observe(elapsed.as_secs_f64());
        m.decisions
            .get_or_create(&crate::metrics::DecisionLabels { tier: d.tier.as_str(), action: d.action.as_str() })
            .inc();
        for step in &d.path {
            m.steps.get_or_create(&StepLabels { tier: step.tier.as_str(), outcome: step.outcome }).inc();
        }
        d
    }

    /// The configured gpu backend (for `/readyz`).
    pub fn gpu_backend(&self) -> GpuBackend {
        self.gpu_backend
    }
}

/// The tier verdicts a live run obtained, for replaying under a shadow policy.
#[derive(Debug, Default)]
struct Recorded {
    cpu: Option<Result<ModelVerdict, TierError>>,
    gpu: Option<Result<ModelVerdict, TierError>>,
}

/// Where a cascade's tier verdicts come from.
enum Tiers<'a> {
    /// Call the tiers, and record what they answer.
    Live(&'a std::sync::Mutex<Recorded>),
    /// Replay what the live run obtained; a tier it did not call is unavailable.
    Replay(&'a Recorded),
}

const NOT_RUN: &str = "not called by the live policy (shadow evaluation never calls a model)";

impl Tiers<'_> {
    async fn cpu(&self, g: &Gateway, text: &Arc<str>, deadline: Instant) -> Result<ModelVerdict, TierError> {
        match self {
            Tiers::Live(rec) => {
                let r = g.cpu.classify(Arc::clone(text), deadline).await;
                rec.lock().unwrap_or_else(|e| e.into_inner()).cpu = Some(r.clone());
                r
            }
            Tiers::Replay(rec) => rec.cpu.clone().unwrap_or_else(|| Err(TierError::Unavailable(NOT_RUN.into()))),
        }
    }

    async fn gpu(
        &self,
        g: &Gateway,
        policy: &Policy,
        text: &Arc<str>,
        deadline: Instant,
    ) -> Result<ModelVerdict, TierError> {
        match self {
            Tiers::Live(rec) => {
                let gpu = g.gpu.as_ref().expect("routing picks the gpu tier only when it exists");
                let r = gpu.classify(policy.prompt.as_ref(), Arc::clone(text), deadline).await;
                rec.lock().unwrap_or_else(|e| e.into_inner()).gpu = Some(r.clone());
                r
            }
            Tiers::Replay(rec) => rec.gpu.clone().unwrap_or_else(|| Err(TierError::Unavailable(NOT_RUN.into()))),
        }
    }
}

/// A candidate policy evaluated beside the live one (`[shadow]` in config).
pub struct Shadow {
    pub policies: PolicyStore,
    /// Share of requests evaluated, [0, 1].
    pub share: f64,
    /// Disagreements go to this writer task as JSON lines.
    log: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

/// The cascade's state for one request.
struct Run<'a> {
    /// Where to count escalations and fallbacks: live runs only.
    metrics: Option<&'a Metrics>,
    path: Vec<Step>,
    /// The last unsure model verdict, for the rules to see.
    model: Option<ModelView>,
    /// The cpu verdict an escalation to the gpu tier started from.
    escalated: Option<ModelVerdict>,
    cpu_tried: bool,
    gpu_tried: bool,
}

impl Run<'_> {
    fn count(
        &self,
        family: fn(
            &Metrics,
        ) -> &prometheus_client::metrics::family::Family<
            ReasonLabels,
            prometheus_client::metrics::counter::Counter,
        >,
        reason: &'static str,
    ) {
        if let Some(m) = self.metrics {
            family(m).get_or_create(&ReasonLabels { reason }).inc();
        }
    }

    /// Records a model tier's step; `None` when its verdict stands, else the next stage.
    fn model_step(&mut self, tier: TierName, v: &ModelVerdict, us: u64, next: Next) -> Option<Stage> {
        let mut step = Step::new(tier, "accepted", us);
        step.confidence = Some(v.confidence);
        step.risk_score = Some(v.risk_score);
        step.ood_score = v.ood_score;
        step.endpoint = v.endpoint.clone();
        let next = match next {
            Next::Accept { note } => {
                step.reason = note;
                None
            }
            Next::Escalate { outcome, reason } => {
                self.count(|m| &m.escalations, outcome);
                step.outcome = outcome;
                step.reason = Some(format!("{reason}; escalating to gpu"));
                self.escalated = Some(v.clone());
                Some(Stage::Gpu)
            }
            Next::Rules { outcome, reason } => {
                self.count(|m| &m.fallbacks, outcome);
                step.outcome = outcome;
                step.reason = Some(reason);
                Some(Stage::Rules)
            }
        };
        if next.is_some() {
            self.model = Some(ModelView { risk_score: v.risk_score, confidence: v.confidence, ood_score: v.ood_score });
        }
        self.path.push(step);
        next
    }

    /// Records a tier's failure.
    fn failed(&mut self, tier: TierName, e: &TierError, us: u64) {
        self.count(|m| &m.fallbacks, e.outcome());
        self.path.push(Step::new(tier, e.outcome(), us).reason(e.to_string()));
    }

    /// A tier failed: the other model tier if it was not tried and is eligible, else rules.
    fn tier_failed(
        &mut self,
        tier: TierName,
        e: TierError,
        us: u64,
        other: impl FnOnce() -> Result<(), String>,
    ) -> Stage {
        self.failed(tier, &e, us);
        let (other_tried, other_stage, other_name) = match tier {
            TierName::Cpu => (self.gpu_tried, Stage::Gpu, TierName::Gpu),
            _ => (self.cpu_tried, Stage::Cpu, TierName::Cpu),
        };
        if other_tried {
            return Stage::Rules;
        }
        match other() {
            Ok(()) => other_stage,
            Err(why) => {
                self.path.push(Step::new(other_name, "skipped", 0).reason(why));
                Stage::Rules
            }
        }
    }

    fn skip_gpu(&mut self, why: Option<String>) {
        if let Some(why) = why {
            self.path.push(Step::new(TierName::Gpu, "skipped", 0).reason(format!("unavailable: {why}")));
        }
    }

    fn decide(self, tier: TierName, v: &ModelVerdict, policy: &Policy) -> Decision {
        Decision {
            request_id: String::new(),
            label: Label::from_risk_score(v.risk_score),
            risk_score: v.risk_score,
            confidence: Some(v.confidence),
            action: policy.actions.action_for(v.risk_score),
            tier,
            rule: None,
            signals: None,
            path: self.path,
            policy_version: String::new(),
            model: String::new(),
            latency_us: 0,
            explain: None,
        }
    }
}

impl Shadow {
    /// Loads the candidate policy, watches its directory, starts the disagreement log writer.
    fn start(config: &crate::config::ShadowConfig) -> anyhow::Result<Option<Shadow>> {
        let Some(dir) = &config.dir else { return Ok(None) };
        let policy = Policy::load_dir(dir).map_err(|e| anyhow::anyhow!("shadow policy: {e}"))?;
        tracing::info!(version = %policy.version, share = config.share, "shadow policy loaded");
        let policies = PolicyStore::new(policy);
        let log = config.log.as_ref().map(|path| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
            let path = path.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut file = match tokio::fs::OpenOptions::new().create(true).append(true).open(&path).await {
                    Ok(f) => f,
                    Err(e) => return tracing::error!(path = %path.display(), error = %e, "cannot open the shadow log"),
                };
                while let Some(line) = rx.recv().await {
                    if let Err(e) = file.write_all(format!("{line}\n").as_bytes()).await {
                        tracing::error!(error = %e, "writing the shadow log");
                    }
                }
            });
            tx
        });
        Ok(Some(Shadow { policies, share: config.share, log }))
    }
}

/// Periodic upkeep off the request path: p95 refresh, rate-limiter memory.
async fn housekeeping(gateway: std::sync::Weak<Gateway>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(g) = gateway.upgrade() else { return };
        g.cpu_latency.refresh();
        if let Some(gpu) = &g.gpu {
            gpu.latency.refresh();
        }
        if let Some(t) = &g.tenants {
            t.retain_recent();
        }
    }
}
