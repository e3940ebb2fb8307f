//! Per-tenant metrics, registered into the server's registry by [`TenantMetrics::register`]
//! (names below with the registry's `tiergate` prefix). The `tenant` label is a known tenant's
//! name or `other`, never a name a client chose, so the series stay bounded.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub tenant: String,
    /// `rate` (answered 429), `gpu_share` or `gpu_daily_budget` (routed down the cascade).
    pub limit: &'static str,
}

/// Handles to the tenant metrics; clones share the same values.
#[derive(Clone, Debug, Default)]
pub struct TenantMetrics {
    /// `tiergate_tenant_requests_total{tenant}`: requests admitted, by tenant.
    pub requests: Family<TenantLabels, Counter>,
    /// `tiergate_tenant_limited_total{tenant,limit}`: requests a tenant limit acted on.
    pub limited: Family<LimitLabels, Counter>,
}

impl TenantMetrics {
    /// Registers the metrics (under the registry's prefix) and returns the handles.
    pub fn register(registry: &mut Registry) -> TenantMetrics {
        let m = TenantMetrics::default();
        registry.register(
            "tenant_requests",
            "Requests admitted, by tenant (known tenants; `other`)",
            m.requests.clone(),
        );
        registry.register(
            "tenant_limited",
            "Requests a tenant limit acted on: `rate` answered 429; `gpu_share`, `gpu_daily_budget` routed down the cascade",
            m.limited.clone(),
        );
        m
    }

    /// Counts one request `limit` acted on for the tenant labelled `tenant`.
    pub fn limited(&self, tenant: &str, limit: &'static str) {
        self.limited.get_or_create(&LimitLabels { tenant: tenant.to_string(), limit }).inc();
    }
}
