//! Letters split apart: `M|u|m| |I| |l|o|s|t`, `s_e_n_d`, `p.a.s.s.w.o.r.d` — one separator
//! character put between every character of a text so that neither a keyword filter nor a
//! tokenizer sees its words (a subword model reads each letter as a word of its own, and the
//! probe text above scored 0.005 split against 0.998 joined).
//!
//! [`join_split`] (a step of [`super::canonicalize`], so the model reads it too) joins a run of
//! at least [`MIN_SPLIT_RUN`] single characters that alternate strictly with one and the same
//! separator (a character that is neither a letter, a digit nor white space), at least
//! [`MIN_SPLIT_LETTERS`] of them letters. Members may be spaces (the word breaks of the text that
//! was split) or punctuation, the separator's own character included; a line break ends a run.
//! Separators of white space alone (`S A L E`) are left alone: ordinary headings and acronyms are
//! written that way. Runs of digits (`1-2-3-4-5-6-7-8`) are not joined, so a number keeps its
//! shape for the signals; Chinese padded apart is `han.rs`'s. On every labelled set in tests/data
//! (about 18,000 messages) no run is joined.

/// Fewest members (characters between separators) of a run that is joined.
pub const MIN_SPLIT_RUN: usize = 8;

/// Fewest letters among a joined run's members: no date, version or code has six letters
/// standing one by one between the same separator.
pub const MIN_SPLIT_LETTERS: usize = 6;

fn is_separator(c: char) -> bool {
    !c.is_alphanumeric() && !c.is_whitespace()
}

/// The text with split runs joined, and the number of characters joined; `None` when there was
/// no such run. Linear in the length of `s`; a text without a candidate run
/// ([`may_hold_split_run`]) costs one pass and no allocation.
pub fn join_split(s: &str) -> Option<(String, usize)> {
    if !may_hold_split_run(s) {
        return None;
    }
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let mut out: Option<String> = None;
    let mut copied = 0; // bytes of `s` already in `out`
    let mut joined = 0;
    let mut i = 0;
    // A member may be the separator itself: the text's own `.` in `r.... .P` ("r. P" split with
    // `.`); the alternation, not the character, says which is which.
    let member = |c: char| c != '\n' && c != '\r';
    while i + 2 < chars.len() {
        let sep = chars[i + 1].1;
        if !is_separator(sep) || !member(chars[i].1) {
            i += 1;
            continue;
        }
        // m0 sep m1 sep m2 ...: members at i, i + 2, ...; the run ends at the first position that
        // breaks the alternation.
        let mut end = i; // last member
        while end + 2 < chars.len() && chars[end + 1].1 == sep && member(chars[end + 2].1) {
            end += 2;
        }
        let members = (end - i) / 2 + 1;
        let letters = (i..=end).step_by(2).filter(|&k| chars[k].1.is_alphabetic()).count();
        if members >= MIN_SPLIT_RUN && letters >= MIN_SPLIT_LETTERS {
            let buf = out.get_or_insert_with(|| String::with_capacity(s.len()));
            buf.push_str(&s[copied..chars[i].0]);
            buf.extend((i..=end).step_by(2).map(|k| chars[k].1));
            copied = chars[end].0 + chars[end].1.len_utf8();
            joined += members;
            i = end + 1;
        } else {
            i += 1;
        }
    }
    let mut out = out?;
    out.push_str(&s[copied..]);
    Some((out, joined))
}

/// Whether `s` may hold a split run: some separator recurs every other character
/// [`MIN_SPLIT_RUN`] - 1 times in a row. One pass, no allocation; the canonical text's fast path
/// asks it too. Conservative: true does not mean [`join_split`] joins something.
pub fn may_hold_split_run(s: &str) -> bool {
    // Separators sit every other character, so a run shows on one parity of positions: how many
    // times in a row the separator two characters back recurs, per parity.
    // A member may be the separator's own character (`r.... .P`), so a rule of `-----` counts
    // too: it costs join_split's scan, never a join (no letters).
    let mut streak = [0usize; 2];
    let (mut before, mut last) = ('\0', '\0');
    for (k, c) in s.chars().enumerate() {
        if k >= 2 && is_separator(c) && before == c {
            streak[k % 2] += 1;
            // MIN_SPLIT_RUN members stand between MIN_SPLIT_RUN - 1 separators.
            if streak[k % 2] + 2 >= MIN_SPLIT_RUN {
                return true;
            }
        } else {
            streak[k % 2] = 0;
        }
        (before, last) = (last, c);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str, sep: char) -> String {
        let mut out = String::new();
        for (k, c) in text.chars().enumerate() {
            if k > 0 {
                out.push(sep);
            }
            out.push(c);
        }
        out
    }

    #[test]
    fn a_text_split_with_any_separator_reads_whole_again() {
        let text = "Mum I lost my phone, this is my new number. Please send me 500 pounds today.";
        for sep in ['|', '_', '.', '/', '~', '-', '*', '•'] {
            let s = split(text, sep);
            let (joined, n) = join_split(&s).unwrap_or_else(|| panic!("{sep:?} not joined"));
            assert_eq!(joined, text, "separator {sep:?}");
            assert_eq!(n, text.chars().count());
            assert!(may_hold_split_run(&s), "{sep:?}: the fast path must not skip it");
        }
    }

    #[test]
    fn a_split_word_inside_ordinary_text_is_joined_alone() {
        let (joined, n) = join_split("Please confirm your p.a.s.s.w.o.r.d here").unwrap();
        assert_eq!(joined, "Please confirm your password here");
        assert_eq!(n, 8);
        // A member that is the separator's own character does not end the run.
        let (joined, _) = join_split("your p.a.s.s...w.o.r.d now").unwrap();
        assert_eq!(joined, "your pass.word now");
        let (joined, _) = join_split("Отправьте к-о-д-и-з-с-м-с сейчас").unwrap();
        assert_eq!(joined, "Отправьте кодизсмс сейчас");
    }

    #[test]
    fn ordinary_text_with_separators_is_left_alone() {
        for s in [
            "Meeting on 2026-12-06 at 10:30, room B-2.",
            "Call 1-2-3-4-5-6-7-8 for the lottery",
            "U.S.A. and the U.K. signed it",
            "S A L E   S A L E   50 % off",
            "path a/b/c and x|y",
            "ID: A-1-B-2-C-3",
            "-.-.-.-.-.-.-.-.-",
            "e.g. i.e. etc.",
            "Tabelle | Spalte | Wert | Summe | Ende | mehr | noch | viel",
        ] {
            assert_eq!(join_split(s), None, "{s}");
        }
    }

    #[test]
    fn the_fast_path_check_sees_no_run_in_ordinary_ascii() {
        for s in ["Meeting on 2026-12-06 at 10:30, room B-2.", "See https://example.com/a/b?c=d&e=f", "a.b"] {
            assert!(!may_hold_split_run(s), "{s}");
        }
    }
}
