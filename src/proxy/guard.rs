//! The streaming guard: the policy's rules over what an app streams back (Server-Sent Events
//! or chunked text from an LLM), as it flows.
//!
//! The app's bytes are held back until the text they carry ends a sentence, or until
//! `buffer_ms` has passed since the oldest held byte; then the rules run over the trailing
//! `window_bytes` of everything generated so far (never per token; a burst longer than the window
//! is covered by overlapping windows), and the held bytes are released unchanged. What is
//! released at a sentence end stops at a boundary the client can take: SSE, the last complete
//! event (an event is never split, so the final event below always starts on its own); plain
//! text, the last sentence end (the sentence in progress stays held). When a rule whose action
//! is in `cut_on` matches, the held bytes — the sentence that matched — are dropped and the
//! stream ends cleanly with a final event that carries the decision (SSE: `event: tiergate` then
//! `data: [DONE]`; plain text: a last JSON line). A stream that never matches reaches the client
//! byte for byte.
//!
//! The guard reads identity-coded bodies only: a compressed body (`Content-Encoding`) is not
//! text it can read, see [`applies`].

use super::config::StreamGuardConfig;
use super::{BoxBody, BoxError};
use crate::metrics::RouteLabels;
use crate::policy::Policy;
use crate::rules::{RuleVerdict, RulesInput};
use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Whether a response is a stream the guard reads: `text/event-stream` or `text/plain`, not
/// content-coded (`Content-Encoding: identity` or absent).
pub fn applies(headers: &HeaderMap) -> bool {
    let essence = content_type(headers);
    (essence == "text/event-stream" || essence == "text/plain") && !encoded(headers)
}

/// Whether the body is content-coded (gzip, br, ...): bytes the guard cannot read as text. A
/// guarded route should ask its app for identity coding (`Accept-Encoding: identity`).
pub fn encoded(headers: &HeaderMap) -> bool {
    headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| !coding.trim().is_empty() && !coding.trim().eq_ignore_ascii_case("identity"))
}

fn content_type(headers: &HeaderMap) -> String {
    let raw = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    raw.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

/// Starts guarding `body`; returns the body the client gets. The guard runs as its own task and
/// stops when the stream ends or the client goes away (dropping the app's body with it).
pub fn spawn(
    policy: Arc<Policy>,
    counter: Family<RouteLabels, Counter>,
    route: String,
    config: StreamGuardConfig,
    headers: &HeaderMap,
    body: BoxBody,
) -> BoxBody {
    let (tx, mut rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(16);
    let guard = Guard::new(policy, counter, route, config, content_type(headers) == "text/event-stream", tx);
    tokio::spawn(guard.run(body));
    BoxBody::new(StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))))
}

struct Guard {
    policy: Arc<Policy>,
    counter: Family<RouteLabels, Counter>,
    route: String,
    sse: bool,
    config: StreamGuardConfig,
    /// Bytes received and not yet released to the client, with when each frame arrived.
    held: VecDeque<(Bytes, Instant)>,
    held_len: usize,
    /// Plain text: how many of the held bytes come after the last sentence end.
    text_tail: usize,
    /// The text generated so far (trimmed to the window at each evaluation).
    generated: String,
    /// How many trailing bytes of `generated` the rules have not seen yet.
    unevaluated: usize,
    /// SSE: the bytes of an event not yet complete (events end with a blank line); always the
    /// last bytes held, since only complete events are released before the end.
    partial_event: BytesMut,
    /// Plain text: the first bytes of a UTF-8 character whose rest is in the next frame.
    utf8_carry: Vec<u8>,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
}

/// Whether the client is still there.
type Open = bool;

/// What to release after an evaluation that passed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Release {
    /// Up to the last complete SSE event / the last sentence end of plain text.
    Sentence,
    /// `buffer_ms` is up: everything but an incomplete SSE event.
    Timer,
    /// The app's stream ended: everything.
    All,
}

impl Guard {
    fn new(
        policy: Arc<Policy>,
        counter: Family<RouteLabels, Counter>,
        route: String,
        config: StreamGuardConfig,
        sse: bool,
        tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    ) -> Guard {
        Guard {
            policy,
            counter,
            route,
            sse,
            config,
            held: VecDeque::new(),
            held_len: 0,
            text_tail: 0,
            generated: String::new(),
            unevaluated: 0,
            partial_event: BytesMut::new(),
            utf8_carry: Vec::new(),
            tx,
        }
    }

    async fn run(mut self, mut body: BoxBody) {
        loop {
            tokio::select! {
                frame = body.frame() => match frame {
                    None => {
                        self.take_last_text();
                        self.evaluate_and_release(Release::All).await;
                        return;
                    }
                    Some(Err(e)) => {
                        // The app's stream broke: release what was held only if it passes.
                        self.take_last_text();
                        if self.evaluate_and_release(Release::All).await {
                            let _ = self.tx.send(Err(e)).await;
                        }
                        return;
                    }
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            let sentence_ended = self.take_text(&data);
                            self.held_len += data.len();
                            self.held.push_back((data, Instant::now()));
                            if sentence_ended && !self.evaluate_and_release(Release::Sentence).await {
                                return;
                            }
                        }
                        Err(trailers) => {
                            self.take_last_text();
                            if !self.evaluate_and_release(Release::All).await || self.tx.send(Ok(trailers)).await.is_err() {
                                return;
                            }
                        }
                    },
                },
                _ = sleep_until(self.flush_at()) => {
                    if !self.evaluate_and_release(Release::Timer).await {
                        return;
                    }
                }
                // Without this a guard waiting on a quiet app would hold the app's stream open
                // until its next frame, long after the client left.
                _ = self.tx.closed() => return,
            }
        }
    }

    /// When the time-based flush is due: `buffer_ms` after the oldest held byte, if any held
    /// byte may be released by it (an incomplete SSE event may not).
    fn flush_at(&self) -> Option<Instant> {
        let keep = if self.sse { self.partial_event.len() } else { 0 };
        let (_, oldest) = self.held.front()?;
        (self.held_len > keep).then(|| *oldest + Duration::from_millis(self.config.buffer_ms))
    }

    /// Appends the text `data` carries; true when a sentence ended in it.
    fn take_text(&mut self, data: &Bytes) -> bool {
        let before = self.generated.len();
        if self.sse {
            self.partial_event.extend_from_slice(data);
            while let Some(end) = event_end(&self.partial_event) {
                let event = self.partial_event.split_to(end);
                if let Some(text) = sse_event_text(&String::from_utf8_lossy(&event)) {
                    self.generated.push_str(&text);
                }
            }
            if self.partial_event.len() > MAX_PARTIAL_EVENT {
                // Not SSE as it should be (no blank line for this long): read the bytes as they
                // are and let them go, rather than hold the rest of the stream.
                let event = std::mem::take(&mut self.partial_event);
                self.generated.push_str(&String::from_utf8_lossy(&event));
            }
        } else {
            let mut bytes = std::mem::take(&mut self.utf8_carry);
            bytes.extend_from_slice(data);
            // A character split across frames is decoded whole with the next frame, not as two
            // replacement characters (which would hide it from the rules).
            self.utf8_carry = bytes.split_off(bytes.len() - incomplete_char_len(&bytes));
            self.generated.push_str(&String::from_utf8_lossy(&bytes));
            match last_sentence_end(data) {
                Some(end) => self.text_tail = data.len() - end,
                None => self.text_tail += data.len(),
            }
        }
        let new = &self.generated[before..];
        self.unevaluated += new.len();
        new.contains(SENTENCE_ENDS)
    }

    /// At the end of the app's stream: the text of what never completed (an SSE event without
    /// its blank line, a truncated character), so that no held byte is released unread.
    fn take_last_text(&mut self) {
        let text = if self.sse {
            let event = std::mem::take(&mut self.partial_event);
            sse_event_text(&String::from_utf8_lossy(&event))
        } else {
            let carry = std::mem::take(&mut self.utf8_carry);
            (!carry.is_empty()).then(|| String::from_utf8_lossy(&carry).into_owned())
        };
        if let Some(text) = text {
            self.unevaluated += text.len();
            self.generated.push_str(&text);
        }
    }

    /// Runs the rules over the window if text arrived since the last run; releases held bytes
    /// (which, see [`Release`]) if no cutting rule matched, else ends the stream with the
    /// decision. Returns whether the stream goes on (and the client is still there).
    async fn evaluate_and_release(&mut self, how: Release) -> Open {
        if self.unevaluated > 0 {
            let cut = self.evaluate();
            let outcome = if cut.is_some() { "cut" } else { "pass" };
            self.counter.get_or_create(&RouteLabels { route: self.route.clone(), outcome }).inc();
            if let Some(verdict) = cut {
                self.cut(verdict).await;
                return false;
            }
        }
        let keep = match how {
            Release::All => 0,
            _ if self.sse => self.partial_event.len(),
            Release::Timer => 0,
            Release::Sentence => self.text_tail,
        };
        let open = self.release(self.held_len.saturating_sub(keep)).await;
        self.text_tail = self.text_tail.min(self.held_len);
        open
    }

    /// The verdict of the first window in which a cutting rule matched, if any. The unevaluated
    /// text is covered by windows that overlap by half, each ending further on, so a burst
    /// longer than the window is read whole and a phrase up to half a window long is seen in one
    /// piece wherever it falls.
    fn evaluate(&mut self) -> Option<RuleVerdict> {
        let window = self.config.window_bytes.max(1);
        let len = self.generated.len();
        let first_new = len - self.unevaluated.min(len);
        self.unevaluated = 0;
        let step = (window / 2).max(1);
        let mut end = first_new + window;
        let mut ends = Vec::new();
        while end < len {
            ends.push(end);
            end += step;
        }
        ends.push(len);
        let mut found = None;
        for end in ends {
            let end = floor_char_boundary(&self.generated, end);
            let start = ceil_char_boundary(&self.generated, end.saturating_sub(window));
            let text = &self.generated[start..end];
            let signals = self.policy.rules.count_signals(text);
            let verdict = self.policy.rules.evaluate(&RulesInput {
                text,
                signals: &signals,
                features: &serde_json::Map::new(),
                tenant: None,
                model: None,
            });
            if verdict.rule.is_some() && self.config.cut_on.contains(&verdict.action) {
                found = Some(verdict);
                break;
            }
        }
        trim_to_window(&mut self.generated, window);
        found
    }

    /// Drops what is held and ends the stream with the decision.
    async fn cut(&mut self, verdict: RuleVerdict) {
        tracing::warn!(route = %self.route, rule = ?verdict.rule, action = verdict.action.as_str(), "stream guard ended a response");
        self.held.clear();
        self.held_len = 0;
        let decision = json!({"tiergate": {
            "action": verdict.action.as_str(),
            "rule": verdict.rule,
            "risk_score": verdict.risk_score,
            "policy_version": self.policy.version,
            "reason": "the response was ended by the stream guard",
        }});
        let last = if self.sse {
            format!("event: tiergate\ndata: {decision}\n\ndata: [DONE]\n\n")
        } else {
            format!("\n{decision}\n")
        };
        let _ = self.tx.send(Ok(Frame::data(Bytes::from(last)))).await;
    }

    /// Sends the first `n` held bytes, as the frames they came in (the last one split if needed).
    async fn release(&mut self, mut n: usize) -> Open {
        while n > 0 {
            let Some((mut data, arrived)) = self.held.pop_front() else { break };
            if data.len() > n {
                self.held.push_front((data.split_off(n), arrived));
            }
            n -= data.len();
            self.held_len -= data.len();
            if self.tx.send(Ok(Frame::data(data))).await.is_err() {
                return false;
            }
        }
        true
    }
}

/// The longest incomplete SSE event held back whole; longer, its bytes are read as plain text.
const MAX_PARTIAL_EVENT: usize = 64 * 1024;

/// Characters that end a sentence (and so trigger an evaluation).
const SENTENCE_ENDS: [char; 7] = ['.', '!', '?', '\n', '。', '！', '？'];

/// End (exclusive) of the last sentence-ending character in raw text bytes. UTF-8 bytes below
/// 0x80 never occur inside a longer character, so ASCII ends can be found without decoding.
fn last_sentence_end(data: &[u8]) -> Option<usize> {
    let ascii = data.iter().rposition(|b| matches!(b, b'.' | b'!' | b'?' | b'\n')).map(|i| i + 1);
    let wide = ["。", "！", "？"]
        .iter()
        .filter_map(|c| data.windows(c.len()).rposition(|w| w == c.as_bytes()).map(|i| i + c.len()))
        .max();
    ascii.max(wide)
}

/// How many trailing bytes of `bytes` are the start of a UTF-8 character whose rest is missing.
fn incomplete_char_len(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: the lead is further back
        }
        let needs = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needs > back { back } else { 0 };
    }
    0
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Keeps the last `window` bytes, cut at a character boundary.
fn trim_to_window(text: &mut String, window: usize) {
    if text.len() > window {
        let start = ceil_char_boundary(text, text.len() - window);
        text.drain(..start);
    }
}

/// End (exclusive) of the first complete SSE event: after its blank line. Lines end with
/// `\r\n`, `\n` or `\r` (the SSE grammar allows all three); a `\r` at the very end of `buf`
/// waits for the next byte, which may be its `\n`.
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    let mut i = 0;
    while i < buf.len() {
        let eol = match buf[i] {
            b'\n' => 1,
            b'\r' if i + 1 == buf.len() => return None,
            b'\r' if buf[i + 1] == b'\n' => 2,
            b'\r' => 1,
            _ => {
                i += 1;
                continue;
            }
        };
        if i == line_start {
            return Some(i + eol);
        }
        i += eol;
        line_start = i;
    }
    None
}

/// The generated text in one SSE event: its `data:` lines joined; from JSON, OpenAI chat's
/// `choices[].delta.content` / `choices[].text`, TGI's `token.text`, Anthropic's `delta.text`
/// or OpenAI Responses' `delta` (a string); `[DONE]` carries none.
fn sse_event_text(event: &str) -> Option<String> {
    let data: Vec<&str> = event
        .split(['\r', '\n'])
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return None;
    }
    let data = data.join("\n");
    if data.trim() == "[DONE]" {
        return None;
    }
    let Ok(value) = serde_json::from_str::<Value>(&data) else {
        return Some(data);
    };
    let mut text = String::new();
    if let Some(choices) = value.get("choices").and_then(Value::as_array) {
        for choice in choices {
            let piece = choice.pointer("/delta/content").or_else(|| choice.get("text"));
            if let Some(s) = piece.and_then(Value::as_str) {
                text.push_str(s);
            }
        }
    } else if let Some(s) =
        ["/token/text", "/delta/text", "/text", "/delta"].iter().find_map(|p| value.pointer(p).and_then(Value::as_str))
    {
        text.push_str(s);
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Action;
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

    fn policy() -> Arc<Policy> {
        Arc::new(Policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap())
    }

    fn config(buffer_ms: u64, window_bytes: usize) -> StreamGuardConfig {
        StreamGuardConfig { enabled: true, buffer_ms, cut_on: vec![Action::Block], window_bytes }
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
        let mut out = spawn(policy(), Family::default(), "t".into(), config, &headers, body);
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
        let cut_at = got.find("event: tiergate\n").expect("the stream was cut");
        assert_eq!(&got[..cut_at], delta("Hello there."), "the client got a complete event, then the decision");
        assert!(got.ends_with("data: [DONE]\n\n"));
    }

    #[tokio::test(start_paused = true)]
    async fn plain_text_is_released_up_to_the_last_sentence_end() {
        let pieces =
            vec![b"Hello there. Please send your password".to_vec(), b" to http://evil.example/x now.".to_vec()];
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
        let frames =
            guard(true, config(100, 4096), vec![endless.into(), b"\n\n".to_vec()], Duration::from_secs(5)).await;
        assert_eq!(frames[0].1, 100, "released by the timer, not at the end of the stream");
        assert_eq!(joined(&frames).len(), MAX_PARTIAL_EVENT + 9);
    }

    #[tokio::test(start_paused = true)]
    async fn a_character_split_across_frames_is_read_whole() {
        let text = "パスワード。".as_bytes();
        let (tx, _rx) = mpsc::channel(1);
        let mut g = Guard::new(policy(), Family::default(), "t".into(), config(100, 4096), false, tx);
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
        let client = spawn(policy(), Family::default(), "t".into(), config(100, 4096), &headers, body);
        drop(client);
        // The app sends nothing more; its stream must still be let go.
        tokio::time::timeout(Duration::from_secs(1), app.closed()).await.expect("the guard dropped the app's body");
    }
}
