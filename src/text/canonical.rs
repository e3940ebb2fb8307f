//! Canonical text for the model and the rules, and counts of the obfuscation it took to get there.
//!
//! [`canonicalize`] runs, in this order, until a round changes nothing (at most [`MAX_ROUNDS`]):
//!
//! 1. **HTML entities** decoded with the WHATWG named-entity table of the `html-escape` crate;
//!    only references ending in `;` are decoded (`&#112;`, `&#x70;`, `&amp;`), so prose such as
//!    "AT&T" or "R&D" stays as it is. A chain such as `&amp;#112;` is decoded in one go.
//! 2. **Invisible characters** removed (`invisible.rs`, which also decodes the text hidden in Tag
//!    characters and variation-selector runs): every format character (General Category Cf: soft hyphen,
//!    zero-width space, zero-width (non-)joiner, word joiner, BOM, bidi controls, tags, ...), every
//!    control character (Cc) except the ASCII white space and U+0085, and the other characters that
//!    the UTS #39 skeleton ignores as Default_Ignorable (variation selectors, combining grapheme
//!    joiner, Hangul fillers).
//! 3. **Unicode NFKC** (UAX #15) with `unicode-normalization`: fullwidth forms, mathematical
//!    alphanumerics, ligatures, circled letters and the like become their plain letters.
//! 4. **Mixed-script words** (UAX #29 words whose UTS #39 resolved script set is empty, e.g.
//!    "pаypal" with a Cyrillic "а") are folded to Latin when every non-Latin letter in them has a
//!    Latin confusable prototype (UTS #39 `confusables.txt`, via `unicode-security`), so
//!    "pаssword" reads "password". A word in one script ("Привет", "Καλημέρα") is never touched.
//! 5. **Defanged links** restored: `hxxp`/`hxxps`/`fxp` (any case) before a `:` become
//!    `http`/`https`/`ftp`; `[.]` `(.)` `{.}` `[dot]` `(dot)` between two letters or digits become
//!    `.`; `[:]` after a letter or digit and before `/` or a digit becomes `:`; `[://]` becomes
//!    `://`; `[@]` `[at]` `(at)` between an address character and a letter or digit become `@`.
//!    Brackets anywhere else (prose such as `see [1] (a)`) are left alone.
//! 6. **Padded Han characters** joined (`han.rs`): three or more single Chinese characters each
//!    padded apart with spaces or symbols (`加 微 信`, `刷*单`) read as the word they spell.
//! 7. **Split letters** joined (`split.rs`): eight or more single characters, six of them letters,
//!    alternating with one and the same separator (`M|u|m| |I`, `p.a.s.s.w.o.r.d`) read as the
//!    text they spell.
//!
//! The result is idempotent: `canonicalize(&canonicalize(x).text).text == canonicalize(x).text`
//! for every input that settles within [`MAX_ROUNDS`] rounds (anything but deliberately nested
//! encodings deeper than that).
//!
//! Plain printable ASCII without `&`, without a defanged scheme, without a bracketed marker and
//! without a separator recurring every other character takes a fast path: one copy of the text
//! and a table-driven skeleton, no Unicode work.

use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::OnceLock;
use unicode_normalization::{is_nfkc_quick, IsNormalized, UnicodeNormalization};
use unicode_script::{Script, UnicodeScript};
use unicode_security::{is_potential_mixed_script_confusable_char, MixedScript};
use unicode_segmentation::UnicodeSegmentation;

use super::defang::{bracket_marker, defanged_scheme, restore_defanged};
use super::han::join_padded;
use super::invisible::strip_invisible;
use super::split::{join_split, may_hold_split_run};

/// Most rounds of the pipeline [`canonicalize`] runs. Another round runs only while the previous
/// one changed a text that is not plain ASCII by then; it usually confirms that nothing is left,
/// and finds work only when a later step made input for an earlier one (a fullwidth `＆` that NFKC
/// turned into the start of an entity, `&a` U+200B `mp;`, `[[.].]`).
pub const MAX_ROUNDS: usize = 4;

/// Longest character reference that is tried, `&` and `;` excluded (the longest WHATWG name,
/// "CounterClockwiseContourIntegral", has 31 characters; numeric ones may carry leading zeros).
const MAX_ENTITY_LEN: usize = 40;

/// The text in three forms: the canonical text, its skeleton, and counts of what was hidden in it.
///
/// The original text is not kept here: the caller keeps it, and it is what the audit and the app
/// see.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Canonical {
    /// Canonical text for the model and the rules: HTML entities decoded, invisible and format
    /// characters removed, NFKC (UAX #15), Latin-looking mixed-script words folded to Latin,
    /// defanged links restored. Line breaks and ordinary spacing are kept (NFKC turns the
    /// compatibility spaces such as U+00A0 into U+0020).
    pub text: String,
    /// Lower-cased UTS #39 skeleton of [`Canonical::text`], for look-alike-proof matching of
    /// signal keywords: compare it with [`skeleton`] of the keyword, never with the keyword itself
    /// (the skeleton maps for example "1" and "I" to "l", "0" to "o" and "m" to "rn").
    pub skeleton: String,
    /// What the canonical form had to undo.
    pub obfuscation: Obfuscation,
}

/// Counts of what [`canonicalize`] removed or rewrote; all counts are numbers of occurrences in
/// the original text.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Obfuscation {
    /// Invisible characters removed (format Cf, control Cc, Default_Ignorable). A zero-width
    /// (non-)joiner, a variation selector, a tag character or a left-to-right/right-to-left/Arabic
    /// letter mark right after a non-Latin, non-ASCII character is removed but not counted: that is
    /// how emoji sequences, Indic, Arabic and Persian text and CJK ideographic variants use them.
    pub invisible_chars: usize,
    /// Invisible characters that carried hidden text, decoded into [`Canonical::text`] where they
    /// stood: Unicode Tag characters outside an emoji flag sequence (ASCII smuggling) and runs of
    /// two or more variation selectors (bytes encoded as selectors). No ordinary text has them, so
    /// any count means text written to be read by a machine and not by a person.
    pub smuggled_chars: usize,
    /// Words that mix scripts with a look-alike character in the minority script (for example
    /// "pаypal" with a Cyrillic "а"), or that could be folded to Latin; a word that merely mixes
    /// scripts without look-alikes, such as Korean "iPhone을", does not count.
    pub mixed_script_words: usize,
    /// Characters rewritten to a look-alike Latin letter or digit: letters folded inside
    /// mixed-script words, plus letters and digits that NFKC turned into ASCII (fullwidth,
    /// mathematical, circled, superscript forms and ligatures).
    pub confusable_chars: usize,
    /// Whitespace-separated tokens in which a defanged link, domain or address was restored
    /// (`hxxps://evil[.]co[.]uk` counts once).
    pub defanged_links: usize,
    /// HTML character references decoded (`&amp;#112;` counts two).
    pub html_entities: usize,
    /// Han characters that stood padded apart (`加 微 信`: three) and were joined.
    pub padded_han_chars: usize,
    /// Characters that stood split apart, one separator between each (`s|e|n|d`: four), and
    /// were joined.
    pub split_chars: usize,
    /// Whether [`Canonical::text`] differs from the original text.
    pub changed: bool,
}

/// Canonical text of `original` (see the module documentation for the steps and the sources:
/// UAX #15 for NFKC, UTS #39 for confusables, skeleton and mixed-script detection, UAX #29 for
/// word boundaries, WHATWG for entities).
///
/// Never panics; time is linear in the length of the text (times at most [`MAX_ROUNDS`]).
pub fn canonicalize(original: &str) -> Canonical {
    if !needs_work(original) {
        return Canonical {
            text: original.to_owned(),
            skeleton: ascii_skeleton(original),
            obfuscation: Obfuscation::default(),
        };
    }
    let mut obfuscation = Obfuscation::default();
    // Mixed-script words left unfolded, as seen by the latest round: a later round sees the same
    // words again, so this is overwritten rather than added up.
    let mut unfolded = 0;
    let mut text = Cow::Borrowed(original);
    for _ in 0..MAX_ROUNDS {
        match round(&text, &mut obfuscation, &mut unfolded) {
            Some(next) => text = Cow::Owned(next),
            None => break,
        }
        if !needs_work(&text) {
            unfolded = 0;
            break;
        }
    }
    obfuscation.mixed_script_words += unfolded;
    obfuscation.changed = text != original;
    let skeleton = skeleton(&text);
    Canonical { text: text.into_owned(), skeleton, obfuscation }
}

/// Lower-cased UTS #39 skeleton of `s`: NFD, Default_Ignorable characters dropped, each character
/// replaced by its confusable prototype (`confusables.txt`), NFD again, then each character
/// lower-cased on its own (no context rules: when a text contains a keyword, the skeleton of the
/// text contains the skeleton of the keyword, unless a combining mark follows the keyword).
///
/// The skeleton is for comparing two strings, not for reading: "mail" becomes "rnail".
pub fn skeleton(s: &str) -> String {
    // ASCII runs go through a table, the rest through `unicode-security`. Cutting the text there
    // gives the same result as one call: every ASCII character is a starter (canonical combining
    // class 0) that decomposes to itself, and so are the first and last characters of its
    // prototype, so neither NFD pass reorders anything across a cut (checked by the tests).
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let ascii = b[i].is_ascii();
        while i < b.len() && b[i].is_ascii() == ascii {
            i += 1;
        }
        // Both ends are char boundaries: a run ends before an ASCII byte or at the end.
        if ascii {
            push_ascii_skeleton(&s[start..i], &mut out);
        } else {
            out.extend(unicode_security::skeleton(&s[start..i]).flat_map(char::to_lowercase));
        }
    }
    out
}

/// One round of the pipeline; `None` when it changed nothing.
fn round(s: &str, obfuscation: &mut Obfuscation, unfolded: &mut usize) -> Option<String> {
    let mut text = Cow::Borrowed(s);
    if let Some(next) = decode_entities(&text, &mut obfuscation.html_entities) {
        text = Cow::Owned(next);
    }
    if let Some(next) = strip_invisible(&text, &mut obfuscation.invisible_chars, &mut obfuscation.smuggled_chars) {
        text = Cow::Owned(next);
    }
    if let Some(next) = nfkc(&text, &mut obfuscation.confusable_chars) {
        text = Cow::Owned(next);
    }
    if let Some(next) = fold_mixed_script(&text, obfuscation, unfolded) {
        text = Cow::Owned(next);
    }
    if let Some(next) = restore_defanged(&text, &mut obfuscation.defanged_links) {
        text = Cow::Owned(next);
    }
    if let Some((next, joined)) = join_padded(&text) {
        obfuscation.padded_han_chars += joined;
        text = Cow::Owned(next);
    }
    if let Some((next, joined)) = join_split(&text) {
        obfuscation.split_chars += joined;
        text = Cow::Owned(next);
    }
    match text {
        Cow::Borrowed(_) => None,
        Cow::Owned(next) => Some(next),
    }
}

/// Whether `s` may need anything beyond a copy: false only for printable ASCII (plus ASCII white
/// space) with no `&`, no defanged scheme, no bracketed marker and no split run. Conservative:
/// true does not mean a round will change something.
fn needs_work(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter().enumerate().any(|(i, &c)| match c {
        b'&' | 0x80..=0xFF => true,
        b'\t' | b'\n' | 0x0C | b'\r' => false,
        0x00..=0x1F | 0x7F => true,
        b'[' | b'(' | b'{' => bracket_marker(&b[i..]).is_some(),
        b'h' | b'H' | b'f' | b'F' => defanged_scheme(&b[i..]).is_some(),
        _ => false,
    }) || may_hold_split_run(s)
}

// ---------------------------------------------------------------------------------------------
// Step 1: HTML character references

/// Decodes every character reference that ends in `;`, following chains (`&amp;#112;` -> `p`) in
/// one pass; adds the number decoded to `count`.
fn decode_entities(s: &str, count: &mut usize) -> Option<String> {
    let first = s.find('&')?;
    let mut out = String::with_capacity(s.len());
    out.push_str(&s[..first]);
    let mut at = first; // s[at] == '&'
    let mut changed = false;
    loop {
        let mut body = at + 1;
        let mut amp_pending = true;
        while let Some((decoded, used)) = decode_one(&s[body..]) {
            *count += 1;
            changed = true;
            body += used;
            if decoded != "&" {
                out.push_str(&decoded);
                amp_pending = false;
                break;
            }
            // The reference stood for "&": it may start another reference with what follows.
        }
        if amp_pending {
            out.push('&');
        }
        match s[body..].find('&') {
            Some(k) => {
                out.push_str(&s[body..body + k]);
                at = body + k;
            }
            None => {
                out.push_str(&s[body..]);
                break;
            }
        }
    }
    changed.then_some(out)
}

/// The character reference at the start of `body` (the text right after an `&`): what it stands
/// for and how many bytes of `body` it used, `None` when it is not one.
fn decode_one(body: &str) -> Option<(String, usize)> {
    let b = body.as_bytes();
    let name_len = b.iter().take(MAX_ENTITY_LEN + 1).position(|c| !(c.is_ascii_alphanumeric() || *c == b'#'))?;
    if name_len == 0 || b[name_len] != b';' {
        return None;
    }
    let mut reference = String::with_capacity(name_len + 2);
    reference.push('&');
    reference.push_str(&body[..=name_len]);
    match html_escape::decode_html_entities(&reference) {
        Cow::Owned(decoded) => Some((decoded, name_len + 1)),
        Cow::Borrowed(_) => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Step 3: NFKC

/// NFKC (UAX #15); adds to `confusables` the letters and digits it turned into ASCII.
fn nfkc(s: &str, confusables: &mut usize) -> Option<String> {
    if non_ascii_pieces(s).all(|piece| is_nfkc_quick(s[piece].chars()) == IsNormalized::Yes) {
        return None;
    }
    *confusables += s
        .chars()
        .filter(|&c| {
            !c.is_ascii()
                && c.is_alphanumeric()
                && is_nfkc_quick(std::iter::once(c)) != IsNormalized::Yes
                && std::iter::once(c).nfkc().all(|n| n.is_ascii_alphanumeric())
        })
        .count();
    let out = nfkc_by_pieces(s);
    (out != s).then_some(out)
}

/// NFKC of `s`, normalizing only the [`non_ascii_pieces`] and copying the ASCII in between.
fn nfkc_by_pieces(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut copied = 0;
    for piece in non_ascii_pieces(s) {
        out.push_str(&s[copied..piece.start]);
        out.extend(s[piece.clone()].nfkc());
        copied = piece.end;
    }
    out.push_str(&s[copied..]);
    out
}

/// Byte ranges of `s` that NFKC has to look at: each run of non-ASCII characters together with the
/// ASCII character right before it (a combining mark may compose with it). An ASCII character has
/// canonical combining class 0, decomposes to itself and never composes with what precedes it, so
/// normalizing these pieces one by one and copying the rest equals normalizing the whole text.
fn non_ascii_pieces(s: &str) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let b = s.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() && b[i].is_ascii() {
            i += 1;
        }
        if i == b.len() {
            return None;
        }
        // b[i - 1], when there is one, is ASCII: either this run's first byte follows ASCII, or
        // the text starts here.
        let start = i.saturating_sub(1);
        while i < b.len() && !b[i].is_ascii() {
            i += 1;
        }
        Some(start..i)
    })
}

#[cfg(test)]
pub(super) fn nfkc_by_pieces_for_test(s: &str) -> String {
    nfkc_by_pieces(s)
}

// ---------------------------------------------------------------------------------------------
// Step 4: mixed-script words

/// Folds the Latin-looking mixed-script words to Latin; counts them in `obfuscation` and sets
/// `unfolded` to the number of counted mixed-script words it could not fold.
fn fold_mixed_script(s: &str, obfuscation: &mut Obfuscation, unfolded: &mut usize) -> Option<String> {
    *unfolded = 0;
    if !has_two_scripts(s) {
        return None;
    }
    let mut out: Option<String> = None;
    let mut copied = 0;
    for (at, word) in s.split_word_bound_indices() {
        if word.is_ascii() || word.is_single_script() {
            continue;
        }
        match fold_word(word) {
            Some((folded, rewritten)) => {
                obfuscation.mixed_script_words += 1;
                obfuscation.confusable_chars += rewritten;
                let out = out.get_or_insert_with(|| String::with_capacity(s.len()));
                out.push_str(&s[copied..at]);
                out.push_str(&folded);
                copied = at + word.len();
            }
            None if has_minority_confusable(word) => *unfolded += 1,
            None => {}
        }
    }
    let mut out = out?;
    out.push_str(&s[copied..]);
    Some(out)
}

/// Whether the letters of `s` belong to more than one script (Common and Inherited aside): the
/// cheap test before word segmentation.
fn has_two_scripts(s: &str) -> bool {
    if s.is_ascii() {
        return false;
    }
    let mut seen = None;
    for c in s.chars() {
        let script = match c {
            'a'..='z' | 'A'..='Z' => Script::Latin,
            _ if c.is_ascii() || !c.is_alphabetic() => continue,
            _ => c.script(),
        };
        if matches!(script, Script::Common | Script::Inherited) {
            continue;
        }
        match seen {
            None => seen = Some(script),
            Some(first) if first != script => return true,
            Some(_) => {}
        }
    }
    false
}

/// `word` with every non-ASCII letter replaced by its Latin look-alike, and how many letters were
/// replaced; `None` unless the result is a single-script (Latin) word.
fn fold_word(word: &str) -> Option<(String, usize)> {
    let mut out = String::with_capacity(word.len());
    let mut rewritten = 0;
    for c in word.chars() {
        if c.is_ascii() || !c.is_alphabetic() {
            out.push(c);
            continue;
        }
        match latin_lookalike(c) {
            Some(latin) if latin.chars().eq(std::iter::once(c)) => out.push(c),
            Some(latin) => {
                out.push_str(&latin);
                rewritten += 1;
            }
            None if c.script() == Script::Latin => out.push(c),
            None => return None,
        }
    }
    out.as_str().is_single_script().then_some((out, rewritten))
}

/// The Latin letter(s) that `c` is confusable with per UTS #39: the ASCII letter or digit with the
/// same skeleton (lower case first, then upper case, then digits), else the NFC of the prototype
/// when that is Latin; `None` when `c` does not look Latin.
fn latin_lookalike(c: char) -> Option<String> {
    let mut buf = [0u8; 4];
    let prototype: String = unicode_security::skeleton(c.encode_utf8(&mut buf)).collect();
    if let Some(&ascii) = ascii_by_skeleton().get(&prototype) {
        return Some(ascii.to_string());
    }
    let composed: String = prototype.nfc().collect();
    let latin = composed.chars().all(|p| matches!(p.script(), Script::Latin | Script::Common | Script::Inherited))
        && composed.chars().any(|p| p.script() == Script::Latin);
    latin.then_some(composed)
}

/// ASCII letters and digits by their (not lower-cased) skeleton, built once from
/// `unicode-security`.
fn ascii_by_skeleton() -> &'static HashMap<String, char> {
    static MAP: OnceLock<HashMap<String, char>> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = HashMap::new();
        for c in ('a'..='z').chain('A'..='Z').chain('0'..='9') {
            let mut buf = [0u8; 4];
            map.entry(unicode_security::skeleton(c.encode_utf8(&mut buf)).collect()).or_insert(c);
        }
        map
    })
}

/// Whether a letter outside the word's majority script is a potential mixed-script confusable
/// (UTS #39): "pаypal" (Cyrillic "а" among Latin) yes, Korean "iPhone을" no.
fn has_minority_confusable(word: &str) -> bool {
    let mut counts: Vec<(Script, usize)> = Vec::new();
    for c in word.chars().filter(|c| c.is_alphabetic()) {
        let script = c.script();
        if matches!(script, Script::Common | Script::Inherited) {
            continue;
        }
        match counts.iter_mut().find(|(s, _)| *s == script) {
            Some((_, n)) => *n += 1,
            None => counts.push((script, 1)),
        }
    }
    let Some(&(majority, _)) = counts.iter().max_by_key(|(_, n)| *n) else {
        return false;
    };
    word.chars().any(|c| {
        c.is_alphabetic()
            && !matches!(c.script(), Script::Common | Script::Inherited)
            && c.script() != majority
            && is_potential_mixed_script_confusable_char(c)
    })
}

// ---------------------------------------------------------------------------------------------
// Skeleton of ASCII text

/// Per ASCII byte: whether its UTS #39 skeleton is the byte itself, and its lower-cased skeleton.
struct AsciiSkeletons {
    same: [bool; 128],
    lowered: Vec<String>,
}

/// The ASCII table, built once from `unicode-security`.
fn ascii_skeletons() -> &'static AsciiSkeletons {
    static TABLE: OnceLock<AsciiSkeletons> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut same = [false; 128];
        let mut lowered = Vec::with_capacity(128);
        for b in 0u8..128 {
            let c = char::from(b);
            let mut buf = [0u8; 4];
            let prototype: String = unicode_security::skeleton(c.encode_utf8(&mut buf)).collect();
            same[usize::from(b)] = prototype.chars().eq(std::iter::once(c));
            lowered.push(prototype.chars().flat_map(char::to_lowercase).collect());
        }
        AsciiSkeletons { same, lowered }
    })
}

/// Appends the lower-cased skeleton of the ASCII string `s` to `out`: runs of characters that are
/// their own prototype are copied as they are, then everything appended is ASCII-lower-cased
/// (the table's entries are lower case already).
fn push_ascii_skeleton(s: &str, out: &mut String) {
    let table = ascii_skeletons();
    let start = out.len();
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        if !table.same[usize::from(b)] {
            out.push_str(&s[run..i]);
            out.push_str(&table.lowered[usize::from(b)]);
            run = i + 1;
        }
    }
    out.push_str(&s[run..]);
    if let Some(appended) = out.get_mut(start..) {
        appended.make_ascii_lowercase();
    }
}

/// [`skeleton`] of an ASCII string.
fn ascii_skeleton(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    push_ascii_skeleton(s, &mut out);
    out
}
