//! Route matching phase: a compiled `[[routes]]` entry (its app addresses, timeouts, screening
//! and stream guard) and whether a request matches it (method, normalised path, host).

use super::config::{ProxyConfig, RouteConfig, StreamGuardConfig};
use super::screen::Screen;
use crate::balance::{Balancer, BalancerConfig, Readmit};
use http::header::{self, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Method, Request, Uri};
use std::time::Duration;

/// What `Host` the app gets (`host_header`: `"preserve"`, `"upstream"`, or a literal).
#[derive(Debug, Clone)]
pub(super) enum HostHeader {
    Preserve,
    /// The app address's own authority (config value `"upstream"`).
    App,
    Literal(HeaderValue),
}

impl HostHeader {
    fn parse(value: &str) -> Result<HostHeader, String> {
        Ok(match value {
            "preserve" => HostHeader::Preserve,
            "upstream" => HostHeader::App,
            literal => HostHeader::Literal(
                HeaderValue::from_str(literal)
                    .map_err(|_| format!("`host_header` `{literal}` is not a header value"))?,
            ),
        })
    }
}

/// Timeouts, the HTTP/2 `Host` rule and the stream guard's settings.
fn check_limits(c: &RouteConfig) -> Result<(), String> {
    for (field, v) in [
        ("request_timeout_ms", c.request_timeout_ms),
        ("response_header_timeout_ms", c.response_header_timeout_ms),
        ("body_idle_timeout_ms", c.body_idle_timeout_ms),
    ] {
        if v == 0 {
            return Err(format!("`{field}` must be at least 1"));
        }
    }
    if c.http2 && c.host_header != "upstream" {
        return Err(
            "with `http2 = true` the app gets its own address as `:authority`; set `host_header = \"upstream\"` \
             (the client's host is in X-Forwarded-Host)"
                .into(),
        );
    }
    if let Some(g) = c.stream_guard.as_ref().filter(|g| g.enabled) {
        if g.buffer_ms == 0 || g.window_bytes == 0 || g.cut_on.is_empty() {
            return Err("`stream_guard` needs buffer_ms >= 1, window_bytes >= 1 and a non-empty cut_on".into());
        }
    }
    Ok(())
}

/// One address of an app (a `[[routes]] upstream` entry).
#[derive(Debug, Clone)]
pub(super) struct AppAddr {
    pub(super) scheme: Scheme,
    pub(super) authority: Authority,
}

/// A compiled `[[routes]]` entry.
pub struct Route {
    pub name: String,
    host: Option<String>,
    path_prefix: Option<String>,
    path: Option<regex::Regex>,
    methods: Vec<Method>,
    pub(super) apps: Vec<AppAddr>,
    pub(super) balancer: Balancer,
    pub(super) http2: bool,
    pub(super) host_header: HostHeader,
    pub(super) request_timeout: Duration,
    pub(super) response_header_timeout: Duration,
    pub(super) body_idle_timeout: Duration,
    pub(super) retries: u32,
    pub screen: Option<Screen>,
    pub(super) stream_guard: Option<StreamGuardConfig>,
    /// Answers 403 and forwards nothing (`refuse = true`).
    pub(super) refuse: bool,
}

impl Route {
    /// Compiles a route; errors name the route and the field.
    pub(super) fn new(c: &RouteConfig, proxy: &ProxyConfig) -> Result<Route, String> {
        let named = |e: String| format!("route `{}`: {e}", c.name);
        if c.name.trim().is_empty() {
            return Err("every route needs a `name`".into());
        }
        if c.refuse && (!c.upstream.is_empty() || c.screen.is_some() || c.stream_guard.is_some()) {
            return Err(named(
                "`refuse = true` forwards nothing: remove `upstream`, `screen` and `stream_guard`".into(),
            ));
        }
        if c.upstream.is_empty() && !c.refuse {
            return Err(named("`upstream` must list at least one http:// base URL (or set `refuse = true`)".into()));
        }
        let apps = c.upstream.iter().map(|u| parse_app(u).map_err(named)).collect::<Result<Vec<_>, _>>()?;
        if c.path.is_some() && c.path_prefix.is_some() {
            return Err(named("set `path` (a regex) or `path_prefix`, not both".into()));
        }
        let path = c
            .path
            .as_deref()
            .map(|p| {
                // Case-insensitive, as `path_prefix` (see `matches`).
                let re = regex::RegexBuilder::new(&format!("^(?:{p})$")).case_insensitive(true).build();
                re.map_err(|e| named(format!("`path` is not a regex: {e}")))
            })
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
        let host_header = HostHeader::parse(&c.host_header).map_err(named)?;
        check_limits(c).map_err(named)?;
        let screen = c.screen.as_ref().map(Screen::new).transpose().map_err(named)?;
        let balancer = Balancer::new(
            apps.iter().map(|u| format!("{}://{}", u.scheme, u.authority)),
            BalancerConfig {
                eject_after_failures: proxy.eject_after_failures.max(1),
                eject: Duration::from_millis(proxy.eject_ms),
                decay_ms: 10_000.0,
                readmit: Readmit::AfterEject,
                panic_threshold: proxy.panic_threshold.clamp(0.0, 1.0),
            },
        );
        Ok(Route {
            name: c.name.clone(),
            host: c.host.as_ref().map(|h| h.to_ascii_lowercase()),
            path_prefix: c.path_prefix.as_ref().map(|p| p.trim_end_matches('/').to_string()),
            path,
            methods,
            apps,
            balancer,
            http2: c.http2,
            host_header,
            request_timeout: Duration::from_millis(c.request_timeout_ms),
            response_header_timeout: Duration::from_millis(c.response_header_timeout_ms),
            body_idle_timeout: Duration::from_millis(c.body_idle_timeout_ms),
            retries: c.retries,
            screen,
            refuse: c.refuse,
            stream_guard: c.stream_guard.clone().filter(|g| g.enabled),
        })
    }

    pub(super) fn matches<B>(&self, req: &Request<B>) -> bool {
        if !self.methods.is_empty() && !self.methods.contains(req.method()) {
            return false;
        }
        // Paths match ignoring ASCII case: apps that route case-insensitively (ASP.NET, IIS) read
        // `/V1/Chat` as `/v1/chat`, so a case variant must meet the same route (see `normalize`).
        let path = req.uri().path();
        if self.path_prefix.as_deref().is_some_and(|prefix| !has_prefix_ignoring_case(path, prefix)) {
            return false;
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

/// `path` starts with `prefix` (ASCII case ignored) at a segment boundary: `/v1` is a prefix of
/// `/V1/chat` and `/v1`, not of `/v10`.
fn has_prefix_ignoring_case(path: &str, prefix: &str) -> bool {
    let (path, prefix) = (path.as_bytes(), prefix.as_bytes());
    path.get(..prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(prefix))
        && matches!(path.get(prefix.len()), None | Some(b'/'))
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

fn parse_app(url: &str) -> Result<AppAddr, String> {
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
    Ok(AppAddr { scheme: Scheme::HTTP, authority })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(route.matches(&req("POST", "/V1/Chat", "api.example.com")), "case variants match");
        assert!(!route.matches(&req("POST", "/V10", "api.example.com")));
        let bad = |extra: &str| {
            let c: RouteConfig = toml::from_str(&format!("name = \"r\"\n{extra}")).unwrap();
            Route::new(&c, &ProxyConfig::default()).err().unwrap()
        };
        assert!(bad(r#"upstream = ["https://x"]"#).contains("scheme `https`"));
        assert!(bad(r#"upstream = ["http://x/app"]"#).contains("without a path"));
        assert!(bad("upstream = []").contains("at least one"));
        assert!(bad("upstream = [\"http://x\"]\npath = \"(\"").contains("not a regex"));
        assert!(bad("refuse = true\nupstream = [\"http://x\"]").contains("forwards nothing"));
        assert!(bad("refuse = true\n[screen]\ntext = [\"/text\"]").contains("forwards nothing"));
        let refusing: RouteConfig = toml::from_str("name = \"r\"\nrefuse = true\nmethods = [\"POST\"]").unwrap();
        let route = Route::new(&refusing, &ProxyConfig::default()).unwrap();
        assert!(route.refuse && route.matches(&req("POST", "/anything", "h")) && !route.matches(&req("GET", "/", "h")));
    }

    #[test]
    fn paths_match_ignoring_ascii_case() {
        let route = |extra: &str| {
            let c: RouteConfig =
                toml::from_str(&format!("name = \"r\"\nupstream = [\"http://x:1\"]\n{extra}")).unwrap();
            Route::new(&c, &ProxyConfig::default()).unwrap()
        };
        let req = |uri: &str| Request::post(uri).header("host", "h").body(()).unwrap();
        let prefix = route("path_prefix = \"/Echo/chat/\"");
        for uri in ["/echo/chat", "/ECHO/CHAT/x", "/eCho/Chat"] {
            assert!(prefix.matches(&req(uri)), "{uri}");
        }
        for uri in ["/echo/chats", "/echo", "/", "/x/echo/chat"] {
            assert!(!prefix.matches(&req(uri)), "{uri}");
        }
        let regex = route("path = \"/v1/(chat|embed)/[a-z]+\"");
        for uri in ["/v1/chat/completions", "/V1/CHAT/Completions", "/v1/Embed/x"] {
            assert!(regex.matches(&req(uri)), "{uri}");
        }
        assert!(!regex.matches(&req("/v1/chat/x/y")), "still anchored");
        assert!(!regex.matches(&req("/x/v1/chat/y")), "still anchored");
        assert!(has_prefix_ignoring_case("/é", "") && !has_prefix_ignoring_case("/", "/é"), "bytes, no char boundary");
    }
}
