//! One view of the request target for tiergate and the app: routes are matched on — and the app
//! receives — the same normalised path and host, so that no spelling of a path reaches an
//! app's screened handler through an unscreened route.
//!
//! Path (RFC 3986 §6.2.2): percent-encoded unreserved characters are decoded (`%63` is `c`),
//! other percent-encodings get upper-case hex, runs of `/` are merged, and `.` / `..` segments
//! removed (§5.2.4). Refused: encoded `/` and `\` (`%2F`, `%5C`: apps differ on whether they
//! separate segments), encoded control characters and broken percent-encoding.
//!
//! Spellings apps read differently, decided one by one. The rule for a screening proxy: what an
//! app may read as another path is refused (400 `bad_request_target`, naming the character), not
//! guessed at, since normalising it one way would still miss the apps that read it the other way.
//! - A literal `\`: refused. IIS and other Windows stacks read it as `/` (`/v1\chat` is their
//!   `/v1/chat`), most others as a character of the segment.
//! - A `;` in the path: refused. Tomcat, Jetty and Spring strip `;` parameters from each
//!   segment (`/v1/chat;jsessionid=1/completions` reaches their `/v1/chat/completions`), others
//!   keep them as part of the name. An encoded `%3B` is data to all of them and is kept.
//! - Case (`/V1/Chat`): apps matching case-insensitively (ASP.NET, IIS) and case-sensitively
//!   both exist, and refusing upper case would refuse real paths. Routes therefore match the
//!   path ignoring ASCII case (`path_prefix` and `path`, see `route.rs`), so a case variant
//!   always meets the route its lower-case spelling meets; the app gets the normalised path in
//! the client's case.
//! - Method case (`post`): RFC 9110 §9.1 makes methods case-sensitive, so `post` is not `POST`
//!   to tiergate's routes, but Werkzeug, Rails and others upper-case the method and serve it as
//!   `POST`. A method that differs from a standard one (§9.3, RFC 5789's `PATCH`) only in case
//!   is refused, naming it; other extension methods go on as they are.
//!
//! Host (RFC 9112 §3.2): an HTTP/1.1 request needs exactly one `Host`; an absolute-form target's
//! authority replaces `Host` (§3.2.2), an HTTP/2 `:authority` must agree with any `Host` (RFC 9113
//! §8.3.1), and userinfo is refused, so the host routed on is the host forwarded.

use crate::error::ApiError;
use http::header::HOST;
use http::{HeaderValue, Request, Uri, Version};
use std::borrow::Cow;

/// Normalises `req`'s path and `Host` in place, or says why the target is refused (400).
pub fn request<B>(req: &mut Request<B>) -> Result<(), ApiError> {
    method(req.method().as_str()).map_err(ApiError::BadTarget)?;
    let hosts = req.headers().get_all(HOST).iter().count();
    if hosts > 1 {
        return Err(ApiError::BadTarget(format!("{hosts} Host headers")));
    }
    if req.version() == Version::HTTP_11 && hosts == 0 && req.uri().authority().is_none() {
        return Err(ApiError::BadTarget("an HTTP/1.1 request needs a Host header".into()));
    }
    if let Some(authority) = req.uri().authority() {
        // RFC 9110 §4.2.4: userinfo in an http(s) URI is an error; it would also let
        // `api.example.com@other.example` read as two different hosts.
        if authority.as_str().contains('@') {
            return Err(ApiError::BadTarget("userinfo (`user@`) in the request target".into()));
        }
        // RFC 9113 §8.3.1: an HTTP/2 `:authority` and a `Host` that differ make the request
        // malformed (routing would read one and the app the other).
        let differs =
            req.headers().get(HOST).is_some_and(|h| !h.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()));
        if req.version() == Version::HTTP_2 && differs {
            return Err(ApiError::BadTarget("`:authority` and `Host` differ".into()));
        }
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| ApiError::BadTarget("the request target's authority is not a valid host".into()))?;
        req.headers_mut().insert(HOST, host);
    } else if req.headers().get(HOST).is_some_and(|h| h.as_bytes().contains(&b'@')) {
        return Err(ApiError::BadTarget("userinfo (`user@`) in Host".into()));
    }
    let path = path(req.uri().path()).map_err(ApiError::BadTarget)?;
    if let Cow::Owned(path) = path {
        let path_and_query = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query =
            Some(path_and_query.parse().map_err(|_| ApiError::BadTarget("the normalised path is not valid".into()))?);
        *req.uri_mut() = Uri::from_parts(parts).map_err(|e| ApiError::BadTarget(e.to_string()))?;
    }
    Ok(())
}

/// The standard methods (RFC 9110 §9.3, RFC 5789), the spellings apps that fold case read.
const STANDARD_METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

/// Refuses a method that is a standard one in another case (`post`, `Post`): routes match
/// methods exactly, and an app that folds case would serve it as the standard one.
pub fn method(raw: &str) -> Result<(), String> {
    match STANDARD_METHODS.iter().find(|m| m.eq_ignore_ascii_case(raw)) {
        Some(standard) if *standard != raw => {
            Err(format!("method `{raw}`: methods are case-sensitive (RFC 9110 §9.1); send `{standard}`"))
        }
        _ => Ok(()),
    }
}

/// The normalised form of an origin-form path (borrowed when already normal). Paths that do not
/// start with `/` (`*` of `OPTIONS *`) are left alone.
pub fn path(raw: &str) -> Result<Cow<'_, str>, String> {
    if !raw.starts_with('/') {
        return Ok(Cow::Borrowed(raw));
    }
    if raw.contains('\\') {
        return Err("a literal `\\` in the path (some apps read it as `/`)".into());
    }
    if raw.contains(';') {
        return Err("a `;` in the path (some apps strip `;` parameters from a segment)".into());
    }
    let mut decoded = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(i) = rest.find('%') {
        decoded.push_str(&rest[..i]);
        let hex = rest.get(i + 1..i + 3).filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        let hex = hex.ok_or_else(|| format!("broken percent-encoding in the path at `{}`", &rest[i..]))?;
        // Two hex digits always parse.
        let byte = u8::from_str_radix(hex, 16).unwrap_or_default();
        match byte {
            b'/' | b'\\' => return Err(format!("encoded `{}` (%{hex}) in the path", byte as char)),
            0..=0x1f | 0x7f => return Err(format!("encoded control character (%{hex}) in the path")),
            b if b.is_ascii_alphanumeric() || b"-._~".contains(&b) => decoded.push(b as char),
            _ => {
                decoded.push('%');
                decoded.push_str(&hex.to_ascii_uppercase());
            }
        }
        rest = &rest[i + 3..];
    }
    decoded.push_str(rest);
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in decoded.split('/').skip(1) {
        trailing_slash = matches!(segment, "" | "." | "..");
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut normal = String::with_capacity(decoded.len());
    for s in &segments {
        normal.push('/');
        normal.push_str(s);
    }
    if trailing_slash || segments.is_empty() {
        normal.push('/');
    }
    Ok(if normal == raw { Cow::Borrowed(raw) } else { Cow::Owned(normal) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        for (raw, normal) in [
            ("/v1/chat/completions", "/v1/chat/completions"),
            ("/v1/%63hat/completions", "/v1/chat/completions"),
            ("/%761/chat", "/v1/chat"),
            ("//v1//chat", "/v1/chat"),
            ("/v1/./chat/../chat/", "/v1/chat/"),
            ("/../../etc", "/etc"),
            ("/a%20b%2a", "/a%20b%2A"),
            ("/", "/"),
            ("/a/..", "/"),
            ("*", "*"),
        ] {
            assert_eq!(path(raw).unwrap(), normal, "{raw}");
        }
        assert!(matches!(path("/v1/chat").unwrap(), Cow::Borrowed(_)));
        for bad in ["/v1%2Fchat", "/v1%5cchat", "/a%00", "/a%zz", "/a%4"] {
            assert!(path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn methods_in_another_case_are_refused_naming_the_standard_one() {
        for ok in ["POST", "GET", "PATCH", "PROPFIND", "purge"] {
            assert!(method(ok).is_ok(), "{ok}");
        }
        for (bad, standard) in [("post", "`POST`"), ("Post", "`POST`"), ("pOST", "`POST`"), ("delete", "`DELETE`")] {
            let e = method(bad).unwrap_err();
            assert!(e.contains(standard) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn spellings_apps_read_differently_are_refused_naming_the_character() {
        for (bad, named) in [
            ("/echo\\chat", "`\\`"),
            ("/v1\\..\\chat", "`\\`"),
            ("/echo/chat;x=1", "`;`"),
            ("/v1/chat;jsessionid=1/completions", "`;`"),
            ("/;", "`;`"),
        ] {
            let err = path(bad).unwrap_err();
            assert!(err.contains(named), "{bad}: {err}");
        }
        assert_eq!(path("/a%3Bb").unwrap(), "/a%3Bb", "an encoded `;` is data");
        assert_eq!(path("/V1/Chat").unwrap(), "/V1/Chat", "case is kept (routes match ignoring it)");
        let mut r = Request::post("/echo/chat;x=1").header("host", "h").body(()).unwrap();
        let err = request(&mut r).unwrap_err();
        assert_eq!((err.status().as_u16(), err.code()), (400, "bad_request_target"));
        assert!(err.to_string().contains("`;`"), "{err}");
    }

    #[test]
    fn hosts() {
        let mut r = Request::get("http://api.example.com/x").header("host", "other.example").body(()).unwrap();
        request(&mut r).unwrap();
        assert_eq!(r.headers()["host"], "api.example.com", "absolute-form authority wins");
        let mut r = Request::get("/x").header("host", "a").header("host", "b").body(()).unwrap();
        assert!(request(&mut r).is_err());
        let mut r = Request::get("/x").body(()).unwrap();
        assert!(request(&mut r).is_err(), "HTTP/1.1 without Host");
        let mut r = Request::get("/x").version(Version::HTTP_10).body(()).unwrap();
        assert!(request(&mut r).is_ok(), "HTTP/1.0 may omit Host");
        let h2 = |authority: &str, host: &str| {
            Request::get(format!("http://{authority}/x"))
                .version(Version::HTTP_2)
                .header("host", host)
                .body(())
                .unwrap()
        };
        assert!(request(&mut h2("other.example", "api.example.com")).is_err(), ":authority and Host differ");
        let mut r = h2("api.example.com", "API.example.com");
        assert!(request(&mut r).is_ok());
        assert_eq!(r.headers()["host"], "api.example.com");
        let mut r = Request::get("http://api.example.com@other.example/x").body(()).unwrap();
        assert!(request(&mut r).is_err(), "userinfo");
        let mut r = Request::get("/x").header("host", "api.example.com@other.example").body(()).unwrap();
        assert!(request(&mut r).is_err(), "userinfo in Host");
    }
}

#[cfg(test)]
mod properties {
    use super::path;
    use proptest::prelude::*;

    /// Paths made of the characters normalisation cares about, and of anything at all.
    fn raw_path() -> impl Strategy<Value = String> {
        prop_oneof![
            "(/|//|\\.|\\.\\.|%2[eE]|%2[fF]|%5[cC]|%[0-9a-fA-F]{0,2}|%7[eE]|%41|%61|%30|[a-zA-Z0-9~_.;-]){0,24}"
                .prop_map(|s| format!("/{s}")),
            any::<String>().prop_map(|s| format!("/{s}")),
        ]
    }

    /// `(byte)` of each `%XX` in `s`.
    fn encoded_bytes(s: &str) -> Vec<u8> {
        s.match_indices('%')
            .filter_map(|(i, _)| s.get(i + 1..i + 3))
            .filter_map(|h| u8::from_str_radix(h, 16).ok())
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn a_normalised_path_is_normal_and_stays_so(raw in raw_path()) {
            let Ok(normal) = path(&raw) else { return Ok(()) };
            prop_assert!(normal.starts_with('/'), "{raw:?} -> {normal:?}");
            prop_assert!(!normal.contains("//"), "{raw:?} -> {normal:?}");
            prop_assert!(!normal.split('/').any(|s| s == "." || s == ".."), "{raw:?} -> {normal:?}");
            prop_assert!(!normal.contains('\\') && !normal.contains(';'), "{raw:?} -> {normal:?}");
            let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
            prop_assert!(!encoded_bytes(&normal).into_iter().any(unreserved), "{raw:?} -> {normal:?}");
            let again = path(&normal);
            prop_assert_eq!(again.as_deref(), Ok(&*normal), "idempotent: {:?}", raw);
        }
    }
}
