//! The streaming guard: the policy's rules over what an app streams back (Server-Sent Events
//! or chunked text from an LLM), as it flows.
//!
//! The app's bytes are held back until the text they carry ends a sentence, or until
//! `buffer_ms` has passed since the oldest held byte; then the rules run once over the trailing
//! `window_bytes` of everything generated so far (never per token), and the held bytes are
//! released unchanged. When a rule whose action is in `cut_on` matches, the held bytes — the
//! sentence that matched — are dropped and the stream ends cleanly with a final event that
//! carries the decision (SSE: `event: tiergate` then `data: [DONE]`; plain text: a last JSON
//! line). A stream that never matches reaches the client byte for byte.

use super::config::StreamGuardConfig;
use super::{BoxBody, BoxError};
use crate::metrics::RouteLabels;
use crate::policy::Policy;
use crate::rules::RulesInput;
use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, CONTENT_TYPE};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Whether a response is a stream the guard reads: `text/event-stream` or `text/plain`.
pub fn applies(headers: &HeaderMap) -> bool {
    let essence = content_type(headers);
    essence == "text/event-stream" || essence == "text/plain"
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
    let guard = Guard {
        policy,
        counter,
        route,
        sse: content_type(headers) == "text/event-stream",
        config,
        held: Vec::new(),
        held_since: None,
        generated: String::new(),
        unevaluated: false,
        partial_event: BytesMut::new(),
        tx,
    };
    tokio::spawn(guard.run(body));
    BoxBody::new(StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))))
}

struct Guard {
    policy: Arc<Policy>,
    counter: Family<RouteLabels, Counter>,
    route: String,
    sse: bool,
    config: StreamGuardConfig,
    /// Bytes received and not yet released to the client.
    held: Vec<Bytes>,
    held_since: Option<Instant>,
    /// The text generated so far (trimmed to the window at each evaluation).
    generated: String,
    /// Text arrived since the last evaluation.
    unevaluated: bool,
    /// An SSE event not yet complete (events end with a blank line).
    partial_event: BytesMut,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
}

/// Whether the client is still there.
type Open = bool;

impl Guard {
    async fn run(mut self, mut body: BoxBody) {
        loop {
            let flush_at = self.held_since.map(|t| t + Duration::from_millis(self.config.buffer_ms));
            tokio::select! {
                frame = body.frame() => match frame {
                    None => {
                        self.evaluate_and_release().await;
                        return;
                    }
                    Some(Err(e)) => {
                        // The app's stream broke: release what was held only if it passes.
                        if self.evaluate_and_release().await {
                            let _ = self.tx.send(Err(e)).await;
                        }
                        return;
                    }
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            let sentence_ended = self.take_text(&data);
                            self.held.push(data);
                            self.held_since.get_or_insert_with(Instant::now);
                            if sentence_ended && !self.evaluate_and_release().await {
                                return;
                            }
                        }
                        Err(trailers) => {
                            if !self.evaluate_and_release().await || self.tx.send(Ok(trailers)).await.is_err() {
                                return;
                            }
                        }
                    },
                },
                _ = sleep_until(flush_at) => {
                    if !self.evaluate_and_release().await {
                        return;
                    }
                }
            }
        }
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
        } else {
            self.generated.push_str(&String::from_utf8_lossy(data));
        }
        let new = &self.generated[before..];
        if !new.is_empty() {
            self.unevaluated = true;
        }
        new.contains(['.', '!', '?', '\n', '。', '！', '？'])
    }

    /// Runs the rules over the window if text arrived since the last run; releases the held bytes
    /// if no cutting rule matched, else ends the stream with the decision. Returns whether the
    /// stream goes on (and the client is still there).
    async fn evaluate_and_release(&mut self) -> Open {
        self.held_since = None;
        if self.unevaluated {
            self.unevaluated = false;
            trim_to_window(&mut self.generated, self.config.window_bytes);
            let signals = self.policy.rules.count_signals(&self.generated);
            let verdict = self.policy.rules.evaluate(&RulesInput {
                text: &self.generated,
                signals: &signals,
                features: &serde_json::Map::new(),
                tenant: None,
                model: None,
            });
            let cut = verdict.rule.is_some() && self.config.cut_on.contains(&verdict.action);
            let outcome = if cut { "cut" } else { "pass" };
            self.counter.get_or_create(&RouteLabels { route: self.route.clone(), outcome }).inc();
            if cut {
                tracing::warn!(route = %self.route, rule = ?verdict.rule, action = verdict.action.as_str(), "stream guard ended a response");
                self.held.clear();
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
                return false;
            }
        }
        for data in self.held.drain(..) {
            if self.tx.send(Ok(Frame::data(data))).await.is_err() {
                return false;
            }
        }
        true
    }
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
        let mut start = text.len() - window;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text.drain(..start);
    }
}

/// End (exclusive) of the first complete SSE event: after a blank line (`\n\n`, `\r\n\r\n`).
fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The generated text in one SSE event: its `data:` lines joined; from JSON, OpenAI's
/// `choices[].delta.content` / `choices[].text` or TGI's `token.text`; `[DONE]` carries none.
fn sse_event_text(event: &str) -> Option<String> {
    let data: Vec<&str> =
        event.lines().filter_map(|line| line.strip_prefix("data:")).map(|d| d.strip_prefix(' ').unwrap_or(d)).collect();
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
    } else if let Some(s) = value.pointer("/token/text").or_else(|| value.get("text")).and_then(Value::as_str) {
        text.push_str(s);
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_text() {
        assert_eq!(sse_event_text("data: {\"choices\":[{\"delta\":{\"content\":\"Hi.\"}}]}\n\n").unwrap(), "Hi.");
        assert_eq!(sse_event_text("data: {\"token\":{\"text\":\" there\"}}\n\n").unwrap(), " there");
        assert_eq!(sse_event_text("data: plain\ndata: two\n\n").unwrap(), "plain\ntwo");
        assert_eq!(sse_event_text("data: [DONE]\n\n"), None);
        assert_eq!(sse_event_text(": comment\n\n"), None);
        assert_eq!(event_end(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(event_end(b"data: a\r\n\r\n"), Some(11));
        assert_eq!(event_end(b"data: a\n"), None);
        let mut s = "ééé".to_string();
        trim_to_window(&mut s, 3);
        assert_eq!(s, "é");
    }
}
