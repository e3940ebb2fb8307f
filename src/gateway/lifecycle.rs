//! The gateway's life: start (models, policies, samplers), policy reloads (file watches,
//! SIGHUP, admin), and periodic housekeeping off the request path.

use super::shadow::{Log, Shadow};
use super::shadow_model::ShadowModel;
use super::{Gateway, GatewayConfig, Sources};
use crate::metrics::{Metrics, ReloadLabels};
use crate::policy::{Policy, PolicyError, PolicyStore};
use crate::readings::ReadingsHub;
use crate::tenant::metrics::TenantMetrics;
use crate::tenant::Tenants;
use crate::tier::gpu::GpuTier;
use crate::tier::onnx::OnnxPool;
use ort::environment::Environment;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// `[campaign]`'s tracker (`None`: off), sharing through the quota store's Redis `link` (and its
/// key prefix) when there is one; its metrics registered either way.
fn campaigns(
    config: &GatewayConfig<'_>,
    link: Option<(Arc<crate::tenant::shared::Link>, String)>,
    metrics: &mut Metrics,
) -> anyhow::Result<Option<Arc<crate::campaign::Campaigns>>> {
    let registered = crate::campaign::metrics::CampaignMetrics::register(metrics.registry_mut(), config.campaign.top_k);
    let campaigns = crate::campaign::Campaigns::new(config.campaign, link, registered).map_err(anyhow::Error::msg)?;
    Ok(campaigns.map(Arc::new))
}

/// Labels and live quality over the audit store (`None` without `[audit]`); its metrics
/// registered either way.
fn feedback(
    config: &GatewayConfig<'_>,
    tenants: &Arc<Tenants>,
    metrics: &mut Metrics,
) -> anyhow::Result<Option<Arc<crate::feedback::Feedback>>> {
    let registered = crate::feedback::quality::QualityMetrics::register(metrics.registry_mut());
    let Some(audit) = config.audit else { return Ok(None) };
    let db = audit.dir.join(crate::audit::store::DB_FILE);
    let token = config.admin_token.map(str::to_string);
    let started = crate::feedback::Feedback::start(config.feedback, db, Arc::clone(tenants), registered, token)?;
    Ok(Some(Arc::new(started)))
}

/// The confirm model's pool (`[confirm]`; `None` without one).
fn confirm_pool(env: &'static Environment, config: &GatewayConfig<'_>) -> anyhow::Result<Option<OnnxPool>> {
    let start = |c| OnnxPool::start(env, c, "tiergate-confirm").map_err(|e| anyhow::anyhow!("confirm model: {e:#}"));
    config.confirm.map(start).transpose()
}

/// The candidate model scored beside the cpu tier (`[shadow.model]`; `None` without one).
fn shadow_model(
    env: &'static Environment,
    config: &GatewayConfig<'_>,
    log: Option<Log>,
    metrics: &mut Metrics,
) -> anyhow::Result<Option<ShadowModel>> {
    let share = config.shadow.share;
    config.shadow.model.as_ref().map(|m| ShadowModel::start(env, m, share, log, metrics.registry_mut())).transpose()
}

impl Gateway {
    /// Loads ONNX Runtime, the models and the policies, and starts the background samplers,
    /// the policy watches and housekeeping. Call inside a tokio runtime (blocking work at
    /// start-up is fine there).
    pub fn start(config: &GatewayConfig<'_>, sources: Sources) -> anyhow::Result<Arc<Gateway>> {
        let policy = Policy::load_dir_within(&config.policies.dir, &config.limits)?;
        let mut route_policies = BTreeMap::new();
        for dir in config.route_policies.iter().filter(|d| **d != config.policies.dir) {
            if !route_policies.contains_key(dir) {
                let loaded = Policy::load_dir_within(dir, &config.limits)
                    .map_err(|e| anyhow::anyhow!("route policy {}: {e}", dir.display()))?;
                route_policies.insert(dir.clone(), loaded);
            }
        }
        let env = crate::ort_lib::environment(config.model.onnxruntime.as_deref()).map_err(anyhow::Error::msg)?;
        let cpu = OnnxPool::start(env, config.model, "tiergate-cpu")?;
        let confirm = confirm_pool(env, config)?;
        let gpu = GpuTier::start(env, config.gpu)?;
        check_prompts(gpu.as_ref(), std::iter::once(&policy).chain(route_policies.values()))?;
        let shared_quotas = config.tenants.redis.clone();
        let tenants = Arc::new(Tenants::new(config.tenants, config.admission.quota()));
        let readings = ReadingsHub::new(config.readings);
        readings.spawn_samplers(config.readings, sources.cpu, sources.gpu);
        let mut metrics = Metrics::new();
        let kafka_metrics = crate::audit::kafka::KafkaMetrics::register(metrics.registry_mut());
        let tenant_metrics = TenantMetrics::register(metrics.registry_mut());
        let tracer =
            crate::trace::Tracer::start(config.tracing, crate::trace::TraceMetrics::register(metrics.registry_mut()))?;
        // Rate and budget state: in Redis when [tenants.redis] is set, else in this process.
        let (quotas, redis) = crate::tenant::shared::quota_store(shared_quotas.as_ref(), metrics.registry_mut())
            .map_err(anyhow::Error::msg)?;
        let campaigns =
            campaigns(config, redis.zip(shared_quotas.as_ref().map(|r| r.key_prefix.clone())), &mut metrics)?;
        let ab = super::ab::Ab::start(config.ab, config.limits, metrics.registry_mut())?;
        let feedback = feedback(config, &tenants, &mut metrics)?;
        let audit =
            config.audit.map(|c| crate::audit::Audit::open(c, &metrics, kafka_metrics).map(Arc::new)).transpose()?;
        let shadow_log =
            config.shadow.log.as_deref().map(|p| Log::open(p, metrics.shadow_log_dropped.clone())).transpose()?;
        let shadow_model = shadow_model(env, config, shadow_log.clone(), &mut metrics)?;
        let features_model = load_features_model(config.features_model, env)?;
        let drift =
            crate::drift::Monitor::start(config.drift, &config.model.dir, &cpu.info().manifest_sha256, &metrics)?;
        let verdicts = super::cache::VerdictCache::start(config.cache, &cpu, gpu.as_ref(), metrics.registry_mut());
        let overflow = super::overflow::OverflowPacer::new(config.admission.overflow(), metrics.registry_mut());
        tracing::info!(policy_version = %policy.version, rules = policy.rules.rule_count(), gpu = %config.gpu.backend, "gateway ready");
        let gateway = Arc::new(Gateway {
            cpu,
            confirm,
            gpu,
            policies: PolicyStore::within(policy, config.limits),
            route_policies: route_policies
                .into_iter()
                .map(|(dir, p)| (dir, PolicyStore::within(p, config.limits)))
                .collect(),
            metrics,
            readings,
            tenants,
            quotas,
            tenant_metrics,
            watchers: Mutex::new(Vec::new()),
            shadow: Shadow::start(config.shadow, config.limits, shadow_log)?,
            shadow_model,
            ab,
            gpu_below: Mutex::new(Default::default()),
            audit,
            drift,
            tracer,
            features_model,
            verdicts,
            campaigns,
            feedback,
            overflow,
        });
        if config.policies.watch {
            gateway.watch(Duration::from_millis(config.policies.debounce_ms))?;
        }
        let every = Duration::from_millis(config.readings.cpu_interval_ms.max(10));
        tokio::spawn(housekeeping(Arc::downgrade(&gateway), every));
        Ok(gateway)
    }

    /// Watches the live, route, shadow and A/B candidate policy directories; a change reloads
    /// that policy.
    fn watch(self: &Arc<Self>, debounce: Duration) -> anyhow::Result<()> {
        let poll = Duration::from_secs(1);
        let mut dirs: Vec<(PathBuf, Box<dyn Fn(&Gateway) + Send + Sync>)> =
            vec![(self.policies.dir().to_path_buf(), Box::new(|g| drop(g.reload_policy("file"))))];
        for dir in self.route_policies.keys() {
            let owned = dir.clone();
            dirs.push((dir.clone(), Box::new(move |g| g.reload_route_policy(&owned, "file"))));
        }
        if let Some(shadow) = &self.shadow {
            dirs.push((shadow.policies.dir().to_path_buf(), Box::new(|g| g.reload_shadow())));
        }
        if let Some(ab) = &self.ab {
            dirs.push((ab.policies.dir().to_path_buf(), Box::new(|g| g.reload_ab("file"))));
        }
        for (dir, reload) in dirs {
            let weak = Arc::downgrade(self);
            let watcher = crate::policy::watch::watch(&dir, debounce, poll, move || {
                if let Some(g) = weak.upgrade() {
                    reload(&g);
                }
            })?;
            self.watchers.lock().unwrap_or_else(|e| e.into_inner()).push(watcher);
        }
        Ok(())
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

    /// Reloads the A/B candidate's directory, if there is one; a new version takes its share
    /// again (after a rollback too) with fresh counts.
    fn reload_ab(&self, trigger: &'static str) {
        if let Some(ab) = &self.ab {
            if let Ok(Some(_)) = self.reload_store(&ab.policies, trigger, "A/B candidate policy") {
                ab.rearm_if_changed();
            }
        }
    }

    /// An operator's reload (`trigger`: `sighup`, `admin`): the shadow and A/B candidates, the
    /// route policies, then the live policy, whose result is returned.
    pub fn reload_all(&self, trigger: &'static str) -> Result<Option<String>, PolicyError> {
        self.reload_shadow();
        self.reload_ab(trigger);
        for dir in self.route_policies.keys() {
            self.reload_route_policy(dir, trigger);
        }
        self.reload_policy(trigger)
    }

    /// Reloads one route's policy directory; logs and counts the result like the live policy's.
    fn reload_route_policy(&self, dir: &Path, trigger: &'static str) {
        if let Some(store) = self.route_policies.get(dir) {
            let _ = self.reload_store(store, trigger, "route policy");
        }
    }

    /// Reloads the live policy directory (`trigger`: `file`, `sighup`, `admin`), logs and counts
    /// the result. A refused policy changes nothing but the error report.
    pub fn reload_policy(&self, trigger: &'static str) -> Result<Option<String>, PolicyError> {
        self.reload_store(&self.policies, trigger, "policy")
    }

    fn reload_store(
        &self,
        store: &PolicyStore,
        trigger: &'static str,
        what: &'static str,
    ) -> Result<Option<String>, PolicyError> {
        let result = store.reload();
        let dir = store.dir().display();
        let outcome = match &result {
            Ok(Some(version)) => {
                tracing::info!(trigger, %dir, %version, "{what} reloaded");
                "ok"
            }
            Ok(None) => "unchanged",
            Err(e) => {
                tracing::error!(trigger, %dir, error = %e, "{what} refused; the last good one keeps serving");
                "refused"
            }
        };
        self.metrics.policy_reloads.get_or_create(&ReloadLabels { trigger, result: outcome }).inc();
        result
    }
}

/// Periodic upkeep off the request path: the p95 refresh and the A/B judgement, on the
/// blocking pool, never on a runtime thread that serves requests; it ends once the gateway is
/// gone. (Tenant limit state needs no sweep: its keys are the known tenants plus one shared by
/// every unknown tenant.)
async fn housekeeping(gateway: Weak<Gateway>, every: Duration) {
    every_off_runtime(every, move || {
        let Some(g) = gateway.upgrade() else { return false };
        if let Some(gpu) = &g.gpu {
            gpu.latency.refresh();
        }
        if let Some(ab) = &g.ab {
            ab.tick();
        }
        true
    })
    .await
}

/// Runs the blocking `chore` on tokio's blocking pool every `every` (missed ticks delayed) until
/// it returns `false` or panics.
async fn every_off_runtime(every: Duration, chore: impl Fn() -> bool + Send + Sync + 'static) {
    let chore = Arc::new(chore);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let chore = Arc::clone(&chore);
        if !tokio::task::spawn_blocking(move || chore()).await.unwrap_or(false) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::every_off_runtime;
    use std::time::Duration;

    #[test]
    fn the_periodic_chore_runs_off_the_runtime_thread() {
        // A chore that blocks until a task on the same single-threaded runtime has run: were it
        // run on the runtime thread, that task could never run and the runtime would hang.
        let (ran_tx, ran_rx) = std::sync::mpsc::channel::<()>();
        let ran_rx = std::sync::Mutex::new(ran_rx);
        let outcome = crate::test_support::on_current_thread_runtime(async move {
            let waker = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                ran_tx.send(()).unwrap();
            });
            every_off_runtime(Duration::from_millis(1), move || {
                ran_rx.lock().unwrap().recv().unwrap();
                false
            })
            .await;
            waker.await.unwrap();
        });
        assert!(outcome.is_ok(), "the chore blocked the runtime thread");
    }
}

/// An upstream gpu backend needs every policy to carry a `[prompt]`.
fn check_prompts<'a>(gpu: Option<&GpuTier>, mut policies: impl Iterator<Item = &'a Policy>) -> anyhow::Result<()> {
    if let Some(g) = gpu.filter(|g| g.needs_prompt()) {
        if let Some(p) = policies.find(|p| p.prompt.is_none()) {
            anyhow::bail!("gpu.backend = {:?} needs a [prompt] section in the policy ({})", g.name(), p.dir.display());
        }
    }
    Ok(())
}

/// `[features_model]`: the model loaded and checked, or `None` without the section.
fn load_features_model(
    config: Option<&crate::features_model::FeaturesModelConfig>,
    env: &'static ort::environment::Environment,
) -> anyhow::Result<Option<Arc<crate::features_model::FeaturesModel>>> {
    let Some(f) = config else { return Ok(None) };
    let model = crate::features_model::FeaturesModel::load(&f.dir, env)
        .map_err(|e| anyhow::anyhow!("features model {}: {e:#}", f.dir.display()))?;
    tracing::info!(name = %model.manifest.name, features = model.schema.features.len(), "features model loaded");
    Ok(Some(Arc::new(model)))
}
