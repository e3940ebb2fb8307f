//! The entities a text or a request's features name — link domains, phone numbers, IBANs,
//! wallet addresses, device ids — found in their canonical form, so that one IBAN written with
//! or without spaces, or one phone number with any punctuation, is one entity. They are only
//! ever stored as keyed hashes (`mod.rs`), never in clear.

use regex::Regex;
use std::sync::LazyLock;

/// What an entity is; the rule variable `entity.KIND` and the Redis key part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntityKind {
    LinkDomain,
    Phone,
    Iban,
    Wallet,
    Device,
}

impl EntityKind {
    /// Every kind, in the order the rule variables list them.
    pub const ALL: [EntityKind; 5] =
        [EntityKind::LinkDomain, EntityKind::Phone, EntityKind::Iban, EntityKind::Wallet, EntityKind::Device];

    /// The kind as written in rules and keys: `link_domain`, `phone`, `iban`, `wallet`, `device`.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityKind::LinkDomain => "link_domain",
            EntityKind::Phone => "phone",
            EntityKind::Iban => "iban",
            EntityKind::Wallet => "wallet",
            EntityKind::Device => "device",
        }
    }

    /// The kind named `name` (as [`EntityKind::as_str`] writes it).
    pub fn parse(name: &str) -> Option<EntityKind> {
        EntityKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// The most entities tracked per request (the first found, by kind order): bounds one lookup's
/// Redis work whatever the text holds.
pub const MAX_ENTITIES: usize = 8;

static LINK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b(?:https?://|www\.)([a-z0-9\-]+(?:\.[a-z0-9\-]+)+)").expect("valid regex"));
static PHONE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\+?\d[\d \-().]{6,20}\d").expect("valid regex"));
static IBAN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b[a-z]{2}\d{2}(?: ?[a-z0-9]{4}){2,7}(?: ?[a-z0-9]{1,4})?\b").expect("valid regex")
});
static WALLET: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(?:0x[0-9a-fA-F]{40}|bc1[02-9ac-hj-np-z]{25,59}|[13][1-9A-HJ-NP-Za-km-z]{25,34}|T[1-9A-HJ-NP-Za-km-z]{33})\b")
        .expect("valid regex")
});

/// The entities of `text`, in canonical form (domain lowercased without `www.`; phone as its
/// digits with a leading `+` kept; IBAN uppercase without spaces and with a valid ISO 13616
/// mod-97 check; wallet as written), then `features`' values for the `(kind, feature)` pairs
/// given; duplicates once; at most [`MAX_ENTITIES`].
pub fn find(
    text: &str,
    features: &serde_json::Map<String, serde_json::Value>,
    from_features: &[(EntityKind, String)],
) -> Vec<(EntityKind, String)> {
    let mut found: Vec<(EntityKind, String)> = Vec::new();
    let mut add = |kind, value: String| {
        if found.len() < MAX_ENTITIES && !found.iter().any(|(k, v)| *k == kind && *v == value) {
            found.push((kind, value));
        }
    };
    for c in LINK.captures_iter(text) {
        let host = c[1].to_ascii_lowercase();
        add(EntityKind::LinkDomain, host.strip_prefix("www.").unwrap_or(&host).to_string());
    }
    let ibans: Vec<String> = IBAN
        .find_iter(text)
        .map(|m| m.as_str().replace(' ', "").to_ascii_uppercase())
        .filter(|i| iban_valid(i))
        .collect();
    for m in PHONE.find_iter(text).filter(|m| standalone(text, m.start(), m.end())) {
        let digits: String = m.as_str().chars().filter(char::is_ascii_digit).collect();
        let plus = if m.as_str().starts_with('+') { "+" } else { "" };
        if (8..=15).contains(&digits.len()) && !ibans.iter().any(|i| i.contains(&digits)) {
            add(EntityKind::Phone, format!("{plus}{digits}"));
        }
    }
    for iban in ibans {
        add(EntityKind::Iban, iban);
    }
    for m in WALLET.find_iter(text) {
        add(EntityKind::Wallet, m.as_str().to_string());
    }
    for (kind, feature) in from_features {
        match features.get(feature) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => add(*kind, s.clone()),
            Some(serde_json::Value::Number(n)) => add(*kind, n.to_string()),
            _ => {}
        }
    }
    found
}

/// Whether `text[start..end]` is not part of a longer word (a phone number inside a wallet
/// address or a reference is none).
fn standalone(text: &str, start: usize, end: usize) -> bool {
    let before = text[..start].chars().next_back().is_none_or(|c| !c.is_alphanumeric());
    before && text[end..].chars().next().is_none_or(|c| !c.is_alphanumeric())
}

/// ISO 13616's check: the country and check digits moved to the end, letters as 10..35, the
/// number mod 97 is 1.
fn iban_valid(iban: &str) -> bool {
    if !(15..=34).contains(&iban.len()) || !iban.is_ascii() {
        return false;
    }
    let (head, tail) = iban.split_at(4);
    let mut rem: u32 = 0;
    for c in tail.chars().chain(head.chars()) {
        let v = match c.to_digit(36) {
            Some(v) => v,
            None => return false,
        };
        rem = if v < 10 { (rem * 10 + v) % 97 } else { (rem * 100 + v) % 97 };
    }
    rem == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<(EntityKind, String)> {
        find(text, &serde_json::Map::new(), &[])
    }

    #[test]
    fn one_iban_written_two_ways_is_one_entity_and_a_bad_check_is_none() {
        let spaced = kinds("Please pay to DE89 3704 0044 0532 0130 00 today");
        let packed = kinds("IBAN: de89370400440532013000.");
        assert_eq!(spaced, vec![(EntityKind::Iban, "DE89370400440532013000".into())]);
        assert_eq!(spaced, packed);
        assert!(kinds("DE88 3704 0044 0532 0130 00").is_empty(), "mod-97 check fails");
    }

    #[test]
    fn domains_phones_and_wallets_in_canonical_form() {
        let found = kinds(
            "Visit https://WWW.Pay-Now.example/x or call +44 (20) 7946-0958, send to 0x52908400098527886E0F7030069857D2E4169EE7",
        );
        assert_eq!(
            found,
            vec![
                (EntityKind::LinkDomain, "pay-now.example".into()),
                (EntityKind::Phone, "+442079460958".into()),
                (EntityKind::Wallet, "0x52908400098527886E0F7030069857D2E4169EE7".into()),
            ]
        );
    }

    #[test]
    fn features_name_devices_and_the_count_is_bounded() {
        let features = serde_json::json!({"device_id": "dev-42"}).as_object().cloned().unwrap();
        let found = find("hi", &features, &[(EntityKind::Device, "device_id".into())]);
        assert_eq!(found, vec![(EntityKind::Device, "dev-42".into())]);
        let many: String = (0..20).map(|i| format!("https://d{i}.example/ ")).collect();
        assert_eq!(kinds(&many).len(), MAX_ENTITIES);
    }
}
