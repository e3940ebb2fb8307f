//! The text as a record keeps it (`[audit] text`): a keyed hash (HMAC-SHA256, crate `hmac`),
//! the text with personal data masked, or the text as sent.
//!
//! Redaction masks, in this order (each mask has no digits, so a later pass cannot re-match it):
//! e-mail addresses (`[email]`: any script's letters, an IP literal `user@[192.0.2.1]` as the
//! domain, and the defanged forms `[@]` `(at)` `[.]` `(dot)` that the model reads through),
//! IBANs whose ISO 13616 mod-97 check holds (`[iban]`, any case), card numbers of 13-19 digits
//! whose Luhn check holds (`[card]`), and phone numbers (`[phone]`: runs of 9-15 digits with
//! separators between them, or 7-15 after a `+` or an opening bracket; a date such as
//! 2026-12-01 has 8 digits and stays). Digits are those of any script (fullwidth `４`,
//! Arabic-Indic `٤`: General Category Nd), and between two digits may stand spaces of any kind
//! (no-break and thin spaces), invisible format characters (zero-width space, joiners), dots and
//! dashes, in card numbers slashes, and in phone numbers brackets — what a fraudster uses to slip
//! a number past a pattern while the model still reads it as one. A digit run that fails its
//! check is left alone unless a later pattern matches it.

use super::config::TextMode;
use hmac::{Hmac, Mac};
use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::sync::LazyLock;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

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

/// An address's local part, `@` (or a defanged `[@]`, `(at)`), then a domain name whose dots
/// may be defanged (`[.]`, `(dot)`) or an IP literal in brackets.
static EMAIL: LazyLock<Regex> = LazyLock::new(|| {
    let dot = r"(?:\.|\[\.\]|\(\.\)|\[dot\]|\(dot\))";
    let label = r"[\p{L}\p{N}](?:[\p{L}\p{N}-]*[\p{L}\p{N}])?";
    Regex::new(&format!(
        r"(?i)[\p{{L}}\p{{N}}._%+-]+(?:@|\[@\]|\(@\)|\[at\]|\(at\))(?:{label}(?:{dot}{label})*{dot}\p{{L}}{{2,}}\b|\[[0-9a-f.:]+\])"
    ))
    .unwrap()
});
/// What may stand between two digits of one number (besides nothing): a space of any kind or an
/// invisible format character, one or two of them, or one `.`, `/` or `-` with them around it.
const GAP: &str = r"[\p{Zs}\p{Cf}]{0,2}[./-]?[\p{Zs}\p{Cf}]{0,2}";
/// Country code, check digits, then 11-30 letters or digits, in groups of four in print form.
static IBAN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b[A-Z]{2}\d{2}(?:[\p{Zs}\p{Cf}]{0,2}[A-Z0-9]){11,30}\b").unwrap());
static CARD: LazyLock<Regex> = LazyLock::new(|| Regex::new(&format!(r"\b\d(?:{GAP}\d){{12,18}}\b")).unwrap());
static PHONE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?:\+|\(|\b)\d[\d\p{Zs}\p{Cf}().-]{5,}\d\b").unwrap());

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
    s.chars().filter_map(digit_value).collect()
}

/// The value of a decimal digit of any script (General Category Nd). Unicode lays out each set
/// of decimal digits as ten consecutive code points from 0 to 9 (sets may follow each other
/// directly, as the mathematical digits do), so the value is the distance from the first digit
/// of the consecutive run, modulo 10.
fn digit_value(c: char) -> Option<u32> {
    if let Some(d) = c.to_digit(10) {
        return Some(d);
    }
    let is_digit = |c: char| c.general_category() == GeneralCategory::DecimalNumber;
    if !is_digit(c) {
        return None;
    }
    let mut first = c as u32;
    while let Some(prev) = first.checked_sub(1).and_then(char::from_u32).filter(|p| is_digit(*p)) {
        first = prev as u32;
    }
    Some((c as u32 - first) % 10)
}

/// A space of any kind or an invisible format character: the gaps [`IBAN`] allows.
fn is_gap(c: char) -> bool {
    c.general_category() == GeneralCategory::SpaceSeparator || c.general_category() == GeneralCategory::Format
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
        let compact: Vec<char> = m[..end].chars().filter(|c| !is_gap(*c)).collect();
        !m[..end].ends_with(is_gap) && (15..=34).contains(&compact.len()) && iban_valid(&compact)
    })
}

/// ISO 13616: the first four characters moved to the end, letters (either case) as 10..35,
/// digits of any script as their value, mod 97 is 1.
fn iban_valid(compact: &[char]) -> bool {
    if compact.len() < 5 {
        return false;
    }
    let rearranged = compact[4..].iter().chain(&compact[..4]);
    let mut rest = 0u32;
    for &c in rearranged {
        let Some(v) = digit_value(c).or_else(|| c.to_digit(36)) else { return false };
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
    fn disguised_numbers_and_addresses_are_masked_too() {
        let cases = [
            ("iban de89370400440532013000 ok", "iban [iban] ok"),
            ("card 4111\u{a0}1111\u{a0}1111\u{a0}1111 ok", "card [card] ok"),
            ("card 4111\u{200b}1111\u{200b}1111\u{200b}1111 ok", "card [card] ok"),
            ("card 4111.1111.1111.1111 or 4111/1111/1111/1111", "card [card] or [card]"),
            ("card ４１１１ １１１１ １１１１ １１１１ ok", "card [card] ok"),
            ("card ٤١١١ ١١١١ ١١١١ ١١١١ ok", "card [card] ok"),
            ("call +٤٤ ٢٠ ٧٩٤٦ ٠٩٥٨ now", "call [phone] now"),
            ("mail ünïcödé@exämple.de now", "mail [email] now"),
            ("mail user@[192.168.0.1] now", "mail [email] now"),
            ("mail john@gmail[.]com or john[at]gmail(dot)com now", "mail [email] or [email] now"),
        ];
        for (text, want) in cases {
            assert_eq!(redact(text), want, "{text:?}");
        }
    }

    #[test]
    fn numbers_that_fail_their_checks_are_left_alone() {
        // 16 digits failing Luhn: not a card, and too long for a phone number.
        let not_card = "order 4111 1111 1111 1112 shipped";
        assert_eq!(redact(not_card), not_card);
        // A wrong IBAN check digit.
        let not_iban = "ref NL92ABNA0417164300 ok";
        assert_eq!(redact(not_iban), not_iban);
        for kept in [
            "on 2026-12-01 at 10:30",
            "on 01.12.2026 and 2026/12/01",
            "amount 12000 EUR",
            "code 123456",
            "version 1.2.3",
            "no digits at all",
            "a@b without a domain",
        ] {
            assert_eq!(redact(kept), kept);
        }
    }

    #[test]
    fn the_luhn_and_iban_checks() {
        assert!(luhn("4111111111111111") && luhn("378282246310005") && !luhn("4111111111111112"));
        assert!(!luhn("0"), "too short to be a card");
        let iban = |s: &str| iban_valid(&s.chars().collect::<Vec<_>>());
        assert!(iban("NL91ABNA0417164300") && iban("DE89370400440532013000") && iban("de89370400440532013000"));
        assert!(!iban("DE89370400440532013001") && !iban("DE8"));
        assert_eq!(
            ["٤", "４", "𝟗", "𝟎", "7"].map(|d| digit_value(d.chars().next().unwrap())),
            [4, 4, 9, 0, 7].map(Some)
        );
        assert_eq!(digit_value('x'), None);
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
