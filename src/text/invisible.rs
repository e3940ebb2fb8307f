//! Step 2 of the canonical text ([`super::canonicalize`]): invisible characters removed, and the
//! text hidden in them decoded where it stood.
//!
//! Removed: every format character (General Category Cf), every control character (Cc) except
//! the ASCII white space and U+0085, and the other characters that the UTS #39 skeleton ignores
//! as Default_Ignorable (variation selectors, combining grapheme joiner, Hangul fillers).
//! Counted as hidden, except where a script or emoji uses them legitimately: one variation
//! selector after an emoji, keycap base or non-Latin letter; a zero-width (non-)joiner between
//! emoji or letters of a script that shapes with it; Tag characters in an emoji flag sequence.
//! Decoded: Unicode Tag characters as the ASCII they shadow, runs of variation selectors as the
//! bytes they encode.

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
use unicode_script::{Script, UnicodeScript};

/// Removes the invisible characters and decodes the text hidden in them; adds those that count
/// as hidden to `invisible` and those that carried text to `smuggled` (`Obfuscation`'
/// `invisible_chars` and `smuggled_chars`).
///
/// Hidden text is decoded where it stood, because that is what a language model behind the proxy
/// reads: Unicode Tag characters U+E0020-E007E as the ASCII characters they shadow ("ASCII
/// smuggling"), and a run of two or more variation selectors as the bytes they encode
/// (U+FE00-FE0F = 0-15, U+E0100-E01EF = 16-255, the scheme of Paul Butler's "emoji smuggling"),
/// when those bytes are UTF-8, set apart by spaces.
pub(super) fn strip_invisible(s: &str, invisible: &mut usize, smuggled: &mut usize) -> Option<String> {
    let first = s.char_indices().find(|&(_, c)| is_invisible(c))?.0;
    let mut out = String::with_capacity(s.len());
    out.push_str(&s[..first]);
    let mut prev = out.chars().next_back();
    let mut rest = s[first..].chars().peekable();
    while let Some(c) = rest.next() {
        if !is_invisible(c) {
            out.push(c);
            prev = Some(c);
        } else if unicode_properties::emoji::is_tag_character(c) {
            let mut run = vec![c];
            run.extend(std::iter::from_fn(|| rest.next_if(|&c| unicode_properties::emoji::is_tag_character(c))));
            if prev == Some(BLACK_FLAG) && is_flag_tag_sequence(&run) {
                continue;
            }
            *invisible += run.len();
            for t in run {
                // U+E0001 LANGUAGE TAG and U+E007F CANCEL TAG shadow nothing printable.
                if let Some(ascii) = char::from_u32(t as u32 - 0xE0000).filter(|a| (' '..='~').contains(a)) {
                    out.push(ascii);
                    *smuggled += 1;
                }
            }
        } else if let Some(byte) = selector_byte(c) {
            let mut bytes = vec![byte];
            while let Some(b) = rest.peek().and_then(|&n| selector_byte(n)) {
                bytes.push(b);
                rest.next();
            }
            if bytes.len() == 1 && prev.is_some_and(takes_a_selector) {
                continue;
            }
            *invisible += bytes.len();
            if bytes.len() > 1 {
                *smuggled += bytes.len();
                if let Ok(hidden) = String::from_utf8(bytes) {
                    out.push(' ');
                    out.push_str(&hidden);
                    out.push(' ');
                }
            }
        } else if !(is_script_joiner(c) && prev.is_some_and(uses_joiners) && rest.peek().is_none_or(|&n| joins(c, n))) {
            *invisible += 1;
        }
    }
    Some(out)
}

/// U+1F3F4 WAVING BLACK FLAG, the base of the emoji tag sequences (UTS #51: 🏴 + tag letters +
/// U+E007F CANCEL TAG, the flags of England, Scotland and Wales).
const BLACK_FLAG: char = '\u{1F3F4}';

/// Whether `run` is the tail of an emoji flag tag sequence (UTS #51 ED-14a): 1-6 tag digits or
/// lower-case tag letters, then CANCEL TAG.
fn is_flag_tag_sequence(run: &[char]) -> bool {
    let Some((&last, spec)) = run.split_last() else { return false };
    last == '\u{E007F}'
        && (1..=6).contains(&spec.len())
        && spec.iter().all(|&t| matches!(t, '\u{E0030}'..='\u{E0039}' | '\u{E0061}'..='\u{E007A}'))
}

/// The byte a variation selector encodes (U+FE00-FE0F = 0-15, U+E0100-E01EF = 16-255).
fn selector_byte(c: char) -> Option<u8> {
    match c {
        '\u{FE00}'..='\u{FE0F}' => Some((c as u32 - 0xFE00) as u8),
        '\u{E0100}'..='\u{E01EF}' => Some((c as u32 - 0xE0100 + 16) as u8),
        _ => None,
    }
}

/// Characters after which one variation selector is ordinary: emoji and keycap bases (VS15/VS16
/// choose text or emoji presentation), and the non-Latin letters that have standardized or
/// ideographic variation sequences (CJK ideographs, Mongolian, ...).
fn takes_a_selector(c: char) -> bool {
    use unicode_properties::UnicodeEmoji;
    c.is_emoji_char() || uses_joiners(c)
}

/// Whether a joiner or mark `c` before `next` sits inside a sequence of the kind that uses it: an
/// emoji ZWJ sequence or a word of a script that shapes with joiners (a zero-width joiner before
/// a space or a Latin letter joins nothing).
fn joins(c: char, next: char) -> bool {
    if !matches!(c, '\u{200C}' | '\u{200D}') {
        return true;
    }
    use unicode_properties::UnicodeEmoji;
    next.is_emoji_char() || uses_joiners(next)
}

/// Whether `text` is white space once its invisible characters are removed and the text hidden
/// in them decoded ([`strip_invisible`]): zero-width spaces and joiners, soft hyphens, byte-order
/// marks and controls alone are blank; a message written only in Tag characters or in a run of
/// variation selectors is not (it is smuggled text, to be judged, not refused as empty). A blank
/// text is no message to judge (the model would score an empty input).
pub fn is_blank(text: &str) -> bool {
    let (mut invisible, mut smuggled) = (0, 0);
    match strip_invisible(text, &mut invisible, &mut smuggled) {
        Some(decoded) => decoded.chars().all(char::is_whitespace),
        None => text.chars().all(char::is_whitespace),
    }
}

/// Format (Cf), control (Cc, except white space) and other Default_Ignorable characters.
fn is_invisible(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_control() && !c.is_ascii_whitespace();
    }
    match c.general_category() {
        GeneralCategory::Format => true,
        GeneralCategory::Control => !c.is_whitespace(),
        // Variation selectors, the combining grapheme joiner, Mongolian free variation selectors,
        // reserved Default_Ignorable code points.
        GeneralCategory::NonspacingMark | GeneralCategory::Unassigned => ignored_by_skeleton(c),
        // Hangul fillers.
        GeneralCategory::OtherLetter => c.script() == Script::Hangul && ignored_by_skeleton(c),
        _ => false,
    }
}

/// Whether the UTS #39 skeleton drops `c`, i.e. `c` is Default_Ignorable (the table lives in
/// `unicode-security`).
fn ignored_by_skeleton(c: char) -> bool {
    let mut buf = [0u8; 4];
    let ignored = unicode_security::skeleton(c.encode_utf8(&mut buf)).next().is_none();
    ignored
}

/// Invisible characters that scripts and emoji use legitimately after their own characters.
fn is_script_joiner(c: char) -> bool {
    matches!(c, '\u{200C}' | '\u{200D}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
        || unicode_properties::emoji::is_tag_character(c)
        || c.general_category() == GeneralCategory::NonspacingMark
}

/// Characters after which a joiner, mark or variation selector is ordinary: non-ASCII and not
/// Latin (emoji, Arabic, Indic, CJK, ...).
fn uses_joiners(c: char) -> bool {
    !c.is_ascii() && c.script() != Script::Latin
}
