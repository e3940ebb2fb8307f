//! Reading text out of a stream: SSE events and their deltas (OpenAI, TGI, Anthropic), sentence
//! ends, UTF-8 boundaries, the evaluation window.

use serde_json::{json, Value};
use tokio::time::Instant;

/// The longest incomplete SSE event held back whole; longer, its bytes are read as plain text.
pub(super) const MAX_PARTIAL_EVENT: usize = 64 * 1024;

/// End (exclusive) of the last sentence end in raw text bytes: a line feed, a CJK `。！？`, or
/// an ASCII `.`, `!`, `?` followed by white space or ending `data` (the piece just streamed). A
/// `.` or `?` followed by anything else — inside a link, a number or a query
/// (`login.top/verify?id=1`, `4.5`) — ends nothing, so a link streamed in one piece is held with
/// the rest of its sentence. UTF-8 bytes below 0x80 never occur inside a longer character, so
/// ASCII ends can be found without decoding.
pub(super) fn last_sentence_end(data: &[u8]) -> Option<usize> {
    let ascii = (0..data.len()).rev().find_map(|i| match data[i] {
        b'\n' => Some(i + 1),
        b'.' | b'!' | b'?' if data.get(i + 1).is_none_or(u8::is_ascii_whitespace) => Some(i + 1),
        _ => None,
    });
    let wide = ["。", "！", "？"]
        .iter()
        .filter_map(|c| data.windows(c.len()).rposition(|w| w == c.as_bytes()).map(|i| i + c.len()))
        .max();
    ascii.max(wide)
}

/// How many trailing bytes of `bytes` are the start of a UTF-8 character whose rest is missing.
pub(super) fn incomplete_char_len(bytes: &[u8]) -> usize {
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

pub(super) fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

pub(super) fn ceil_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Keeps the last `window` bytes, cut at a character boundary.
pub(super) fn trim_to_window(text: &mut String, window: usize) {
    if text.len() > window {
        let start = ceil_char_boundary(text, text.len() - window);
        text.drain(..start);
    }
}

/// End (exclusive) of the first complete SSE event: after its blank line. Lines end with
/// `\r\n`, `\n` or `\r` (the SSE grammar allows all three); a `\r` at the very end of `buf`
/// waits for the next byte, which may be its `\n`.
pub(super) fn event_end(buf: &[u8]) -> Option<usize> {
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

/// What the guard reads of one SSE event.
#[derive(Debug, Default, PartialEq)]
pub(super) struct SseEvent {
    /// The generated text: the `data:` lines joined; from JSON, OpenAI chat's
    /// `choices[].delta.content` / `choices[].text`, TGI's `token.text`, Anthropic's
    /// `delta.text` or OpenAI Responses' `delta` (a string); `[DONE]` and comments carry none.
    pub text: Option<String>,
    /// The event is an OpenAI-style completion chunk: what a closing chunk must repeat.
    pub head: Option<ChunkHead>,
}

/// The identity of an OpenAI-style streamed completion (`chat.completion.chunk`, or the legacy
/// `text_completion`), from one of its chunks. OpenAI-compatible clients end a stream on a last
/// chunk of the same id and model with a `finish_reason`; `content_filter` is the reason the
/// OpenAI API gives when its own filter stops a reply, so SDK loops such as
/// `chunk.choices[0].delta.content` handle a cut as an ordinary end.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ChunkHead {
    /// `id`, `object`, `created`, `model`, `system_fingerprint`: those the app's chunk had.
    fields: serde_json::Map<String, Value>,
    /// Chat chunks carry `delta`, legacy completions `text`.
    chat: bool,
}

impl ChunkHead {
    fn of(chunk: &Value) -> Option<ChunkHead> {
        let first = chunk.get("choices")?.as_array()?.first()?;
        let chat = match chunk.get("object").and_then(Value::as_str) {
            Some("chat.completion.chunk") => true,
            Some("text_completion") => false,
            Some(_) => return None,
            None if first.get("delta").is_some() => true,
            None if first.get("text").is_some() => false,
            None => return None,
        };
        let fields = ["id", "object", "created", "model", "system_fingerprint"]
            .into_iter()
            .filter_map(|k| chunk.get(k).map(|v| (k.to_string(), v.clone())))
            .collect();
        Some(ChunkHead { fields, chat })
    }

    /// The chunk that ends a cut stream: this stream's head, one choice with an empty delta (or
    /// text) and `finish_reason: "content_filter"`, and `decision` as the extra field `tiergate`.
    pub(super) fn closing_chunk(&self, decision: &Value) -> Value {
        let choice = if self.chat {
            json!({"index": 0, "delta": {}, "finish_reason": "content_filter"})
        } else {
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "content_filter"})
        };
        let mut chunk = self.fields.clone();
        chunk.insert("choices".into(), json!([choice]));
        chunk.insert("tiergate".into(), decision.clone());
        Value::Object(chunk)
    }
}

/// Reads one SSE event (see [`SseEvent`]).
pub(super) fn sse_event(event: &str) -> SseEvent {
    let data: Vec<&str> = event
        .split(['\r', '\n'])
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return SseEvent::default();
    }
    let data = data.join("\n");
    if data.trim() == "[DONE]" {
        return SseEvent::default();
    }
    let Ok(value) = serde_json::from_str::<Value>(&data) else {
        return SseEvent { text: Some(data), head: None };
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
    SseEvent { text: Some(text), head: ChunkHead::of(&value) }
}
