//! A label as `POST /v1/feedback` and `tiergate feedback import` take it: one JSON object, or an
//! array of up to [`MAX_BATCH`], each checked field by field (the error names the field, with
//! its index in an array, and the limit).

use super::Truth;
use crate::error::ApiError;
use serde::Deserialize;

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    record_id: Option<String>,
    request_id: Option<String>,
    label: String,
    source: String,
    reviewer: Option<String>,
    note: Option<String>,
}

/// The labels in `body` (one object or an array), each checked. Errors: malformed JSON, an
/// array over [`MAX_BATCH`] or empty, and per label (field `labels[i].name`, or `name` for one
/// object): an unknown field, neither or both of `record_id`/`request_id`, `label` not
/// `risk`/`ok`, `source` not 1-32 of `a-z 0-9 _`, an over-long `reviewer` or `note`.
pub fn parse_labels(body: &[u8]) -> Result<Vec<Label>, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    match value {
        serde_json::Value::Array(items) => {
            if items.is_empty() || items.len() > MAX_BATCH {
                return Err(ApiError::invalid(
                    "labels",
                    format!("give 1 to {MAX_BATCH} labels in one request, got {}", items.len()),
                ));
            }
            items.into_iter().enumerate().map(|(i, v)| parse_one(v, &format!("labels[{i}]."))).collect()
        }
        value => Ok(vec![parse_one(value, "")?]),
    }
}

fn parse_one(value: serde_json::Value, at: &str) -> Result<Label, ApiError> {
    let raw: Raw = serde_json::from_value(value).map_err(|e| ApiError::invalid(format!("{at}body"), e.to_string()))?;
    let field = |name: &str| format!("{at}{name}");
    let target = match (raw.record_id, raw.request_id) {
        (Some(id), None) => Target::RecordId(id),
        (None, Some(id)) => Target::RequestId(id),
        _ => return Err(ApiError::invalid(field("record_id"), "give exactly one of `record_id` and `request_id`")),
    };
    let id = target.id();
    if id.is_empty() || id.len() > MAX_ID_BYTES || !id.bytes().all(|b| b.is_ascii_graphic()) {
        let name = if matches!(target, Target::RecordId(_)) { "record_id" } else { "request_id" };
        return Err(ApiError::invalid(field(name), format!("1 to {MAX_ID_BYTES} visible ASCII characters")));
    }
    let truth = Truth::parse(&raw.label)
        .ok_or_else(|| ApiError::invalid(field("label"), format!("`risk` or `ok`, got `{}`", raw.label)))?;
    let source_ok = !raw.source.is_empty()
        && raw.source.len() <= MAX_SOURCE_BYTES
        && raw.source.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !source_ok {
        return Err(ApiError::invalid(
            field("source"),
            format!("1 to {MAX_SOURCE_BYTES} of a-z, 0-9 and _ (analyst, chargeback, user_report, ...)"),
        ));
    }
    if raw.reviewer.as_ref().is_some_and(|r| r.is_empty() || r.len() > MAX_REVIEWER_BYTES) {
        return Err(ApiError::invalid(field("reviewer"), format!("1 to {MAX_REVIEWER_BYTES} bytes")));
    }
    if raw.note.as_ref().is_some_and(|n| n.chars().count() > MAX_NOTE_CHARS) {
        return Err(ApiError::invalid(field("note"), format!("at most {MAX_NOTE_CHARS} characters")));
    }
    Ok(Label { target, truth, source: raw.source, reviewer: raw.reviewer, note: raw.note, tenant_scope: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(e: ApiError) -> String {
        match e {
            ApiError::InvalidField { field, .. } => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_object_or_an_array_each_field_checked_by_name() {
        let one = parse_labels(br#"{"record_id":"r1","label":"risk","source":"analyst"}"#).unwrap();
        assert_eq!(one[0].target, Target::RecordId("r1".into()));
        assert_eq!(one[0].truth, Truth::Risk);
        let many = parse_labels(
            br#"[{"request_id":"q","label":"ok","source":"chargeback","reviewer":"ann"},
                 {"record_id":"r","label":"nope","source":"analyst"}]"#,
        );
        assert_eq!(field(many.unwrap_err()), "labels[1].label");
        let both = parse_labels(br#"{"record_id":"a","request_id":"b","label":"ok","source":"analyst"}"#);
        assert_eq!(field(both.unwrap_err()), "record_id");
        let source = parse_labels(br#"{"record_id":"a","label":"ok","source":"Analyst!"}"#);
        assert_eq!(field(source.unwrap_err()), "source");
        let extra = parse_labels(br#"{"record_id":"a","label":"ok","source":"analyst","tenant_scope":"x"}"#);
        assert_eq!(field(extra.unwrap_err()), "body", "a client cannot set the tenant scope");
        assert_eq!(field(parse_labels(b"[]").unwrap_err()), "labels");
        assert!(matches!(parse_labels(b"{"), Err(ApiError::MalformedJson(_))));
    }
}
