//! tiergate as a reverse proxy: requests matching a `[[routes]]` entry are (optionally) screened
//! and forwarded to the route's app; the decision travels with the request as headers, a blocked
//! request never reaches the app, and streamed answers can be screened as they flow
//! ([`guard`]).
//!
//! Forwarding follows RFC 9110 / 9112 for intermediaries: hop-by-hop headers (those listed in
//! `Connection` and the fixed set of §7.6.1) are removed both ways; `Via`, `X-Forwarded-For`,
//! `-Proto` and `-Host` are added; bodies stream in both directions unless screening needs the
//! request body; the app's failures become 502 / 504 with a JSON body.

pub mod config;
pub mod guard;
pub mod layer;
pub mod normalize;
pub mod screen;

use crate::balance::{Balancer, BalancerConfig, Readmit};
use crate::config::ServerConfig;
use crate::decision::Decision;
use crate::error::{error_chain, ApiError};
use crate::gateway::Gateway;
use crate::metrics::RouteLabels;
use crate::policy::Action;
use bytes::Bytes;
use config::{Disposition, FailMode, ProxyConfig, RouteConfig, StreamGuardConfig};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, Uri, Version};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use screen::{Outgoing, Screen};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
/// Every body the proxy sends: a buffered JSON answer, or a streamed body of the client's or the
/// app's. A struct rather than an alias of `UnsyncBoxBody<Bytes, BoxError>`: with the boxed error's
/// trait-object lifetime visible in the type, rustc fails to prove futures holding it `Send`
/// (rust-lang/rust#110338).
pub struct BoxBody(UnsyncBoxBody<Bytes, BoxError>);

impl BoxBody {
    pub fn new<B>(body: B) -> BoxBody
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        BoxBody(body.map_err(Into::into).boxed_unsync())
    }
}

impl http_body::Body for BoxBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

/// The decision headers an app receives (RFC 6648 discourages `X-` for new standards; these are
/// private to a deployment and follow the `x-request-id` convention).
pub const ACTION_HEADER: &str = "x-tiergate-action";
pub const RISK_SCORE_HEADER: &str = "x-tiergate-risk-score";
pub const TIER_HEADER: &str = "x-tiergate-tier";
pub const POLICY_VERSION_HEADER: &str = "x-tiergate-policy-version";
pub const RULE_HEADER: &str = "x-tiergate-rule";
/// Why a fail-open route forwarded a request unscreened.
pub const SCREEN_ERROR_HEADER: &str = "x-tiergate-screen-error";

/// Hop-by-hop headers (RFC 9110 §7.6.1: `Connection`, `Proxy-Connection`, `Keep-Alive`, `TE`,
/// `Transfer-Encoding`, `Upgrade`), never forwarded as they are; plus `Proxy-Authorization` /
/// `Proxy-Authenticate`, which are for the proxy itself. `Transfer-Encoding` is re-framed by
/// each hop; `TE: trailers` is passed on (see [`prepare_request_headers`]); `Trailer` is
/// end-to-end and kept.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// The client's address, put in each request's extensions by the server.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Converts a buffered answer into the public listener's body type.
pub fn boxed(response: Response<Full<Bytes>>) -> Response<BoxBody> {
    response.map(BoxBody::new)
}

/// What `Host` the app gets.
#[derive(Debug, Clone)]
enum HostHeader {
    Preserve,
    Upstream,
    Literal(HeaderValue),
}

/// One address of an app.
#[derive(Debug, Clone)]
struct Upstream {
    scheme: Scheme,
    authority: Authority,
}

/// A compiled `[[routes]]` entry.
pub struct Route {
    pub name: String,
    host: Option<String>,
    path_prefix: Option<String>,
    path: Option<regex::Regex>,
    methods: Vec<Method>,
    upstreams: Vec<Upstream>,
    balancer: Balancer,
    http2: bool,
    host_header: HostHeader,
    response_header_timeout: Duration,
    body_idle_timeout: Duration,
    retries: u32,
    pub screen: Option<Screen>,
    guard: Option<StreamGuardConfig>,
}

impl Route {
    fn new(c: &RouteConfig, proxy: &ProxyConfig) -> Result<Route, String> {
        let named = |e: String| format!("route `{}`: {e}", c.name);
        if c.name.trim().is_empty() {
            return Err("every route needs a `name`".into());
        }
        if c.upstream.is_empty() {
            return Err(named("`upstream` must list at least one http:// base URL".into()));
        }
        let upstreams = c.upstream.iter().map(|u| parse_upstream(u).map_err(named)).collect::<Result<Vec<_>, _>>()?;
        if c.path.is_some() && c.path_prefix.is_some() {
            return Err(named("set `path` (a regex) or `path_prefix`, not both".into()));
        }
        let path = c
            .path
            .as_deref()
            .map(|p| regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| named(format!("`path` is not a regex: {e}"))))
            .transpose()?;
        if let Some(prefix) = &c.path_prefix {
            if !prefix.starts_with('/') {
                return Err(named(format!("`path_prefix` must start with `/`, got `{prefix}`")));
            }
        }
        let methods = c
            .methods
            .iter()
            .map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| named(format!("bad method `{m}`")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let host_header = match c.host_header.as_str() {
            "preserve" => HostHeader::Preserve,
            "upstream" => HostHeader::Upstream,
            literal => HostHeader::Literal(
                HeaderValue::from_str(literal)
                    .map_err(|_| named(format!("`host_header` `{literal}` is not a header value")))?,
            ),
        };
        for (field, v) in [
            ("response_header_timeout_ms", c.response_header_timeout_ms),
            ("body_idle_timeout_ms", c.body_idle_timeout_ms),
        ] {
            if v == 0 {
                return Err(named(format!("`{field}` must be at least 1")));
            }
        }
        if c.http2 && !matches!(host_header, HostHeader::Upstream) {
            return Err(named(
                "with `http2 = true` the app gets its own address as `:authority`; set `host_header = \"upstream\"` \
                 (the client's host is in X-Forwarded-Host)"
                    .into(),
            ));
        }
        let screen = c.screen.as_ref().map(Screen::new).transpose().map_err(named)?;
        if let Some(g) = &c.stream_guard {
            if g.enabled && (g.buffer_ms == 0 || g.window_bytes == 0 || g.cut_on.is_empty()) {
                return Err(named(
                    "`stream_guard` needs buffer_ms >= 1, window_bytes >= 1 and a non-empty cut_on".into(),
                ));
            }
        }
        let balancer = Balancer::new(
            upstreams.iter().map(|u| format!("{}://{}", u.scheme, u.authority)),
            BalancerConfig {
                eject_after_failures: proxy.eject_after_failures.max(1),
                eject: Duration::from_millis(proxy.eject_ms),
                decay_ms: 10_000.0,
                readmit: Readmit::AfterEject,
            },
        );
        Ok(Route {
            name: c.name.clone(),
            host: c.host.as_ref().map(|h| h.to_ascii_lowercase()),
            path_prefix: c.path_prefix.as_ref().map(|p| p.trim_end_matches('/').to_string()),
            path,
            methods,
            upstreams,
            balancer,
            http2: c.http2,
            host_header,
            response_header_timeout: Duration::from_millis(c.response_header_timeout_ms),
            body_idle_timeout: Duration::from_millis(c.body_idle_timeout_ms),
            retries: c.retries,
            screen,
            guard: c.stream_guard.clone().filter(|g| g.enabled),
        })
    }

    fn matches<B>(&self, req: &Request<B>) -> bool {
        if !self.methods.is_empty() && !self.methods.contains(req.method()) {
            return false;
        }
        let path = req.uri().path();
        if let Some(prefix) = &self.path_prefix {
            let at_boundary =
                path.strip_prefix(prefix.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
            if !at_boundary {
                return false;
            }
        }
        if self.path.as_ref().is_some_and(|re| !re.is_match(path)) {
            return false;
        }
        match &self.host {
            None => true,
            // `api.example.com.` (the fully qualified form) is the same host.
            Some(want) => request_host(req).is_some_and(|h| h.trim_end_matches('.').eq_ignore_ascii_case(want)),
        }
    }
}

/// The request's host without the port: the URI's authority (HTTP/2, absolute-form) or `Host`.
fn request_host<B>(req: &Request<B>) -> Option<&str> {
    let raw = match req.uri().authority() {
        Some(a) => a.as_str(),
        None => req.headers().get(header::HOST)?.to_str().ok()?,
    };
    // `[v6]:port`, `host:port`, `host`.
    Some(match raw.rfind(':') {
        Some(i) if !raw[i..].contains(']') => &raw[..i],
        _ => raw,
    })
}

fn parse_upstream(url: &str) -> Result<Upstream, String> {
    let uri: Uri = url.trim().parse().map_err(|e| format!("upstream `{url}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!("upstream `{url}`: scheme `{other}` is not supported (plain http to a local app)"))
        }
        None => return Err(format!("upstream `{url}` must start with http://")),
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty()) {
        return Err(format!("upstream `{url}` must be a base URL without a path (the request's path is kept)"));
    }
    let authority = uri.authority().cloned().ok_or_else(|| format!("upstream `{url}` has no host"))?;
    if authority.as_str().rsplit_once(':').is_some_and(|(_, p)| !p.ends_with(']')) && authority.port_u16().is_none() {
        return Err(format!("upstream `{url}`: the port is not a number from 1 to 65535"));
    }
    Ok(Upstream { scheme: Scheme::HTTP, authority })
}

/// Routes and the upstream clients.
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
        if config.connect_timeout_ms == 0 {
            return Err("`proxy.connect_timeout_ms` must be at least 1".into());
        }
        let mut names = std::collections::HashSet::new();
        if let Some(dup) = routes.iter().find(|r| !names.insert(r.name.as_str())) {
            return Err(format!("route name `{}` is used twice", dup.name));
        }
        let routes = routes.iter().map(|r| Route::new(r, config)).collect::<Result<Vec<_>, _>>()?;
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

    /// Screens (when the route says so) and forwards one request. Never fails: errors are
    /// responses, and every outcome is counted in `tiergate_proxy_requests_total{route, outcome}`.
    pub async fn handle(
        &self,
        gateway: &Gateway,
        limits: &ServerConfig,
        route: &Route,
        req: Request<Incoming>,
    ) -> Response<BoxBody> {
        let (parts, body) = req.into_parts();
        let Some(screen) = &route.screen else {
            return self.forward(gateway, route, parts, Outgoing::Stream(body), None).await;
        };
        let request_id = header_str(&parts.headers, "x-request-id").unwrap_or_default().to_string();
        let (outcome, outgoing) = screen::screen(gateway, limits, screen, &parts, body, request_id).await;
        match decide(gateway, &route.name, screen, outcome, matches!(outgoing, Outgoing::Broken)) {
            Next::Respond(response) => response,
            Next::Forward(screening) => self.forward(gateway, route, parts, outgoing, Some(&screening)).await,
        }
    }

    async fn forward(
        &self,
        gateway: &Gateway,
        route: &Route,
        mut parts: http::request::Parts,
        body: Outgoing<Incoming>,
        screened: Option<&Screening>,
    ) -> Response<BoxBody> {
        let original_host = request_host_header(&parts);
        prepare_request_headers(&mut parts, self.via.as_deref(), self.trust_forwarded, screened);
        if route.guard.is_some() {
            // The guard reads the app's text as it flows: ask for it uncompressed.
            parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        parts.version = if route.http2 { Version::HTTP_2 } else { Version::HTTP_11 };
        // A body we hold whole can be sent again; a streamed one only once.
        let replayable = match &body {
            Outgoing::Bytes(b) => Some(b.clone()),
            Outgoing::Stream(b) if http_body::Body::is_end_stream(b) => Some(Bytes::new()),
            _ => None,
        };
        let idempotent = matches!(
            parts.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
        );
        let mut body = Some(outgoing_body(body));
        let path_and_query = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
        let client = if route.http2 { &self.http2 } else { &self.http1 };
        let mut tried = None;
        let mut attempt = 0;
        loop {
            let pick = match route.balancer.pick(tried) {
                Ok(p) => p,
                Err(e) => {
                    count(gateway, &route.name, "upstream_error");
                    return boxed(
                        ApiError::BadGateway { route: route.name.clone(), reason: e.to_string() }.into_response(),
                    );
                }
            };
            tried = Some(pick.index);
            let upstream = &route.upstreams[pick.index];
            let mut request = Request::from_parts(parts.clone(), ());
            *request.uri_mut() = Uri::from_parts({
                let mut u = http::uri::Parts::default();
                u.scheme = Some(upstream.scheme.clone());
                u.authority = Some(upstream.authority.clone());
                u.path_and_query = Some(path_and_query.clone());
                u
            })
            .unwrap_or_default();
            let host = match &route.host_header {
                HostHeader::Preserve => original_host.clone(),
                HostHeader::Upstream => HeaderValue::from_str(upstream.authority.as_str()).ok(),
                HostHeader::Literal(v) => Some(v.clone()),
            };
            if let Some(host) = host {
                request.headers_mut().insert(header::HOST, host);
            }
            let body = match body.take() {
                Some(b) => b,
                None => replayable.clone().map(full).unwrap_or_else(empty),
            };
            let (body, mut upload) = Tracked::wrap(body, route.body_idle_timeout);
            let request = request.map(|()| body);
            let sent = Instant::now();
            // The response-head timeout runs from the end of the upload: a large or slow upload
            // is bounded by the body idle timeout instead, and is not the app's delay.
            let head_timeout = route.response_header_timeout;
            let result = tokio::select! {
                result = client.request(request) => Ok(result),
                _ = async {
                    let _ = upload.wait_for(|u| *u != Upload::Sending).await;
                    tokio::time::sleep(head_timeout).await;
                } => Err(()),
            };
            let upload = *upload.borrow();
            match result {
                Ok(Err(e)) if upload == Upload::Failed => {
                    // Not the app's fault: no failure recorded against its address.
                    let reason = error_chain(&e);
                    tracing::info!(route = %route.name, error = %reason, "the client's request body failed");
                    count(gateway, &route.name, "client_error");
                    return boxed(ApiError::BodyRead(client_body_error(&reason)).into_response());
                }
                Ok(Ok(response)) => {
                    let status = response.status();
                    gateway
                        .metrics
                        .proxy_upstream_latency
                        .get_or_create(&RouteLabels { route: route.name.clone(), outcome: status_class(status) })
                        .observe(sent.elapsed().as_secs_f64());
                    // The app answering 502-504 is the app (or what is behind it) failing.
                    pick.record(!matches!(status.as_u16(), 502..=504));
                    count(
                        gateway,
                        &route.name,
                        match screened {
                            Some(Screening::Failed(_)) => "unscreened",
                            _ => "forwarded",
                        },
                    );
                    let head = parts.method == Method::HEAD;
                    return self.prepare_response(gateway, route, response, screened, head);
                }
                Ok(Err(e)) => {
                    pick.record(false);
                    let reason = error_chain(&e);
                    if e.is_connect() && idempotent && replayable.is_some() && attempt < route.retries {
                        tracing::debug!(route = %route.name, upstream = %pick.url(), error = %reason, "connect failed; retrying on another address");
                        attempt += 1;
                        continue;
                    }
                    tracing::warn!(route = %route.name, upstream = %pick.url(), error = %reason, "upstream request failed");
                    count(gateway, &route.name, "upstream_error");
                    // The details (addresses, errors) go to the log, not to the client.
                    let reason = if e.is_connect() {
                        "could not connect to the app"
                    } else {
                        "the app closed the connection or sent an invalid response"
                    };
                    return boxed(
                        ApiError::BadGateway { route: route.name.clone(), reason: reason.into() }.into_response(),
                    );
                }
                Err(()) => {
                    pick.record(false);
                    count(gateway, &route.name, "upstream_timeout");
                    let timeout_ms = route.response_header_timeout.as_millis() as u64;
                    tracing::warn!(route = %route.name, upstream = %pick.url(), timeout_ms, "upstream sent no response head in time");
                    return boxed(ApiError::GatewayTimeout { route: route.name.clone(), timeout_ms }.into_response());
                }
            }
        }
    }

    fn prepare_response(
        &self,
        gateway: &Gateway,
        route: &Route,
        response: Response<Incoming>,
        screened: Option<&Screening>,
        head: bool,
    ) -> Response<BoxBody> {
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(via) = &self.via {
            append_via(&mut parts.headers, parts.version, via);
        }
        if let Some(Screening::Decided(d)) = screened {
            // The client sees the decision too (the app may also act on it).
            parts.headers.insert(ACTION_HEADER, HeaderValue::from_static(d.action.as_str()));
        }
        let body = BoxBody::new(IdleTimeout::new(body, route.body_idle_timeout, "the app's response body"));
        let body = match &route.guard {
            // A HEAD response has no body to read, and keeps its Content-Length.
            Some(guard) if !head && guard::applies(&parts.headers) => {
                // The guard may end the stream early: the app's length no longer holds.
                parts.headers.remove(header::CONTENT_LENGTH);
                let policy = route.screen.as_ref().and_then(|s| s.config.policy.as_deref());
                guard::spawn(
                    gateway.policy_store(policy).snapshot(),
                    gateway.metrics.stream_guard.clone(),
                    route.name.clone(),
                    guard.clone(),
                    &parts.headers,
                    body,
                )
            }
            Some(_) if guard::encoded(&parts.headers) => {
                // Asked for identity coding and got a compressed body anyway: it passes unread.
                tracing::warn!(route = %route.name, "compressed response on a guarded route; not screened");
                let labels = RouteLabels { route: route.name.clone(), outcome: "unreadable" };
                gateway.metrics.stream_guard.get_or_create(&labels).inc();
                body
            }
            _ => body,
        };
        Response::from_parts(parts, body)
    }
}

/// Counts one proxied request in `tiergate_proxy_requests_total{route, outcome}`.
fn count(gateway: &Gateway, route: &str, outcome: &'static str) {
    gateway.metrics.proxy_requests.get_or_create(&RouteLabels { route: route.to_string(), outcome }).inc();
}

fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// What screening concluded, when the request goes on to the app.
pub enum Screening {
    Decided(Decision),
    /// Fail-open: screening could not run, for this reason.
    Failed(String),
}

/// What happens after screening.
pub(crate) enum Next {
    /// Blocked (403 with the decision) or refused (fail-closed: the screening error).
    Respond(Response<BoxBody>),
    Forward(Screening),
}

/// Applies a route's action mapping and failure mode to a screening outcome; logs and counts
/// what is not forwarded (`tiergate_proxy_requests_total{route, outcome="blocked"|"refused"}`).
/// `broken`: the body could not be read, so the request cannot be forwarded in any mode.
pub(crate) fn decide(
    gateway: &Gateway,
    route: &str,
    screen: &Screen,
    outcome: Result<Decision, ApiError>,
    broken: bool,
) -> Next {
    let count = |outcome| count(gateway, route, outcome);
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
                return Next::Respond(boxed(ApiError::Blocked(Box::new(decision)).into_response()));
            }
            Next::Forward(Screening::Decided(decision))
        }
        Err(e) if screen.config.on_error == FailMode::Closed || broken => {
            tracing::warn!(route, error = %e, "screening failed; request refused");
            count("refused");
            Next::Respond(boxed(e.into_response()))
        }
        Err(e) => {
            tracing::warn!(route, error = %e, "screening failed; forwarded unscreened (fail-open)");
            Next::Forward(Screening::Failed(e.to_string()))
        }
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The client's `Host`, or the HTTP/2 `:authority` as one.
fn request_host_header(parts: &http::request::Parts) -> Option<HeaderValue> {
    parts
        .headers
        .get(header::HOST)
        .cloned()
        .or_else(|| parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()))
}

/// Removes hop-by-hop headers, including those the `Connection` header names (RFC 9110 §7.6.1).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in listed.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// Removes every client-sent `x-tiergate-*` header: an app must be able to trust the decision
/// headers it receives.
pub(crate) fn strip_forged(headers: &mut HeaderMap) {
    // `x_tiergate_action` too: some servers (CGI/WSGI) read `_` and `-` as the same.
    let forged: Vec<HeaderName> =
        headers.keys().filter(|k| k.as_str().replace('_', "-").starts_with("x-tiergate-")).cloned().collect();
    for name in forged {
        headers.remove(name);
    }
}

/// `Via: 1.1 tiergate` appended to what earlier hops wrote (RFC 9110 §7.6.3).
fn append_via(headers: &mut HeaderMap, version: Version, pseudonym: &str) {
    let protocol = match version {
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    };
    if let Ok(v) = HeaderValue::from_str(&format!("{protocol} {pseudonym}")) {
        headers.append(header::VIA, v);
    }
}

/// The request as the app gets it: hop-by-hop headers out, any client-sent `x-tiergate-*`
/// out (a client must not be able to forge a decision), forwarding headers and the decision in.
fn prepare_request_headers(
    parts: &mut http::request::Parts,
    via: Option<&str>,
    trust_forwarded: bool,
    screened: Option<&Screening>,
) {
    let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0.ip());
    let host = request_host_header(parts);
    let headers = &mut parts.headers;
    // The client can take trailers: the app may send them (gRPC needs this on HTTP/2).
    let te_trailers = headers.get_all(header::TE).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    strip_hop_by_hop(headers);
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    strip_forged(headers);
    // A single Host; for HTTP/2 clients the authority is set per attempt.
    headers.remove(header::HOST);
    if let Some(ip) = peer {
        // Every earlier line, in order, then the client's address (as nginx's
        // `$proxy_add_x_forwarded_for`); the app decides how many hops it trusts.
        let mut chain: Vec<String> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        chain.push(ip.to_string());
        if let Ok(v) = HeaderValue::from_str(&chain.join(", ")) {
            headers.insert("x-forwarded-for", v);
        }
    }
    // A client could claim any scheme or host: only a trusted front proxy (a TLS terminator)
    // may set these, and then it knows better than tiergate.
    let keep = |headers: &HeaderMap, name: &str| trust_forwarded && headers.contains_key(name);
    if !keep(headers, "x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
    if !keep(headers, "x-forwarded-host") {
        match host {
            Some(host) => headers.insert("x-forwarded-host", host),
            None => headers.remove("x-forwarded-host"),
        };
    }
    if let Some(via) = via {
        append_via(headers, parts.version, via);
    }
    if let Some(screened) = screened {
        set_decision_headers(headers, screened);
    }
}

/// The decision headers (`x-tiergate-action`, `-risk-score`, `-tier`, `-policy-version`, `-rule`),
/// or for a fail-open request `x-tiergate-action: unscreened` and `x-tiergate-screen-error`.
pub(crate) fn set_decision_headers(headers: &mut HeaderMap, screened: &Screening) {
    match screened {
        Screening::Decided(d) => {
            headers.insert(ACTION_HEADER, HeaderValue::from_static(d.action.as_str()));
            headers.insert(TIER_HEADER, HeaderValue::from_static(d.tier.as_str()));
            for (name, value) in
                [(RISK_SCORE_HEADER, format!("{:.4}", d.risk_score)), (POLICY_VERSION_HEADER, d.policy_version.clone())]
            {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    headers.insert(name, v);
                }
            }
            if let Some(rule) = d.rule.as_deref().and_then(|r| HeaderValue::from_str(r).ok()) {
                headers.insert(RULE_HEADER, rule);
            }
        }
        Screening::Failed(reason) => {
            headers.insert(ACTION_HEADER, HeaderValue::from_static("unscreened"));
            let printable: String =
                reason.chars().filter(|c| c.is_ascii() && !c.is_ascii_control()).take(200).collect();
            if let Ok(v) = HeaderValue::from_str(&printable) {
                headers.insert(SCREEN_ERROR_HEADER, v);
            }
        }
    }
}

fn full(bytes: Bytes) -> BoxBody {
    BoxBody::new(Full::new(bytes))
}

fn empty() -> BoxBody {
    BoxBody::new(Empty::new())
}

pub(crate) fn outgoing_body<B>(body: Outgoing<B>) -> BoxBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    match body {
        Outgoing::Bytes(b) => full(b),
        Outgoing::Stream(b) => BoxBody::new(b),
        Outgoing::Partial(prefix, rest) => {
            let head = futures_util::stream::once(async move { Ok::<_, BoxError>(hyper::body::Frame::data(prefix)) });
            let tail = http_body_util::BodyStream::new(rest.map_err(Into::into));
            BoxBody::new(StreamBody::new(futures_util::StreamExt::chain(head, tail)))
        }
        Outgoing::Broken => empty(),
    }
}

/// What a client is told about its own broken body: the innermost cause (hyper's outer layers
/// name the app-side request, which is not the client's business).
fn client_body_error(chain: &str) -> String {
    chain.rsplit(": ").next().unwrap_or(chain).to_string()
}

/// A body that fails when no frame arrives for `limit`: an app that stalls mid-response, or a
/// client that stalls mid-upload, ends the stream with an error instead of holding it open.
struct IdleTimeout<B> {
    inner: B,
    limit: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Whose body, for the error: "the app's response body", "the client's request body".
    whose: &'static str,
}

impl<B> IdleTimeout<B> {
    fn new(inner: B, limit: Duration, whose: &'static str) -> Self {
        IdleTimeout { inner, limit, sleep: Box::pin(tokio::time::sleep(limit)), whose }
    }
}

impl<B> http_body::Body for IdleTimeout<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let deadline = tokio::time::Instant::now() + this.limit;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let message = format!("{} sent nothing for {} ms", this.whose, this.limit.as_millis());
                    Poll::Ready(Some(Err(message.into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

use std::future::Future;

/// Where a request body stands on its way to the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upload {
    Sending,
    /// Sent whole: from now on, waiting is the app's doing.
    Sent,
    /// The client's body failed (broken framing, reset, stalled): the client's doing.
    Failed,
}

/// The request body as the app gets it: idle-limited, and reporting its [`Upload`] state, so
/// that the response-head timeout starts once the body is sent and a client's broken upload is
/// not counted against the app.
struct Tracked {
    inner: IdleTimeout<BoxBody>,
    state: tokio::sync::watch::Sender<Upload>,
}

impl Tracked {
    /// The body to send and its upload state. A body that is already complete (none, or one
    /// held whole) is sent as it is: it cannot stall, and it counts as sent from the start.
    fn wrap(body: BoxBody, idle: Duration) -> (BoxBody, tokio::sync::watch::Receiver<Upload>) {
        if http_body::Body::is_end_stream(&body) {
            return (body, tokio::sync::watch::channel(Upload::Sent).1);
        }
        let (state, watch) = tokio::sync::watch::channel(Upload::Sending);
        (BoxBody::new(Tracked { inner: IdleTimeout::new(body, idle, "the client's request body"), state }), watch)
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                this.state.send_replace(Upload::Sent);
            }
            Poll::Ready(Some(Err(_))) => {
                this.state.send_replace(Upload::Failed);
            }
            // hyper stops polling a body that says it has ended.
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => {
                this.state.send_replace(Upload::Sent);
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_listed_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);
    }

    #[test]
    fn route_matching() {
        let config: RouteConfig = toml::from_str(
            r#"name = "r"
            upstream = ["http://127.0.0.1:1"]
            host = "API.example.com"
            path_prefix = "/v1/"
            methods = ["post"]"#,
        )
        .unwrap();
        let route = Route::new(&config, &ProxyConfig::default()).unwrap();
        let req = |method: &str, uri: &str, host: &str| {
            Request::builder().method(method).uri(uri).header("host", host).body(()).unwrap()
        };
        assert!(route.matches(&req("POST", "/v1/chat", "api.example.com:8080")));
        assert!(route.matches(&req("POST", "/v1", "api.example.com")));
        assert!(!route.matches(&req("POST", "/v10", "api.example.com")), "prefix at a segment boundary");
        assert!(!route.matches(&req("GET", "/v1/chat", "api.example.com")));
        assert!(!route.matches(&req("POST", "/v1/chat", "other.example.com")));
        let bad = |extra: &str| {
            let c: RouteConfig = toml::from_str(&format!("name = \"r\"\n{extra}")).unwrap();
            Route::new(&c, &ProxyConfig::default()).err().unwrap()
        };
        assert!(bad(r#"upstream = ["https://x"]"#).contains("scheme `https`"));
        assert!(bad(r#"upstream = ["http://x/app"]"#).contains("without a path"));
        assert!(bad("upstream = []").contains("at least one"));
        assert!(bad("upstream = [\"http://x\"]\npath = \"(\"").contains("not a regex"));
    }
}
