//! Reading a request on its way to an app: the text, features and tenant are taken from the
//! request by the route's sources into a classify request, and the body is handed back intact for
//! forwarding, whatever happened. Deciding it is the next phase (`pipeline.rs`).

use super::config::ScreenConfig;
use crate::error::ApiError;
use crate::request::{self, ClassifyRequest};
use crate::tenant::Tenants;
use crate::web::{self, ServerConfig};
use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, CONTENT_LENGTH};
use http::request::Parts;
use http_body_util::BodyExt;
use serde_json::Value;
use std::time::Duration;

/// Where one value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A JSON pointer into the body (RFC 6901), as reference tokens; `-1` selects an array's last
    /// element (an extension: RFC 6901's `-` names the element *after* the last).
    Pointer(Vec<String>),
    /// `messages:POINTER`: a conversation at a JSON pointer (an OpenAI- or Anthropic-style
    /// `messages` array, a single message, a `system` string or content parts), read message by
    /// message: every role's content, the text of every content part, nested tool results and
    /// tool-call arguments ([`collect_conversation`]), never the roles, names, ids or media URLs.
    Messages(Vec<String>),
    Header(HeaderName),
    /// A query parameter, percent-decoded; every occurrence.
    Query(String),
}

impl Source {
    /// `"/a/b/0"`, `"header:NAME"` or `"query:NAME"`. The message names what is wrong.
    pub fn parse(spec: &str) -> Result<Source, String> {
        if let Some(name) = spec.strip_prefix("header:") {
            return HeaderName::try_from(name.trim())
                .map(Source::Header)
                .map_err(|_| format!("`{spec}`: `{name}` is not a valid header name"));
        }
        if let Some(name) = spec.strip_prefix("query:") {
            if name.is_empty() {
                return Err(format!("`{spec}`: the query parameter name is empty"));
            }
            return Ok(Source::Query(name.to_string()));
        }
        if let Some(pointer) = spec.strip_prefix("messages:") {
            return match Source::parse(pointer) {
                Ok(Source::Pointer(tokens)) => Ok(Source::Messages(tokens)),
                _ => Err(format!("`{spec}`: `{pointer}` is not a JSON pointer (`/messages`)")),
            };
        }
        if spec.is_empty() || spec.starts_with('/') {
            // RFC 6901 §4: `~1` is `/`, `~0` is `~`, in that order.
            let tokens = spec.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
            return Ok(Source::Pointer(tokens));
        }
        Err(format!(
            "`{spec}` is neither a JSON pointer (`/field/0`), `messages:POINTER`, `header:NAME` nor `query:NAME`"
        ))
    }

    fn reads_body(&self) -> bool {
        matches!(self, Source::Pointer(_) | Source::Messages(_))
    }

    /// The value at this source, if present.
    fn get(&self, parts: &Parts, json: Option<&Value>) -> Option<Value> {
        match self {
            Source::Pointer(tokens) | Source::Messages(tokens) => {
                let mut at = json?;
                for token in tokens {
                    at = match at {
                        Value::Object(map) => map.get(token)?,
                        Value::Array(items) if token == "-1" => items.last()?,
                        // RFC 6901 §4: array indices are decimal digits without leading zeros
                        // (not `+1`, which `usize::from_str` would take).
                        Value::Array(items) if is_index(token) => items.get(token.parse::<usize>().ok()?)?,
                        _ => return None,
                    };
                }
                Some(at.clone())
            }
            // Every occurrence, joined by newlines: the app may read any of them (the last, or all),
            // so screening only the first would let a second one through unread.
            Source::Header(name) => {
                let values: Vec<String> = parts
                    .headers
                    .get_all(name)
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect();
                (!values.is_empty()).then(|| Value::String(values.join("\n")))
            }
            Source::Query(name) => {
                let values: Vec<String> = form_urlencoded::parse(parts.uri.query()?.as_bytes())
                    .filter(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
                    .collect();
                (!values.is_empty()).then(|| Value::String(values.join("\n")))
            }
        }
    }
}

/// An RFC 6901 array index: `0`, or digits not starting with `0`.
fn is_index(token: &str) -> bool {
    token == "0" || (!token.starts_with('0') && !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()))
}

/// A route's screening rule, compiled.
#[derive(Debug)]
pub struct Screen {
    text: Vec<Source>,
    features: Vec<(String, Source)>,
    tenant: Option<Source>,
    reads_body: bool,
    pub config: ScreenConfig,
}

impl Screen {
    pub fn new(config: &ScreenConfig) -> Result<Screen, String> {
        if config.text.is_empty() {
            return Err("`screen.text` must name at least one source".into());
        }
        let text = config.text.iter().map(|s| Source::parse(s)).collect::<Result<Vec<_>, _>>()?;
        let features = config
            .features
            .iter()
            .map(|(name, s)| Source::parse(s).map(|src| (name.clone(), src)))
            .collect::<Result<Vec<_>, _>>()?;
        let tenant = config.tenant.as_deref().map(Source::parse).transpose()?;
        if config.max_body_bytes == 0 {
            return Err("`screen.max_body_bytes` must be at least 1".into());
        }
        if config.deadline_ms == Some(0) {
            return Err("`screen.deadline_ms` must be at least 1".into());
        }
        let reads_body = text.iter().chain(features.iter().map(|(_, s)| s)).chain(&tenant).any(Source::reads_body);
        Ok(Screen { text, features, tenant, reads_body, config: config.clone() })
    }
}

/// The request body after screening, to forward as it is.
pub enum Outgoing<B> {
    /// Read whole (it may be sent again on a retry).
    Bytes(Bytes),
    /// Not read at all.
    Stream(B),
    /// Read up to the limit and found longer: what was read, then the rest.
    Partial(Bytes, B),
    /// Lost: the client's body could not be read (reset, broken chunking, too slow).
    Broken,
}

/// The read phase of screening (`pipeline.rs`): the classify request the route's sources give (its
/// tenant identified), or why there is none; and the body to forward, intact whatever happened.
pub async fn read<B>(
    tenants: &Tenants,
    server: &ServerConfig,
    screen: &Screen,
    parts: &Parts,
    body: B,
) -> (Result<ClassifyRequest, ApiError>, Outgoing<B>)
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (json, outgoing) = if screen.reads_body {
        match read_json(server, screen.config.max_body_bytes, parts, body).await {
            (Ok(json), outgoing) => (Some(json), outgoing),
            (Err(e), outgoing) => return (Err(e), outgoing),
        }
    } else {
        (None, Outgoing::Stream(body))
    };
    (classify_request(server, tenants, screen, parts, json.as_ref()), outgoing)
}

/// Reads and parses the JSON body, keeping every byte read for forwarding.
async fn read_json<B>(
    server: &ServerConfig,
    limit: usize,
    parts: &Parts,
    body: B,
) -> (Result<Value, ApiError>, Outgoing<B>)
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    if let Err(e) = web::require_json(&parts.headers) {
        return (Err(e), Outgoing::Stream(body));
    }
    let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return (Err(ApiError::PayloadTooLarge { limit }), Outgoing::Stream(body));
    }
    let timeout_ms = server.request_timeout_ms;
    let read = match tokio::time::timeout(Duration::from_millis(timeout_ms), read_up_to(body, limit)).await {
        Ok(read) => read,
        Err(_) => return (Err(ApiError::Timeout { timeout_ms }), Outgoing::Broken),
    };
    match read {
        Read::Whole(bytes) => {
            let parsed = crate::web::json::parse(&bytes);
            (parsed, Outgoing::Bytes(bytes))
        }
        Read::Over(prefix, rest) => (Err(ApiError::PayloadTooLarge { limit }), Outgoing::Partial(prefix, rest)),
        Read::Failed(e) => (Err(ApiError::BodyRead(e)), Outgoing::Broken),
    }
}

enum Read<B> {
    Whole(Bytes),
    Over(Bytes, B),
    Failed(String),
}

/// Reads frames until the end or until more than `limit` bytes have arrived.
async fn read_up_to<B>(mut body: B, limit: usize) -> Read<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut buf = BytesMut::new();
    loop {
        match body.frame().await {
            None => return Read::Whole(buf.freeze()),
            Some(Err(e)) => return Read::Failed(e.to_string()),
            Some(Ok(frame)) => {
                // Trailers carry no text to screen; they are dropped with a buffered body.
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                    if buf.len() > limit {
                        return Read::Over(buf.freeze(), body);
                    }
                }
            }
        }
    }
}

/// The classify request the sources give, its tenant resolved as on `/v1/classify` (the route's
/// `tenant_name` counts as a source; its claim source is read only when claims count).
fn classify_request(
    server: &ServerConfig,
    tenants: &Tenants,
    screen: &Screen,
    parts: &Parts,
    json: Option<&Value>,
) -> Result<ClassifyRequest, ApiError> {
    let mut pieces = Vec::new();
    for source in &screen.text {
        match (source, source.get(parts, json)) {
            (Source::Messages(_), Some(value)) => collect_conversation(&value, &mut pieces),
            (_, Some(value)) => collect_text(&value, &mut pieces),
            (_, None) => {}
        }
    }
    let text = pieces.join("\n");
    if text.trim().is_empty() {
        return Err(ApiError::invalid(
            "text",
            format!("no text to screen at any of the route's sources {:?}", screen.config.text),
        ));
    }
    let features: serde_json::Map<String, Value> =
        screen.features.iter().filter_map(|(name, source)| Some((name.clone(), source.get(parts, json)?))).collect();
    let claimed = match &screen.tenant {
        _ if !tenants.accepts_claims() => None,
        Some(source) => source.get(parts, json).map(|v| match v {
            Value::String(s) => s,
            other => other.to_string(),
        }),
        None => request::tenant_header(&parts.headers),
    };
    let deadline = Duration::from_millis(screen.config.deadline_ms.unwrap_or(server.default_deadline_ms));
    let mut request = ClassifyRequest::new(text, features, claimed, deadline, server)?;
    request.identify(tenants, &parts.headers, screen.config.tenant_name.as_deref())?;
    Ok(request)
}

/// The text in a JSON value: a string as it is, the strings inside arrays and objects in order,
/// other scalars as JSON.
fn collect_text(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Null => {}
        Value::Array(items) => items.iter().for_each(|v| collect_text(v, out)),
        Value::Object(map) => map.values().for_each(|v| collect_text(v, out)),
        other => out.push(other.to_string()),
    }
}

/// The text of a conversation, message by message, in order: what a language model behind the
/// proxy reads. A string is text; an array is messages or content parts, each read in turn; in an
/// object, `content` (a string, content parts, or a tool result's nested content), `text` and
/// `refusal` strings, and the `arguments` of `tool_calls[].function` and `function_call`. Roles,
/// names, ids, part types and media (image or audio URLs and data) are not text and are skipped.
pub(super) fn collect_conversation(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| collect_conversation(v, out)),
        Value::Object(map) => {
            for key in ["content", "text", "refusal"] {
                if let Some(v) = map.get(key) {
                    collect_conversation(v, out);
                }
            }
            let calls = map.get("tool_calls").and_then(Value::as_array).into_iter().flatten();
            for function in calls.filter_map(|c| c.get("function")).chain(map.get("function_call")) {
                if let Some(Value::String(arguments)) = function.get("arguments") {
                    out.push(arguments.clone());
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(super) fn parts(uri: &str) -> Parts {
        let (parts, ()) = http::Request::post(uri).header("x-country", "NL").body(()).unwrap().into_parts();
        parts
    }

    #[test]
    fn sources() {
        let body = json!({"messages": [{"content": "first"}, {"content": "last"}], "a/b": {"~x": 7}, "n": [0, 1]});
        let p = parts("/v1/chat?q=hello%20there&q=2&user=u1");
        let get = |spec: &str| Source::parse(spec).unwrap().get(&p, Some(&body));
        assert_eq!(get("/messages/-1/content"), Some(json!("last")));
        assert_eq!(get("/messages/0/content"), Some(json!("first")));
        assert_eq!(get("/a~1b/~0x"), Some(json!(7)));
        assert_eq!(get("/n/01"), None, "leading zeros are not indices");
        assert_eq!(get("/n/+1"), None, "a sign is not an index");
        assert_eq!(get("/messages/5/content"), None);
        assert_eq!(get(""), Some(body.clone()), "the empty pointer is the whole document");
        assert_eq!(get("header:x-country"), Some(json!("NL")));
        assert_eq!(get("header:x-missing"), None);
        assert_eq!(get("query:q"), Some(json!("hello there\n2")), "decoded, every occurrence");
        assert!(Source::parse("messages/0").unwrap_err().contains("neither a JSON pointer"));
        assert!(Source::parse("header:bad header").unwrap_err().contains("not a valid header name"));
        let mut text = Vec::new();
        collect_text(&body["messages"], &mut text);
        assert_eq!(text, ["first", "last"]);
        assert_eq!(Source::parse("messages:/messages"), Ok(Source::Messages(vec!["messages".into()])));
        assert!(Source::parse("messages:messages").unwrap_err().contains("not a JSON pointer"));
    }

    /// Issue 25, item 4: every message that reaches the model is read, whatever its role and the
    /// shape of its content; nothing that is not text is.
    #[test]
    fn a_conversation_is_read_message_by_message_in_every_role_and_content_shape() {
        let body = json!({"system": [{"type": "text", "text": "anthropic system"}], "messages": [
            {"role": "system", "content": "system prompt"},
            {"role": "developer", "content": [{"type": "text", "text": "developer part"}]},
            {"role": "user", "name": "bob", "content": [
                {"type": "text", "text": "user part one"},
                {"type": "image_url", "image_url": {"url": "https://img.example/cat.png"}},
                {"type": "input_text", "text": "user part two"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"tool args\"}"}}]},
            {"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "legacy args"}},
            {"role": "tool", "tool_call_id": "call_1", "content": "tool result"},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                "content": [{"type": "text", "text": "nested tool result"}]}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "a refusal"}]},
            {"role": "assistant", "content": "assistant prefill"}]});
        let p = parts("/");
        let mut text = Vec::new();
        for spec in ["messages:/system", "messages:/messages"] {
            collect_conversation(&Source::parse(spec).unwrap().get(&p, Some(&body)).unwrap(), &mut text);
        }
        let want = [
            "anthropic system",
            "system prompt",
            "developer part",
            "user part one",
            "user part two",
            "{\"q\": \"tool args\"}",
            "",
            "legacy args",
            "tool result",
            "nested tool result",
            "a refusal",
            "assistant prefill",
        ];
        assert_eq!(text, want);
    }
}

#[cfg(test)]
mod properties {
    use super::tests::parts;
    use super::Source;
    use proptest::prelude::*;
    use serde_json::Value;

    /// Keys rich in what pointers escape (`~`, `/`) and in what looks like an index.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![4 => "[a-z~/01-]{0,5}", 1 => any::<String>()]
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            key().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn escape(token: &str) -> String {
        token.replace('~', "~0").replace('/', "~1")
    }

    fn get(spec: &str, body: &Value) -> Option<Value> {
        Source::parse(spec).unwrap().get(&parts("/"), Some(body))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn parsing_any_source_never_panics(spec in any::<String>()) {
            let _ = Source::parse(&spec);
            let _ = Source::parse(&format!("/{spec}"));
            let _ = Source::parse(&format!("header:{spec}"));
        }

        #[test]
        fn escaping_round_trips(token in key()) {
            prop_assert_eq!(Source::parse(&format!("/{}", escape(&token))), Ok(Source::Pointer(vec![token])));
        }

        /// A pointer to a value that exists finds it; `-1` for an array's last element too.
        #[test]
        fn a_pointer_to_a_present_value_finds_it(body in json(), choices in prop::collection::vec(any::<usize>(), 0..6)) {
            let (mut at, mut tokens, mut last_of_array) = (&body, Vec::new(), false);
            for c in choices {
                (at, last_of_array) = match at {
                    Value::Array(items) if !items.is_empty() => {
                        tokens.push((c % items.len()).to_string());
                        (&items[c % items.len()], c % items.len() + 1 == items.len())
                    }
                    Value::Object(map) if !map.is_empty() => {
                        let (k, v) = map.iter().nth(c % map.len()).unwrap();
                        tokens.push(k.clone());
                        (v, false)
                    }
                    _ => break,
                };
            }
            let pointer: String = tokens.iter().map(|t| format!("/{}", escape(t))).collect();
            prop_assert_eq!(get(&pointer, &body), Some(at.clone()), "{}", pointer);
            if last_of_array {
                let parent: String = tokens[..tokens.len() - 1].iter().map(|t| format!("/{}", escape(t))).collect();
                prop_assert_eq!(get(&format!("{parent}/-1"), &body), Some(at.clone()), "{}/-1", parent);
            }
        }

        /// Only RFC 6901 indices (and `-1`) select array elements.
        #[test]
        fn only_indices_select_array_elements(token in "[0-9+ -]{0,4}|\\PC{0,4}", len in 0usize..12) {
            let body = Value::Array((0..len).map(Value::from).collect());
            let found = get(&format!("/{}", escape(&token)), &body);
            let want = match token.as_str() {
                "-1" => body.as_array().unwrap().last().cloned(),
                t if t == "0" || (!t.is_empty() && !t.starts_with('0') && t.bytes().all(|b| b.is_ascii_digit())) => {
                    t.parse::<usize>().ok().and_then(|i| body.get(i).cloned())
                }
                _ => None,
            };
            prop_assert_eq!(found, want, "{:?}", token);
        }
    }
}
