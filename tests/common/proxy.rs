//! One app and one tiergate in front of it, shared by the proxy tests of a test binary, and the
//! helpers they use (a raw HTTP/1 client for requests a well-behaved client cannot send).

use super::app::{self, AppHandle};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;
use tiergate::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[allow(unused_imports)] // for the proxy tests, which glob-import this module
pub use super::{BENIGN, PHISHING};

/// A tiergate in front of an app, shared by the tests of a binary ([`shared`]).
pub struct Setup {
    pub proxy: SocketAddr,
    /// The admin listener: `/metrics` there (the catch-all route sends the public one to the app).
    pub admin: SocketAddr,
    pub app: AppHandle,
}

/// An app and one tiergate in front of it, configured by `config` (given the app), started in
/// `cell` (a static of the test binary) by the first test that asks and shared by the rest.
pub fn shared(cell: &'static OnceLock<Setup>, config: impl FnOnce(&AppHandle) -> Config) -> &'static Setup {
    cell.get_or_init(|| {
        let app = app::start();
        let (proxy, admin, _) = super::start_with_admin(config(&app), Default::default(), None);
        Setup { proxy, admin, app }
    })
}

/// One app and one tiergate in front of it with the bundled policies and the routes of
/// `proxy_routes.toml`, started by the first test of the binary that asks.
pub fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    shared(&SETUP, |app| {
        // A route policy under which every model verdict is at least `review`.
        let review_policy = super::reviewing_policies("proxy-review");
        let routes = include_str!("proxy_routes.toml")
            .replace("{app}", &app.url())
            .replace("{dead}", &dead_address())
            .replace("{review_policy}", &review_policy.display().to_string());
        let mut config = super::config_with_routes(&super::repo().join("policies"), &routes);
        config.server.request_timeout_ms = 1000;
        config.server.header_read_timeout_ms = 500;
        config
    })
}

/// An address nothing listens on (bound, then released).
pub fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

pub fn chat(text: &str) -> String {
    json!({"user": "u-17", "messages": [{"role": "system", "content": "be nice"}, {"role": "user", "content": text}]})
        .to_string()
}

pub fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> &'a str {
    headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
}

pub async fn post_json(addr: SocketAddr, path: &str, body: String, extra: &[(&str, &str)]) -> super::Reply {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend_from_slice(extra);
    super::send(addr, "POST", path, &headers, body).await
}

/// Sends raw bytes, returns the status code of the first response: 0 when the server closed the
/// connection without one, `None` when it neither answered nor closed within `read_for`.
pub async fn raw(addr: SocketAddr, request: &[u8], read_for: Duration) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let ended = tokio::time::timeout(read_for, async {
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let head = String::from_utf8_lossy(&buf);
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    match (status, ended) {
        (Some(status), _) => Some(status),
        (None, Ok(())) => Some(0),
        (None, Err(_)) => None,
    }
}
