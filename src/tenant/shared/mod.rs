//! Quotas shared by a fleet of replicas through Redis: [`SharedQuotas`], a [`QuotaStore`] whose
//! GCRA rate state and daily budgets live in Redis, one Lua script call (EVALSHA) per check.
//!
//! While Redis is out of reach (down, refusing, or slower than `timeout_ms`) a check takes the
//! configured outage path ([`OnOutage`]). By default a rate check is then decided by
//! [`mirror::RateMirror`], which continues the shared cell from the TAT Redis last returned at
//! this replica's share of the rate and carries what it admitted back to Redis when it answers
//! (one budget, not two cells that refill while the other is in use: see its module doc); a
//! daily budget by this replica's local store at the budget divided by the replica count. A
//! circuit breaker (`crate::breaker`, the one the tiers use) keeps a dead Redis from
//! costing every request a failed round trip: after `failure_threshold` consecutive failures
//! checks stay off Redis for `open_ms`, then one check probes it. Connecting happens in the
//! background; a request never waits for a connect.

pub mod config;
pub mod metrics;
pub mod mirror;

pub use config::{OnOutage, RedisConfig};
pub use metrics::SharedQuotaMetrics;

use super::local::LocalQuotas;
use super::quota::{Denied, Limit, Quota, QuotaStore};
use crate::breaker::{BreakerConfig, CircuitBreaker, CircuitState};
use futures_util::future::BoxFuture;
use metrics::{FallbackLabels, StoreErrorLabels};
use mirror::RateMirror;
use redis::aio::MultiplexedConnection;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The quota store of a gateway: [`SharedQuotas`] over Redis when `[tenants.redis]` is set
/// (falling back to a [`LocalQuotas`]; its metrics registered into `registry`; a connect
/// started now when called on a runtime, so that the first requests are shared too), else a
/// [`LocalQuotas`]. Also returns the Redis [`Link`] when there is one, so that other shared
/// state (the campaign store) rides the same connection and circuit breaker. Errors name the
/// config key.
pub fn quota_store(
    redis: Option<&RedisConfig>,
    registry: &mut prometheus_client::registry::Registry,
) -> Result<(Arc<dyn QuotaStore>, Option<Arc<Link>>), String> {
    let Some(config) = redis else {
        return Ok((Arc::new(LocalQuotas::new()), None));
    };
    let metrics = SharedQuotaMetrics::register(registry);
    let store = Arc::new(SharedQuotas::new(config, Arc::new(LocalQuotas::new()), metrics)?);
    tracing::info!(
        redis = %store.link.client.get_connection_info().addr,
        replicas = config.replicas,
        on_outage = config.on_outage.as_str(),
        "quota store: rates and daily budgets shared through Redis"
    );
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let connecting = Arc::clone(&store);
        // A failed connect is logged (and counted) by the store; requests take the outage path.
        runtime.spawn(async move { drop(connecting.connect().await) });
    }
    let link = store.link();
    Ok((store, Some(link)))
}

/// The GCRA script (see the file for its keys, arguments and reply).
pub const GCRA_LUA: &str = include_str!("gcra.lua");
/// The daily budget script (see the file for its keys, arguments and reply).
pub const DAILY_BUDGET_LUA: &str = include_str!("daily_budget.lua");

/// Bound on one background connect to Redis (requests never wait for it).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

const UNKNOWN: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// A [`QuotaStore`] over Redis with a fallback for outages; cheap to share behind an `Arc`.
pub struct SharedQuotas {
    link: Arc<Link>,
    gcra: redis::Script,
    daily: redis::Script,
    key_prefix: String,
    replicas: u32,
    on_outage: OnOutage,
    /// The local store of daily budgets under `on_outage = "local"`.
    fallback: Arc<dyn QuotaStore>,
    /// The rate cells mirrored from Redis: the local rate check under `on_outage = "local"`.
    mirror: RateMirror,
    /// `Retry-After` of a refusal under `on_outage = "closed"`: the breaker's open time, at
    /// least one second.
    closed_retry_after: Duration,
}

/// The connection to Redis and its health (circuit breaker, `tiergate_quota_store_*` metrics),
/// shared with the background connect task and with the campaign store (the campaign store),
/// whose round trips count in the same breaker: one Redis, one judgement of whether it answers.
pub struct Link {
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
    connecting: AtomicBool,
    breaker: CircuitBreaker,
    timeout: Duration,
    /// `UNKNOWN` until the first round trip, then `UP` or `DOWN`: transitions are logged.
    health: AtomicU8,
    on_outage: OnOutage,
    metrics: SharedQuotaMetrics,
}

impl SharedQuotas {
    /// A store for `config` (validated here too) that takes the `on_outage = "local"` path
    /// through its rate mirror and, for daily budgets, `fallback`. Connects lazily, in the
    /// background, on the first check: Redis being down at start-up is an outage like any
    /// other, not a start-up error.
    pub fn new(
        config: &RedisConfig,
        fallback: Arc<dyn QuotaStore>,
        metrics: SharedQuotaMetrics,
    ) -> Result<SharedQuotas, String> {
        config.validate()?;
        let client = redis::Client::open(config.url.as_str()).map_err(|e| format!("`tenants.redis.url`: {e}"))?;
        let breaker =
            CircuitBreaker::new(BreakerConfig { failure_threshold: config.failure_threshold, open_ms: config.open_ms });
        let link = Link {
            client,
            conn: Mutex::new(None),
            connecting: AtomicBool::new(false),
            breaker,
            timeout: Duration::from_millis(config.timeout_ms),
            health: AtomicU8::new(UNKNOWN),
            on_outage: config.on_outage,
            metrics,
        };
        Ok(SharedQuotas {
            link: Arc::new(link),
            gcra: redis::Script::new(GCRA_LUA),
            daily: redis::Script::new(DAILY_BUDGET_LUA),
            key_prefix: config.key_prefix.clone(),
            replicas: config.replicas,
            on_outage: config.on_outage,
            fallback,
            mirror: RateMirror::new(),
            closed_retry_after: Duration::from_millis(config.open_ms).max(Duration::from_secs(1)),
        })
    }

    /// Connects now (at start-up, so that the first requests are shared too) and checks the
    /// server answers; bounded by [`CONNECT_TIMEOUT`]. An error names the URL's host and why; the
    /// store stays usable either way (it reconnects in the background on later checks).
    pub async fn connect(&self) -> Result<(), String> {
        let link = &self.link;
        let config = redis::AsyncConnectionConfig::new().set_connection_timeout(CONNECT_TIMEOUT);
        let made = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let mut conn = link.client.get_multiplexed_async_connection_with_config(&config).await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok::<_, redis::RedisError>(conn)
        })
        .await;
        let where_ = link.client.get_connection_info().addr.to_string();
        match made {
            Ok(Ok(conn)) => {
                *link.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
                link.success();
                Ok(())
            }
            Ok(Err(e)) => {
                link.failure("connection", &e.to_string(), true);
                Err(format!("Redis at {where_}: {e}"))
            }
            Err(_) => {
                link.failure("timeout", "connect timed out", true);
                Err(format!("Redis at {where_}: no connection within {CONNECT_TIMEOUT:?}"))
            }
        }
    }

    /// The Redis key of `key`'s GCRA state: `{prefix}rate:{key}`.
    pub fn rate_key(&self, key: &str) -> String {
        format!("{}rate:{key}", self.key_prefix)
    }

    /// The Redis key of `key`'s calls taken today: `{prefix}daily:{key}`.
    pub fn daily_key(&self, key: &str) -> String {
        format!("{}daily:{key}", self.key_prefix)
    }

    /// The connection and its breaker, for other state shared through the same Redis.
    pub fn link(&self) -> Arc<Link> {
        Arc::clone(&self.link)
    }

    /// The circuit breaker's state now (`closed` while Redis answers).
    pub fn circuit(&self) -> CircuitState {
        self.link.breaker.state(Instant::now())
    }

    /// A check Redis could not decide: the configured outage path.
    /// `local` is the fallback store's check (a future, only polled under `on_outage = "local"`).
    async fn outage(&self, check: &'static str, local: BoxFuture<'_, Result<(), Denied>>) -> Result<(), Denied> {
        let labels = FallbackLabels { check, on_outage: self.on_outage.as_str() };
        self.link.metrics.fallbacks.get_or_create(&labels).inc();
        match self.on_outage {
            OnOutage::Local => local.await,
            OnOutage::Open => Ok(()),
            OnOutage::Closed => {
                Err(Denied { limit: Limit::QuotaStoreUnavailable, retry_after: self.closed_retry_after })
            }
        }
    }
}

/// GCRA's emission interval of `per_second`, in microseconds, rounded to nearest, at least 1.
pub(crate) fn emission_interval_us(per_second: u32) -> u64 {
    let rate = u64::from(per_second.max(1));
    ((1_000_000 + rate / 2) / rate).max(1)
}

impl QuotaStore for SharedQuotas {
    fn check_rate<'a>(&'a self, key: &'a str, quota: Quota) -> BoxFuture<'a, Result<(), Denied>> {
        Box::pin(async move {
            let floor = self.mirror.floor(key, Instant::now());
            let args = [emission_interval_us(quota.per_second), u64::from(quota.burst.max(1)), floor.offset_us];
            match self.link.eval::<(u64, u64)>(&self.gcra, self.rate_key(key), &args).await {
                Some((wait_us, tat_offset_us)) => {
                    self.mirror.answered(key, Instant::now(), tat_offset_us, floor.carried);
                    self.link.metrics.reconciled.inc_by(u64::from(floor.carried));
                    match wait_us {
                        0 => Ok(()),
                        _ => Err(Denied { limit: Limit::Rate, retry_after: Duration::from_micros(wait_us) }),
                    }
                }
                None => {
                    // Lazy: the mirror charges only when the local path is the configured one.
                    let local = Box::pin(async move {
                        let decided = self.mirror.check_local(key, quota, self.replicas, Instant::now());
                        decided.map_err(|retry_after| Denied { limit: Limit::Rate, retry_after })
                    });
                    self.outage("rate", local).await
                }
            }
        })
    }

    fn take_daily<'a>(&'a self, key: &'a str, per_day: u32) -> BoxFuture<'a, Result<(), Denied>> {
        Box::pin(async move {
            let args = [u64::from(per_day.max(1))];
            match self.link.eval::<u64>(&self.daily, self.daily_key(key), &args).await {
                Some(0) => Ok(()),
                Some(wait_s) => Err(Denied { limit: Limit::GpuDailyBudget, retry_after: Duration::from_secs(wait_s) }),
                None => {
                    let share = per_day.div_ceil(self.replicas.max(1)).max(1);
                    self.outage("daily", self.fallback.take_daily(key, share)).await
                }
            }
        })
    }
}

/// Frees a breaker permit that was not judged (the caller's future was dropped mid-call), so a
/// half-open circuit is never left waiting on a probe that will not report.
struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    judged: bool,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.judged {
            self.breaker.release();
        }
    }
}

impl Link {
    /// One script call: its reply, or `None` when Redis could not decide (circuit open,
    /// no connection yet, error, timeout). One round trip (EVALSHA), plus SCRIPT LOAD and a
    /// second EVALSHA once after Redis lost its script cache (a restart).
    async fn eval<T: redis::FromRedisValue>(
        self: &Arc<Self>,
        script: &redis::Script,
        key: String,
        args: &[u64],
    ) -> Option<T> {
        let mut call = script.key(key);
        for arg in args {
            call.arg(*arg);
        }
        self.run(call).await
    }

    /// One call of a prepared script invocation (any keys and arguments), under the same
    /// breaker, timeout and failure accounting as the quota checks: its reply, or `None` when
    /// Redis could not decide. For shared state beside the quotas (the campaign store).
    pub async fn run<T: redis::FromRedisValue>(self: &Arc<Self>, call: redis::ScriptInvocation<'_>) -> Option<T> {
        if !self.breaker.try_acquire(Instant::now()) {
            return None;
        }
        let mut permit = Permit { breaker: &self.breaker, judged: false };
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(conn) = conn else {
            if !self.connecting.swap(true, Ordering::AcqRel) {
                permit.judged = true; // the connect task judges this permit
                self.spawn_connect();
            }
            return None;
        };
        self.invoke(call, permit, conn).await
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: redis::ScriptInvocation<'_>,
        mut permit: Permit<'_>,
        mut conn: MultiplexedConnection,
    ) -> Option<T> {
        let reply = tokio::time::timeout(self.timeout, call.invoke_async::<T>(&mut conn)).await;
        permit.judged = true;
        match reply {
            Ok(Ok(value)) => {
                self.success();
                Some(value)
            }
            Ok(Err(e)) => {
                let kind = if e.kind() == redis::ErrorKind::ResponseError { "response" } else { "connection" };
                let drop_connection = e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error();
                self.failure(kind, &e.to_string(), drop_connection);
                None
            }
            Err(_) => {
                self.failure("timeout", &format!("no reply within {} ms", self.timeout.as_millis()), false);
                None
            }
        }
    }

    /// Connects in the background, holding the breaker permit of the check that found no
    /// connection: a failed connect counts as a failed check; a made one frees the permit so
    /// that the next check (the half-open probe, if the circuit was open) judges Redis.
    fn spawn_connect(self: &Arc<Self>) {
        let link = Arc::clone(self);
        tokio::spawn(async move {
            let config = redis::AsyncConnectionConfig::new().set_connection_timeout(CONNECT_TIMEOUT);
            let made = tokio::time::timeout(
                CONNECT_TIMEOUT,
                link.client.get_multiplexed_async_connection_with_config(&config),
            )
            .await;
            match made {
                Ok(Ok(conn)) => {
                    *link.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
                    link.breaker.release();
                }
                Ok(Err(e)) => link.failure("connection", &e.to_string(), true),
                Err(_) => link.failure("timeout", "connect timed out", true),
            }
            link.connecting.store(false, Ordering::Release);
        });
    }

    fn success(&self) {
        self.breaker.record(true, Instant::now());
        self.metrics.up.set(1);
        self.metrics.circuit_open.set(0);
        match self.health.swap(UP, Ordering::AcqRel) {
            DOWN => tracing::info!("quota store: Redis answers again; quotas are shared by the fleet again"),
            UNKNOWN => tracing::info!("quota store: connected to Redis; quotas are shared by the fleet"),
            _ => {}
        }
    }

    /// Counts a failed round trip; drops the connection when it is broken or the circuit opens
    /// (a later check reconnects), and logs the first failure of an outage.
    fn failure(&self, error: &'static str, detail: &str, broken: bool) {
        let now = Instant::now();
        self.metrics.errors.get_or_create(&StoreErrorLabels { error }).inc();
        self.breaker.record(false, now);
        let open = self.breaker.state(now) == CircuitState::Open;
        self.metrics.circuit_open.set(i64::from(open));
        self.metrics.up.set(0);
        if broken || open {
            *self.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        if self.health.swap(DOWN, Ordering::AcqRel) != DOWN {
            tracing::warn!(
                error,
                detail,
                on_outage = self.on_outage.as_str(),
                "quota store: Redis out of reach; quota checks take the on_outage path until it answers"
            );
        }
    }
}
