//! Every kind of bad input gets its status and a JSON error naming the field and the limit.

mod common;
use common::*;
use serde_json::Value;

fn error_of(r: &Reply) -> Value {
    assert_eq!(r.headers["content-type"], "application/json");
    let v = r.json();
    let e = v["error"].clone();
    assert!(e["code"].is_string() && e["message"].is_string(), "{v}");
    e
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn malformed_json_is_400() {
    let r = send(default_server(), "POST", "/v1/classify", &[JSON], "{\"text\": ").await;
    assert_eq!(r.status, 400);
    assert_eq!(error_of(&r)["code"], "malformed_json");
}

#[tokio::test]
async fn an_unusable_request_id_is_replaced_not_copied() {
    let addr = default_server();
    let body = r#"{"text": "lunch at noon?"}"#;
    let long = "a".repeat(129);
    for bad in [long.as_str(), "two words", "tab\there"] {
        let r = send(addr, "POST", "/v1/classify", &[JSON, ("x-request-id", bad)], body).await;
        assert_eq!(r.status, 200);
        let id = r.headers["x-request-id"].to_str().unwrap();
        assert!(id != bad && id.len() == 36, "{bad:?} came back as {id:?}");
        assert_eq!(r.json()["request_id"], id, "the decision carries the generated id");
    }
    let ok = "a".repeat(128);
    let r = send(addr, "POST", "/v1/classify", &[JSON, ("x-request-id", &ok)], body).await;
    assert_eq!(r.headers["x-request-id"], ok.as_str(), "128 visible ASCII bytes are kept");
}

#[tokio::test]
async fn a_repeated_key_is_400_and_named() {
    let addr = default_server();
    for body in [
        r#"{"text": "Verify your password at http://x.example.top", "text": "hello"}"#,
        r#"{"text": "hello", "features": {"amount": 5000, "amount": 1}}"#,
    ] {
        let r = send(addr, "POST", "/v1/classify", &[JSON], body).await;
        assert_eq!(r.status, 400, "{body}");
        let e = error_of(&r);
        assert_eq!(e["code"], "malformed_json");
        assert!(e["message"].as_str().unwrap().contains("duplicate key"), "{e}");
    }
}

#[tokio::test]
async fn field_errors_are_422_and_name_the_field() {
    let addr = default_server();
    let cases: &[(&str, &str, &str)] = &[
        ("{}", "text", "`text` is required"),
        (r#"{"text": null}"#, "text", "`text` is required"),
        (r#"{"text": ""}"#, "text", "`text` must not be empty"),
        (r#"{"text": "   \n"}"#, "text", "`text` must not be empty"),
        // invisible characters alone (zero-width space, byte-order mark, soft hyphen) are no message
        (r#"{"text": "\u200b\ufeff\u00ad"}"#, "text", "`text` must not be empty"),
        (r#"{"text": 42}"#, "text", "`text` must be a string, got a number"),
        (r#"{"text": ["a"]}"#, "text", "`text` must be a string, got an array"),
        (r#"{"text": "hi", "features": "x"}"#, "features", "`features` must be an object, got a string"),
        (r#"{"text": "hi", "tenant": 3}"#, "tenant", "`tenant` must be a string, got a number"),
        (r#"{"text": "hi", "colour": "red"}"#, "colour", "unknown field `colour`"),
        (r#""just a string""#, "body", "body must be a JSON object"),
    ];
    for (body, field, message) in cases {
        let r = send(addr, "POST", "/v1/classify", &[JSON], body.to_string()).await;
        assert_eq!(r.status, 422, "{body}");
        let e = error_of(&r);
        assert_eq!(e["code"], "invalid_field");
        assert_eq!(e["field"], *field, "{body}");
        assert!(e["message"].as_str().unwrap().contains(message), "{body}: {e}");
    }
}

#[tokio::test]
async fn text_over_its_limit_is_422_naming_the_limit() {
    let text = "a".repeat(16 * 1024 + 1);
    let r =
        send(default_server(), "POST", "/v1/classify", &[JSON], serde_json::json!({"text": text}).to_string()).await;
    assert_eq!(r.status, 422);
    let e = error_of(&r);
    assert_eq!(e["field"], "text");
    assert!(e["message"].as_str().unwrap().contains("at most 16384 bytes"), "{e}");
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let body = format!("{{\"text\": \"{}\"}}", "a".repeat(70 * 1024));
    let r = send(default_server(), "POST", "/v1/classify", &[JSON], body).await;
    assert_eq!(r.status, 413);
    let e = error_of(&r);
    assert_eq!(e["code"], "payload_too_large");
    assert!(e["message"].as_str().unwrap().contains("65536 bytes"), "{e}");
}

#[tokio::test]
async fn wrong_content_type_is_415() {
    let addr = default_server();
    for headers in [&[("content-type", "text/plain")][..], &[][..]] {
        let r = send(addr, "POST", "/v1/classify", headers, r#"{"text":"hi"}"#).await;
        assert_eq!(r.status, 415);
        let e = error_of(&r);
        assert_eq!(e["field"], "content-type");
    }
}

#[tokio::test]
async fn an_encoded_or_doubly_typed_body_is_refused_naming_the_header() {
    let addr = default_server();
    // A gzip body would read as malformed JSON; a plain one labelled gzip would be one thing to
    // tiergate and another to an app that decodes it.
    let gzip = vec![0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0x03, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    for body in [gzip, br#"{"text":"hi"}"#.to_vec()] {
        let r = send(addr, "POST", "/v1/classify", &[JSON, ("content-encoding", "gzip")], body).await;
        assert_eq!(r.status, 415);
        let e = error_of(&r);
        assert_eq!(e["code"], "unsupported_content_encoding");
        assert_eq!(e["field"], "content-encoding");
    }
    let r = send(addr, "POST", "/v1/classify", &[JSON, ("content-encoding", "identity")], r#"{"text":"hi"}"#).await;
    assert_eq!(r.status, 200);
    let r = send(addr, "POST", "/v1/classify", &[JSON, ("content-type", "text/plain")], r#"{"text":"hi"}"#).await;
    assert_eq!(r.status, 400);
    let e = error_of(&r);
    assert_eq!((e["code"].as_str(), e["field"].as_str()), (Some("repeated_header"), Some("content-type")));
}

#[tokio::test]
async fn bad_deadline_header_is_422() {
    let r =
        send(default_server(), "POST", "/v1/classify", &[JSON, ("x-tiergate-deadline-ms", "soon")], r#"{"text":"hi"}"#)
            .await;
    assert_eq!(r.status, 422);
    assert_eq!(error_of(&r)["field"], "x-tiergate-deadline-ms");
}

#[tokio::test]
async fn unknown_route_is_404_and_wrong_method_is_405() {
    let addr = default_server();
    let r = send(addr, "GET", "/v2/nothing", &[], "").await;
    assert_eq!(r.status, 404);
    assert_eq!(error_of(&r)["code"], "not_found");
    let r = send(addr, "GET", "/v1/classify", &[], "").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.headers["allow"], "POST");
    assert_eq!(error_of(&r)["code"], "method_not_allowed");
    // the admin listener's own endpoints too (a fresh-user check found 404 there)
    let (_, admin, _) = start_with_admin(config(&repo().join("policies")), Default::default(), Some("t"));
    for (method, path, allow) in [
        ("GET", "/v1/classify", "POST"),
        ("POST", "/healthz", "GET, HEAD"),
        ("DELETE", "/readyz", "GET, HEAD"),
        ("POST", "/metrics", "GET"),
    ] {
        let r = send(admin, method, path, &[], "").await;
        assert_eq!(r.status, 405, "{method} {path} on the admin listener");
        assert_eq!(r.headers["allow"], allow, "{method} {path}");
    }
}

#[tokio::test]
async fn bad_requests_do_not_disturb_the_server() {
    let addr = default_server();
    for _ in 0..20 {
        send(addr, "POST", "/v1/classify", &[JSON], "\u{0}\u{1}garbage").await;
    }
    let r = classify(addr, serde_json::json!({"text": "still here?"})).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn a_body_that_never_arrives_in_full_is_408_not_a_hang() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = config(&repo().join("policies"));
    c.server.request_timeout_ms = 300;
    let addr = start(c);
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Declares 20 bytes, sends 12, then waits.
    let head = "POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"text\":\"hi\"";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            response.extend_from_slice(&buf[..n]);
            if n == 0 || response.windows(4).any(|w| w == b"\r\n\r\n") && response.ends_with(b"}") {
                break;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server answered: {}", String::from_utf8_lossy(&response));
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
}
