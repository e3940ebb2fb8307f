//! A label as `POST /v1/feedback` and `tiergate feedback import` take it: one JSON object, or an
//! array of up to [`MAX_BATCH`], each checked field by field (the error names the field, with
//! its index in an array, and the limit).

use super::Truth;
use crate::error::{json_type, ApiError};
use serde_json::Value;

/// Most labels in one request body.
pub const MAX_BATCH: usize = 1000;
/// Longest `record_id` (a UUID is 36) and `request_id`, bytes: `x-request-id`'s limit
/// (`web::headers::MAX_REQUEST_ID_BYTES`, a layer above this one).
const MAX_ID_BYTES: usize = 128;
/// Longest `source`, bytes: a short name (`analyst`, `chargeback`, `user_report`).
const MAX_SOURCE_BYTES: usize = 32;
/// Longest `reviewer`, bytes.
const MAX_REVIEWER_BYTES: usize = 128;
/// Longest `note`, characters.
const MAX_NOTE_CHARS: usize = 2000;

/// Which record a label is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The record's own id (the decision response's `record_id`).
    RecordId(String),
    /// The client's request id: the newest decision with it.
    RequestId(String),
}

impl Target {
    pub fn id(&self) -> &str {
        match self {
            Target::RecordId(id) | Target::RequestId(id) => id,
        }
    }
}

/// One checked label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    pub target: Target,
    pub truth: Truth,
    pub source: String,
    pub reviewer: Option<String>,
    pub note: Option<String>,
    /// Set by the server, never by the client: a tenant's key may label only its own decisions.
    pub tenant_scope: Option<String>,
}

impl Label {
    /// The label as a client sends it (what a forwarded label carries; the tenant scope travels
    /// in a header only a replica's admin token may set).
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({"label": self.truth.as_str(), "source": self.source});
        match &self.target {
            Target::RecordId(id) => v["record_id"] = id.as_str().into(),
            Target::RequestId(id) => v["request_id"] = id.as_str().into(),
        }
        if let Some(r) = &self.reviewer {
            v["reviewer"] = r.as_str().into();
        }
        if let Some(n) = &self.note {
            v["note"] = n.as_str().into();
        }
        v
    }
}

/// A label's fields, in the order the docs list them.
const FIELDS: [&str; 6] = ["record_id", "request_id", "label", "source", "reviewer", "note"];

/// The labels in `body` (one object or an array, parsed: the endpoint parses with
/// `web::json::parse`, which refuses a repeated key), each checked. Errors: an array over
/// [`MAX_BATCH`] or empty, and
/// per label (field `labels[i].name`, or `name` for one object): not an object, an unknown
/// field, a field that is not a string, neither or both of `record_id`/`request_id`, `label`
/// not `risk`/`ok`, `source` missing or not 1-32 of `a-z 0-9 _`, a `reviewer` or `note` over
/// its limit or carrying control or bidirectional-override characters.
pub fn parse_labels(body: Value) -> Result<Vec<Label>, ApiError> {
    match body {
        Value::Array(items) => {
            if items.is_empty() || items.len() > MAX_BATCH {
                return Err(ApiError::invalid(
                    "labels",
                    format!("give 1 to {MAX_BATCH} labels in one request, got {}", items.len()),
                ));
            }
            items.into_iter().enumerate().map(|(i, v)| parse_one(v, &format!("labels[{i}]"))).collect()
        }
        value => Ok(vec![parse_one(value, "")?]),
    }
}

/// One label at `at` (`labels[3]`, or empty for a body of one object).
fn parse_one(value: Value, at: &str) -> Result<Label, ApiError> {
    let field = |name: &str| if at.is_empty() { name.to_string() } else { format!("{at}.{name}") };
    let Value::Object(mut object) = value else {
        let whole = if at.is_empty() { "body" } else { at };
        return Err(ApiError::invalid(
            whole,
            "a label is a JSON object with `record_id` or `request_id`, `label`, `source`",
        ));
    };
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::invalid(field(unknown), format!("unknown field; a label has {}", FIELDS.join(", "))));
    }
    let mut take = |name: &str| match object.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::invalid(field(name), format!("a string, got {}", json_type(&other)))),
    };
    let (record_id, request_id) = (take("record_id")?, take("request_id")?);
    let (label, source, reviewer, note) = (take("label")?, take("source")?, take("reviewer")?, take("note")?);
    let target = match (record_id, request_id) {
        (Some(id), None) => Target::RecordId(id),
        (None, Some(id)) => Target::RequestId(id),
        _ => return Err(ApiError::invalid(field("record_id"), "give exactly one of `record_id` and `request_id`")),
    };
    let id = target.id();
    if id.is_empty() || id.len() > MAX_ID_BYTES || !id.bytes().all(|b| b.is_ascii_graphic()) {
        let name = if matches!(target, Target::RecordId(_)) { "record_id" } else { "request_id" };
        return Err(ApiError::invalid(field(name), format!("1 to {MAX_ID_BYTES} visible ASCII characters")));
    }
    let label = label.ok_or_else(|| ApiError::invalid(field("label"), "required: `risk` or `ok`"))?;
    let truth = Truth::parse(&label)
        .ok_or_else(|| ApiError::invalid(field("label"), format!("`risk` or `ok`, got `{label}`")))?;
    let source = source.unwrap_or_default();
    let source_ok = !source.is_empty()
        && source.len() <= MAX_SOURCE_BYTES
        && source.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !source_ok {
        return Err(ApiError::invalid(
            field("source"),
            format!("required, 1 to {MAX_SOURCE_BYTES} of a-z, 0-9 and _ (analyst, chargeback, user_report, ...)"),
        ));
    }
    if reviewer.as_ref().is_some_and(|r| r.is_empty() || r.len() > MAX_REVIEWER_BYTES || !plain(r, false)) {
        let limit = format!("1 to {MAX_REVIEWER_BYTES} bytes, no control or bidirectional-override characters");
        return Err(ApiError::invalid(field("reviewer"), limit));
    }
    if note.as_ref().is_some_and(|n| n.chars().count() > MAX_NOTE_CHARS || !plain(n, true)) {
        let limit = format!("at most {MAX_NOTE_CHARS} characters, no control characters but newline and tab, no bidirectional overrides");
        return Err(ApiError::invalid(field("note"), limit));
    }
    Ok(Label { target, truth, source, reviewer, note, tenant_scope: None })
}

/// Free of what would mislead a reader of a report, a console or a Kafka consumer: control
/// characters (newline and tab allowed in `lines`) and the bidirectional embeddings, overrides
/// and isolates (U+202A-U+202E, U+2066-U+2069) that reorder what is shown (the "Trojan Source"
/// characters, CVE-2021-42574).
fn plain(s: &str, lines: bool) -> bool {
    s.chars().all(|c| {
        let allowed_control = lines && (c == '\n' || c == '\t');
        (!c.is_control() || allowed_control) && !matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &[u8]) -> Result<Vec<Label>, ApiError> {
        parse_labels(serde_json::from_slice(body).unwrap())
    }

    fn field(e: ApiError) -> String {
        match e {
            ApiError::InvalidField { field, .. } => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_object_or_an_array_each_field_checked_by_name() {
        let one = parse(br#"{"record_id":"r1","label":"risk","source":"analyst"}"#).unwrap();
        assert_eq!(one[0].target, Target::RecordId("r1".into()));
        assert_eq!(one[0].truth, Truth::Risk);
        let many = parse(
            br#"[{"request_id":"q","label":"ok","source":"chargeback","reviewer":"ann"},
                 {"record_id":"r","label":"nope","source":"analyst"}]"#,
        );
        assert_eq!(field(many.unwrap_err()), "labels[1].label");
        let both = parse(br#"{"record_id":"a","request_id":"b","label":"ok","source":"analyst"}"#);
        assert_eq!(field(both.unwrap_err()), "record_id");
        let source = parse(br#"{"record_id":"a","label":"ok","source":"Analyst!"}"#);
        assert_eq!(field(source.unwrap_err()), "source");
        let extra = parse(br#"{"record_id":"a","label":"ok","source":"analyst","tenant_scope":"x"}"#);
        assert_eq!(field(extra.unwrap_err()), "tenant_scope", "a client cannot set the tenant scope");
        assert_eq!(field(parse(b"[]").unwrap_err()), "labels");
    }

    #[test]
    fn types_missing_fields_and_hidden_characters_name_their_field() {
        for (body, at) in [
            (r#"{"record_id":"a","label":1,"source":"analyst"}"#, "label"),
            (r#"{"record_id":"a","label":null,"source":"analyst"}"#, "label"),
            (r#"{"record_id":"a","label":"ok"}"#, "source"),
            (r#"{"record_id":"a","label":"ok","source":5}"#, "source"),
            (r#"[{"record_id":"a","label":"ok","source":"analyst","reviewer":"an\u0000n"}]"#, "labels[0].reviewer"),
            (r#"{"record_id":"a","label":"ok","source":"analyst","note":"refund \u202egnp.exe"}"#, "note"),
            (r#"["r1"]"#, "labels[0]"),
            (r#""r1""#, "body"),
            (r#"[["r1",null,"ok","analyst",null,null]]"#, "labels[0]"),
        ] {
            assert_eq!(field(parse(body.as_bytes()).unwrap_err()), at, "{body}");
        }
        let note = r#"{"record_id":"a","label":"ok","source":"analyst","note":"line one\n\tline two"}"#;
        assert_eq!(parse(note.as_bytes()).unwrap()[0].note.as_deref(), Some("line one\n\tline two"));
    }
}
