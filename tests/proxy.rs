//! tiergate as a reverse proxy in front of a real app (tests/common/app.rs): screening per route,
//! the headers both ways, bodies streamed intact, the app failing. Hostile requests, spellings and
//! limits: tests/proxy_hostile.rs.

mod common;

use bytes::Bytes;
use common::app;
use common::proxy::*;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use std::time::{Duration, Instant};

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
