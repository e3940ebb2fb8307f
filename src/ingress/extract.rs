//! Request extraction and validation: HTTP request -> [`ClassifyRequest`], or an [`ApiError`]
//! that names the field and the limit.

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::gateway::ClassifyRequest;
use bytes::Bytes;
use http::{header, HeaderMap};
use http_body_util::{BodyExt, Limited};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Header carrying a per-request deadline in milliseconds.
pub const DEADLINE_HEADER: &str = "x-tiergate-deadline-ms";
/// Header naming the tenant when the body does not.
pub const TENANT_HEADER: &str = "x-tiergate-tenant";
const MAX_TENANT_BYTES: usize = 128;

/// Reads the body up to `limit` bytes. A declared `Content-Length` over the limit is refused
/// before reading anything.
pub async fn read_body<B>(headers: &HeaderMap, body: B, limit: usize) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Some(len) =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(ApiError::PayloadTooLarge { limit });
        }
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::PayloadTooLarge { limit }),
        Err(e) => Err(ApiError::BodyRead(e.to_string())),
    }
}

/// Checks that the content type is JSON (`application/json`, parameters such as charset allowed).
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let got = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let essence = got.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType { got: if got.is_empty() { "(none)".into() } else { got } })
    }
}

/// Parses and validates a `/v1/classify` body: `{"text": str, "features": {..}?, "tenant": str?}`.
pub fn classify_request(headers: &HeaderMap, body: &[u8], limits: &ServerConfig) -> Result<ClassifyRequest, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    let Value::Object(mut obj) = value else {
        return Err(ApiError::invalid("body", format!("body must be a JSON object, got {}", type_name(&value))));
    };
    if let Some(unknown) = obj.keys().find(|k| !matches!(k.as_str(), "text" | "features" | "tenant")) {
        return Err(ApiError::invalid(
            unknown.clone(),
            format!("unknown field `{unknown}`; expected `text`, `features`, `tenant`"),
        ));
    }
    let text = match obj.remove("text") {
        None | Some(Value::Null) => return Err(ApiError::invalid("text", "`text` is required")),
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(ApiError::invalid("text", format!("`text` must be a string, got {}", type_name(&other))))
        }
    };
    if text.trim().is_empty() {
        return Err(ApiError::invalid("text", "`text` must not be empty"));
    }
    if text.len() > limits.max_text_bytes {
        return Err(ApiError::invalid(
            "text",
            format!("`text` must be at most {} bytes, got {}", limits.max_text_bytes, text.len()),
        ));
    }
    let features = match obj.remove("features") {
        None | Some(Value::Null) => serde_json::Map::new(),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(ApiError::invalid(
                "features",
                format!("`features` must be an object, got {}", type_name(&other)),
            ))
        }
    };
    if features.len() > limits.max_features {
        return Err(ApiError::invalid(
            "features",
            format!("`features` must have at most {} keys, got {}", limits.max_features, features.len()),
        ));
    }
    let tenant = match obj.remove("tenant") {
        None | Some(Value::Null) => {
            headers.get(TENANT_HEADER).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        }
        Some(Value::String(s)) => Some(s),
        Some(other) => {
            return Err(ApiError::invalid("tenant", format!("`tenant` must be a string, got {}", type_name(&other))))
        }
    };
    if tenant.as_ref().is_some_and(|t| t.len() > MAX_TENANT_BYTES) {
        return Err(ApiError::invalid("tenant", format!("`tenant` must be at most {MAX_TENANT_BYTES} bytes")));
    }
    Ok(ClassifyRequest {
        text: Arc::from(text),
        features,
        tenant,
        deadline: deadline(headers, limits)?,
        explain: false,
    })
}

/// `explain=true|false|1|0` in the query string.
pub fn explain_flag(query: Option<&str>) -> Result<bool, ApiError> {
    let Some(query) = query else { return Ok(false) };
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        if key == "explain" {
            return match value {
                "true" | "1" | "" => Ok(true),
                "false" | "0" => Ok(false),
                _ => Err(ApiError::invalid("explain", format!("`explain` must be true or false, got `{value}`"))),
            };
        }
    }
    Ok(false)
}

fn deadline(headers: &HeaderMap, limits: &ServerConfig) -> Result<Duration, ApiError> {
    let Some(raw) = headers.get(DEADLINE_HEADER) else {
        return Ok(Duration::from_millis(limits.default_deadline_ms));
    };
    let max = limits.max_deadline_ms;
    let ms =
        raw.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()).filter(|ms| (1..=max).contains(ms)).ok_or_else(
            || {
                ApiError::invalid(
                    DEADLINE_HEADER,
                    format!("`{DEADLINE_HEADER}` must be an integer from 1 to {max} (milliseconds)"),
                )
            },
        )?;
    Ok(Duration::from_millis(ms))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ServerConfig {
        ServerConfig { max_text_bytes: 10, max_features: 2, ..ServerConfig::default() }
    }

    fn field_of(r: Result<ClassifyRequest, ApiError>) -> (String, String) {
        match r {
            Err(ApiError::InvalidField { field, message }) => (field, message),
            other => panic!("expected InvalidField, got {other:?}"),
        }
    }

    #[test]
    fn valid_request_with_features_tenant_and_deadline() {
        let mut h = HeaderMap::new();
        h.insert(DEADLINE_HEADER, "50".parse().unwrap());
        let r = classify_request(&h, br#"{"text":"hi","features":{"a":1},"tenant":"t1"}"#, &limits()).unwrap();
        assert_eq!(&*r.text, "hi");
        assert_eq!(r.features["a"], 1);
        assert_eq!(r.tenant.as_deref(), Some("t1"));
        assert_eq!(r.deadline, Duration::from_millis(50));
    }

    #[test]
    fn each_bad_field_is_named_with_its_limit() {
        let h = HeaderMap::new();
        let l = limits();
        assert!(matches!(classify_request(&h, b"{not json", &l), Err(ApiError::MalformedJson(_))));
        assert_eq!(field_of(classify_request(&h, b"[1]", &l)).0, "body");
        assert_eq!(field_of(classify_request(&h, b"{}", &l)), ("text".into(), "`text` is required".into()));
        assert_eq!(field_of(classify_request(&h, br#"{"text":5}"#, &l)).1, "`text` must be a string, got a number");
        assert_eq!(field_of(classify_request(&h, br#"{"text":"  "}"#, &l)).1, "`text` must not be empty");
        assert_eq!(
            field_of(classify_request(&h, br#"{"text":"01234567890"}"#, &l)).1,
            "`text` must be at most 10 bytes, got 11"
        );
        assert_eq!(field_of(classify_request(&h, br#"{"text":"a","features":[]}"#, &l)).0, "features");
        assert!(field_of(classify_request(&h, br#"{"text":"a","features":{"a":1,"b":2,"c":3}}"#, &l))
            .1
            .contains("at most 2 keys"));
        assert_eq!(field_of(classify_request(&h, br#"{"text":"a","tenant":7}"#, &l)).0, "tenant");
        assert_eq!(field_of(classify_request(&h, br#"{"txt":"a"}"#, &l)).0, "txt");
        let mut bad = HeaderMap::new();
        bad.insert(DEADLINE_HEADER, "0".parse().unwrap());
        assert_eq!(field_of(classify_request(&bad, br#"{"text":"a"}"#, &l)).0, DEADLINE_HEADER);
    }

    #[test]
    fn content_type_must_be_json() {
        let mut h = HeaderMap::new();
        assert!(matches!(require_json(&h), Err(ApiError::UnsupportedMediaType { .. })));
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(matches!(require_json(&h), Err(ApiError::UnsupportedMediaType { .. })));
        h.insert(header::CONTENT_TYPE, "Application/JSON; charset=utf-8".parse().unwrap());
        assert!(require_json(&h).is_ok());
    }
}
