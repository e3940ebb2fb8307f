//! Tests of tenant identity resolution: each source, their order, claims off by default, the
//! one shared key of unknown tenants, name validation, and which names are authenticated.

use super::*;
use crate::tenant::config::{TenantsConfig, MAX_NAME_BYTES};

/// sha256("pay-key"), as `printf %s pay-key | sha256sum` prints it.
fn hash(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn config(extra: &str) -> TenantsConfig {
    let text = format!(
        "{extra}\n[api_keys]\n\"{}\" = \"payments\"\n[known]\npayments = \"gold\"\nchat = \"default\"\n\
         [classes.gold]\nrate = {{ per_second = 100, burst = 100 }}\ngpu_share = 0.5\n\
         [classes.default]\nrate = {{ per_second = 1, burst = 2 }}\n",
        hash("pay-key")
    );
    let c: TenantsConfig = toml::from_str(&text).unwrap();
    c.check(None).unwrap();
    c
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs.iter().map(|(k, v)| (HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap())).collect()
}

fn field(e: ApiError) -> String {
    match e {
        ApiError::InvalidField { field, .. } => field,
        other => panic!("expected InvalidField, got {other:?}"),
    }
}

#[test]
fn an_api_key_names_its_tenant_from_either_header() {
    let t = Tenants::new(&config(""), None);
    for h in [headers(&[("x-api-key", "pay-key")]), headers(&[("authorization", "Bearer pay-key")])] {
        let id = t.resolve(&h, None, Some("chat")).unwrap();
        assert_eq!((id.name.as_deref(), id.source), (Some("payments"), Source::ApiKey));
        assert_eq!((id.state.key.as_str(), id.state.label.as_str()), ("tenant:payments", "payments"));
        assert_eq!(id.state.class.name, "gold");
        assert_eq!(id.state.class.gpu_share, Some(0.5));
    }
    // A key that matches no hash (perhaps the app's own credential) identifies nobody.
    let id = t.resolve(&headers(&[("authorization", "Bearer other-key")]), None, None).unwrap();
    assert_eq!((id.name, id.source, id.state.label.as_str()), (None, Source::None, OTHER));
}

#[test]
fn the_trusted_header_counts_only_when_configured() {
    let h = headers(&[("x-client-tenant", "chat")]);
    let off = Tenants::new(&config(""), None);
    assert_eq!(off.resolve(&h, None, None).unwrap().source, Source::None, "no header is trusted by default");
    let on = Tenants::new(&config("trusted_header = \"x-client-tenant\""), None);
    let id = on.resolve(&h, None, None).unwrap();
    assert_eq!(
        (id.name.as_deref(), id.source, id.state.key.as_str()),
        (Some("chat"), Source::TrustedHeader, "tenant:chat")
    );
    // A name the proxy vouches for but the config does not know: the unknown tenants' key.
    let id = on.resolve(&headers(&[("x-client-tenant", "newco")]), None, None).unwrap();
    assert_eq!(
        (id.name.as_deref(), id.state.key.as_str(), id.state.label.as_str()),
        (Some("newco"), "class:default", OTHER)
    );
    // An API key outranks the header.
    let both = headers(&[("x-client-tenant", "chat"), ("x-api-key", "pay-key")]);
    assert_eq!(on.resolve(&both, None, None).unwrap().name.as_deref(), Some("payments"));
    // A bad name is a 422 naming the header.
    let bad = on.resolve(&headers(&[("x-client-tenant", "a b")]), None, None).unwrap_err();
    assert_eq!(field(bad), "x-client-tenant");
}

#[test]
fn a_claimed_tenant_is_ignored_unless_the_config_accepts_claims() {
    let off = Tenants::new(&config(""), None);
    let id = off.resolve(&HeaderMap::new(), None, Some("payments")).unwrap();
    assert_eq!((id.name, id.source, id.state.key.as_str()), (None, Source::None, "class:default"));
    assert!(off.resolve(&HeaderMap::new(), None, Some("not valid!")).is_ok(), "an ignored claim is not read");

    let on = Tenants::new(&config("accept_claimed = true"), None);
    let id = on.resolve(&HeaderMap::new(), None, Some("payments")).unwrap();
    assert_eq!(
        (id.name.as_deref(), id.source, id.state.key.as_str()),
        (Some("payments"), Source::Claimed, "tenant:payments")
    );
    assert_eq!(field(on.resolve(&HeaderMap::new(), None, Some("x".repeat(65).as_str())).unwrap_err()), "tenant");
    assert_eq!(field(on.resolve(&HeaderMap::new(), None, Some("émile")).unwrap_err()), "tenant");
}

#[test]
fn every_unknown_name_shares_one_key_and_label() {
    let t = Tenants::new(&config("accept_claimed = true"), None);
    let keys: std::collections::BTreeSet<_> = (0..50)
        .map(|i| t.resolve(&HeaderMap::new(), None, Some(&format!("rotating-{i}"))).unwrap())
        .map(|id| (id.state.key.clone(), id.state.label.clone(), Arc::as_ptr(&id.state)))
        .collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let unknown = t.unknown();
    assert!(Arc::ptr_eq(&unknown.state, &t.resolve(&HeaderMap::new(), None, Some("rotating-0")).unwrap().state));
    assert_eq!(unknown.state.class.rate, Some(Quota { per_second: 1, burst: 2 }));
}

#[test]
fn the_route_tenant_comes_after_keys_and_headers_and_before_claims() {
    let t = Tenants::new(&config("accept_claimed = true\ntrusted_header = \"x-client-tenant\""), None);
    let id = t.resolve(&HeaderMap::new(), Some("chat"), Some("payments")).unwrap();
    assert_eq!((id.name.as_deref(), id.source), (Some("chat"), Source::Route));
    let id = t.resolve(&headers(&[("x-api-key", "pay-key")]), Some("chat"), None).unwrap();
    assert_eq!(id.source, Source::ApiKey);
}

#[test]
fn admission_rate_is_the_default_class_rate_when_it_has_none() {
    let c: TenantsConfig = toml::from_str("[classes.gold]\nrate = { per_second = 9, burst = 9 }").unwrap();
    let legacy = Quota { per_second: 3, burst: 4 };
    let t = Tenants::new(&c, Some(legacy));
    assert_eq!(t.unknown().state.class.rate, Some(legacy));
    assert_eq!(Tenants::new(&TenantsConfig::default(), None).unknown().state.class.rate, None);
}

#[test]
fn names_are_bounded_and_plain() {
    assert!(valid_name("pay.ments_2-eu").is_ok());
    assert!(valid_name(&"a".repeat(MAX_NAME_BYTES)).is_ok());
    for bad in ["", "a b", "a/b", "ä", "a\n"] {
        assert!(valid_name(bad).is_err(), "{bad:?}");
    }
    assert!(valid_name(&"a".repeat(MAX_NAME_BYTES + 1)).unwrap_err().contains("1 to 64 bytes"));
}

#[test]
fn only_a_vouched_for_name_is_authenticated() {
    let t = Tenants::new(&config("accept_claimed = true\ntrusted_header = \"x-client-tenant\""), None);
    let resolve = |h: &[(&str, &str)], route: Option<&str>, claim: Option<&str>| t.resolve(&headers(h), route, claim);
    let by_key = resolve(&[("x-api-key", "pay-key")], None, Some("chat")).unwrap();
    assert_eq!(by_key.authenticated(), Some("payments"));
    let by_proxy = resolve(&[("x-client-tenant", "someone")], None, None).unwrap();
    assert_eq!(by_proxy.authenticated(), Some("someone"), "the trusted proxy vouches for unknown names too");
    assert_eq!(resolve(&[], Some("chat"), None).unwrap().authenticated(), Some("chat"));
    let claimed = resolve(&[], None, Some("payments")).unwrap();
    assert_eq!((claimed.name.as_deref(), claimed.authenticated()), (Some("payments"), None), "a claim is a name only");
    assert_eq!(resolve(&[("x-api-key", "wrong")], None, None).unwrap().authenticated(), None);
}

/// `headers` from lines, repeated names appended (not replaced).
fn lines(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
    }
    h
}

#[test]
fn an_identity_header_sent_twice_is_refused_naming_it() {
    let t = Tenants::new(&config("trusted_header = \"x-client-tenant\"\naccept_claimed = true"), None);
    for name in ["x-api-key", "authorization", "x-client-tenant", "x-tiergate-tenant"] {
        let h = lines(&[(name, "Bearer pay-key"), (name, "chat")]);
        match t.resolve(&h, None, None) {
            Err(ApiError::RepeatedHeader { header, count }) => assert_eq!((header.as_str(), count), (name, 2)),
            other => panic!("{name}: {other:?}"),
        }
    }
    // Only what tiergate reads: without API keys or a trusted header, those are the app's.
    let bare: TenantsConfig = toml::from_str("").unwrap();
    let h = lines(&[("x-api-key", "a"), ("x-api-key", "b"), ("x-client-tenant", "a"), ("x-client-tenant", "b")]);
    assert_eq!(Tenants::new(&bare, None).resolve(&h, None, None).unwrap().source, Source::None);
}

#[test]
fn tiergates_own_credentials_are_stripped_and_the_apps_kept() {
    let t = Tenants::new(&config("trusted_header = \"x-client-tenant\""), None);
    let mut h = lines(&[
        ("x-api-key", "pay-key"),
        ("authorization", "bearer  pay-key "),
        ("authorization", "Bearer app-key"),
        ("x-client-tenant", "chat"),
        ("x-other", "1"),
    ]);
    t.strip_credentials(&mut h);
    assert_eq!(h.get_all("authorization").iter().collect::<Vec<_>>(), ["Bearer app-key"]);
    assert!(h.get("x-api-key").is_none() && h.get("x-client-tenant").is_none());
    assert_eq!(h.len(), 2);
}
