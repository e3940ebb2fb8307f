//! The stream guard against a real app (tests/common/app.rs) streaming Server-Sent Events and
//! chunked text through tiergate: benign streams pass byte for byte, a stream that turns risky is
//! cut before the risky sentence and ends cleanly with the decision, text without a sentence end
//! is released after `buffer_ms`, and every evaluation is counted in `/metrics`.

mod common;

use bytes::Bytes;
use common::proxy::Setup;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const RISKY: &str = "Please send your password to http://evil.example/login now.";
const BENIGN: [&str; 4] = ["Hello there.", " The weather is mild today.", " We can meet at noon.", " See you then!"];

/// One app and one tiergate in front of it, shared by the tests here. Routes are told apart by
/// `Host` so that each test reads its own counters and timer settings:
/// `fast.test` flushes after 100 ms, `metered.test` is only used by the metrics test, any other
/// host gets the default guard (300 ms).
fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    common::proxy::shared(&SETUP, |app| {
        let routes = format!(
            r#"
            [[routes]]
            name = "fast"
            host = "fast.test"
            path = "/(sse|text)"
            upstream = ["{app}"]
            [routes.stream_guard]
            buffer_ms = 100

            [[routes]]
            name = "metered"
            host = "metered.test"
            path = "/(sse|text)"
            upstream = ["{app}"]
            [routes.stream_guard]

            [[routes]]
            name = "guarded"
            path = "/(sse|text)"
            upstream = ["{app}"]
            [routes.stream_guard]
            "#,
            app = app.url()
        );
        common::config_with_routes(&common::repo().join("policies"), &routes)
    })
}

/// `/sse?events=...` or `/text?chunks=...` with the pieces and gap, query-encoded.
fn path(kind: &str, pieces: &[&str], gap_ms: u64) -> String {
    let key = if kind == "sse" { "events" } else { "chunks" };
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair(key, &pieces.join("|"))
        .append_pair("gap_ms", &gap_ms.to_string())
        .finish();
    format!("/{kind}?{query}")
}

/// A streamed response: its head and each body frame with when it arrived after the head.
struct Streamed {
    status: StatusCode,
    headers: http::HeaderMap,
    frames: Vec<(Bytes, Duration)>,
}

impl Streamed {
    fn body(&self) -> Bytes {
        self.frames.iter().flat_map(|(b, _)| b.iter().copied()).collect::<Vec<u8>>().into()
    }

    fn text(&self) -> String {
        String::from_utf8(self.body().to_vec()).expect("UTF-8 body")
    }
}

/// GETs `path` from `addr` with `Host: host`, reading the body frame by frame. Panics if the
/// body ends with an error: every stream here must end cleanly.
async fn get(addr: SocketAddr, host: &str, path: &str) -> Streamed {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::get(format!("http://{addr}{path}")).header("host", host).body(Empty::new()).unwrap();
    let response = client.request(req).await.expect("request reaches the server");
    let head_at = Instant::now();
    let (parts, mut body) = response.into_parts();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap_or_else(|e| panic!("the body ended with an error: {e}"));
        if let Ok(data) = frame.into_data() {
            frames.push((data, head_at.elapsed()));
        }
    }
    Streamed { status: parts.status, headers: parts.headers, frames }
}

/// The decision carried by the closing chunk of a cut SSE stream (an OpenAI-style chunk with
/// `finish_reason: "content_filter"` and the decision as its `tiergate` field, then `[DONE]`),
/// as `{"tiergate": ...}`, and what came before it.
fn split_sse_decision(body: &str) -> (&str, Value) {
    let last = body
        .strip_suffix("\n\ndata: [DONE]\n\n")
        .unwrap_or_else(|| panic!("the stream must end with the closing chunk then [DONE]: {body:?}"));
    let at = last.rfind("data: ").unwrap();
    let (before, closing) = last.split_at(at);
    let chunk: Value =
        serde_json::from_str(closing.strip_prefix("data: ").unwrap()).expect("the closing chunk is JSON");
    assert_eq!(chunk["choices"][0]["finish_reason"], "content_filter", "{chunk}");
    assert_eq!(chunk["choices"][0]["delta"], serde_json::json!({}), "{chunk}");
    (before, serde_json::json!({"tiergate": chunk["tiergate"]}))
}

fn assert_credential_block(decision: &Value) {
    assert_eq!(decision["tiergate"]["action"], "block", "{decision}");
    assert_eq!(decision["tiergate"]["rule"], "credential_phishing", "{decision}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_benign_sse_stream_passes_byte_for_byte() {
    let s = setup();
    let path = path("sse", &BENIGN, 20);
    let direct = get(s.app.addr(), "app", &path).await;
    let proxied = get(s.proxy, "any.test", &path).await;
    assert_eq!(proxied.status, StatusCode::OK);
    assert_eq!(proxied.headers["content-type"], "text/event-stream");
    assert!(direct.text().ends_with("data: [DONE]\n\n"), "the app sent the whole stream: {:?}", direct.text());
    assert_eq!(proxied.body(), direct.body(), "the guard changed a stream no rule matched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_stream_that_turns_risky_is_cut_before_the_risky_sentence() {
    let s = setup();
    let pieces = [BENIGN[0], BENIGN[1], RISKY, " More text after.", " And more."];
    let path = path("sse", &pieces, 20);
    let direct = get(s.app.addr(), "app", &path).await.text();
    let proxied = get(s.proxy, "any.test", &path).await;
    assert_eq!(proxied.status, StatusCode::OK);
    let body = proxied.text();
    let (before, decision) = split_sse_decision(&body);
    // Exactly the app's first two events (each `data: {...}\n\n`), then the decision.
    let benign_events: String = direct.split_inclusive("\n\n").take(2).collect();
    assert!(benign_events.contains("mild today"), "{direct:?}");
    assert_eq!(before, benign_events);
    assert!(!body.contains("password") && !body.contains("More text"), "{body:?}");
    assert_credential_block(&decision);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_stream_that_turns_risky_is_cut_with_a_final_json_line() {
    let s = setup();
    let pieces = [BENIGN[0], BENIGN[1], RISKY, " More text after."];
    let proxied = get(s.proxy, "any.test", &path("text", &pieces, 20)).await;
    assert_eq!(proxied.status, StatusCode::OK);
    assert!(!proxied.headers.contains_key("content-length"), "the guard may end the body early");
    let body = proxied.text();
    let (text, last) = body.rsplit_once('\n').map(|(t, _)| t.rsplit_once('\n').unwrap()).unwrap();
    assert_eq!(text, "Hello there. The weather is mild today.");
    assert!(body.ends_with('\n'), "{body:?}");
    assert_credential_block(&serde_json::from_str(last).unwrap_or_else(|e| panic!("last line {last:?}: {e}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_without_a_sentence_end_is_released_after_buffer_ms() {
    let s = setup();
    // Two pieces 400 ms apart, neither ending a sentence; the route flushes after 100 ms.
    let pieces = ["the first piece has no full stop", " the second piece neither"];
    let (sse_path, text_path) = (path("sse", &pieces, 400), path("text", &pieces, 400));
    let (sse, text) = tokio::join!(get(s.proxy, "fast.test", &sse_path), get(s.proxy, "fast.test", &text_path));
    for streamed in [sse, text] {
        let first = streamed.frames.iter().find(|(b, _)| b.windows(5).any(|w| w == b"first")).expect("first piece");
        let second = streamed.frames.iter().find(|(b, _)| b.windows(6).any(|w| w == b"second")).expect("second");
        assert!(first.1 >= Duration::from_millis(90), "the first piece was held for buffer_ms: {:?}", first.1);
        // Released by the timer (~100 ms), not with the second piece (~400 ms).
        assert!(second.1 - first.1 >= Duration::from_millis(150), "first {:?}, second {:?}", first.1, second.1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evaluations_are_counted_by_route_and_outcome() {
    let s = setup();
    let cut = get(s.proxy, "metered.test", &path("sse", &[BENIGN[0], RISKY, BENIGN[2]], 20)).await;
    split_sse_decision(&cut.text());
    let passed = get(s.proxy, "metered.test", &path("text", &BENIGN, 20)).await;
    assert_eq!(passed.text(), BENIGN.concat());
    let metrics = common::send(s.proxy, "GET", "/metrics", &[], Bytes::new()).await;
    assert_eq!(metrics.status, StatusCode::OK);
    let metrics = String::from_utf8(metrics.body.to_vec()).unwrap();
    let count = |outcome: &str| -> u64 {
        let series = format!("tiergate_stream_guard_evaluations_total{{route=\"metered\",outcome=\"{outcome}\"}} ");
        let line = metrics.lines().find_map(|l| l.strip_prefix(series.as_str()));
        line.unwrap_or_else(|| panic!("no {series} in /metrics")).trim().parse().unwrap()
    };
    assert_eq!(count("cut"), 1);
    // One evaluation per sentence end: the benign sentence of the cut stream, and the four of
    // the text stream.
    assert_eq!(count("pass"), 5);
}
