//! Hashing and redaction: examples of each mask, disguises, what stays, and properties over
//! generated numbers in many groupings and separators.

use super::redact::{digit_value, iban_valid, resident_id};
use super::*;
use proptest::prelude::*;

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
    assert_eq!(["٤", "４", "𝟗", "𝟎", "7"].map(|d| digit_value(d.chars().next().unwrap())), [4, 4, 9, 0, 7].map(Some));
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

#[test]
fn a_card_followed_by_more_digits_and_lists_of_phone_numbers_are_masked() {
    let cases = [
        ("card 4111 1111 1111 1111 123 ok", "card [card] 123 ok"),
        ("card 4111-1111-1111-1111-2026 ok", "card [card]-2026 ok"),
        ("call 0612345678 0687654321 now", "call [phone] [phone] now"),
        ("call 06 12 34 56 78 06 98 76 54 32 now", "call [phone] [phone] now"),
        ("call 555 123 4567 555 765 4321", "call [phone] [phone]"),
        ("card 4111 1111 1111 1111 0612345678", "card [card] [phone]"),
        ("id 11010519491231002X ok", "id [id] ok"),
        ("身份证号11010519491231002x，谢谢", "身份证号[id]，谢谢"),
        ("手机13812345678，或+86 139 8765 4321。", "手机[phone]，或[phone]。"),
        ("电话 (+86) 138-1234-5678 0086 13987654321", "电话 ([phone] [phone]"),
    ];
    for (text, want) in cases {
        assert_eq!(redact(text), want, "{text:?}");
    }
}

#[test]
fn dates_versions_and_amounts_stay() {
    for kept in [
        "from 2026-12-01 to 2026-12-31",
        "2026-12-01 2026-12-02 2026-12-03",
        "version 10.2.3.4 and 1.2.3",
        "total 1,299.00 EUR, 12 000 EUR, 3 x 250",
        "order 4111 1111 1111 1112 shipped",
        "2026年12月1日",
    ] {
        assert_eq!(redact(kept), kept);
    }
}

/// The check character of a resident id's 17 digits (ISO 7064 MOD 11-2).
fn id_check(body: &[u32]) -> char {
    let sum: u32 = body.iter().enumerate().map(|(i, &v)| v * ((1u32 << (17 - i)) % 11)).sum();
    b"10X98765432"[(sum % 11) as usize] as char
}

/// The Luhn check digit that completes `body`.
fn luhn_digit(body: &[u32]) -> u32 {
    let sum: u32 = body
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| {
            if i % 2 == 0 {
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
    (10 - sum % 10) % 10
}

fn digit_string(d: &[u32]) -> String {
    d.iter().map(|d| char::from_digit(*d, 10).unwrap()).collect()
}

/// The digits (of any script) left in `s`.
fn digits_left(s: &str) -> String {
    s.chars().filter_map(digit_value).map(|d| char::from_digit(d, 10).unwrap()).collect()
}

/// What people and fraudsters put between the groups of a number: nothing, spaces (no-break,
/// narrow), dots, dashes, zero-width spaces and word joiners.
fn separator() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", " ", "  ", ".", "-", " - ", "\u{a0}", "\u{202f}", "\u{200b}", "\u{2060}"])
}

/// `digits` cut into groups of the given sizes (cycled), joined by the given separators.
fn grouped(digits: &str, cuts: &[(usize, &str)]) -> String {
    let chars: Vec<char> = digits.chars().collect();
    let (mut out, mut at, mut k) = (String::new(), 0, 0);
    while at < chars.len() {
        let (size, sep) = cuts[k % cuts.len()];
        let end = (at + size).min(chars.len());
        out.extend(&chars[at..end]);
        if end < chars.len() {
            out.push_str(sep);
        }
        (at, k) = (end, k + 1);
    }
    out
}

fn cuts() -> impl Strategy<Value = Vec<(usize, &'static str)>> {
    prop::collection::vec((1usize..=6, separator()), 1..6)
}

/// A mainland mobile number, 1[3-9] and nine digits, as people write it: plain, 3-4-4, with
/// +86 or 0086, or in any other grouping.
fn mainland_mobile() -> impl Strategy<Value = String> {
    let number = (3u32..=9, prop::collection::vec(0u32..10, 9)).prop_map(|(second, rest)| {
        let mut d = vec![1, second];
        d.extend(rest);
        digit_string(&d)
    });
    let prefix = prop::sample::select(vec!["", "+86 ", "+86", "+86-", "0086 ", "(+86) "]);
    (number, prefix, separator(), cuts(), any::<bool>()).prop_map(|(n, prefix, sep, cuts, three_four_four)| {
        let body =
            if three_four_four { format!("{}{sep}{}{sep}{}", &n[..3], &n[3..7], &n[7..]) } else { grouped(&n, &cuts) };
        format!("{prefix}{body}")
    })
}

/// A national phone number of 9-12 digits (a leading 0), in any grouping.
fn national_phone() -> impl Strategy<Value = String> {
    (prop::collection::vec(0u32..10, 8..=11), cuts()).prop_map(|(rest, cuts)| {
        let mut d = vec![0];
        d.extend(rest);
        grouped(&digit_string(&d), &cuts)
    })
}

/// An 18-character resident id with a valid check character (X as either case), plain or 6-8-4.
fn resident_id_number() -> impl Strategy<Value = String> {
    let body = (1u32..=8, prop::collection::vec(0u32..10, 5), 1930u32..2011, 1u32..=12, 1u32..=28, 0u32..1000);
    (body, separator(), any::<bool>(), any::<bool>()).prop_map(|((a, region, y, m, d, seq), sep, spaced, lower)| {
        let digits = format!("{a}{}{y:04}{m:02}{d:02}{seq:03}", digit_string(&region));
        let values: Vec<u32> = digits.chars().map(|c| c.to_digit(10).unwrap()).collect();
        let check = id_check(&values);
        let check = if lower { check.to_ascii_lowercase() } else { check };
        if spaced {
            format!("{}{sep}{}{sep}{}{check}", &digits[..6], &digits[6..14], &digits[14..])
        } else {
            format!("{digits}{check}")
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A card number of 13-19 digits in any grouping, followed or not by a few more digits, leaves
    /// none of its digits behind.
    #[test]
    fn no_card_number_survives(
        len in 13usize..=19,
        body in prop::collection::vec(0u32..10, 18),
        cuts in cuts(),
        tail in prop::option::of((prop::sample::select(vec![" ", "\u{a0}", "\u{200b}", " - ", "."]), 1u32..10_000)),
    ) {
        let mut d = body[..len - 1].to_vec();
        d.push(luhn_digit(&d));
        let tail = tail.map(|(sep, n)| (format!("{sep}{n}"), n.to_string())).unwrap_or_default();
        let text = format!("pay with {}{} today", grouped(&digit_string(&d), &cuts), tail.0);
        let out = redact(&text);
        prop_assert!(digits_left(&out).len() <= tail.1.len(), "{text:?} -> {out:?}");
    }

    /// One to three phone numbers, mainland mobiles or national numbers, in any grouping, alone or
    /// in a space-separated list, in English or Chinese text: none survives.
    #[test]
    fn no_phone_number_survives(
        phones in prop::collection::vec(prop_oneof![mainland_mobile(), national_phone()], 1..=3),
        joiner in prop::sample::select(vec![" ", "  ", "\u{a0}", "\u{3000}", ", ", " / ", "，"]),
        chinese in any::<bool>(),
    ) {
        let list = phones.join(joiner);
        let text = if chinese { format!("请打电话{list}，谢谢") } else { format!("call me on {list} today") };
        let out = redact(&text);
        prop_assert!(digits_left(&out).is_empty(), "{text:?} -> {out:?}");
    }

    /// An 18-character resident id, in English or Chinese text: none survives.
    #[test]
    fn no_resident_id_survives(id in resident_id_number(), chinese in any::<bool>()) {
        prop_assert!(resident_id(&id), "{id}");
        let text = if chinese { format!("身份证号{id}，谢谢") } else { format!("my ID is {id} thanks") };
        let out = redact(&text);
        prop_assert!(digits_left(&out).is_empty(), "{text:?} -> {out:?}");
    }
}
