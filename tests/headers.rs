//! Headers through the proxy, from raw sockets (so that every line is the client's own): a
//! `Connection` list cannot strip what tiergate screened and audited, tiergate's own credentials
//! (its API keys, the trusted tenant header) never reach the app, and identity headers sent
//! twice are refused with 400 naming the header.

mod common;

use common::app::{self, AppHandle};
use common::proxy::{Setup, BENIGN};
use common::routes::{route, screened_route};
use serde_json::{json, Value};
use sha2::Digest;
use std::net::SocketAddr;
use std::sync::OnceLock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// tiergate's API key of tenant `payments`; `app-key` is the app's own.
const OWN_KEY: &str = "tg-secret";

/// An app behind a screened route (`/echo/chat`) and an unscreened one (`/echo/plain`), with an
/// API key and a trusted header configured.
fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    common::proxy::shared(&SETUP, |app| {
        let key_hash: String = sha2::Sha256::digest(OWN_KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let toml = format!(
            r#"
            [tenants]
            trusted_header = "x-client-tenant"
            [tenants.api_keys]
            "{key_hash}" = "payments"
            [tenants.known]
            payments = "default"
            {chat}{plain}"#,
            chat = screened_route("chat", "/echo/chat", &app.url(), &[]),
            plain = route("plain", "/echo/plain", &app.url()),
        );
        let mut config = common::config_with_routes(&common::repo().join("policies"), &toml);
        config.tenants = tiergate::Config::parse(&toml).unwrap().tenants;
        config
    })
}

/// Sends `POST path` with `body` and the given header lines (as written, repeated ones too) and
/// `Connection: close`; the status and the body of the answer.
async fn raw_post(addr: SocketAddr, path: &str, lines: &[&str], body: &str) -> (u16, String) {
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: app.example\r\nContent-Length: {}\r\n", body.len());
    for line in lines {
        head.push_str(line);
        head.push_str("\r\n");
    }
    if !lines.iter().any(|l| l.to_ascii_lowercase().starts_with("connection:")) {
        head.push_str("Connection: close\r\n");
    }
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(format!("{head}\r\n{body}").as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(20), stream.read_to_end(&mut reply))
        .await
        .expect("answered and closed")
        .unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let status = reply.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status: {reply:?}"));
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// The request the app saw with this `x-marker` header.
fn seen(app: &AppHandle, marker: &str) -> Option<app::Seen> {
    app.requests().into_iter().find(|r| r.headers.get("x-marker").is_some_and(|v| v == marker))
}

fn chat(text: &str) -> String {
    json!({ "text": text }).to_string()
}

#[tokio::test]
async fn a_connection_list_cannot_strip_the_request_id_or_the_content_type() {
    let s = setup();
    let lines = [
        "Content-Type: application/json",
        "X-Request-Id: audit-me-1",
        "X-Hop: only for the next hop",
        "X-Marker: connection-list",
        "Connection: close, x-request-id, content-type, x-hop",
    ];
    let (status, body) = raw_post(s.proxy, "/echo/chat", &lines, &chat(BENIGN)).await;
    assert_eq!(status, 200, "{body}");
    let seen = seen(&s.app, "connection-list").expect("forwarded");
    let header = |name: &str| seen.headers.get(name).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(header("x-request-id").as_deref(), Some("audit-me-1"), "the id tiergate audited reaches the app");
    assert_eq!(header("content-type").as_deref(), Some("application/json"), "the type tiergate screened");
    assert_eq!(header("x-tiergate-action").as_deref(), Some("allow"));
    assert_eq!(header("x-hop"), None, "any other listed name is removed, as RFC 9110 §7.6.1 says");
}

#[tokio::test]
async fn tiergates_own_credentials_never_reach_the_app() {
    let s = setup();
    for (path, marker) in [("/echo/chat", "own-screened"), ("/echo/plain", "own-plain")] {
        let marker_line = format!("X-Marker: {marker}");
        let key_line = format!("X-Api-Key: {OWN_KEY}");
        let lines = ["Content-Type: application/json", &marker_line, &key_line, "X-Client-Tenant: payments"];
        let (status, body) = raw_post(s.proxy, path, &lines, &chat(BENIGN)).await;
        assert_eq!(status, 200, "{path}: {body}");
        let seen = seen(&s.app, marker).expect("forwarded");
        assert!(seen.headers.get("x-api-key").is_none(), "{path}: tiergate's key reached the app");
        assert!(seen.headers.get("x-client-tenant").is_none(), "{path}: the trusted header reached the app");
    }
    // A bearer token that is tiergate's is removed too; the app's own keys are the app's.
    let bearer = format!("Authorization: Bearer {OWN_KEY}");
    let lines = ["Content-Type: application/json", "X-Marker: own-bearer", &bearer];
    assert_eq!(raw_post(s.proxy, "/echo/chat", &lines, &chat(BENIGN)).await.0, 200);
    assert!(seen(&s.app, "own-bearer").unwrap().headers.get("authorization").is_none());
    let lines =
        ["Content-Type: application/json", "X-Marker: app-keys", "Authorization: Bearer app-key", "X-Api-Key: app-key"];
    assert_eq!(raw_post(s.proxy, "/echo/chat", &lines, &chat(BENIGN)).await.0, 200);
    let seen = seen(&s.app, "app-keys").unwrap();
    assert_eq!(seen.headers["authorization"].to_str().unwrap(), "Bearer app-key");
    assert_eq!(seen.headers["x-api-key"].to_str().unwrap(), "app-key");
}

#[tokio::test]
async fn repeated_identity_headers_are_refused_naming_the_header() {
    let s = setup();
    let own_key = format!("X-Api-Key: {OWN_KEY}");
    let own_bearer = format!("Authorization: Bearer {OWN_KEY}");
    let cases: [(&str, [&str; 2]); 4] = [
        ("x-api-key", [&own_key, "X-Api-Key: app-key"]),
        ("x-api-key", ["x-api-key: app-key", &own_key]),
        ("authorization", [&own_bearer, "Authorization: Bearer app-key"]),
        ("x-client-tenant", ["X-Client-Tenant: payments", "X-Client-Tenant: other"]),
    ];
    for (i, (name, repeated)) in cases.iter().enumerate() {
        let marker = format!("X-Marker: repeated-{i}");
        let lines = ["Content-Type: application/json", &marker, repeated[0], repeated[1]];
        let (status, body) = raw_post(s.proxy, "/echo/chat", &lines, &chat(BENIGN)).await;
        assert_eq!(status, 400, "{name}: {body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["error"]["code"], "repeated_header", "{error}");
        assert_eq!(error["error"]["field"], *name, "{error}");
        assert!(error["error"]["message"].as_str().unwrap().contains(name), "{error}");
        assert!(seen(&s.app, &format!("repeated-{i}")).is_none(), "{name}: forwarded");
        // The same on tiergate's own endpoint: one identity, whichever door.
        let lines = ["Content-Type: application/json", repeated[0], repeated[1]];
        let (status, body) = raw_post(s.proxy, "/v1/classify", &lines, &chat(BENIGN)).await;
        assert_eq!(status, 400, "/v1/classify, {name}: {body}");
    }
}
