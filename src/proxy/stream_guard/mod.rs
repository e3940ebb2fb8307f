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
//! stream ends cleanly with a final event that carries the decision: an OpenAI-compatible stream
//! with a last chunk of the same id and model, `finish_reason: "content_filter"` and the decision
//! as its `tiergate` field (what OpenAI SDK loops handle as an ordinary end), other SSE with
//! `event: tiergate`, each then `data: [DONE]`; plain text with a last JSON line. A stream that
//! never matches reaches the client byte for byte.
//!
//! The guard reads identity-coded bodies only: a compressed body (`Content-Encoding`) is not
//! text it can read, see [`applies`].

mod text;

use super::config::StreamGuardConfig;
use crate::audit::record::Event;
use crate::audit::{Audit, Draft, ModelRef};
use crate::decision::{Outcome, Step, TierName};
use crate::metrics::RouteLabels;
use crate::policy::Policy;
use crate::rules::RuleVerdict;
use crate::web::{BoxBody, BoxError};
use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, CONTENT_ENCODING, CONTENT_TYPE};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::json;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use text::*;
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
/// `audit`: where a cut's record goes (kind `stream_cut`), when the trail is on.
pub fn spawn(
    policy: Arc<Policy>,
    counter: Family<RouteLabels, Counter>,
    route: String,
    config: StreamGuardConfig,
    headers: &HeaderMap,
    body: BoxBody,
    audit: Option<CutAudit>,
) -> BoxBody {
    let (tx, mut rx) = mpsc::channel::<Result<Frame<Bytes>, BoxError>>(16);
    let mut guard = StreamGuard::new(policy, counter, route, config, content_type(headers) == "text/event-stream", tx);
    guard.audit = audit;
    tokio::spawn(guard.run(body));
    BoxBody::new(StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))))
}

/// The audit trail and what a cut's record says about the request it ends the answer to.
pub struct CutAudit {
    pub audit: Arc<Audit>,
    pub request_id: String,
    pub tenant: Option<String>,
    /// The model deployed beside the rules (a cut is a rules verdict).
    pub model: ModelRef,
}

/// The window of the app's text in which a cutting rule matched, for the audit record.
struct CutText {
    text: String,
    lang: &'static str,
    latency_us: u64,
}

struct StreamGuard {
    policy: Arc<Policy>,
    audit: Option<CutAudit>,
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
    /// SSE from an OpenAI-compatible app: the stream's identity, for the chunk that ends a cut.
    chunk_head: Option<ChunkHead>,
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

impl StreamGuard {
    fn new(
        policy: Arc<Policy>,
        counter: Family<RouteLabels, Counter>,
        route: String,
        config: StreamGuardConfig,
        sse: bool,
        tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    ) -> StreamGuard {
        StreamGuard {
            policy,
            audit: None,
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
            chunk_head: None,
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
                            let release = if self.held_len > self.config.max_held_bytes {
                                Some(Release::Timer)
                            } else if sentence_ended {
                                Some(Release::Sentence)
                            } else {
                                None
                            };
                            if let Some(how) = release {
                                if !self.evaluate_and_release(how).await {
                                    return;
                                }
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
        let ended = if self.sse {
            self.partial_event.extend_from_slice(data);
            while let Some(end) = event_end(&self.partial_event) {
                let event = self.partial_event.split_to(end);
                let event = sse_event(&String::from_utf8_lossy(&event));
                if let Some(text) = event.text {
                    self.generated.push_str(&text);
                }
                if self.chunk_head.is_none() {
                    self.chunk_head = event.head;
                }
            }
            if self.partial_event.len() > MAX_PARTIAL_EVENT {
                // Not SSE as it should be (no blank line for this long): read the bytes as they
                // are and let them go, rather than hold the rest of the stream.
                let event = std::mem::take(&mut self.partial_event);
                self.generated.push_str(&String::from_utf8_lossy(&event));
            }
            last_sentence_end(&self.generated.as_bytes()[before..])
        } else {
            let mut bytes = std::mem::take(&mut self.utf8_carry);
            bytes.extend_from_slice(data);
            // A character split across frames is decoded whole with the next frame, not as two
            // replacement characters (which would hide it from the rules).
            self.utf8_carry = bytes.split_off(bytes.len() - incomplete_char_len(&bytes));
            self.generated.push_str(&String::from_utf8_lossy(&bytes));
            let end = last_sentence_end(data);
            self.text_tail = end.map_or(self.text_tail + data.len(), |end| data.len() - end);
            end
        };
        self.unevaluated += self.generated.len() - before;
        ended.is_some()
    }

    /// At the end of the app's stream: the text of what never completed (an SSE event without
    /// its blank line, a truncated character), so that no held byte is released unread.
    fn take_last_text(&mut self) {
        let text = if self.sse {
            let event = std::mem::take(&mut self.partial_event);
            sse_event(&String::from_utf8_lossy(&event)).text
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
            if let Some((verdict, text)) = cut {
                self.record_cut(&verdict, text);
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
    fn evaluate(&mut self) -> Option<(RuleVerdict, CutText)> {
        let started = Instant::now();
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
        let (mut found, no_features) = (None, serde_json::Map::new());
        for end in ends {
            let end = floor_char_boundary(&self.generated, end);
            let start = ceil_char_boundary(&self.generated, end.saturating_sub(window));
            // The app's words are read as a request's are (`RuleSet::read`): look-alikes folded,
            // invisibles out, the same signals; no features, tenant or model view.
            let facts = self.policy.rules.read(&Arc::from(&self.generated[start..end]));
            let verdict = self.policy.rules.evaluate(&facts.input(&no_features, None, None, None));
            let lang = facts.lang.get().code;
            if verdict.rule.is_some() && self.config.cut_on.contains(&verdict.action) {
                let window = self.generated[start..end].to_string();
                let latency_us = started.elapsed().as_micros() as u64;
                found = Some((verdict, CutText { text: window, lang, latency_us }));
                break;
            }
        }
        trim_to_window(&mut self.generated, window);
        found
    }

    /// Queues the cut's audit record (kind `stream_cut`): the rules verdict on the window of the
    /// app's text that matched.
    fn record_cut(&self, verdict: &RuleVerdict, cut: CutText) {
        let Some(a) = &self.audit else { return };
        let mut step =
            Step::new(TierName::Rules, Outcome::Matched, cut.latency_us).reason("the stream guard ended the response");
        step.rule = verdict.rule.clone();
        step.risk_score = Some(verdict.risk_score);
        let event = Event::StreamCut {
            request_id: &a.request_id,
            tenant: a.tenant.clone(),
            policy_version: &self.policy.version,
            action: verdict.action,
            step,
            lang: cut.lang,
            text: cut.text,
        };
        a.audit.submit_detached(Draft::new(event, Some(&self.route), a.model.clone()));
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
        // OpenAI-compatible streams end the way their clients expect; other SSE gets a named
        // event, which SSE clients that dispatch on `event` can tell apart; plain text a line.
        let last = match (&self.chunk_head, self.sse) {
            (Some(head), _) => format!("data: {}\n\ndata: [DONE]\n\n", head.closing_chunk(&decision["tiergate"])),
            (None, true) => format!("event: tiergate\ndata: {decision}\n\ndata: [DONE]\n\n"),
            (None, false) => format!("\n{decision}\n"),
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

#[cfg(test)]
mod tests;
