//! tiergate as a reverse proxy in front of a real app (tests/common/app.rs): hostile requests
//! refused without disturbing others, every spelling of a screened path screened, a client's
//! broken upload, the server's caps, overload per route, and the sidecar draining on SIGTERM.

mod common;

use bytes::Bytes;
use common::app;
use common::proxy::*;
use common::routes::{route_all, screened_route};
use http::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// (what, request, expected status, whether the app may see it). Each case has its own path.
fn hostile_table() -> Vec<(&'static str, String, u16, bool)> {
    let big_header = "a".repeat(200 * 1024);
    vec![
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
    ]
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
    let table = hostile_table();
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
/// (routes match ignoring ASCII case), a literal `\` or a `;` parameter, or a standard method in
/// another case (`post`), is refused; none reaches the app unscreened.
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
    // A standard method in another case is refused: routes match `POST` exactly, while an app
    // that folds case (Werkzeug, Rails) would serve `post` as `POST`.
    let text = chat(PHISHING);
    for method in ["post", "Post", "pOST"] {
        let request = format!(
            "{method} /echo/chat HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        assert_eq!(raw(s.proxy, request.as_bytes(), Duration::from_secs(3)).await, Some(400), "{method}");
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
    let routes = route_all("old", &format!("http://{app}"));
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
    let routes = route_all("app", &app.url());
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
    let routes = route_all("app", &app.url());
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
    let busy_policy = common::saturated_policies("proxy-busy", false);
    let policy = format!("policy = \"{}\"", busy_policy.display());
    let routes = [
        screened_route("forward", "/echo/forward", &app.url(), &[&policy]),
        screened_route("shed", "/echo/shed", &app.url(), &[&policy, "on_overload = \"shed\""]),
    ]
    .concat();
    let config = common::config_with_routes(&common::repo().join("policies"), &routes);
    let busy_cpu = common::FakeCpu(std::sync::Mutex::new(0.95));
    let sources = tiergate::gateway::Sources { cpu: std::sync::Arc::new(busy_cpu) as _, ..Default::default() };
    let (proxy, gateway) = common::start_with(config, sources);
    // The sampler's first reading can come after the first request on a loaded machine, and an
    // unknown reading leaves the cpu tier eligible: wait for it.
    common::eventually("the busy cpu reading", || {
        gateway.readings.at(tokio::time::Instant::now()).cpu_utilization.is_some_and(|u| u > 0.9)
    })
    .await;
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
