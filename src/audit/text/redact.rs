//! Redaction: personal data in a text replaced by masks without digits, so that a later pass
//! cannot re-match a mask. In this order:
//!
//! 1. e-mail addresses (`[email]`: any script's letters, an IP literal `user@[192.0.2.1]` as the
//!    domain, and the defanged forms `[@]` `(at)` `[.]` `(dot)` that the model reads through);
//! 2. IBANs whose ISO 13616 mod-97 check holds (`[iban]`, any case);
//! 3. runs of digit groups (a list of phone numbers, a card number and a phone number, ...) cut
//!    into whole groups that are each a Chinese resident identity number (`[id]`: 17 digits and
//!    a check digit or `X`, the GB 11643 / ISO 7064 MOD 11-2 check holding), a card number
//!    (`[card]`: 13-19 digits, Luhn) or a phone number (`[phone]`: 9-15 digits, or 7-15 after `+`
//!    or an opening bracket), every digit of the run covered; a run that cannot be covered that
//!    way is left to the next pass, so that an order number is not a phone number;
//! 4. card numbers inside what is left: the longest whole-group window of 13-19 digits whose
//!    Luhn check holds (a card followed by more digits, `4111 1111 1111 1111 123`).
//!
//! A date such as 2026-12-01 has 8 digits, a version or an amount fewer still: they stay. Digits
//! are those of any script (fullwidth `４`, Arabic-Indic `٤`: General Category Nd), and between
//! two digits may stand spaces of any kind (no-break and thin spaces), invisible format characters
//! (zero-width space, joiners), dots and dashes, in card numbers slashes, and in phone numbers
//! brackets — what a fraudster uses to slip a number past a pattern while the model still reads it
//! as one. A digit run that fails every check is left alone.

use regex::Regex;
use std::ops::Range;
use std::sync::LazyLock;
use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

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
/// Where a number may start: not inside a word or a longer digit run — but right after Chinese,
/// Japanese or Korean characters, which are word characters to `\b` and are written without a
/// space before a number (`手机13812345678`). The regex crate has no look-behind, so the character
/// before is matched and each number pattern captures the number itself as `n`.
const BEFORE: &str = r"(?:^|[^\w]|[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}])";
/// Country code, check digits, then 11-30 letters or digits, in groups of four in print form.
static IBAN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\b(?P<n>[A-Z]{2}\d{2}(?:[\p{Zs}\p{Cf}]{0,2}[A-Z0-9]){11,30})\b").unwrap());
/// A run of digits with card separators between them, as long as it goes.
static CARD_RUN: LazyLock<Regex> = LazyLock::new(|| Regex::new(&format!(r"{BEFORE}(?P<n>\d(?:{GAP}\d)*)")).unwrap());
/// A run of digits with phone separators (spaces, brackets, dots, dashes), as long as it goes,
/// and the `X` a resident id may end with.
static NUMBER_RUN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!(r"{BEFORE}(?P<n>[+(]?\d[\d\p{{Zs}}\p{{Cf}}().-]{{5,}}\d[Xx]?)")).unwrap());

/// The text with e-mail addresses, IBANs, resident ids, card numbers and phone numbers masked
/// (see the module documentation for what counts as each).
pub fn redact(text: &str) -> String {
    let text = EMAIL.replace_all(text, "[email]");
    let text = replace_ranges(&text, &IBAN, |m| iban_prefix(m).map(|n| (0..n, "[iban]")).into_iter().collect());
    let text = replace_ranges(&text, &NUMBER_RUN, numbers_covering);
    replace_ranges(&text, &CARD_RUN, card_windows)
}

/// Replaces, in each match of `re` (its capture `n`), the byte ranges `ranges(n)` gives (in
/// order, not overlapping) by their masks.
fn replace_ranges(text: &str, re: &Regex, ranges: impl Fn(&str) -> Vec<(Range<usize>, &'static str)>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for caps in re.captures_iter(text) {
        let m = caps.name("n").expect("every number pattern captures `n`");
        for (r, mask) in ranges(m.as_str()) {
            out.push_str(&text[at..m.start() + r.start]);
            out.push_str(mask);
            at = m.start() + r.end;
        }
    }
    out.push_str(&text[at..]);
    out
}

/// A group of a run: its bytes in the match and how many digits it holds.
#[derive(Debug, Clone)]
struct Group {
    bytes: Range<usize>,
    digits: usize,
}

/// The groups of `m`: maximal stretches between characters for which `split` holds, those
/// with a digit (a lone dash or bracket between spaces is a separator, not a group).
fn groups(m: &str, split: impl Fn(char) -> bool) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    let mut open = false;
    for (i, c) in m.char_indices() {
        if split(c) {
            open = false;
            continue;
        }
        if !open {
            out.push(Group { bytes: i..i, digits: 0 });
            open = true;
        }
        let g = out.last_mut().expect("a group is open");
        g.bytes.end = i + c.len_utf8();
        g.digits += digit_value(c).is_some() as usize;
    }
    out.retain(|g| g.digits > 0);
    out
}

/// What a whole-group stretch `s` of `digits` digits is: a resident id, a card or a phone
/// number. A card number is never written after `+` or a bracket.
fn number_mask(s: &str, digits: usize) -> Option<&'static str> {
    if resident_id(s) {
        return Some("[id]");
    }
    let international = s.starts_with('+') || s.starts_with('(');
    if !international && luhn(s) {
        return Some("[card]");
    }
    (digits <= 15 && (digits >= 9 || (international && digits >= 7))).then_some("[phone]")
}

/// A run of space-separated groups covered by numbers (resident ids, cards, phones) end to end,
/// longest number first; none when no such cover exists (the run is then not a list of
/// numbers).
fn numbers_covering(m: &str) -> Vec<(Range<usize>, &'static str)> {
    let g = groups(m, is_gap);
    // cover[i]: the end (exclusive) and mask of the first number of a cover of groups i.., if any.
    let mut cover: Vec<Option<(usize, &'static str)>> = vec![None; g.len() + 1];
    for i in (0..g.len()).rev() {
        let mut digits = 0;
        let mut found = None;
        for j in i..g.len() {
            digits += g[j].digits;
            if digits > 19 {
                break;
            }
            if let Some(mask) = number_mask(&m[g[i].bytes.start..g[j].bytes.end], digits) {
                // The rest of the run, after this number, is covered too (or there is none).
                if j + 1 == g.len() || cover[j + 1].is_some() {
                    found = Some((j + 1, mask));
                }
            }
        }
        cover[i] = found;
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < g.len() {
        // Only the first lookup can fail: every later start is the end of a found cover.
        let Some((end, mask)) = cover[i] else { return Vec::new() };
        out.push((g[i].bytes.start..g[end - 1].bytes.end, mask));
        i = end;
    }
    out
}

/// In a run of digit groups, each longest whole-group window of 13-19 digits whose Luhn check
/// holds, left to right.
fn card_windows(m: &str) -> Vec<(Range<usize>, &'static str)> {
    let g = groups(m, |c| digit_value(c).is_none());
    let mut out = Vec::new();
    let mut i = 0;
    while i < g.len() {
        let mut hit = None;
        let mut digits = 0;
        for j in i..g.len() {
            digits += g[j].digits;
            if digits > 19 {
                break;
            }
            if luhn(&m[g[i].bytes.start..g[j].bytes.end]) {
                hit = Some(j);
            }
        }
        match hit {
            Some(j) => {
                out.push((g[i].bytes.start..g[j].bytes.end, "[card]"));
                i = j + 1;
            }
            None => i += 1,
        }
    }
    out
}

fn digits(s: &str) -> Vec<u32> {
    s.chars().filter_map(digit_value).collect()
}

/// The value of a decimal digit of any script (General Category Nd). Unicode lays out each set
/// of decimal digits as ten consecutive code points from 0 to 9 (sets may follow each other
/// directly, as the mathematical digits do), so the value is the distance from the first digit
/// of the consecutive run, modulo 10.
pub(super) fn digit_value(c: char) -> Option<u32> {
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

/// A space of any kind or an invisible format character: the gaps [`IBAN`] allows, and what
/// separates the groups of a list of phone numbers.
fn is_gap(c: char) -> bool {
    c.general_category() == GeneralCategory::SpaceSeparator || c.general_category() == GeneralCategory::Format
}

/// The Luhn check (ISO/IEC 7812) over the digits of `s`, which must be 13-19.
pub fn luhn(s: &str) -> bool {
    let d = digits(s);
    let double = |x: u32| if x * 2 > 9 { x * 2 - 9 } else { x * 2 };
    let sum: u32 = d.iter().rev().enumerate().map(|(i, &x)| if i % 2 == 1 { double(x) } else { x }).sum();
    (13..=19).contains(&d.len()) && sum % 10 == 0
}

/// Whether `m` is a Chinese resident identity number (GB 11643): 17 digits, then the ISO 7064
/// MOD 11-2 check character (`0`-`9` or `X`, either case).
pub(super) fn resident_id(m: &str) -> bool {
    let d = digits(m);
    let check = match m.chars().last() {
        Some('X' | 'x') => 10,
        Some(c) => match digit_value(c) {
            Some(v) => v,
            None => return false,
        },
        None => return false,
    };
    let body = if check == 10 { &d[..] } else { &d[..d.len().saturating_sub(1)] };
    if body.len() != 17 {
        return false;
    }
    // The weight of position i is 2^(17-i) mod 11; the check makes the weighted sum 1 mod 11.
    let sum: u32 = body.iter().enumerate().map(|(i, &v)| v * ((1u32 << (17 - i)) % 11)).sum();
    (12 - sum % 11) % 11 == check
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
pub(super) fn iban_valid(compact: &[char]) -> bool {
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
