//! tiergate as a reverse proxy in front of a real app (tests/common/app.rs): screening per route,
//! the headers both ways, bodies streamed intact, the app failing, and hostile requests.

mod common;

use bytes::Bytes;
use common::app::{self, AppHandle};
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BENIGN: &str = "Are we still on for lunch tomorrow at noon? I booked the usual place.";
const PHISHING: &str =
    "Your account is locked. Send your password and PIN to http://secure-login.example.com/verify immediately.";

struct Setup {
    proxy: SocketAddr,
    /// The admin listener: `/metrics` there (the catch-all route sends the public one to the app).
    admin: SocketAddr,
    app: AppHandle,
}

/// One app and one tiergate in front of it with the bundled policies, shared by the tests here.
fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let app = app::start();
        let dead = dead_address();
        // A route policy under which every model verdict is at least `review`.
        let routing = std::fs::read_to_string(common::repo().join("policies/routing.toml")).unwrap();
        let review_policy =
            common::policies_with_routing("proxy-review", &routing.replace("review_at = 0.3", "review_at = 0.0"));
        let routes = format!(
            r#"
            [proxy]
            connect_timeout_ms = 300
            eject_after_failures = 2

            [[routes]]
            name = "chat"
            path_prefix = "/echo/chat"
            methods = ["POST"]
            upstream = ["{app}"]
            [routes.screen]
            text = ["/messages/-1/content"]
            features = {{ country = "header:x-country", user = "/user" }}
            max_body_bytes = 4096

            [[routes]]
            name = "monitor"
            path_prefix = "/echo/monitor"
            upstream = ["{app}"]
            [routes.screen]
            text = ["query:q"]
            on_block = "forward"

            [[routes]]
            name = "open"
            path_prefix = "/echo/open"
            upstream = ["{app}"]
            [routes.screen]
            text = ["/text"]
            max_body_bytes = 1024
            on_error = "open"

            [[routes]]
            name = "down"
            path_prefix = "/down"
            upstream = ["{dead}"]

            [[routes]]
            name = "impatient"
            path_prefix = "/slow"
            upstream = ["{app}"]
            response_header_timeout_ms = 300

            [[routes]]
            name = "stall"
            path_prefix = "/stall"
            upstream = ["{app}"]
            body_idle_timeout_ms = 300

            [[routes]]
            name = "retry"
            path_prefix = "/echo/retry"
            upstream = ["{dead}", "{app}"]
            retries = 1

            [[routes]]
            name = "retry-post"
            path_prefix = "/echo/retry-post"
            upstream = ["{dead}", "{app}"]
            retries = 1
            [routes.screen]
            text = ["/text"]

            [[routes]]
            name = "h2"
            path_prefix = "/echo/h2"
            upstream = ["{app}"]
            http2 = true
            host_header = "upstream"

            [[routes]]
            name = "hold"
            path_prefix = "/echo/hold"
            upstream = ["{app}"]
            [routes.screen]
            text = ["/text"]
            policy = "{review_policy}"

            [[routes]]
            name = "strict"
            path_prefix = "/echo/strict"
            upstream = ["{app}"]
            [routes.screen]
            text = ["/text"]
            policy = "{review_policy}"
            on_review = "block"

            [[routes]]
            name = "hosted"
            host = "api.example.com"
            path_prefix = "/echo/hosted"
            upstream = ["{app}"]
            [routes.screen]
            text = ["/text"]

            [[routes]]
            name = "upload"
            path_prefix = "/echo/upload-slow"
            upstream = ["{app}"]
            response_header_timeout_ms = 300

            [[routes]]
            name = "whole"
            path_prefix = "/echo/whole"
            upstream = ["{app}"]
            request_timeout_ms = 600

            [[routes]]
            name = "app"
            upstream = ["{app}"]
            "#,
            app = app.url(),
            review_policy = review_policy.display(),
        );
        let mut config = common::config_with_routes(&common::repo().join("policies"), &routes);
        config.server.request_timeout_ms = 1000;
        config.server.header_read_timeout_ms = 500;
        let (proxy, admin, _) = common::start_with_admin(config, Default::default(), None);
        Setup { proxy, admin, app }
    })
}

/// An address nothing listens on (bound, then released).
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

fn chat(text: &str) -> String {
    json!({"user": "u-17", "messages": [{"role": "system", "content": "be nice"}, {"role": "user", "content": text}]})
        .to_string()
}

fn header<'a>(headers: &'a http::HeaderMap, name: &str) -> &'a str {
    headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
}

async fn post_json(addr: SocketAddr, path: &str, body: String, extra: &[(&str, &str)]) -> common::Reply {
    let mut headers = vec![("content-type", "application/json")];
    headers.extend_from_slice(extra);
    common::send(addr, "POST", path, &headers, body).await
}

#[tokio::test]
async fn allowed_requests_reach_the_app_with_the_decision() {
    let s = setup();
    // A client claiming https and an earlier hop: the scheme is not trusted (no
    // `trust_forwarded_headers`), the hop is kept and tiergate's peer appended.
    let claims =
        [("x-forwarded-proto", "https"), ("x-forwarded-for", "10.0.0.1"), ("x-forwarded-host", "evil.example")];
    let mut headers = vec![("x-country", "NL"), ("host", "shop.example")];
    headers.extend(claims);
    let reply = post_json(s.proxy, "/echo/chat?x=1", chat(BENIGN), &headers).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&reply.body));
    assert_eq!(reply.body, Bytes::from(chat(BENIGN)), "the app echoes the body it got: unchanged");
    let seen = s.app.requests().into_iter().find(|r| r.body == Bytes::from(chat(BENIGN))).unwrap();
    let h = &seen.headers;
    assert_eq!(seen.uri, "/echo/chat?x=1");
    assert_eq!(header(h, "x-tiergate-action"), "allow");
    let score: f64 = header(h, "x-tiergate-risk-score").parse().unwrap();
    assert!((0.0..0.3).contains(&score), "{score}");
    assert!(["cpu", "gpu", "rules"].contains(&header(h, "x-tiergate-tier")));
    assert!(!header(h, "x-tiergate-policy-version").is_empty());
    assert_eq!(header(h, "x-request-id"), header(&reply.headers, "x-request-id"), "one id end to end");
    assert_eq!(header(h, "x-forwarded-for"), "10.0.0.1, 127.0.0.1");
    assert_eq!(header(h, "x-forwarded-proto"), "http");
    assert_eq!(header(h, "x-forwarded-host"), "shop.example");
    assert_eq!(header(h, "host"), "shop.example", "host_header = preserve");
    assert_eq!(header(h, "via"), "1.1 tiergate");
    // The response: the app's headers, hop-by-hop ones (and those its Connection names) removed.
    assert_eq!(header(&reply.headers, "x-app"), "echo");
    assert!(reply.headers.get("x-app-hop").is_none() && reply.headers.get("connection").is_none());
    assert_eq!(header(&reply.headers, "via"), "1.1 tiergate");
    assert_eq!(header(&reply.headers, "x-tiergate-action"), "allow");
}

#[tokio::test]
async fn blocked_requests_never_reach_the_app_and_forged_decisions_are_dropped() {
    let s = setup();
    let reply =
        post_json(s.proxy, "/echo/chat", chat(PHISHING), &[("x-tiergate-action", "allow"), ("x-tiergate-tier", "cpu")])
            .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let body = reply.json();
    assert_eq!(body["error"]["code"], "blocked");
    assert_eq!(body["decision"]["action"], "block");
    assert!(body["decision"]["risk_score"].as_f64().unwrap() >= 0.8, "{body}");
    let reached = s.app.requests().iter().any(|r| r.body == Bytes::from(chat(PHISHING)));
    assert!(!reached, "a blocked request reached the app");

    // The pointer picks the *last* message: a phishing system prompt before a benign last
    // message is not what is screened.
    let mixed = json!({"messages": [{"content": PHISHING}, {"content": BENIGN}]}).to_string();
    let reply = post_json(s.proxy, "/echo/chat", mixed.clone(), &[("x-tiergate-action", "block")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = s.app.requests().into_iter().find(|r| r.body == Bytes::from(mixed.clone())).unwrap();
    assert_eq!(header(&seen.headers, "x-tiergate-action"), "allow", "the client's own header was replaced");
    assert_eq!(seen.headers.get_all("x-tiergate-action").iter().count(), 1);
}

#[tokio::test]
async fn monitor_mode_forwards_blocks_with_the_decision() {
    let s = setup();
    let q = form_urlencoded::byte_serialize(PHISHING.as_bytes()).collect::<String>();
    let reply = common::send(s.proxy, "GET", &format!("/echo/monitor?q={q}"), &[], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = s.app.requests().into_iter().rev().find(|r| r.uri.starts_with("/echo/monitor")).unwrap();
    assert_eq!(header(&seen.headers, "x-tiergate-action"), "block");
    // The rule that decided is named when rules decided.
    assert_eq!(seen.headers.contains_key("x-tiergate-rule"), header(&seen.headers, "x-tiergate-tier") == "rules");
}

#[tokio::test]
async fn what_cannot_be_screened_is_refused_and_never_reaches_the_app() {
    let s = setup();
    let cases: [(&str, Vec<(&str, &str)>, String, StatusCode, &str); 5] = [
        (
            "malformed JSON",
            vec![("content-type", "application/json")],
            "{\"messages\": [".into(),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            // Screening one value of a repeated key would leave the app free to read the other.
            "a repeated key",
            vec![("content-type", "application/json")],
            format!(r#"{{"messages":[{{"content":{PHISHING:?}}}],"messages":[{{"content":{BENIGN:?}}}]}}"#),
            StatusCode::BAD_REQUEST,
            "malformed_json",
        ),
        (
            "over the limit",
            vec![("content-type", "application/json")],
            chat(&"a ".repeat(3000)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            "not JSON",
            vec![("content-type", "text/plain")],
            "plain words, not JSON".into(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            "no text",
            vec![("content-type", "application/json")],
            json!({"messages": []}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
    ];
    for (what, headers, body, status, code) in cases {
        let reply = common::send(s.proxy, "POST", "/echo/chat", &headers, body.clone()).await;
        let forwarded = s.app.requests().iter().any(|r| r.body == Bytes::from(body.clone()));
        assert!(!forwarded, "{what}: fail-closed forwarded it");
        assert_eq!(reply.status, status, "{what}: {:?}", String::from_utf8_lossy(&reply.body));
        assert_eq!(reply.json()["error"]["code"], code, "{what}");
    }

    // Fail-open forwards only what tiergate's own faults left unscreened (tests/fail_open.rs):
    // a body over the screening limit is the client's doing, refused as on a closed route.
    let big = json!({"text": "x".repeat(5000)}).to_string();
    let reply = post_json(s.proxy, "/echo/open", big.clone(), &[]).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(!s.app.requests().iter().any(|r| r.body == Bytes::from(big.clone())), "forwarded unscreened");
    // ... and a body within the limit is screened as usual.
    let reply = post_json(s.proxy, "/echo/open", json!({"text": BENIGN}).to_string(), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);

    let metrics = String::from_utf8(common::send(s.admin, "GET", "/metrics", &[], "").await.body.to_vec()).unwrap();
    for line in
        [r#"route="open",outcome="refused""#, r#"route="chat",outcome="refused""#, r#"route="chat",outcome="blocked""#]
    {
        assert!(metrics.contains(line), "metrics lack {line}");
    }
}

#[tokio::test]
async fn large_bodies_stream_through_unchanged_both_ways() {
    let s = setup();
    let upload = app::pattern(8 << 20);
    let reply =
        common::send(s.proxy, "PUT", "/echo/upload", &[("content-type", "application/octet-stream")], upload.clone())
            .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body == upload, "echoed upload differs ({} bytes back)", reply.body.len());
    assert!(s.app.requests().iter().any(|r| r.body == upload), "the app got a different upload");

    let n = 24 << 20;
    let reply = common::send(s.proxy, "GET", &format!("/bytes?n={n}"), &[], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body == app::pattern(n), "download differs ({} bytes)", reply.body.len());
}

#[tokio::test]
async fn the_app_failing_becomes_502_or_504() {
    let s = setup();
    let reply = common::send(s.proxy, "GET", "/down/x", &[], "").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    let body = reply.json();
    assert_eq!(body["error"]["code"], "bad_gateway");
    assert!(body["error"]["message"].as_str().unwrap().contains("route `down`"), "{body}");

    let started = Instant::now();
    let reply = common::send(s.proxy, "GET", "/slow?ms=3000", &[], "").await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(reply.json()["error"]["code"], "upstream_timeout");
    assert!(started.elapsed() < Duration::from_millis(2000), "{:?}", started.elapsed());

    // An app that stalls mid-body: the client's stream ends with an error after the idle limit.
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = client.get(format!("http://{}/stall", s.proxy).parse().unwrap()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let started = Instant::now();
    let collected = tokio::time::timeout(Duration::from_secs(5), response.into_body().collect()).await;
    assert!(matches!(collected, Ok(Err(_))), "the stalled body did not end with an error");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn requests_that_could_not_connect_are_retried_on_another_address() {
    let s = setup();
    for i in 0..10 {
        let reply = common::send(s.proxy, "GET", &format!("/echo/retry/{i}"), &[], "").await;
        assert_eq!(reply.status, StatusCode::OK, "attempt {i}: {:?}", String::from_utf8_lossy(&reply.body));
        // A connection that could not be opened carried no byte of the request: a POST whose body
        // screening read whole is as safe to send elsewhere as a GET.
        let body = json!({"text": "see you at noon"}).to_string();
        let reply = post_json(s.proxy, &format!("/echo/retry-post/{i}"), body, &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "POST {i}: {:?}", String::from_utf8_lossy(&reply.body));
    }
}

#[tokio::test]
async fn http2_both_sides() {
    let s = setup();
    // Client -> tiergate over HTTP/2 (prior knowledge), tiergate -> app over HTTP/1.1 ...
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let request =
        http::Request::post(format!("http://{}/echo/plain", s.proxy)).body(Full::new(Bytes::from("h2 body"))).unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let seen = s.app.requests().into_iter().find(|r| r.body == Bytes::from("h2 body")).unwrap();
    assert_eq!(seen.version, http::Version::HTTP_11);
    assert_eq!(header(&seen.headers, "host"), s.proxy.to_string(), "the :authority became Host");
    assert_eq!(header(&seen.headers, "via"), "2 tiergate");
    // ... and a route that speaks HTTP/2 to the app.
    let reply = common::send(s.proxy, "POST", "/echo/h2", &[], "to an h2 app").await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = s.app.requests().into_iter().find(|r| r.body == Bytes::from("to an h2 app")).unwrap();
    assert_eq!(seen.version, http::Version::HTTP_2);
    assert_eq!(header(&seen.headers, "host"), s.app.addr().to_string(), "host_header = upstream");
}

#[tokio::test]
async fn routes_can_name_their_own_policy_and_review_follows_the_route_mapping() {
    let s = setup();
    let body = json!({"text": BENIGN}).to_string();
    let reply = post_json(s.proxy, "/echo/hold", body.clone(), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = s.app.requests().into_iter().rev().find(|r| r.uri == "/echo/hold").unwrap();
    assert_eq!(header(&seen.headers, "x-tiergate-action"), "review", "the route's policy: review_at = 0");
    let route_version = header(&seen.headers, "x-tiergate-policy-version").to_string();

    let reply = post_json(s.proxy, "/echo/strict", body.clone(), &[]).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "on_review = block");
    assert_eq!(reply.json()["decision"]["action"], "review");
    assert_eq!(reply.json()["decision"]["policy_version"], route_version.as_str());
    assert!(!s.app.requests().iter().any(|r| r.uri == "/echo/strict"));

    // The same text on a route under the live policy is allowed, under another version.
    let reply = post_json(s.proxy, "/echo/open", body, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = s.app.requests().into_iter().rev().find(|r| r.uri == "/echo/open").unwrap();
    assert_eq!(header(&seen.headers, "x-tiergate-action"), "allow");
    assert_ne!(header(&seen.headers, "x-tiergate-policy-version"), route_version);
    let admin = common::send(s.admin, "GET", "/admin/policy", &[], "").await.json();
    assert_eq!(admin["route_policies"][0]["version"], route_version.as_str(), "{admin}");
}

/// Sends raw bytes, returns the status code of the first response: 0 when the server closed the
/// connection without one, `None` when it neither answered nor closed within `read_for`.
async fn raw(addr: SocketAddr, request: &[u8], read_for: Duration) -> Option<u16> {
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

#[tokio::test]
async fn hostile_requests_are_refused_without_disturbing_others() {
    let s = setup();
    // Good requests keep flowing while the table runs.
    let proxy = s.proxy;
    let good = tokio::spawn(async move {
        let mut statuses = Vec::new();
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            statuses.push(post_json(proxy, "/echo/chat", chat(BENIGN), &[]).await.status);
        }
        statuses
    });
    let big_header = "a".repeat(200 * 1024);
    // (what, request, expected status, whether the app may see it). Each case has its own path.
    let table: Vec<(&str, String, u16, bool)> = vec![
        // hyper resolves these as RFC 9112 §6.3 and RFC 9110 §8.6 allow (chunked wins and
        // Content-Length is removed; identical duplicates count once) before tiergate sees the
        // request, so they arrive framed one way and are forwarded re-framed: nothing is left
        // for the app to read differently.
        (
            "Content-Length then Transfer-Encoding",
            "POST /echo/hostile/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into(),
            200,
            true,
        ),
        (
            "Transfer-Encoding then Content-Length",
            "POST /echo/hostile/2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into(),
            200,
            true,
        ),
        (
            "duplicate equal Content-Length",
            "POST /echo/hostile/3 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello".into(),
            200,
            true,
        ),
        (
            "conflicting Content-Length",
            "POST /echo/hostile/4 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".into(),
            400,
            false,
        ),
        (
            "Content-Length list",
            "POST /echo/hostile/5 HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 4\r\n\r\nabcd".into(),
            400,
            false,
        ),
        (
            "Transfer-Encoding not ending in chunked",
            "POST /echo/hostile/6 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc".into(),
            400,
            false,
        ),
        (
            "oversized header",
            format!("GET /echo/hostile/7 HTTP/1.1\r\nHost: x\r\nX-Big: {big_header}\r\n\r\n"),
            431,
            false,
        ),
        (
            "broken chunked body on a screened route",
            "POST /echo/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n".into(),
            400,
            false,
        ),
        (
            "slow body on a screened route (declares 500 bytes, sends 10)",
            "POST /echo/chat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"message".into(),
            408,
            false,
        ),
        (
            "a transfer coding other than chunked",
            "POST /echo/hostile/11 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into(),
            501,
            false,
        ),
        ("two Host headers", "GET /echo/hostile/12 HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n".into(), 400, false),
        ("HTTP/1.1 without Host", "GET /echo/hostile/13 HTTP/1.1\r\n\r\n".into(), 400, false),
        ("an encoded slash", "GET /echo%2Fhostile/14 HTTP/1.1\r\nHost: x\r\n\r\n".into(), 400, false),
        // Slowloris: half a head, then nothing. hyper drops the connection at
        // `header_read_timeout_ms` without an answer (0 = closed with no response).
        ("slow headers", "GET /echo/hostile/10 HTTP/1.1\r\nHost: x\r\nX-Slow: ".into(), 0, false),
    ];
    let mut wrong = Vec::new();
    for (what, request, expected, _) in &table {
        let status = raw(s.proxy, request.as_bytes(), Duration::from_secs(3)).await;
        if status != Some(*expected) {
            wrong.push(format!("{what}: {status:?}, expected {expected}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    let statuses = good.await.unwrap();
    assert!(statuses.len() > 5 && statuses.iter().all(|s| *s == StatusCode::OK), "{statuses:?}");
    let seen = s.app.requests();
    for (what, request, _, may_reach) in &table {
        let path = request.split_whitespace().nth(1).unwrap();
        if !path.starts_with("/echo/hostile/") {
            continue; // the screened-route cases: checked by their status
        }
        let reached: Vec<_> = seen.iter().filter(|r| r.uri == path).collect();
        assert_eq!(!reached.is_empty(), *may_reach, "{what}");
        for r in reached {
            assert_eq!(r.body, Bytes::from("hello"), "{what}: the chunked framing decides");
            assert!(r.headers.get("content-length").is_none_or(|v| v == "5"), "{what}: {:?}", r.headers);
            assert!(r.headers.get("transfer-encoding").is_none() || r.headers.get("content-length").is_none());
        }
    }
}

/// The "done when" of the sidecar: the real binary with `config/sidecar.example.toml` and
/// `APP_UPSTREAM` screens and forwards, then drains an in-flight request on SIGTERM.
#[test]
fn the_sidecar_example_config_serves_and_drains_on_sigterm() {
    let app = app::start();
    let mut sidecar = common::Sidecar::start(&app.url());
    let (public, admin) = (sidecar.public, sidecar.admin);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let reply = post_json(public, "/v1/chat/completions", chat(BENIGN), &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(header(&app.last().headers, "x-tiergate-action"), "allow");
        let reply = post_json(public, "/v1/chat/completions", chat(PHISHING), &[]).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN);
        assert_eq!(common::send(admin, "GET", "/readyz", &[], "").await.status, StatusCode::OK);

        // The app's alias paths are screened as well (chat messages or a prompt)...
        let prompt = |text: &str| json!({"prompt": text}).to_string();
        for (path, body) in [
            ("/chat/completions", chat as fn(&str) -> String),
            ("/v1/completions", prompt),
            ("/completions", prompt),
            ("/completion", prompt),
        ] {
            let reply = post_json(public, path, body(PHISHING), &[]).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path} was not screened");
            let reply = post_json(public, path, body(BENIGN), &[]).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}");
            assert_eq!((app.last().uri.as_str(), header(&app.last().headers, "x-tiergate-action")), (path, "allow"));
        }
        // ...any other body-carrying path is refused, never forwarded unscreened...
        let seen = app.requests().len();
        for (method, path) in [("POST", "/v1/embeddings"), ("POST", "/v1/responses"), ("PUT", "/anything")] {
            let body = json!({"input": PHISHING}).to_string();
            let reply = common::send(public, method, path, &[("content-type", "application/json")], body).await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{method} {path}");
            assert_eq!(reply.json()["error"]["code"], "unscreened_path_refused", "{method} {path}");
        }
        assert_eq!(app.requests().len(), seen, "a refused request reached the app");
        // ...reads pass through, and tiergate's own classify stays reachable on the admin listener.
        assert_eq!(common::send(public, "GET", "/v1/models", &[], "").await.status, StatusCode::OK);
        assert_eq!(app.last().uri, "/v1/models");
        let reply = common::send(
            admin,
            "POST",
            "/v1/classify",
            &[("content-type", "application/json")],
            json!({"text": PHISHING}).to_string(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json()["action"], "block", "{:?}", reply.json());

        let slow = tokio::spawn(async move { common::send(public, "GET", "/slow?ms=1500", &[], "").await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let status =
            std::process::Command::new("kill").args(["-TERM", &sidecar.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let reply = slow.await.unwrap();
        assert_eq!((reply.status, &reply.body[..]), (StatusCode::OK, &b"slow"[..]), "in-flight request drained");
    });
    let exit = sidecar.child.wait().unwrap();
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
}

#[tokio::test]
async fn every_spelling_of_a_screened_path_is_screened() {
    let s = setup();
    for path in ["/echo/%63hat", "//echo/chat", "/echo/./chat", "/x/../echo/chat", "/%65cho/chat/", "/echo//chat"] {
        let reply = post_json(s.proxy, path, chat(PHISHING), &[]).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path} was not screened");
    }
    let reply = post_json(s.proxy, "/echo%2Fchat", chat(PHISHING), &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["code"], "bad_request_target");
    // The app gets the path tiergate routed on.
    let reply = post_json(s.proxy, "/echo/%63hat/../chat", chat("see you at %63 noon"), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(s
        .app
        .requests()
        .iter()
        .any(|r| r.uri == "/echo/chat" && r.body == Bytes::from(chat("see you at %63 noon"))));
    // The fully qualified host is the same host; an absolute-form target's host is the one routed
    // on and the one forwarded.
    let text = json!({"text": PHISHING}).to_string();
    let reply = post_json(s.proxy, "/echo/hosted", text.clone(), &[("host", "api.example.com.")]).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let request = format!(
        "POST http://other.example/echo/hosted HTTP/1.1\r\nHost: api.example.com\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    );
    assert_eq!(raw(s.proxy, request.as_bytes(), Duration::from_secs(3)).await, Some(200));
    let seen = s.app.requests().into_iter().rev().find(|r| r.uri.ends_with("/echo/hosted")).unwrap();
    assert_eq!(header(&seen.headers, "host"), "other.example", "unscreened, so not under the screened host's name");
}

/// Spellings apps read differently (issue 13, item 8): a case variant meets the screened route
/// (routes match ignoring ASCII case), a literal `\` or a `;` parameter is refused; none reaches
/// the app unscreened.
#[tokio::test]
async fn spellings_apps_read_differently_are_screened_or_refused() {
    let s = setup();
    let reply = post_json(s.proxy, "/ECHO/Chat", chat(PHISHING), &[]).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "a case variant is screened");
    for path in ["/echo\\chat", "/echo/chat;x=1", "/echo;jsessionid=1/chat"] {
        let reply = post_json(s.proxy, path, chat(PHISHING), &[]).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(reply.json()["error"]["code"], "bad_request_target", "{path}");
    }
    let reached = |r: &app::Seen| r.uri == "/ECHO/Chat" || r.uri.contains(';') || r.uri.contains('\\');
    assert!(!s.app.requests().iter().any(reached), "nothing reached the app");
    // The app gets the client's case, screened.
    let reply = post_json(s.proxy, "/Echo/CHAT", chat(BENIGN), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = s.app.requests().into_iter().rev().find(|r| r.uri == "/Echo/CHAT").unwrap();
    assert_eq!(header(&seen.headers, "x-tiergate-action"), "allow");
}

#[tokio::test]
async fn every_value_of_a_repeated_source_is_screened() {
    let s = setup();
    let q = form_urlencoded::byte_serialize(PHISHING.as_bytes()).collect::<String>();
    let reply = common::send(s.proxy, "GET", &format!("/echo/monitor/dup?q=hello&q={q}"), &[], "").await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = s.app.requests().into_iter().rev().find(|r| r.uri.starts_with("/echo/monitor/dup")).unwrap();
    assert_eq!(header(&seen.headers, "x-tiergate-action"), "block");
}

#[tokio::test]
async fn a_client_breaking_its_own_upload_is_not_the_apps_failure() {
    let s = setup();
    // More broken uploads than `eject_after_failures` (2): each is the client's 400, and the app
    // stays in rotation for everyone else.
    for _ in 0..4 {
        let broken = "POST /echo/broken HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n";
        assert_eq!(raw(s.proxy, broken.as_bytes(), Duration::from_secs(3)).await, Some(400));
    }
    let reply = common::send(s.proxy, "GET", "/echo/after-broken", &[], "").await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&reply.body));

    // A slow upload (1 s) on a route whose response-head timeout is 300 ms: the timeout starts
    // when the body has been sent.
    let mut stream = tokio::net::TcpStream::connect(s.proxy).await.unwrap();
    stream
        .write_all(b"POST /echo/upload-slow HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for piece in ["slow ", "but ", "steady ", "upload"] {
        tokio::time::sleep(Duration::from_millis(250)).await;
        stream.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes()).await.unwrap();
    }
    stream.write_all(b"0\r\n\r\n").await.unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "{:?}", String::from_utf8_lossy(&head));
    let seen = s.app.requests().into_iter().find(|r| r.uri == "/echo/upload-slow").unwrap();
    assert_eq!(seen.body, Bytes::from("slow but steady upload"));

    // An upload that never goes quiet for the body idle timeout but never ends either: the
    // route's request_timeout_ms (600 ms) ends it with 408.
    let stream = tokio::net::TcpStream::connect(s.proxy).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    write.write_all(b"POST /echo/whole HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").await.unwrap();
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if write.write_all(b"1\r\nx\r\n").await.is_err() {
                return;
            }
        }
    });
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), read.read_exact(&mut head)).await.expect("answered in time").unwrap();
    assert_eq!(&head, b"HTTP/1.1 408", "{:?}", String::from_utf8_lossy(&head));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    trickle.abort();
}

#[tokio::test]
async fn the_client_is_answered_in_tiergates_http_version_whatever_the_app_speaks() {
    // An app that answers in HTTP/1.0 (and closes): the client still gets an HTTP/1.1 answer,
    // and `Via` records what the app spoke.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let app = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    let routes = format!("[[routes]]\nname = \"old\"\nupstream = [\"http://{app}\"]\n");
    let (proxy, _, _) = common::start_with_admin(
        common::config_with_routes(&common::repo().join("policies"), &routes),
        Default::default(),
        None,
    );
    let reply = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut client = std::net::TcpStream::connect(proxy).unwrap();
        client.write_all(b"GET /x HTTP/1.1\r\nHost: example\r\nConnection: close\r\n\r\n").unwrap();
        let mut reply = String::new();
        client.read_to_string(&mut reply).unwrap();
        reply
    })
    .await
    .unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.to_ascii_lowercase().contains("via: 1.0 tiergate"), "{reply}");
    assert!(reply.ends_with("ok"), "{reply}");
}

/// `[server] max_concurrent_requests`: past it a request is shed at once with 503, a JSON body
/// naming the limit and `Retry-After`, and nothing reaches the app; the requests within it are
/// served as usual, and capacity comes back when they finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_servers_concurrency_cap_are_shed_at_once() {
    let app = app::start();
    let routes = format!("[[routes]]\nname = \"app\"\nupstream = [\"{}\"]\n", app.url());
    let mut config = common::config_with_routes(&common::repo().join("policies"), &routes);
    config.server.max_concurrent_requests = 2;
    let proxy = common::start(config);
    let slow: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { common::send(proxy, "GET", "/slow?ms=1500", &[], "").await }))
        .collect();
    common::eventually("both slow requests reach the app", || app.requests().len() == 2).await;
    let started = Instant::now();
    let reply = common::send(proxy, "GET", "/slow?ms=1", &[], "").await;
    assert!(started.elapsed() < Duration::from_millis(500), "shed at once, not queued: {:?}", started.elapsed());
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&reply.headers, "retry-after"), "1");
    assert_eq!(header(&reply.headers, "connection"), "close", "the unread body ends the connection");
    assert_eq!(reply.json()["error"]["code"], "overloaded");
    assert!(
        reply.json()["error"]["message"].as_str().unwrap().contains("max_concurrent_requests"),
        "{:?}",
        reply.json()
    );
    assert_eq!(app.requests().len(), 2, "the shed request never reached the app");
    for s in slow {
        assert_eq!(s.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(common::send(proxy, "GET", "/slow?ms=1", &[], "").await.status, StatusCode::OK, "capacity is back");
}

/// `[server] max_connections`: a connection past the cap is not served until an open one
/// closes (it waits in the accept backlog), and then it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_wait_until_one_closes() {
    let app = app::start();
    let routes = format!("[[routes]]\nname = \"app\"\nupstream = [\"{}\"]\n", app.url());
    let mut config = common::config_with_routes(&common::repo().join("policies"), &routes);
    config.server.max_connections = 1;
    let proxy = common::start(config);
    let get = b"GET /status?code=200 HTTP/1.1\r\nHost: x\r\n\r\n";
    // The first connection is served and stays open (keep-alive).
    let mut first = tokio::net::TcpStream::connect(proxy).await.unwrap();
    first.write_all(get).await.unwrap();
    let mut buf = [0u8; 1024];
    let n = first.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    // The second is not served while the first is open...
    let waiting = tokio::spawn(async move { raw(proxy, get, Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!waiting.is_finished(), "a connection over max_connections was served");
    // ...and is once it closes.
    drop(first);
    assert_eq!(waiting.await.unwrap(), Some(200));
}

/// A decision made by rules because no model tier had capacity (here: the cpu over its
/// `max_utilization`) is marked `overloaded`; a route with `on_overload = "shed"` answers it 503
/// with `Retry-After` and forwards nothing, the default forwards it with the rules' action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_says_what_happens_to_a_decision_made_under_overload() {
    let app = app::start();
    let routing = std::fs::read_to_string(common::repo().join("policies/routing.toml")).unwrap();
    let busy_policy =
        common::policies_with_routing("proxy-busy", &routing.replace("max_utilization = 1.0", "max_utilization = 0.5"));
    let routes = format!(
        r#"
        [[routes]]
        name = "forward"
        path_prefix = "/echo/forward"
        upstream = ["{app}"]
        [routes.screen]
        text = ["/text"]
        policy = "{policy}"

        [[routes]]
        name = "shed"
        path_prefix = "/echo/shed"
        upstream = ["{app}"]
        [routes.screen]
        text = ["/text"]
        policy = "{policy}"
        on_overload = "shed"
        "#,
        app = app.url(),
        policy = busy_policy.display()
    );
    let config = common::config_with_routes(&common::repo().join("policies"), &routes);
    let busy_cpu = common::FakeCpu(std::sync::Mutex::new(0.95));
    let sources = tiergate::gateway::Sources { cpu: std::sync::Arc::new(busy_cpu) as _, ..Default::default() };
    let (proxy, _) = common::start_with(config, sources);
    let body = json!({"text": "see you at the station at noon"}).to_string();

    let reply = post_json(proxy, "/echo/forward", body.clone(), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen = app.last();
    assert_eq!(header(&seen.headers, "x-tiergate-tier"), "rules");
    assert_eq!(header(&seen.headers, "x-tiergate-overloaded"), "true");

    let seen = app.requests().len();
    let reply = post_json(proxy, "/echo/shed", body, &[]).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", reply.json());
    assert_eq!(header(&reply.headers, "retry-after"), "1");
    assert_eq!(reply.json()["error"]["code"], "overloaded");
    assert_eq!(app.requests().len(), seen, "a shed request never reaches the app");
}
