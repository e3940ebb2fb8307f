//! The verdict cache (`[cache]`): an exact repeat of a request reuses the model tiers' verdicts
//! instead of calling the model again, and concurrent identical requests wait for one model call
//! (single flight).
//!
//! What is reused is a model tier's [`ModelVerdict`] only, per tier (cpu, gpu). Everything else
//! runs on every request as before: admission, assessment, routing (which reads the reused
//! verdict as if the tier had just given it), rules, guards, the allow-list and the audit record.
//! The tier's path step says `cached: true`.
//!
//! The key ([`key`]) is an HMAC of the canonical text, the features, the tenant, the scenario,
//! the policy directory, the A/B arm, the policy version and the models' digests, per tier: a
//! policy reload or another model makes new keys, and the old entries age out unused.
//!
//! Only verdicts a tier gave are kept: a [`TierError`] (queue full, doomed, deadline, circuit
//! open, unavailable, inference error) is never stored, and its waiters do not inherit it — one
//! of them calls the model in turn. A waiter honours its own deadline: past it, it leaves with
//! [`TierError::DeadlineExceeded`] like a model call that did not answer in time.
//!
//! Bounded: at most `max_entries` entries (quick_cache's S3-FIFO eviction, scan resistant, sharded), each
//! at most `ttl_ms` old when used. Metrics: `tiergate_verdict_cache_lookups_total{tier,result}`
//! (`hit`, `coalesced`: waited for a call in flight, `miss`: called the model, `timeout`: the
//! deadline passed while waiting), `..._insertions_total{tier}`, `..._evictions_total{reason}`
//! (`capacity`, `expired`), `..._entries`. Hit rate: (hit + coalesced) / all lookups.

pub mod key;
#[cfg(test)]
mod tests;

use crate::decision::TierName;
use crate::metrics::ReasonLabels;
use crate::text::{Language, LanguageCell};
use crate::tier::{ModelVerdict, TierError};
use key::{Key, KeyBase, Scope, Secret};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, UnitWeighter};
use serde::Deserialize;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// `[cache]`: the verdict cache. Off by default: turning it on changes how many model calls a
/// wave of repeats costs, which an operator should choose knowingly.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    pub enabled: bool,
    /// Most entries kept (at least 1); about 200 bytes each (a 32-byte key and a verdict).
    pub max_entries: usize,
    /// How long a verdict may be reused, ms (at least 1; at most a day, as every `_ms` key).
    pub ttl_ms: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { enabled: false, max_entries: 65_536, ttl_ms: 300_000 }
    }
}

impl CacheConfig {
    /// Checks ranges; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_entries == 0 {
            return Err("`cache.max_entries` must be at least 1".into());
        }
        if self.ttl_ms == 0 {
            return Err("`cache.ttl_ms` must be at least 1 (or `cache.enabled = false`)".into());
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    tier: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InsertLabels {
    tier: &'static str,
}

#[derive(Clone, Default)]
struct CacheMetrics {
    lookups: Family<LookupLabels, Counter>,
    insertions: Family<InsertLabels, Counter>,
    evictions: Family<ReasonLabels, Counter>,
    entries: Gauge,
}

impl CacheMetrics {
    fn register(registry: &mut Registry) -> CacheMetrics {
        let m = CacheMetrics::default();
        registry.register(
            "verdict_cache_lookups",
            "Model tier verdicts looked up in the verdict cache, by tier and result (hit, coalesced: waited for the \
             call in flight, miss: called the model, timeout: the deadline passed while waiting)",
            m.lookups.clone(),
        );
        registry.register(
            "verdict_cache_insertions",
            "Verdicts stored in the verdict cache, by tier",
            m.insertions.clone(),
        );
        registry.register(
            "verdict_cache_evictions",
            "Verdicts that left the verdict cache, by reason (capacity, expired)",
            m.evictions.clone(),
        );
        registry.register("verdict_cache_entries", "Verdicts in the verdict cache", m.entries.clone());
        m
    }

    fn lookup(&self, tier: TierName, result: &'static str) {
        self.lookups.get_or_create(&LookupLabels { tier: tier.as_str(), result }).inc();
    }

    fn evicted(&self, reason: &'static str) {
        self.evictions.get_or_create(&ReasonLabels { reason }).inc();
    }
}

/// A stored verdict, the language its tier detected (the cpu worker detects it beside
/// tokenisation: a hit then need not detect it on the async runtime), and when it was stored.
#[derive(Clone)]
struct Entry {
    verdict: ModelVerdict,
    lang: Option<Language>,
    stored: Instant,
}

/// Counts evictions for capacity. Called under a shard's lock: it only counts.
#[derive(Clone)]
struct Evictions(CacheMetrics);

impl Lifecycle<Key, Entry> for Evictions {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), _key: Key, _entry: Entry) {
        self.0.evicted("capacity");
    }
}

type Entries = Cache<Key, Entry, UnitWeighter, DefaultHashBuilder, Evictions>;

/// The cache one gateway holds (`Gateway::verdicts`), shared by every request and policy.
pub struct VerdictCache {
    entries: Entries,
    ttl: Duration,
    secret: Secret,
    /// The models' digests, as every key carries them ([`Scope::models`]).
    models: String,
    metrics: CacheMetrics,
}

/// How a lookup ended.
enum Lookup<'a> {
    /// A verdict to reuse: stored, or just given to the request this one waited for.
    Hit(Entry),
    /// No verdict and none in flight: this request calls the model; waiters wait on the guard.
    Lead(quick_cache::sync::PlaceholderGuard<'a, Key, Entry, UnitWeighter, DefaultHashBuilder, Evictions>),
    /// The deadline passed while waiting for the call in flight.
    Late(TierError),
}

impl VerdictCache {
    /// A cache for `config`, with `models` (the model digests every key carries) and its metrics
    /// in `registry`.
    pub fn new(config: &CacheConfig, models: String, registry: &mut Registry) -> VerdictCache {
        let metrics = CacheMetrics::register(registry);
        let capacity = config.max_entries;
        let entries = Cache::with(
            capacity,
            capacity as u64,
            UnitWeighter,
            DefaultHashBuilder::default(),
            Evictions(metrics.clone()),
        );
        VerdictCache { entries, ttl: Duration::from_millis(config.ttl_ms), secret: Secret::random(), models, metrics }
    }

    /// The gateway's cache when `config` turns it on, keyed to these models.
    pub fn start(
        config: &CacheConfig,
        cpu: &crate::tier::onnx::OnnxPool,
        gpu: Option<&crate::tier::gpu::GpuTier>,
        registry: &mut Registry,
    ) -> Option<VerdictCache> {
        config.enabled.then(|| VerdictCache::new(config, model_digests(cpu, gpu), registry))
    }

    /// The key base of one request, `scope` with its `models` left empty: the cache fills them.
    pub fn scope(&self, scope: Scope<'_>) -> Cached<'_> {
        let base = KeyBase::new(&self.secret, &Scope { models: &self.models, ..scope });
        Cached { cache: self, base }
    }

    /// Entries now (expired ones included until they are next looked up or evicted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A stored verdict younger than the TTL; an older one is removed (counted `expired`).
    fn fresh(&self, key: &Key) -> Option<Entry> {
        let entry = self.entries.get(key)?;
        if entry.stored.elapsed() < self.ttl {
            return Some(entry);
        }
        if self.entries.remove_if(key, |e| e.stored == entry.stored).is_some() {
            self.metrics.evicted("expired");
            self.metrics.entries.set(self.entries.len() as i64);
        }
        None
    }

    async fn lookup(&self, key: &Key, tier: TierName, deadline: Instant) -> Lookup<'_> {
        if let Some(entry) = self.fresh(key) {
            self.metrics.lookup(tier, "hit");
            return Lookup::Hit(entry);
        }
        let waited = Instant::now();
        match tokio::time::timeout_at(deadline, self.entries.get_value_or_guard_async(key)).await {
            Ok(Ok(entry)) => {
                self.metrics.lookup(tier, "coalesced");
                Lookup::Hit(entry)
            }
            Ok(Err(guard)) => {
                self.metrics.lookup(tier, "miss");
                Lookup::Lead(guard)
            }
            Err(_) => {
                self.metrics.lookup(tier, "timeout");
                Lookup::Late(TierError::DeadlineExceeded { waited_us: waited.elapsed().as_micros() as u64 })
            }
        }
    }
}

/// One request's view of the cache: the cache and the request's key base.
pub struct Cached<'a> {
    cache: &'a VerdictCache,
    base: KeyBase,
}

impl Cached<'_> {
    /// `tier`'s verdict for this request: reused when stored, awaited when an identical request
    /// is calling the model now (until `deadline`), else `call`ed and, when the tier gave a
    /// verdict, stored with the language in `lang` (the canonical text's cell, which a reused
    /// verdict fills). Returns the result and whether it was reused (`true`: no model call).
    pub async fn through(
        &self,
        tier: TierName,
        deadline: Instant,
        lang: Option<&LanguageCell>,
        call: impl Future<Output = Result<ModelVerdict, TierError>>,
    ) -> (Result<ModelVerdict, TierError>, bool) {
        let key = self.base.key(tier);
        let guard = match self.cache.lookup(&key, tier, deadline).await {
            Lookup::Hit(entry) => {
                if let (Some(cell), Some(known)) = (lang, entry.lang) {
                    cell.fill(known);
                }
                return (Ok(entry.verdict), true);
            }
            Lookup::Late(e) => return (Err(e), false),
            Lookup::Lead(guard) => guard,
        };
        // A failure drops the guard unfilled: the next waiter calls the model itself.
        let result = call.await;
        if let Ok(v) = &result {
            let entry =
                Entry { verdict: v.clone(), lang: lang.and_then(|c| c.peek().copied()), stored: Instant::now() };
            if guard.insert(entry).is_ok() {
                self.cache.metrics.insertions.get_or_create(&InsertLabels { tier: tier.as_str() }).inc();
            }
            self.cache.metrics.entries.set(self.cache.entries.len() as i64);
        }
        (result, false)
    }
}

/// The models every key carries: the cpu model's manifest digest and the gpu backend's (its
/// manifest digest; for a backend without one, such as model servers, its name — a model changed
/// on the servers is not seen here, and `ttl_ms` bounds how long a verdict outlives it).
fn model_digests(cpu: &crate::tier::onnx::OnnxPool, gpu: Option<&crate::tier::gpu::GpuTier>) -> String {
    let gpu = match gpu {
        None => "none".to_string(),
        Some(g) => g.model_info().map_or_else(|| format!("backend {}", g.name()), |i| i.manifest_sha256.clone()),
    };
    format!("cpu {} gpu {gpu}", cpu.info().manifest_sha256)
}
