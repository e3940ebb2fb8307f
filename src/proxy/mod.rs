//! tiergate as a reverse proxy: requests matching a `[[routes]]` entry are (optionally) screened
//! and forwarded to the route's app; the decision travels with the request as headers, a blocked
//! request never reaches the app, and streamed answers can be screened as they flow
//! ([`guard`]).
//!
//! Forwarding follows RFC 9110 / 9112 for intermediaries: hop-by-hop headers (the fixed set of
//! §7.6.1, and those `Connection` lists except the end-to-end ones tiergate relies on, see
//! [`headers`]) are removed both ways; tiergate's own credentials never reach the app; `Via`, `X-Forwarded-For`,
//! `-Proto` and `-Host` are added; bodies stream in both directions unless screening needs the
//! request body; the app's failures become 502 / 504 with a JSON body.
//!
//! One file per phase: [`route`] (matching), [`screen`] (reading the text and deciding),
//! [`headers`] (header rules both ways), `forward` (the request to the app and its response),
//! [`guard`] (screening the app's stream), [`normalize`] (one spelling of path and host), and
//! [`layer`] (the same screening as a tower Layer in front of any service). Handlers return
//! `Result<_, ApiError>`; each front door turns errors into responses once.

pub mod config;
mod forward;
pub mod guard;
pub mod headers;
pub mod layer;
pub mod normalize;
pub mod route;
pub mod screen;

use crate::audit::record::Event;
use crate::audit::Kind;
use crate::decision::Decision;
use crate::error::ApiError;
use crate::gateway::Gateway;
use crate::metrics::RouteLabels;
use crate::policy::Action;
use crate::web::{headers as names, BoxBody, ServerConfig};
use config::{Disposition, FailMode, OverloadMode, ProxyConfig, RouteConfig};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
pub use route::Route;
use screen::{Outgoing, Screen};
use std::time::Duration;

/// Checks `[proxy]` and every route without building the app clients (for config validation).
pub fn validate(config: &ProxyConfig, routes: &[RouteConfig]) -> Result<(), String> {
    compile(config, routes).map(drop)
}

/// Compiles the routes; errors name the route and the field.
fn compile(config: &ProxyConfig, routes: &[RouteConfig]) -> Result<Vec<Route>, String> {
    if config.connect_timeout_ms == 0 {
        return Err("`proxy.connect_timeout_ms` must be at least 1".into());
    }
    let mut names = std::collections::HashSet::new();
    if let Some(dup) = routes.iter().find(|r| !names.insert(r.name.as_str())) {
        return Err(format!("route name `{}` is used twice", dup.name));
    }
    routes.iter().map(|r| Route::new(r, config)).collect()
}

/// The routes and the clients to their apps.
pub struct Proxy {
    pub routes: Vec<Route>,
    http1: Client<HttpConnector, BoxBody>,
    http2: Client<HttpConnector, BoxBody>,
    via: Option<String>,
    trust_forwarded: bool,
}

impl Proxy {
    /// `None` when no routes are configured. Errors name the route and field.
    pub fn new(config: &ProxyConfig, routes: &[RouteConfig]) -> Result<Option<Proxy>, String> {
        if routes.is_empty() {
            return Ok(None);
        }
        let routes = compile(config, routes)?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        connector.set_nodelay(true);
        let client = |http2: bool| {
            Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_millis(config.pool_idle_timeout_ms))
                .pool_max_idle_per_host(config.pool_max_idle_per_host)
                .http2_only(http2)
                .build(connector.clone())
        };
        let via = (!config.via.trim().is_empty()).then(|| config.via.trim().to_string());
        Ok(Some(Proxy {
            routes,
            http1: client(false),
            http2: client(true),
            via,
            trust_forwarded: config.trust_forwarded_headers,
        }))
    }

    /// The first route that matches, in configuration order.
    pub fn route<B>(&self, req: &Request<B>) -> Option<&Route> {
        self.routes.iter().find(|r| r.matches(req))
    }

    /// Sets `tiergate_proxy_upstream_ejected{route, upstream}` (called at each scrape).
    pub fn export(&self, metrics: &crate::metrics::Metrics) {
        for route in &self.routes {
            for member in route.balancer.status() {
                let labels = crate::metrics::UpstreamLabels { route: route.name.clone(), upstream: member.url };
                metrics.proxy_upstream_ejected.get_or_create(&labels).set(member.ejected as i64);
            }
        }
    }

    /// Each route's upstream addresses and their balancing state (for `/readyz`).
    pub fn status(&self) -> serde_json::Value {
        self.routes
            .iter()
            .map(|r| {
                (r.name.clone(), serde_json::json!({"upstreams": r.balancer.status(), "screened": r.screen.is_some()}))
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// Screens (when the route says so) and forwards one request, within the route's
    /// `request_timeout_ms` until the response head (408 after). Every outcome is counted in
    /// `tiergate_proxy_requests_total{route, outcome}`; errors are the caller's to answer.
    pub async fn handle(
        &self,
        gateway: &Gateway,
        limits: &ServerConfig,
        route: &Route,
        req: Request<Incoming>,
    ) -> Result<Response<BoxBody>, ApiError> {
        let work = async {
            if route.refuse {
                count(gateway, &route.name, "refused");
                let (method, path) = (req.method().to_string(), req.uri().path().to_string());
                tracing::info!(route = %route.name, %method, %path, "refused: the path is not screened");
                return Err(ApiError::Unscreened { route: route.name.clone(), method, path });
            }
            let (parts, body) = req.into_parts();
            let Some(screen) = &route.screen else {
                return self.forward(gateway, route, parts, Outgoing::Stream(body), None).await;
            };
            let request_id = headers::header_str(&parts.headers, names::REQUEST_ID).unwrap_or_default().to_string();
            let (outcome, outgoing) = screen::screen(gateway, limits, screen, &parts, body, request_id.clone()).await;
            let broken = matches!(outgoing, Outgoing::Broken);
            let screening = decide(gateway, &route.name, screen, &request_id, outcome, broken)?;
            self.forward(gateway, route, parts, outgoing, Some(&screening)).await
        };
        tokio::time::timeout(route.request_timeout, work).await.unwrap_or_else(|_| {
            count(gateway, &route.name, "request_timeout");
            let timeout_ms = route.request_timeout.as_millis() as u64;
            tracing::warn!(route = %route.name, timeout_ms, "request not done within the route's request_timeout_ms");
            Err(ApiError::Timeout { timeout_ms })
        })
    }
}

/// Counts one proxied request in `tiergate_proxy_requests_total{route, outcome}`.
fn count(gateway: &Gateway, route: &str, outcome: &'static str) {
    gateway.metrics.proxy_requests.get_or_create(&RouteLabels { route: route.to_string(), outcome }).inc();
}

/// What screening concluded, when the request goes on to the app.
pub enum Screening {
    Decided(Decision),
    /// Fail-open: screening could not run, for this reason.
    Failed(String),
}

/// Applies a route's action mapping and failure mode to a screening outcome: `Ok` forwards,
/// `Err` answers (blocked: 403 with the decision; refused: the screening error). Logs and counts
/// what is not forwarded (`tiergate_proxy_requests_total{route, outcome="blocked"|"refused"}`).
/// `broken`: the body could not be read, so the request cannot be forwarded in any mode.
/// `on_error = "open"` forwards only what tiergate's own faults left unscreened
/// ([`ApiError::may_fail_open`]).
/// A decision, or a request forwarded unscreened, gets its audit record here (kind `screen`);
/// a full audit queue under `on_full = "block"` turns either into a 503 before anything else.
pub(crate) fn decide(
    gateway: &Gateway,
    route: &str,
    screen: &Screen,
    request_id: &str,
    outcome: Result<Decision, ApiError>,
    broken: bool,
) -> Result<Screening, ApiError> {
    let count = |outcome| count(gateway, route, outcome);
    // What the client controls is refused in either mode (`ApiError::may_fail_open`): a
    // client must not be able to choose to go unscreened by sending a bad request.
    let fails_open = |e: &ApiError| screen.config.on_error == FailMode::Open && !broken && e.may_fail_open();
    let reason = outcome.as_ref().err().filter(|e| fails_open(e)).map(ApiError::to_string);
    let event = match (&outcome, &reason) {
        (Ok(decision), _) => Some(Event::Decided { kind: Kind::Screen, decision }),
        (Err(_), Some(reason)) => {
            let policy_version = gateway.policy_store(screen.config.policy.as_deref()).snapshot().version.clone();
            Some(Event::Unscreened { request_id, policy_version, reason })
        }
        (Err(_), None) => None,
    };
    if let Some(event) = event {
        gateway.record(event, Some(route))?;
    }
    match outcome {
        Ok(decision) => {
            let disposition = match decision.action {
                Action::Allow => Disposition::Forward,
                Action::Review => screen.config.on_review,
                Action::Block => screen.config.on_block,
            };
            tracing::info!(
                route, request_id = %decision.request_id, action = decision.action.as_str(),
                risk_score = decision.risk_score, tier = decision.tier.as_str(), rule = ?decision.rule,
                forwarded = disposition == Disposition::Forward, "screened"
            );
            if disposition == Disposition::Block {
                count("blocked");
                return Err(blocked(&decision));
            }
            if decision.overloaded && screen.config.on_overload == OverloadMode::Shed {
                count("shed");
                let reason = "no model tier had the capacity to judge the request (route on_overload = shed)".into();
                return Err(ApiError::Shed { reason, retry_after_s: 1 });
            }
            Ok(Screening::Decided(decision))
        }
        Err(e) => match reason {
            Some(reason) => {
                tracing::warn!(route, error = %e, "screening failed; forwarded unscreened (fail-open)");
                Ok(Screening::Failed(reason))
            }
            None => {
                tracing::warn!(route, error = %e, "screening failed; request refused");
                count("refused");
                Err(e)
            }
        },
    }
}

/// The 403 for a blocked request, with the decision in the body.
fn blocked(d: &Decision) -> ApiError {
    let message = match &d.rule {
        Some(rule) => format!("blocked by policy: rule `{rule}` (risk score {:.2})", d.risk_score),
        None => format!("blocked by policy: risk score {:.2} from the {} tier", d.risk_score, d.tier.as_str()),
    };
    ApiError::Blocked { message, decision: Box::new(serde_json::to_value(d).unwrap_or_default()) }
}
