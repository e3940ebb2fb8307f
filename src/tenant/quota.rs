//! Quotas and where their state lives: this process (`governor`) or Redis shared by replicas.
//!
//! The gateway holds one `Arc<dyn QuotaStore>`; what a tenant class allows (`Quota`, a daily
//! budget) comes from config and is passed on every call, so a store keeps no per-class setup.

use futures_util::future::BoxFuture;
use std::time::Duration;

/// A GCRA quota (generic cell rate algorithm, ITU-T I.371): `per_second` requests sustained,
/// `burst` at once. Both at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct Quota {
    pub per_second: u32,
    pub burst: u32,
}

/// Which limit refused a request and when to try again; becomes a 429 with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub limit: Limit,
    pub retry_after: Duration,
}

/// A limit a quota store enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The tenant class's GCRA rate.
    Rate,
    /// The tenant class's gpu-tier calls per UTC day.
    GpuDailyBudget,
    /// A shared store out of reach under `on_outage = "closed"`.
    QuotaStoreUnavailable,
}

impl Limit {
    /// Its stable name, as the 429 body and the `tiergate_tenant_limited_total` metric name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Rate => "rate",
            Limit::GpuDailyBudget => "gpu_daily_budget",
            Limit::QuotaStoreUnavailable => "quota_store_unavailable",
        }
    }
}

/// Where rate and budget state lives. Implementations: `LocalQuotas` (this process) and the
/// Redis-backed shared store with a local fallback.
pub trait QuotaStore: Send + Sync {
    /// Counts one request against `key`'s GCRA `quota`.
    fn check_rate<'a>(&'a self, key: &'a str, quota: Quota) -> BoxFuture<'a, Result<(), Denied>>;
    /// Takes one gpu-tier call from `key`'s budget of `per_day` calls per UTC day.
    fn take_daily<'a>(&'a self, key: &'a str, per_day: u32) -> BoxFuture<'a, Result<(), Denied>>;
}
