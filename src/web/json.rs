//! Request bodies parsed as JSON with one value per key.
//!
//! RFC 8259 §4 leaves duplicate object keys to the implementation: serde_json keeps the last,
//! other parsers keep the first. On a screened route that difference is an evasion —
//! `{"messages": [<phish>], "messages": [{"content": "hello"}]}` had tiergate screen the second
//! value while the app read the first. Screening every value would still leave the app's
//! choice unknown, so every door refuses a body with a repeated key, at any depth, as malformed
//! (400), naming the key.

use crate::error::ApiError;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// Parses `bytes` as one JSON value, refusing any object that repeats a key.
///
/// Errors: `MalformedJson` (400) for a body that is not JSON or repeats a key (the message
/// names the key, line and column; a lone UTF-16 surrogate escape is named as such).
pub fn parse(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice::<Unique>(bytes).map(|u| u.0).map_err(|e| ApiError::MalformedJson(explain(&e)))
}

/// serde_json's message, with what a `\uD800`-`\uDFFF` error means: its own words ("unexpected
/// end of hex escape") name the parser's state, not the client's mistake.
fn explain(e: &serde_json::Error) -> String {
    let m = e.to_string();
    if m.contains("surrogate") || m.contains("hex escape") {
        format!(
            "{m}: an escape in \\uD800-\\uDFFF must be one half of a UTF-16 surrogate pair \
             (a lone surrogate is not a Unicode character)"
        )
    } else {
        m
    }
}

/// A `serde_json::Value` whose objects were read without repeated keys.
struct Unique(Value);

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Unique, D::Error> {
        deserializer.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON text has no NaN or infinity, so the number is always finite here.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(Unique(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format_args!("duplicate key `{key}`")));
            }
            let Unique(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_at_any_depth_is_refused_and_named() {
        for body in [
            r#"{"text":"a","text":"b"}"#,
            r#"{"messages":[{"content":"pay here"}],"messages":[{"content":"hello"}]}"#,
            r#"{"messages":[{"role":"user","content":"x","content":"y"}]}"#,
            r#"{"features":{"amount":1,"amount":2},"text":"t"}"#,
        ] {
            let err = parse(body.as_bytes()).unwrap_err();
            assert!(matches!(&err, ApiError::MalformedJson(m) if m.contains("duplicate key")), "{body}: {err:?}");
        }
        let err = parse(br#"{"a":{"b":1,"b":2}}"#).unwrap_err();
        assert!(err.to_string().contains("`b`"), "{err}");
    }

    #[test]
    fn unique_bodies_parse_as_serde_json_does() {
        for body in [
            r#"{"text":"a","features":{"amount":12.5,"n":-3,"big":18446744073709551615,"ok":true,"none":null}}"#,
            r#"[1,"two",[3],{"four":4}]"#,
            r#""just a string""#,
            r#"{"a":{"x":1},"b":{"x":1}}"#,
        ] {
            let want: Value = serde_json::from_str(body).unwrap();
            assert_eq!(parse(body.as_bytes()).unwrap(), want, "{body}");
        }
        assert!(matches!(parse(b"{not json"), Err(ApiError::MalformedJson(_))));
    }

    #[test]
    fn a_lone_surrogate_is_named() {
        for body in [r#"{"text":"a\ud800"}"#, r#"{"text":"\ud800b"}"#, r#"{"text":"\udc00"}"#] {
            let err = parse(body.as_bytes()).unwrap_err();
            assert!(matches!(&err, ApiError::MalformedJson(m) if m.contains("surrogate pair")), "{body}: {err:?}");
        }
        assert_eq!(parse(r#"{"text":"\ud83d\ude00"}"#.as_bytes()).unwrap()["text"], "\u{1F600}");
    }
}
