//! Who may use the console and how a browser proves it (the model: docs/operations.md, "Review
//! console").
//!
//! * **Login.** The console's login form takes the admin token (`[admin] token`) and a reviewer
//!   name. The token is checked as the admin API checks a bearer token: SHA-256 digests compared
//!   in constant time. The reviewer name is the analyst's own word (everyone with the token is
//!   trusted alike); it goes into each label they post.
//! * **Session.** A signed cookie, not server state: `v1:ISSUED_MS:REVIEWER:NONCE:MAC`, the MAC an
//!   HMAC-SHA256 under a key derived from the token (SHA-256 of a domain string and the token),
//!   so that every replica with the token accepts it and changing the token ends every session.
//!   Without a token (an admin listener open to whoever reaches it) the key is random per
//!   process. `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page sends it),
//!   `Path=/admin`, valid for [`MAX_AGE_S`].
//! * **CSRF.** A state-changing request (a label, logout) must carry the session's CSRF token —
//!   an HMAC of the cookie under the same key, rendered into the page and sent by its script in
//!   `x-tiergate-csrf` — and an `Origin` whose host and port are the request's `Host` (or HTTP/2
//!   authority). The login form needs the matching `Origin` too. Reads (the queue, an item, the
//!   quality panel) need the session or the bearer token, and answer JSON without CORS headers,
//!   which another origin's script cannot read.

use crate::error::ApiError;
use hmac::{Hmac, Mac};
use http::{header, HeaderMap, Uri};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "tiergate_console";
/// The header a state-changing request carries the CSRF token in.
pub const CSRF_HEADER: &str = "x-tiergate-csrf";
/// How long a session lasts, s (a working day).
pub const MAX_AGE_S: u64 = 12 * 3600;
/// A reviewer name's longest length, bytes.
pub const MAX_REVIEWER: usize = 64;

/// The key sessions and CSRF tokens are signed with.
#[derive(Clone)]
pub struct Keys {
    key: [u8; 32],
}

impl Keys {
    /// Derived from the admin token; random per process without one.
    pub fn new(token: Option<&str>) -> Keys {
        static RANDOM: OnceLock<[u8; 32]> = OnceLock::new();
        let key = match token {
            Some(token) => {
                let mut h = Sha256::new();
                h.update(b"tiergate review console session v1\0");
                h.update(token.as_bytes());
                h.finalize().into()
            }
            None => *RANDOM.get_or_init(|| {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).expect("the OS random source works");
                key
            }),
        };
        Keys { key }
    }

    fn mac(&self, purpose: &str, value: &str) -> String {
        // HMAC takes keys of any length (RFC 2104).
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts any key length");
        mac.update(purpose.as_bytes());
        mac.update(b"\0");
        mac.update(value.as_bytes());
        format!("{:x}", mac.finalize().into_bytes())
    }
}

/// A signed-in reviewer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub reviewer: String,
    pub issued_ms: u64,
    /// The cookie's value.
    value: String,
}

impl Session {
    /// A new session for `reviewer` (checked with [`check_reviewer`]) at `now_ms`.
    pub fn issue(keys: &Keys, reviewer: &str, now_ms: u64) -> Session {
        let mut nonce = [0u8; 12];
        getrandom::fill(&mut nonce).expect("the OS random source works");
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        let unsigned = format!("v1:{now_ms}:{reviewer}:{nonce}");
        let value = format!("{unsigned}:{}", keys.mac("session", &unsigned));
        Session { reviewer: reviewer.to_string(), issued_ms: now_ms, value }
    }

    /// The session in `headers`' cookie, if it is signed with `keys` and not expired at `now_ms`.
    pub fn from_headers(keys: &Keys, headers: &HeaderMap, now_ms: u64) -> Option<Session> {
        let value = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))?;
        let (unsigned, mac) = value.rsplit_once(':')?;
        if !bool::from(keys.mac("session", unsigned).as_bytes().ct_eq(mac.as_bytes())) {
            return None;
        }
        let mut parts = unsigned.split(':');
        let (Some("v1"), Some(issued), Some(reviewer)) = (parts.next(), parts.next(), parts.next()) else {
            return None;
        };
        let issued_ms: u64 = issued.parse().ok()?;
        if now_ms.saturating_sub(issued_ms) > MAX_AGE_S * 1000 || issued_ms > now_ms + 60_000 {
            return None;
        }
        Some(Session { reviewer: reviewer.to_string(), issued_ms, value: value.to_string() })
    }

    /// The `Set-Cookie` value that starts this session.
    pub fn set_cookie(&self) -> String {
        format!("{COOKIE}={}; Path=/admin; Max-Age={MAX_AGE_S}; HttpOnly; SameSite=Strict", self.value)
    }

    /// This session's CSRF token (64 hex digits).
    pub fn csrf(&self, keys: &Keys) -> String {
        keys.mac("csrf", &self.value)
    }

    /// Checks a state-changing request (its `headers`, sent to `uri`): its `x-tiergate-csrf` is
    /// this session's token and its origin is the console's ([`same_origin`]).
    ///
    /// Errors: `Forbidden` naming what is missing or wrong.
    pub fn check_csrf(&self, keys: &Keys, headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
        same_origin(headers, uri)?;
        let given = headers.get(CSRF_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
        if given.is_empty() {
            return Err(forbidden(format!("the console's requests carry the `{CSRF_HEADER}` header; reload the page")));
        }
        if !bool::from(self.csrf(keys).as_bytes().ct_eq(given)) {
            return Err(forbidden(format!("`{CSRF_HEADER}` is not this session's; reload the page")));
        }
        Ok(())
    }
}

/// The `Set-Cookie` value that ends a session.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/admin; Max-Age=0; HttpOnly; SameSite=Strict")
}

fn forbidden(reason: String) -> ApiError {
    ApiError::Forbidden { reason }
}

/// Checks that the request's `Origin` names the host and port it was sent to: its `Host`, or
/// over HTTP/2 (no `Host` header) the URI's authority. Browsers send `Origin` with every `POST`,
/// so a missing one is refused too. Behind a reverse proxy, the proxy must pass `Host` through.
///
/// Errors: `Forbidden` naming the origin.
pub fn same_origin(headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let host = match headers.get(header::HOST) {
        Some(host) => host.to_str().unwrap_or_default(),
        None => uri.authority().map(|a| a.as_str()).unwrap_or_default(),
    };
    let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
    match authority {
        Some(authority) if !host.is_empty() && authority.eq_ignore_ascii_case(host) => Ok(()),
        _ if origin.is_empty() => Err(forbidden("the console's requests carry an `Origin` header".into())),
        _ => Err(forbidden(format!("origin `{origin}` is not this console's (`{host}`)"))),
    }
}

/// Whether `presented` is the admin token (or no token is set), compared as SHA-256 digests in
/// constant time: neither the first wrong byte's position nor the length shows in the time.
pub fn token_matches(presented: &str, token: Option<&str>) -> bool {
    let Some(token) = token else { return true };
    let digest = |t: &str| Sha256::digest(t.as_bytes());
    bool::from(digest(presented).ct_eq(&digest(token)))
}

/// Whether `headers` carry `Authorization: Bearer <token>` (any case of the scheme).
pub fn bearer_matches(headers: &HeaderMap, token: Option<&str>) -> bool {
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match given.map(str::trim).and_then(|g| g.split_once(' ')) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => token_matches(rest.trim(), token),
        _ => false,
    }
}

/// Checks a reviewer name: 1 to [`MAX_REVIEWER`] bytes of letters, digits and `.`, `_`, `-`, `@`,
/// `+` (an e-mail address or a handle).
///
/// Errors: `InvalidField` (`reviewer`) naming the rule.
pub fn check_reviewer(name: &str) -> Result<(), ApiError> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+');
    if name.is_empty() || name.len() > MAX_REVIEWER || !name.chars().all(ok) {
        return Err(ApiError::invalid(
            "reviewer",
            format!("a reviewer name is 1 to {MAX_REVIEWER} letters, digits and . _ - @ +"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
