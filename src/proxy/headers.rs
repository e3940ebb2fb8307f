//! Header rules, both ways: hop-by-hop headers out (RFC 9110 §7.6.1, but never the end-to-end
//! headers tiergate relies on, whatever `Connection` lists), client-sent `x-tiergate-*` out, `X-Forwarded-*` and `Via` in, and the decision headers the app receives.

use super::Screening;
use crate::web::{headers as names, PeerAddr};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::Version;

/// Hop-by-hop headers (RFC 9110 §7.6.1: `Connection`, `Proxy-Connection`, `Keep-Alive`, `TE`,
/// `Transfer-Encoding`, `Upgrade`), never forwarded as they are; plus `Proxy-Authorization` /
/// `Proxy-Authenticate`, which are for the proxy itself. `Transfer-Encoding` is re-framed by
/// each hop; `TE: trailers` is passed on (see [`prepare_request_headers`]); `Trailer` is
/// end-to-end and kept.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

pub(super) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The client's `Host`, or the HTTP/2 `:authority` as one.
pub(super) fn request_host_header(parts: &http::request::Parts) -> Option<HeaderValue> {
    parts
        .headers
        .get(header::HOST)
        .cloned()
        .or_else(|| parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()))
}

/// Whether a name a `Connection` header lists is removed. RFC 9110 §7.6.1 has an intermediary
/// remove what `Connection` names, but the sender chooses the names, and a client could then
/// strip what tiergate needs to travel end to end (the "hop-by-hop header abuse" of proxies):
/// the representation headers, `content-*` (the app would read the body tiergate screened under
/// another type, length or encoding), and `x-request-id` (the id tiergate audited and logged,
/// which ties the app's records to the decision). Those stay; any other listed name is
/// removed, as the RFC says. What tiergate sets itself (`Host`, `X-Forwarded-*`, `Via`,
/// `x-tiergate-*`) is written after the removal, so a listing cannot remove it either.
fn listed_name_is_removed(name: &HeaderName) -> bool {
    !(name.as_str().starts_with("content-") || name.as_str() == names::REQUEST_ID)
}

/// Removes hop-by-hop headers, and those the `Connection` header names except the end-to-end
/// headers tiergate relies on ([`listed_name_is_removed`]) (RFC 9110 §7.6.1).
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .filter(listed_name_is_removed)
        .collect();
    for name in listed.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// Removes every client-sent `x-tiergate-*` header: an app must be able to trust the decision
/// headers it receives.
pub(crate) fn strip_forged(headers: &mut HeaderMap) {
    // `x_tiergate_action` too: some servers (CGI/WSGI) read `_` and `-` as the same.
    let forged: Vec<HeaderName> =
        headers.keys().filter(|k| k.as_str().replace('_', "-").starts_with(names::PREFIX)).cloned().collect();
    for name in forged {
        headers.remove(name);
    }
}

/// `Via: 1.1 tiergate` appended to what earlier hops wrote (RFC 9110 §7.6.3).
pub(super) fn append_via(headers: &mut HeaderMap, version: Version, pseudonym: &str) {
    let protocol = match version {
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    };
    if let Ok(v) = HeaderValue::from_str(&format!("{protocol} {pseudonym}")) {
        headers.append(header::VIA, v);
    }
}

/// The request as the app gets it: hop-by-hop headers out, any client-sent `x-tiergate-*`
/// out (a client must not be able to forge a decision), forwarding headers and the decision in.
pub(super) fn prepare_request_headers(
    parts: &mut http::request::Parts,
    via: Option<&str>,
    trust_forwarded: bool,
    screened: Option<&Screening>,
) {
    let peer = parts.extensions.get::<PeerAddr>().map(|p| p.0.ip());
    let host = request_host_header(parts);
    let headers = &mut parts.headers;
    // The client can take trailers: the app may send them (gRPC needs this on HTTP/2).
    let te_trailers = headers.get_all(header::TE).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    strip_hop_by_hop(headers);
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    strip_forged(headers);
    // A single Host; for HTTP/2 clients the authority is set per attempt.
    headers.remove(header::HOST);
    if let Some(ip) = peer {
        // Every earlier line, in order, then the client's address (as nginx's
        // `$proxy_add_x_forwarded_for`); the app decides how many hops it trusts.
        let mut chain: Vec<String> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        chain.push(ip.to_string());
        if let Ok(v) = HeaderValue::from_str(&chain.join(", ")) {
            headers.insert("x-forwarded-for", v);
        }
    }
    // A client could claim any scheme or host: only a trusted front proxy (a TLS terminator)
    // may set these, and then it knows better than tiergate.
    let keep = |headers: &HeaderMap, name: &str| trust_forwarded && headers.contains_key(name);
    if !keep(headers, "x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
    if !keep(headers, "x-forwarded-host") {
        match host {
            Some(host) => headers.insert("x-forwarded-host", host),
            None => headers.remove("x-forwarded-host"),
        };
    }
    if let Some(via) = via {
        append_via(headers, parts.version, via);
    }
    if let Some(screened) = screened {
        set_decision_headers(headers, screened);
    }
}

/// The decision headers (`x-tiergate-action`, `-risk-score`, `-tier`, `-policy-version`, `-rule`,
/// `-overloaded`, `-record-id`),
/// or for a fail-open request `x-tiergate-action: unscreened` and `x-tiergate-screen-error`.
pub(crate) fn set_decision_headers(headers: &mut HeaderMap, screened: &Screening) {
    match screened {
        Screening::Decided(d) => {
            headers.insert(names::ACTION, HeaderValue::from_static(d.action.as_str()));
            headers.insert(names::TIER, HeaderValue::from_static(d.tier.as_str()));
            for (name, value) in
                [(names::RISK_SCORE, format!("{:.4}", d.risk_score)), (names::POLICY_VERSION, d.policy_version.clone())]
            {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    headers.insert(name, v);
                }
            }
            if let Some(rule) = d.rule.as_deref().and_then(|r| HeaderValue::from_str(r).ok()) {
                headers.insert(names::RULE, rule);
            }
            if let Some(id) = d.record_id.as_deref().and_then(|id| HeaderValue::from_str(id).ok()) {
                headers.insert(names::RECORD_ID, id);
            }
            if d.overloaded {
                headers.insert(names::OVERLOADED, HeaderValue::from_static("true"));
            }
        }
        Screening::Failed(reason) => {
            headers.insert(names::ACTION, HeaderValue::from_static("unscreened"));
            let printable: String =
                reason.chars().filter(|c| c.is_ascii() && !c.is_ascii_control()).take(200).collect();
            if let Ok(v) = HeaderValue::from_str(&printable) {
                headers.insert(names::SCREEN_ERROR, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_listed_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);
    }

    #[test]
    fn a_connection_list_never_removes_what_tiergate_screened_or_audited() {
        let mut h = HeaderMap::new();
        let listed = "x-request-id, Content-Type, content-length, content-encoding, x-secret";
        h.insert(header::CONNECTION, HeaderValue::from_static(listed));
        for name in ["x-request-id", "content-type", "content-length", "content-encoding", "x-secret"] {
            h.insert(name, HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut h);
        let mut kept: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        kept.sort();
        assert_eq!(kept, ["content-encoding", "content-length", "content-type", "x-request-id"]);
    }
}
