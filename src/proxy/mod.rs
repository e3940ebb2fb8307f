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
//! One file per phase: [`route`] (matching), [`pipeline`] (the phases of screening, in order,
//! shared by the routes and the Layer: [`screen`] reads the text, then decide, record, dispose),
//! [`headers`] (header rules both ways), `forward` (the request to the app and its response),
//! [`guard`] (screening the app's stream), [`normalize`] (one spelling of path and host), and
//! [`layer`] (the same screening as a tower Layer in front of any service). Every file reaches
//! the gateway through [`port`]. Handlers return `Result<_, ApiError>`; each front door turns
//! errors into responses once.

pub mod config;
mod forward;
pub mod headers;
pub mod layer;
pub mod normalize;
pub mod pipeline;
pub mod port;
pub mod route;
pub mod screen;
pub mod stream_guard;

use crate::error::ApiError;
use crate::web::{headers as names, BoxBody, ServerConfig};
use config::{ProxyConfig, RouteConfig};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use pipeline::Door;
pub use pipeline::Screening;
pub use port::{Handled, Port};
pub use route::Route;
use screen::Outgoing;
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
    /// One pair of clients (HTTP/1.1, HTTP/2) per runtime thread, each with its own pool: an app
    /// connection is driven by a task that stays, as a rule, on the thread that opened it, so a
    /// shared pool hands a request one thread's connection from another and wakes that thread
    /// for it. Per thread, the pass-through's added p99 went from +0.17-0.38 to +0.17-0.27 ms at
    /// 500-4,000 requests/s (docs/BENCHMARKS.md, "Proxy pass-through: a pool per thread").
    clients: thread_local::ThreadLocal<Clients>,
    connector: HttpConnector,
    pool_idle_timeout: Duration,
    pool_max_idle_per_host: usize,
    via: Option<String>,
    trust_forwarded: bool,
}

/// One thread's clients to the apps.
struct Clients {
    http1: Client<HttpConnector, BoxBody>,
    http2: Client<HttpConnector, BoxBody>,
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
        let via = (!config.via.trim().is_empty()).then(|| config.via.trim().to_string());
        Ok(Some(Proxy {
            routes,
            clients: thread_local::ThreadLocal::new(),
            connector,
            pool_idle_timeout: Duration::from_millis(config.pool_idle_timeout_ms),
            pool_max_idle_per_host: config.pool_max_idle_per_host,
            via,
            trust_forwarded: config.trust_forwarded_headers,
        }))
    }

    /// The calling thread's client for `route` (built on first use).
    fn client(&self, route: &Route) -> &Client<HttpConnector, BoxBody> {
        let clients = self.clients.get_or(|| {
            let client = |http2: bool| {
                Client::builder(TokioExecutor::new())
                    .pool_timer(TokioTimer::new())
                    .timer(TokioTimer::new())
                    .pool_idle_timeout(self.pool_idle_timeout)
                    .pool_max_idle_per_host(self.pool_max_idle_per_host)
                    .http2_only(http2)
                    .build(self.connector.clone())
            };
            Clients { http1: client(false), http2: client(true) }
        });
        if route.http2 {
            &clients.http2
        } else {
            &clients.http1
        }
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
        port: &Port,
        server: &ServerConfig,
        route: &Route,
        req: Request<Incoming>,
    ) -> Result<Response<BoxBody>, ApiError> {
        let work = async {
            if route.refuse {
                port.count(&route.name, Handled::Refused);
                let (method, path) = (req.method().to_string(), req.uri().path().to_string());
                tracing::info!(route = %route.name, %method, %path, "refused: the path is not screened");
                return Err(ApiError::Unscreened { route: route.name.clone(), method, path });
            }
            let (parts, body) = req.into_parts();
            let Some(screen) = &route.screen else {
                return self.forward(port, route, parts, Outgoing::Stream(body), None).await;
            };
            let request_id = headers::header_str(&parts.headers, names::REQUEST_ID).unwrap_or_default().to_string();
            let door = Door { port, name: &route.name, screen, server };
            let (screening, outgoing) = pipeline::screen(&door, &parts, body, &request_id).await?;
            self.forward(port, route, parts, outgoing, Some(&screening)).await
        };
        tokio::time::timeout(route.request_timeout, work).await.unwrap_or_else(|_| {
            port.count(&route.name, Handled::RequestTimeout);
            let timeout_ms = route.request_timeout.as_millis() as u64;
            tracing::warn!(route = %route.name, timeout_ms, "request not done within the route's request_timeout_ms");
            Err(ApiError::Timeout { timeout_ms })
        })
    }
}
