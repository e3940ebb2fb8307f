//! The proxy's one way into the gateway: deciding, recording, the policy in force, the tenants'
//! credentials and the proxy's own metrics. The routes, the Layer and the stream screen reach
//! [`Gateway`] only through [`Port`] (`tests/architecture.rs` checks it), so what the proxy needs
//! of the gateway is this file's list of methods, not the gateway's fields.

use super::stream_guard::CutAudit;
use crate::audit::record::Event;
use crate::decision::Decision;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::metrics::RouteLabels;
use crate::policy::Policy;
use crate::request::ClassifyRequest;
use crate::tenant::Tenants;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How the proxy ended one request: the `outcome` label of
/// `tiergate_proxy_requests_total{route, outcome}`; every request counts once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Screened (or not screened by the route's choice) and handed to the app or inner service.
    Forwarded,
    /// Forwarded without a decision: screening failed on tiergate's side under `on_error = "open"`.
    Unscreened,
    /// The policy's action maps to `block` on this route: answered 403.
    Blocked,
    /// No model tier had the capacity and the route says `on_overload = "shed"`: 503.
    Shed,
    /// Refused: a path the route does not screen, or screening failed and the route fails closed.
    Refused,
    /// Not done within the route's `request_timeout_ms`.
    RequestTimeout,
    /// The client's own body failed on its way to the app.
    ClientError,
    /// The app could not be reached or broke the exchange: 502.
    UpstreamError,
    /// The app sent no response head in time: 504.
    UpstreamTimeout,
}

impl Handled {
    /// The metric label (stable: dashboards read it).
    pub fn as_str(self) -> &'static str {
        match self {
            Handled::Forwarded => "forwarded",
            Handled::Unscreened => "unscreened",
            Handled::Blocked => "blocked",
            Handled::Shed => "shed",
            Handled::Refused => "refused",
            Handled::RequestTimeout => "request_timeout",
            Handled::ClientError => "client_error",
            Handled::UpstreamError => "upstream_error",
            Handled::UpstreamTimeout => "upstream_timeout",
        }
    }
}

/// The gateway as the proxy sees it. Cloning shares the gateway.
#[derive(Clone)]
pub struct Port {
    gateway: Arc<Gateway>,
}

impl From<Arc<Gateway>> for Port {
    fn from(gateway: Arc<Gateway>) -> Port {
        Port { gateway }
    }
}

impl Port {
    /// Whether the gateway loaded the policy directory `dir` at start (`policies.dir`, or a
    /// route's `[routes.screen] policy`); it decides under the live policy for any other.
    pub fn loaded_policy(&self, dir: &Path) -> bool {
        self.gateway.route_policies.contains_key(dir) || self.gateway.policies.dir() == dir
    }

    /// The policy in force now for `dir` (`None`: the live `policies.dir`).
    pub fn policy(&self, dir: Option<&Path>) -> Arc<Policy> {
        self.gateway.policy_store(dir).snapshot()
    }

    /// Who requests are for: identity for a route's request, credentials to strip before the app.
    pub fn tenants(&self) -> &Tenants {
        &self.gateway.tenants
    }

    /// Decides `request` under the policy for `dir` (the cascade, guards, shadow and A/B as on
    /// `/v1/classify`). Errors are the gateway's (429, 503, 422 for an unknown scenario, ...).
    pub async fn decide(
        &self,
        dir: Option<&Path>,
        request: ClassifyRequest,
        request_id: String,
    ) -> Result<Decision, ApiError> {
        self.gateway.classify_under(dir, request, request_id).await
    }

    /// The request's audit record (kind `screen`), from the route named `route`. A full queue
    /// under `on_full = "block"` is a 503.
    pub fn record(&self, event: Event<'_>, route: &str) -> Result<Option<String>, ApiError> {
        self.gateway.record(event, Some(route))
    }

    /// Counts one request in `tiergate_proxy_requests_total{route, outcome}`.
    pub fn count(&self, route: &str, outcome: Handled) {
        let labels = RouteLabels { route: route.to_string(), outcome: outcome.as_str() };
        self.gateway.metrics.proxy_requests.get_or_create(&labels).inc();
    }

    /// Observes the app's time to a response head in
    /// `tiergate_proxy_upstream_header_seconds{route, outcome=<status class>}`.
    pub fn observe_app(&self, route: &str, status_class: &'static str, elapsed: Duration) {
        let labels = RouteLabels { route: route.to_string(), outcome: status_class };
        self.gateway.metrics.proxy_upstream_latency.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// `tiergate_stream_guard_evaluations_total{route, outcome}`, which the stream screen counts in.
    pub fn stream_counter(&self) -> &Family<RouteLabels, Counter> {
        &self.gateway.metrics.stream_guard
    }

    /// The tracer (`[tracing]`), for a front door that begins its own traces (the Layer).
    pub fn tracer(&self) -> &crate::trace::Tracer {
        &self.gateway.tracer
    }

    /// Whether an audit trail is on (a stream cut then needs the request's id).
    pub fn audits(&self) -> bool {
        self.gateway.audit.is_some()
    }

    /// Where a stream cut's record goes, when the trail is on: the request it ends the answer to
    /// and the cpu model deployed beside the rules.
    pub fn cut_audit(&self, request_id: String, tenant: Option<String>) -> Option<CutAudit> {
        let audit = Arc::clone(self.gateway.audit.as_ref()?);
        Some(CutAudit { audit, request_id, tenant, model: self.gateway.cpu_model_ref() })
    }
}
