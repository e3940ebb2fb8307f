//! The classify request every front door builds — `POST /v1/classify`, a screened proxy route,
//! the tower Layer — through one validating constructor, so every door applies the same limits
//! (`[server]`: text length, feature count; tenant length; deadline range). Errors name the
//! field and the limit.

use crate::error::{json_type, ApiError};
use crate::tenant::{Identity, Tenants};
use crate::web::{headers, ServerConfig};
use http::HeaderMap;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// Longest tenant name accepted, bytes.
pub const MAX_TENANT_BYTES: usize = 128;

/// A validated classification request.
#[derive(Debug, Clone)]
pub struct ClassifyRequest {
    /// The text to judge: non-blank, at most `server.max_text_bytes` bytes.
    pub text: Arc<str>,
    /// At most `server.max_features` keys; visible to rules as `features.KEY`.
    pub features: Map<String, Value>,
    /// The tenant as rules and the audit see it. As parsed: the request's own claim, at most
    /// [`MAX_TENANT_BYTES`] bytes; after [`ClassifyRequest::identify`], the resolved name
    /// (`None` unless a configured source or an accepted claim named one).
    pub tenant: Option<String>,
    /// Who the request's limits count against, set by [`ClassifyRequest::identify`] at the
    /// front door; `None` (offline runs): the unknown tenant of the default class.
    pub identity: Option<Identity>,
    /// Time budget for the decision; past it model tiers are abandoned and rules decide.
    pub deadline: Duration,
    /// Add the complexity contributions, the signals snapshot and the routing reasons.
    pub explain: bool,
    /// The policy scenario to decide in (`[scenarios.NAME]`), checked against the policy by the
    /// gateway; `None`: the policy as written. Only `/v1/classify` sets it.
    pub scenario: Option<String>,
    /// Whether the client asked for `deadline` (`x-tiergate-deadline-ms`): a scenario's deadline
    /// replaces a default one, and a requested one may only shorten it.
    pub deadline_requested: bool,
    /// The request's trace (the front door began it; [`crate::trace::Trace::OFF`] offline or
    /// with tracing off): the gateway records its stages in it.
    pub trace: crate::trace::Trace,
}

impl ClassifyRequest {
    /// The one constructor: checks `text`, `features` and `tenant` against `server`.
    ///
    /// Errors: `InvalidField` naming `text` (blank, or over `max_text_bytes`), `features` (over
    /// `max_features` keys) or `tenant` (over [`MAX_TENANT_BYTES`]).
    pub fn new(
        text: String,
        features: Map<String, Value>,
        tenant: Option<String>,
        deadline: Duration,
        server: &ServerConfig,
    ) -> Result<ClassifyRequest, ApiError> {
        // The limit first: a text over it is refused for its size whatever it holds.
        if text.len() > server.max_text_bytes {
            return Err(ApiError::invalid(
                "text",
                format!("`text` must be at most {} bytes, got {}", server.max_text_bytes, text.len()),
            ));
        }
        if crate::text::is_blank(&text) {
            return Err(ApiError::invalid(
                "text",
                "`text` must not be empty (white space and invisible characters alone are empty)",
            ));
        }
        if features.len() > server.max_features {
            return Err(ApiError::invalid(
                "features",
                format!("`features` must have at most {} keys, got {}", server.max_features, features.len()),
            ));
        }
        if tenant.as_ref().is_some_and(|t| t.len() > MAX_TENANT_BYTES) {
            return Err(ApiError::invalid("tenant", format!("`tenant` must be at most {MAX_TENANT_BYTES} bytes")));
        }
        Ok(ClassifyRequest {
            text: Arc::from(text),
            features,
            tenant,
            deadline,
            explain: false,
            identity: None,
            scenario: None,
            deadline_requested: false,
            trace: crate::trace::Trace::OFF,
        })
    }

    /// Resolves the tenant from the configured sources ([`Tenants::resolve`]): `headers`, the
    /// proxy route's `route` tenant, and this request's own claim (counted only under
    /// `[tenants] accept_claimed`). Replaces `tenant` with the resolved name.
    ///
    /// Errors: `InvalidField` naming the trusted header or `tenant` for a name that is not valid.
    pub fn identify(&mut self, tenants: &Tenants, headers: &HeaderMap, route: Option<&str>) -> Result<(), ApiError> {
        let identity = tenants.resolve(headers, route, self.tenant.as_deref())?;
        self.tenant = identity.name.clone();
        self.identity = Some(identity);
        Ok(())
    }

    /// Parses a `/v1/classify` body, `{"text": str, "features": {..}?, "tenant": str?,
    /// "scenario": str?}`, with the tenant and scenario headers as the fallbacks and the deadline
    /// header (see [`deadline`]).
    ///
    /// Errors: `MalformedJson` (400) for a body that is not JSON or repeats a key
    /// ([`crate::web::json`]); `InvalidField` (422) for a
    /// non-object body, an unknown, missing or mistyped field, or a limit from [`Self::new`].
    pub fn from_json(headers: &HeaderMap, body: &[u8], server: &ServerConfig) -> Result<ClassifyRequest, ApiError> {
        let value = crate::web::json::parse(body)?;
        let Value::Object(mut obj) = value else {
            return Err(ApiError::invalid("body", format!("body must be a JSON object, got {}", json_type(&value))));
        };
        if let Some(unknown) = obj.keys().find(|k| !matches!(k.as_str(), "text" | "features" | "tenant" | "scenario")) {
            return Err(ApiError::invalid(
                unknown.clone(),
                format!("unknown field `{unknown}`; expected `text`, `features`, `tenant`, `scenario`"),
            ));
        }
        let scenario = scenario(obj.remove("scenario"), headers)?;
        let text = match obj.remove("text") {
            None | Some(Value::Null) => return Err(ApiError::invalid("text", "`text` is required")),
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(ApiError::invalid("text", format!("`text` must be a string, got {}", json_type(&other))))
            }
        };
        let features = match obj.remove("features") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(ApiError::invalid(
                    "features",
                    format!("`features` must be an object, got {}", json_type(&other)),
                ))
            }
        };
        let tenant = match obj.remove("tenant") {
            None | Some(Value::Null) => tenant_header(headers),
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                return Err(ApiError::invalid(
                    "tenant",
                    format!("`tenant` must be a string, got {}", json_type(&other)),
                ))
            }
        };
        let mut request = ClassifyRequest::new(text, features, tenant, deadline(headers, server)?, server)?;
        request.scenario = scenario;
        request.deadline_requested = headers.contains_key(headers::DEADLINE);
        Ok(request)
    }
}

/// The scenario the body's `scenario` field names, else the `x-tiergate-scenario` header.
///
/// Errors: `InvalidField` naming `scenario` for a non-string or a malformed name (1 to
/// [`crate::policy::scenario::MAX_SCENARIO_BYTES`] of `a-z`, `0-9`, `_`, `-`).
fn scenario(field: Option<Value>, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let name = match field {
        None | Some(Value::Null) => match headers.get(headers::SCENARIO) {
            None => return Ok(None),
            Some(v) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
        },
        Some(Value::String(s)) => s,
        Some(other) => {
            return Err(ApiError::invalid(
                "scenario",
                format!("`scenario` must be a string, got {}", json_type(&other)),
            ))
        }
    };
    if !crate::policy::scenario::valid_name(&name) {
        let max = crate::policy::scenario::MAX_SCENARIO_BYTES;
        return Err(ApiError::invalid("scenario", format!("`scenario` must be 1 to {max} of a-z, 0-9, `_`, `-`")));
    }
    Ok(Some(name))
}

/// The tenant named by the `x-tiergate-tenant` header, if any.
pub fn tenant_header(headers: &HeaderMap) -> Option<String> {
    headers.get(headers::TENANT).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// The deadline from `x-tiergate-deadline-ms` (1..=`max_deadline_ms`), else `default_deadline_ms`.
///
/// Errors: `InvalidField` naming the header when it is not an integer in range, or when it is
/// given more than once (which of two deadlines applies would be a guess).
pub fn deadline(headers: &HeaderMap, server: &ServerConfig) -> Result<Duration, ApiError> {
    let Some(raw) = headers.get(headers::DEADLINE) else {
        return Ok(Duration::from_millis(server.default_deadline_ms));
    };
    if headers.get_all(headers::DEADLINE).iter().nth(1).is_some() {
        return Err(ApiError::invalid(headers::DEADLINE, format!("`{}` must be given once", headers::DEADLINE)));
    }
    let max = server.max_deadline_ms;
    let ms = raw.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()).filter(|ms| (1..=max).contains(ms));
    let ms = ms.ok_or_else(|| {
        ApiError::invalid(
            headers::DEADLINE,
            format!("`{}` must be an integer from 1 to {max} (milliseconds)", headers::DEADLINE),
        )
    })?;
    Ok(Duration::from_millis(ms))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::require_json;
    use http::header;

    fn server() -> ServerConfig {
        ServerConfig { max_text_bytes: 10, max_features: 2, ..ServerConfig::default() }
    }

    fn field_of(r: Result<ClassifyRequest, ApiError>) -> (String, String) {
        match r {
            Err(ApiError::InvalidField { field, message }) => (field, message),
            other => panic!("expected InvalidField, got {other:?}"),
        }
    }

    fn parse(h: &HeaderMap, body: &[u8]) -> Result<ClassifyRequest, ApiError> {
        ClassifyRequest::from_json(h, body, &server())
    }

    #[test]
    fn valid_request_with_features_tenant_and_deadline() {
        let mut h = HeaderMap::new();
        h.insert(headers::DEADLINE, "50".parse().unwrap());
        let r = parse(&h, br#"{"text":"hi","features":{"a":1},"tenant":"t1"}"#).unwrap();
        assert_eq!(&*r.text, "hi");
        assert_eq!(r.features["a"], 1);
        assert_eq!(r.tenant.as_deref(), Some("t1"));
        assert_eq!(r.deadline, Duration::from_millis(50));
    }

    #[test]
    fn each_bad_field_is_named_with_its_limit() {
        let h = HeaderMap::new();
        assert!(matches!(parse(&h, b"{not json"), Err(ApiError::MalformedJson(_))));
        assert_eq!(field_of(parse(&h, b"[1]")).0, "body");
        assert_eq!(field_of(parse(&h, b"{}")), ("text".into(), "`text` is required".into()));
        assert_eq!(field_of(parse(&h, br#"{"text":5}"#)).1, "`text` must be a string, got a number");
        let empty = "`text` must not be empty (white space and invisible characters alone are empty)";
        assert_eq!(field_of(parse(&h, br#"{"text":"  "}"#)).1, empty);
        // zero-width space, zero-width joiner, byte-order mark, soft hyphen, NUL, ideographic space
        for blank in [r#"{"text":"\u200b\u200d\ufeff"}"#, r#"{"text":"\u00ad\u0000\u3000"}"#] {
            assert_eq!(field_of(parse(&h, blank.as_bytes())).1, empty, "{blank}");
        }
        assert!(parse(&h, r#"{"text":"ok\u200b"}"#.as_bytes()).is_ok(), "a visible letter is a message");
        assert_eq!(field_of(parse(&h, br#"{"text":"01234567890"}"#)).1, "`text` must be at most 10 bytes, got 11");
        assert_eq!(field_of(parse(&h, br#"{"text":"a","features":[]}"#)).0, "features");
        assert!(field_of(parse(&h, br#"{"text":"a","features":{"a":1,"b":2,"c":3}}"#)).1.contains("at most 2 keys"));
        assert_eq!(field_of(parse(&h, br#"{"text":"a","tenant":7}"#)).0, "tenant");
        assert_eq!(field_of(parse(&h, br#"{"txt":"a"}"#)).0, "txt");
        let mut bad = HeaderMap::new();
        bad.insert(headers::DEADLINE, "0".parse().unwrap());
        assert_eq!(field_of(parse(&bad, br#"{"text":"a"}"#)).0, headers::DEADLINE);
        let mut twice = HeaderMap::new();
        twice.append(headers::DEADLINE, "50".parse().unwrap());
        twice.append(headers::DEADLINE, "9000".parse().unwrap());
        let (field, message) = field_of(parse(&twice, br#"{"text":"a"}"#));
        assert_eq!(
            (field.as_str(), message.as_str()),
            (headers::DEADLINE, "`x-tiergate-deadline-ms` must be given once")
        );
        // Over the limit and blank: the limit is what the client must hear about.
        assert_eq!(field_of(parse(&h, br#"{"text":"           "}"#)).1, "`text` must be at most 10 bytes, got 11");
        assert_eq!(field_of(parse(&h, br#"{"text":"a","scenario":1}"#)).1, "`scenario` must be a string, got a number");
        assert!(field_of(parse(&h, br#"{"text":"a","scenario":"Pay ments"}"#)).1.contains("1 to 64 of a-z"));
    }

    #[test]
    fn the_scenario_comes_from_the_body_else_the_header_and_the_deadline_says_if_it_was_asked() {
        let mut h = HeaderMap::new();
        let r = parse(&h, br#"{"text":"a"}"#).unwrap();
        assert_eq!((r.scenario, r.deadline_requested), (None, false));
        h.insert(headers::SCENARIO, "payments".parse().unwrap());
        h.insert(headers::DEADLINE, "50".parse().unwrap());
        let r = parse(&h, br#"{"text":"a"}"#).unwrap();
        assert_eq!((r.scenario.as_deref(), r.deadline_requested), (Some("payments"), true));
        let r = parse(&h, br#"{"text":"a","scenario":"content_review"}"#).unwrap();
        assert_eq!(r.scenario.as_deref(), Some("content_review"), "the body wins");
    }

    #[test]
    fn every_door_gets_the_same_caps() {
        let (l, d) = (server(), Duration::from_millis(5));
        let many: Map<String, Value> = (0..3).map(|i| (format!("k{i}"), Value::from(i))).collect();
        assert_eq!(field_of(ClassifyRequest::new("a".into(), many, None, d, &l)).0, "features");
        let long_tenant = Some("t".repeat(MAX_TENANT_BYTES + 1));
        assert_eq!(field_of(ClassifyRequest::new("a".into(), Map::new(), long_tenant, d, &l)).0, "tenant");
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
