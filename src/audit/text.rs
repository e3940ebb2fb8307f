//! The text as a record keeps it (`[audit] text`): a keyed hash (HMAC-SHA256, crate `hmac`),
//! the text with personal data masked, or the text as sent.
//!
//! Redaction masks, in this order (each mask has no digits, so a later pass cannot re-match it):
//! e-mail addresses (`[email]`), IBANs whose ISO 13616 mod-97 check holds (`[iban]`), card
//! numbers of 13-19 digits whose Luhn check holds (`[card]`), and phone numbers (`[phone]`:
//! runs of 9-15 digits with spaces, dots, dashes or brackets between them, or 7-15 after a `+`
//! or an opening bracket; a date such as 2026-12-01 has 8 digits and stays). A digit run that
//! fails its check is left alone unless a later pattern matches it.

use super::config::TextMode;
use hmac::{Hmac, Mac};
use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::sync::LazyLock;

/// `text` in a record: how it was kept and the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditText {
    pub mode: TextMode,
    /// `hash`: 64 lower-case hex digits; `redacted`, `full`: text.
    pub value: String,
}

/// How this deployment keeps text: the mode and, for `hash`, the key.
#[derive(Clone)]
pub struct TextPolicy {
    mode: TextMode,
    key: Vec<u8>,
}

impl std::fmt::Debug for TextPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never reaches a log.
        f.debug_struct("TextPolicy").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl TextPolicy {
    /// `key` is used by `hash` only.
    pub fn new(mode: TextMode, key: Vec<u8>) -> TextPolicy {
        TextPolicy { mode, key }
    }

    /// The text as a record keeps it.
    pub fn render(&self, text: &str) -> AuditText {
        let value = match self.mode {
            TextMode::Hash => keyed_hash(&self.key, text),
            TextMode::Redacted => redact(text),
            TextMode::Full => text.to_string(),
        };
        AuditText { mode: self.mode, value }
    }
}

/// HMAC-SHA256 of the UTF-8 text under `key`, lower-case hex (64 digits).
pub fn keyed_hash(key: &[u8], text: &str) -> String {
    // HMAC takes keys of any length (RFC 2104): `new_from_slice` cannot fail for it.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(text.as_bytes());
    format!("{:x}", mac.finalize().into_bytes())
}

static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\b[a-z0-9._%+-]+@[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9-]+)*\.[a-z]{2,}\b").unwrap()
});
/// Country code, check digits, then 11-30 letters or digits, in groups of four in print form.
static IBAN: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b").unwrap());
static CARD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b\d(?:[ -]?\d){12,18}\b").unwrap());
static PHONE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?:\+|\(|\b)\d[\d ().-]{5,}\d\b").unwrap());

/// The text with e-mail addresses, IBANs, card numbers and phone numbers masked (see the module
/// documentation for what counts as each).
pub fn redact(text: &str) -> String {
    let text = EMAIL.replace_all(text, "[email]");
    let text = replace_checked(&text, &IBAN, "[iban]", iban_prefix);
    let text = replace_checked(&text, &CARD, "[card]", |m| luhn(m).then_some(m.len()));
    replace_checked(&text, &PHONE, "[phone]", |m| phone(m).then_some(m.len()))
}

/// Replaces the first `check(m)` bytes of each match `m` by `mask` where `check` says so.
fn replace_checked(text: &str, re: &Regex, mask: &str, check: impl Fn(&str) -> Option<usize>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for m in re.find_iter(text) {
        if let Some(len) = check(m.as_str()) {
            out.push_str(&text[at..m.start()]);
            out.push_str(mask);
            at = m.start() + len;
        }
    }
    out.push_str(&text[at..]);
    out
}

fn digits(s: &str) -> Vec<u32> {
    s.chars().filter_map(|c| c.to_digit(10)).collect()
}

/// The Luhn check (ISO/IEC 7812) over the digits of `s`.
pub fn luhn(s: &str) -> bool {
    let d = digits(s);
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| {
            if i % 2 == 1 {
                if x * 2 > 9 {
                    x * 2 - 9
                } else {
                    x * 2
                }
            } else {
                x
            }
        })
        .sum();
    (13..=19).contains(&d.len()) && sum % 10 == 0
}

/// Whether `s` looks like a phone number: 9-15 digits, or 7-15 after `+` or `(`.
fn phone(s: &str) -> bool {
    let n = digits(s).len();
    let international = s.starts_with('+') || s.starts_with('(');
    n <= 15 && (n >= 9 || (international && n >= 7))
}

/// The length of the longest prefix of `m` (ending at a letter or digit) that is an IBAN by the
/// ISO 13616 mod-97 check: a match may run on into a following word in capitals.
fn iban_prefix(m: &str) -> Option<usize> {
    let ends = m.char_indices().map(|(i, c)| i + c.len_utf8()).collect::<Vec<_>>();
    ends.into_iter().rev().find(|&end| {
        let compact: String = m[..end].chars().filter(|c| *c != ' ').collect();
        !m[..end].ends_with(' ') && (15..=34).contains(&compact.len()) && iban_valid(&compact)
    })
}

/// ISO 13616: the first four characters moved to the end, letters as 10..35, mod 97 is 1.
fn iban_valid(compact: &str) -> bool {
    let rearranged = compact[4..].chars().chain(compact[..4].chars());
    let mut rest = 0u32;
    for c in rearranged {
        let Some(v) = c.to_digit(36) else { return false };
        rest = if v >= 10 { (rest * 100 + v) % 97 } else { (rest * 10 + v) % 97 };
    }
    rest == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_phones_cards_and_ibans_are_masked() {
        let text = "mail jan.de-vries+x@bank.example.nl or call +31 6 1234 5678 / (555) 123-4567, \
                    card 4111 1111 1111 1111, IBAN NL91 ABNA 0417 1643 00 NOW, also GB82WEST12345698765432.";
        assert_eq!(redact(text), "mail [email] or call [phone] / [phone], card [card], IBAN [iban] NOW, also [iban].");
        assert_eq!(redact("ring 0612345678 today"), "ring [phone] today");
        assert_eq!(redact("pay with 5500-0000-0000-0004"), "pay with [card]");
    }

    #[test]
    fn numbers_that_fail_their_checks_are_left_alone() {
        // 16 digits failing Luhn: not a card, and too long for a phone number.
        let not_card = "order 4111 1111 1111 1112 shipped";
        assert_eq!(redact(not_card), not_card);
        // A wrong IBAN check digit.
        let not_iban = "ref NL92ABNA0417164300 ok";
        assert_eq!(redact(not_iban), not_iban);
        for kept in ["on 2026-12-01 at 10:30", "amount 12000 EUR", "code 123456", "no digits at all"] {
            assert_eq!(redact(kept), kept);
        }
    }

    #[test]
    fn the_luhn_and_iban_checks() {
        assert!(luhn("4111111111111111") && luhn("378282246310005") && !luhn("4111111111111112"));
        assert!(!luhn("0"), "too short to be a card");
        assert!(iban_valid("NL91ABNA0417164300") && iban_valid("DE89370400440532013000"));
        assert!(!iban_valid("DE89370400440532013001"));
    }

    #[test]
    fn the_keyed_hash_is_stable_per_key_and_differs_across_keys() {
        let a = keyed_hash(b"key-one-0123456789", "send the code");
        assert_eq!(a, keyed_hash(b"key-one-0123456789", "send the code"));
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(a, keyed_hash(b"key-two-0123456789", "send the code"));
        assert_ne!(a, keyed_hash(b"key-one-0123456789", "send the code!"));
        // RFC 4231 test case 2: the construction is HMAC-SHA256 itself.
        assert_eq!(
            keyed_hash(b"Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn each_mode_renders_as_it_says() {
        let text = "mail a@b.io";
        assert_eq!(TextPolicy::new(TextMode::Full, vec![]).render(text).value, text);
        assert_eq!(TextPolicy::new(TextMode::Redacted, vec![]).render(text).value, "mail [email]");
        let hashed = TextPolicy::new(TextMode::Hash, b"k".repeat(16)).render(text);
        assert_eq!((hashed.mode, hashed.value), (TextMode::Hash, keyed_hash(&b"k".repeat(16), text)));
    }
}
