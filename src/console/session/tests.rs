//! Sessions, CSRF tokens and origins: what is accepted and what is refused.

use super::*;
use http::HeaderValue;

const NOW: u64 = 1_764_547_200_000;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn cookie_of(session: &Session) -> String {
    session.set_cookie().split(';').next().unwrap().to_string()
}

#[test]
fn a_session_reads_back_from_its_cookie_among_others_until_it_expires() {
    let keys = Keys::new(Some("s3cret-token"));
    let session = Session::issue(&keys, "ana@example.org", NOW);
    let cookie = format!("other=1; {}; last=2", cookie_of(&session));
    let back = Session::from_headers(&keys, &headers(&[("cookie", &cookie)]), NOW + 1000).unwrap();
    assert_eq!(back, session);
    assert_eq!(back.reviewer, "ana@example.org");
    assert!(Session::from_headers(&keys, &headers(&[("cookie", &cookie)]), NOW + MAX_AGE_S * 1000 + 1).is_none());
    let set = session.set_cookie();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/admin", "Max-Age=43200"] {
        assert!(set.contains(attribute), "{set}");
    }
}

#[test]
fn a_cookie_signed_under_another_token_or_altered_is_no_session() {
    let keys = Keys::new(Some("s3cret-token"));
    let cookie = cookie_of(&Session::issue(&keys, "ana", NOW));
    let other = Keys::new(Some("another-token"));
    assert!(Session::from_headers(&other, &headers(&[("cookie", &cookie)]), NOW).is_none());
    // The reviewer changed, the MAC kept.
    let forged = cookie.replace(":ana:", ":eve:");
    assert!(Session::from_headers(&keys, &headers(&[("cookie", &forged)]), NOW).is_none());
    assert!(Session::from_headers(&keys, &headers(&[("cookie", "tiergate_console=v1:1:ana:00:00")]), NOW).is_none());
    assert!(Session::from_headers(&keys, &HeaderMap::new(), NOW).is_none());
}

#[test]
fn a_state_change_needs_the_sessions_csrf_token_and_the_same_origin() {
    let keys = Keys::new(Some("s3cret-token"));
    let session = Session::issue(&keys, "ana", NOW);
    let csrf = session.csrf(&keys);
    let host = ("host", "127.0.0.1:9090");
    // HTTP/1.1: the path only; the host is in `Host`.
    let path: Uri = "/admin/review/label".parse().unwrap();
    let ok = headers(&[host, ("origin", "http://127.0.0.1:9090"), (CSRF_HEADER, &csrf)]);
    assert!(session.check_csrf(&keys, &ok, &path).is_ok());
    let refused = |h: HeaderMap| session.check_csrf(&keys, &h, &path).unwrap_err().to_string();
    assert_eq!(refused(headers(&[host, (CSRF_HEADER, &csrf)])), "the console's requests carry an `Origin` header");
    assert_eq!(
        refused(headers(&[host, ("origin", "http://evil.example"), (CSRF_HEADER, &csrf)])),
        "origin `http://evil.example` is not this console's (`127.0.0.1:9090`)"
    );
    assert!(refused(headers(&[host, ("origin", "http://127.0.0.1:9090")])).contains("carry the `x-tiergate-csrf`"));
    let other = Session::issue(&keys, "ana", NOW).csrf(&keys);
    assert!(refused(headers(&[host, ("origin", "http://127.0.0.1:9090"), (CSRF_HEADER, &other)]))
        .contains("is not this session's"));
    let status = session.check_csrf(&keys, &headers(&[host]), &path).unwrap_err().status();
    assert_eq!(status, http::StatusCode::FORBIDDEN);
    // HTTP/2: no `Host`, the authority in the URI.
    let h2: Uri = "http://127.0.0.1:9090/admin/review/label".parse().unwrap();
    let origin = headers(&[("origin", "http://127.0.0.1:9090"), (CSRF_HEADER, &csrf)]);
    assert!(session.check_csrf(&keys, &origin, &h2).is_ok());
    let evil = headers(&[("origin", "http://evil.example"), (CSRF_HEADER, &csrf)]);
    assert!(session.check_csrf(&keys, &evil, &h2).is_err());
    assert!(same_origin(&headers(&[("origin", "http://127.0.0.1:9090")]), &path).is_err(), "no host at all");
}

#[test]
fn tokens_and_bearer_headers_match_only_exactly() {
    assert!(token_matches("abc", Some("abc")));
    assert!(!token_matches("abd", Some("abc")));
    assert!(!token_matches("ab", Some("abc")));
    assert!(token_matches("anything", None));
    assert!(bearer_matches(&headers(&[("authorization", "bearer abc")]), Some("abc")));
    assert!(!bearer_matches(&headers(&[("authorization", "Basic abc")]), Some("abc")));
    assert!(!bearer_matches(&HeaderMap::new(), Some("abc")));
}

#[test]
fn reviewer_names_are_short_handles_or_addresses() {
    assert!(check_reviewer("ana.lyst+fraud@example.org").is_ok());
    for bad in ["", "ana lyst", "a:b", "<script>", &"x".repeat(65)] {
        let e = check_reviewer(bad).unwrap_err();
        assert_eq!(e.to_string(), "a reviewer name is 1 to 64 letters, digits and . _ - @ +", "{bad:?}");
    }
}
