//! The stream guard on SSE and plain-text streams, with real timing gaps.

use super::text::*;
use super::*;
use crate::policy::Action;
use serde_json::Value;
use std::path::Path;

#[test]
fn sse_text() {
    assert_eq!(sse_event_text("data: {\"choices\":[{\"delta\":{\"content\":\"Hi.\"}}]}\n\n").unwrap(), "Hi.");
    assert_eq!(sse_event_text("data: {\"token\":{\"text\":\" there\"}}\n\n").unwrap(), " there");
    let anthropic = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Yo\"}}\n\n";
    assert_eq!(sse_event_text(anthropic).unwrap(), "Yo");
    assert_eq!(sse_event_text("data: {\"type\":\"response.output_text.delta\",\"delta\":\"R\"}\n\n").unwrap(), "R");
    assert_eq!(sse_event_text("data: plain\ndata: two\n\n").unwrap(), "plain\ntwo");
    assert_eq!(sse_event_text("data: a\rdata: b\r\r").unwrap(), "a\nb");
    assert_eq!(sse_event_text("data: [DONE]\n\n"), None);
    assert_eq!(sse_event_text(": comment\n\n"), None);
    assert_eq!(event_end(b"data: a\n\ndata: b"), Some(9));
    assert_eq!(event_end(b"data: a\r\n\r\n"), Some(11));
    assert_eq!(event_end(b"data: a\r\rdata: b"), Some(9));
    assert_eq!(event_end(b"data: a\r\n\r"), None, "the last CR may be half of a CRLF");
    assert_eq!(event_end(b"data: a\n"), None);
    let mut s = "ééé".to_string();
    trim_to_window(&mut s, 3);
    assert_eq!(s, "é");
    assert_eq!(last_sentence_end(b"Hi. There"), Some(3));
    assert_eq!(last_sentence_end("Hi\u{3002} x".as_bytes()), Some(5));
    assert_eq!(last_sentence_end(b"no end"), None);
    // A dot or question mark inside a link, a number or a query ends nothing; one that ends
    // the piece does.
    assert_eq!(last_sentence_end(b"log in at https://login.top/verify?id=1 now"), None);
    assert_eq!(last_sentence_end(b"it costs 4.5 euros"), None);
    assert_eq!(last_sentence_end(b"Done."), Some(5));
    assert_eq!(last_sentence_end(b"Done. Next"), Some(5));
    assert_eq!(incomplete_char_len("a\u{8a9e}".as_bytes()), 0);
    assert_eq!(incomplete_char_len(&"a\u{8a9e}".as_bytes()[..3]), 2);
    assert_eq!(incomplete_char_len(&[b'a', 0xF0]), 1);
}

#[test]
fn encoded_bodies_are_not_read() {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, "text/event-stream".parse().unwrap());
    assert!(applies(&h));
    h.insert(CONTENT_ENCODING, "identity".parse().unwrap());
    assert!(applies(&h));
    h.insert(CONTENT_ENCODING, "gzip".parse().unwrap());
    assert!(!applies(&h), "gzip bytes are not text the rules can read");
}

fn sse_event_text(event: &str) -> Option<String> {
    sse_event(event).text
}

fn policy() -> Arc<Policy> {
    Arc::new(Policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap())
}

fn config(buffer_ms: u64, window_bytes: usize) -> StreamGuardConfig {
    StreamGuardConfig { enabled: true, buffer_ms, cut_on: vec![Action::Block], window_bytes, max_held_bytes: 64 * 1024 }
}

fn delta(text: &str) -> String {
    format!("data: {}\n\n", json!({"choices": [{"delta": {"content": text}}]}))
}

const RISKY: &str = "Please send your password to http://evil.example/login now.";

/// Guards an app body that sends `pieces` `gap` apart (the first at once) and returns what
/// the client gets: each frame with its arrival time since the start. Time is paused in these
/// tests, so the times are exact.
async fn guard(sse: bool, config: StreamGuardConfig, pieces: Vec<Vec<u8>>, gap: Duration) -> Vec<(Bytes, u64)> {
    let (app, mut app_rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
    tokio::spawn(async move {
        for (i, piece) in pieces.into_iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            if app.send(Ok(Frame::data(Bytes::from(piece)))).await.is_err() {
                return;
            }
        }
    });
    let body = BoxBody::new(StreamBody::new(futures_util::stream::poll_fn(move |cx| app_rx.poll_recv(cx))));
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, if sse { "text/event-stream" } else { "text/plain" }.parse().unwrap());
    let mut out = spawn(policy(), Family::default(), "t".into(), config, &headers, body, None);
    let start = Instant::now();
    let mut frames = Vec::new();
    while let Some(frame) = out.frame().await {
        let data = frame.expect("the guard ends cleanly").into_data().unwrap();
        frames.push((data, start.elapsed().as_millis() as u64));
    }
    frames
}

fn joined(frames: &[(Bytes, u64)]) -> String {
    frames.iter().map(|(b, _)| String::from_utf8_lossy(b)).collect()
}

#[tokio::test(start_paused = true)]
async fn an_incomplete_sse_event_is_never_released() {
    // The risky event arrives in two frames, the first together with a complete benign
    // event that ends a sentence: only the complete event may go out at that point.
    let risky = delta(RISKY);
    let (head, rest) = risky.split_at(40);
    let first = format!("{}{head}", delta("Hello there."));
    let frames = guard(true, config(300, 4096), vec![first.into(), rest.into()], Duration::from_millis(10)).await;
    let got = joined(&frames);
    let cut_at = got.find("content_filter").and_then(|at| got[..at].rfind("data: ")).expect("the stream was cut");
    assert_eq!(&got[..cut_at], delta("Hello there."), "the client got a complete event, then the decision");
    assert!(got.ends_with("data: [DONE]\n\n"));
}

/// The events of an SSE body, without their blank lines.
fn events(body: &str) -> Vec<&str> {
    body.split("\n\n").filter(|e| !e.is_empty()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_cut_openai_stream_ends_with_a_content_filter_chunk_of_the_same_stream() {
    for (object, choice) in [
        ("chat.completion.chunk", json!({"index": 0, "delta": {"content": "Hello there."}, "finish_reason": null})),
        ("text_completion", json!({"index": 0, "text": "Hello there.", "finish_reason": null})),
    ] {
        let head = json!({"id": "cmpl-7", "object": object, "created": 1764547200, "model": "smollm2"});
        let mut first = head.clone();
        first["choices"] = json!([choice]);
        let mut risky = first.clone();
        risky["choices"][0]["delta"]["content"] = json!(RISKY);
        risky["choices"][0]["text"] = json!(RISKY);
        if object == "text_completion" {
            risky["choices"][0].as_object_mut().unwrap().remove("delta");
        }
        let pieces = vec![format!("data: {first}\n\n").into(), format!("data: {risky}\n\n").into()];
        let got = joined(&guard(true, config(300, 4096), pieces, Duration::from_millis(10)).await);
        let events = events(&got);
        assert_eq!(events.len(), 3, "{got}");
        assert_eq!(events[0], format!("data: {first}"));
        assert_eq!(events[2], "data: [DONE]");
        let last: Value = serde_json::from_str(events[1].strip_prefix("data: ").unwrap()).unwrap();
        for key in ["id", "object", "created", "model"] {
            assert_eq!(last[key], head[key], "{key}: {last}");
        }
        let closing = &last["choices"][0];
        assert_eq!(closing["finish_reason"], "content_filter", "{last}");
        assert_eq!(closing["index"], 0);
        if object == "text_completion" {
            assert_eq!(closing["text"], "", "{last}");
        } else {
            assert_eq!(closing["delta"], json!({}), "{last}");
        }
        assert_eq!(last["tiergate"]["rule"], "credential_phishing", "{last}");
        assert_eq!(last["tiergate"]["action"], "block");
    }
}

#[tokio::test(start_paused = true)]
async fn a_cut_stream_of_another_shape_ends_with_a_tiergate_event() {
    let token = |t: &str| format!("data: {}\n\n", json!({"token": {"text": t}}));
    let pieces = vec![token("Hello there.").into(), token(RISKY).into()];
    let got = joined(&guard(true, config(300, 4096), pieces, Duration::from_millis(10)).await);
    let events = events(&got);
    assert_eq!(events.len(), 3, "{got}");
    let decision: Value = serde_json::from_str(events[1].strip_prefix("event: tiergate\ndata: ").unwrap()).unwrap();
    assert_eq!(decision["tiergate"]["rule"], "credential_phishing");
    assert_eq!(events[2], "data: [DONE]");
}

/// An app streaming a phishing link one word per event: the dots inside the link end no
/// sentence, so the link is held with its sentence and never reaches the client once the rest
/// of the sentence makes the rule match.
#[tokio::test(start_paused = true)]
async fn a_link_streamed_word_by_word_is_held_with_its_sentence() {
    let reply = "Sure thing, to fix it log in at https://paypal-secure-login.top/verify and type your password and the SMS code there";
    let pieces = reply.split_inclusive(' ').map(|w| delta(w).into_bytes()).collect();
    let frames = guard(true, config(300, 4096), pieces, Duration::from_millis(1)).await;
    let got = joined(&frames);
    assert!(!got.contains("paypal-secure-login"), "{got:?}");
    assert!(got.contains("credential_phishing"), "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn plain_text_is_released_up_to_the_last_sentence_end() {
    let pieces = vec![b"Hello there. Please send your password".to_vec(), b" to http://evil.example/x now.".to_vec()];
    let frames = guard(false, config(300, 4096), pieces, Duration::from_millis(10)).await;
    let got = joined(&frames);
    assert!(got.starts_with("Hello there.\n{"), "{got:?}");
    let last: Value = serde_json::from_str(got.lines().last().unwrap()).unwrap();
    assert_eq!(last["tiergate"]["rule"], "credential_phishing");
}

#[tokio::test(start_paused = true)]
async fn a_burst_longer_than_the_window_is_read_whole() {
    // One frame: the risky sentence, then far more than a window of benign text.
    let burst = format!("{RISKY} {}", "All is well here and nothing else happens. ".repeat(20));
    let frames = guard(false, config(300, 128), vec![burst.into()], Duration::ZERO).await;
    let got = joined(&frames);
    assert!(!got.contains("password"), "{got:?}");
    assert!(got.contains("credential_phishing"), "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn the_timer_releases_text_without_a_sentence_end_but_not_half_an_event() {
    let pieces = vec![b"no sentence end in this piece".to_vec(), b" and more".to_vec()];
    let frames = guard(false, config(100, 4096), pieces, Duration::from_millis(400)).await;
    assert_eq!(frames[0], (Bytes::from_static(b"no sentence end in this piece"), 100));
    // The last piece goes out when the app's stream ends, right after it.
    assert_eq!(frames[1], (Bytes::from_static(b" and more"), 400));
    // An event split in two is released only once whole, however long that takes.
    let event = delta("no sentence end");
    let (head, tail) = event.split_at(20);
    let frames = guard(true, config(100, 4096), vec![head.into(), tail.into()], Duration::from_millis(400)).await;
    assert_eq!(joined(&frames), event);
    assert!(frames.iter().all(|(_, at)| *at >= 400), "{frames:?}");
}

#[tokio::test(start_paused = true)]
async fn an_event_without_end_is_not_held_for_the_whole_stream() {
    let endless = format!("data: {}", "x".repeat(MAX_PARTIAL_EVENT + 1));
    let frames = guard(true, config(100, 4096), vec![endless.into(), b"\n\n".to_vec()], Duration::from_secs(5)).await;
    assert!(
        frames[0].1 <= 100,
        "released (over max_held_bytes, or by the timer), not at the end of the stream: {frames:?}"
    );
    assert_eq!(joined(&frames).len(), MAX_PARTIAL_EVENT + 9);
}

#[tokio::test(start_paused = true)]
async fn a_character_split_across_frames_is_read_whole() {
    let text = "パスワード。".as_bytes();
    let (tx, _rx) = mpsc::channel(1);
    let mut g = StreamGuard::new(policy(), Family::default(), "t".into(), config(100, 4096), false, tx);
    assert!(!g.take_text(&Bytes::copy_from_slice(&text[..4])));
    assert!(g.take_text(&Bytes::copy_from_slice(&text[4..])), "the full stop ends a sentence");
    assert_eq!(g.generated, "パスワード。");
}

#[tokio::test(start_paused = true)]
async fn the_app_stream_is_dropped_when_the_client_leaves() {
    let (app, mut app_rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
    let body = BoxBody::new(StreamBody::new(futures_util::stream::poll_fn(move |cx| app_rx.poll_recv(cx))));
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, "text/plain".parse().unwrap());
    let client = spawn(policy(), Family::default(), "t".into(), config(100, 4096), &headers, body, None);
    drop(client);
    // The app sends nothing more; its stream must still be let go.
    tokio::time::timeout(Duration::from_secs(1), app.closed()).await.expect("the guard dropped the app's body");
}

#[tokio::test(start_paused = true)]
async fn held_bytes_are_bounded_whatever_buffer_ms_says() {
    // No sentence end and a long buffer_ms: only the byte bound can release these.
    let piece = "word ".repeat(200);
    let mut bounded = config(60_000, 4096);
    bounded.max_held_bytes = 2048;
    let frames = guard(false, bounded, vec![piece.clone().into(); 10], Duration::from_millis(10)).await;
    let before_end: usize = frames.iter().filter(|(_, at)| *at < 90).map(|(b, _)| b.len()).sum();
    assert!(
        before_end >= 8 * 1000,
        "released as the bound was passed, not at the end: {before_end} bytes before 90 ms"
    );
    assert_eq!(joined(&frames), piece.repeat(10), "nothing lost or changed");
}
