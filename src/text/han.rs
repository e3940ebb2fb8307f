//! Chinese evasions: Han characters padded apart, Traditional forms and Chinese numerals.
//!
//! - [`join_padded`] (a step of [`super::canonicalize`], so the model reads it too): a run of at
//!   least [`MIN_PADDED_RUN`] single Han characters, each separated from the next by one to
//!   [`MAX_PAD`] padding characters (white space or ASCII/general punctuation used as filler, such
//!   as `加 微 信`, `加-微-信`, `刷*单`, `转·账`), is joined (`加微信`). Chinese is written without
//!   spaces, so no ordinary text has such a run; CJK punctuation (`，。、：`) is never padding.
//!   Korean padded syllable by syllable (`계 좌 가 정 지 되 었 습 니 다`) is joined the same way
//!   from [`MIN_PADDED_HANGUL_RUN`] syllables: Korean puts spaces between words, and one-syllable
//!   words follow each other in ordinary chat (`너는 꽃 좀 사 올 수 있어`: seven), never ten.
//! - [`fold`] (for the policy's signals only, not for the model, which was trained on both
//!   scripts): Traditional characters to Simplified, character by character with the table of the
//!   `simplet2s` crate (MIT; the Wikipedia list of one-to-many cases), and runs of two or more
//!   Chinese digits (`〇一二…九`, financial `壹贰叁…玖`, Traditional `貳參陸`) to ASCII digits,
//!   so that a code or an account written `五八三二` matches `\d` like `5832`. A single digit
//!   (`一起`, `一下`, `五千元`) is a word and stays. Signal patterns get [`fold_script`] when the
//!   policy loads (Traditional to Simplified, digits untouched), so a pattern written in either
//!   script matches both; a pattern for Chinese amounts lists both forms (`[\d一二三…]`).

use std::borrow::Cow;
use unicode_script::{Script, UnicodeScript};

/// Fewest single Han characters, each padded apart, that [`join_padded`] joins: two (`北 京`)
/// occur in ordinary lists and names, three do not.
pub const MIN_PADDED_RUN: usize = 3;

/// Fewest single Hangul syllables, each padded apart, that [`join_padded`] joins. Over the
/// 1,363 labelled Korean texts in tests/data and the recipe's data the longest such run is seven
/// one-syllable words in ordinary chat; a scam spaced syllable by syllable runs to its full length.
pub const MIN_PADDED_HANGUL_RUN: usize = 10;

/// Most padding characters between two Han characters of a padded run.
pub const MAX_PAD: usize = 3;

fn is_han(c: char) -> bool {
    c.script() == Script::Han
}

/// The script of a character that a padded run may be made of: Han, or a precomposed Hangul
/// syllable (U+AC00-U+D7A3; a lone jamo is not a syllable).
fn run_script(c: char) -> Option<Script> {
    if is_han(c) {
        Some(Script::Han)
    } else if ('\u{AC00}'..='\u{D7A3}').contains(&c) {
        Some(Script::Hangul)
    } else {
        None
    }
}

/// Filler put between characters to break up a word: white space, middle dots, a few dingbats,
/// and ASCII punctuation other than brackets, quotes and the sentence marks `, ! ? : ;` (NFKC has
/// turned the full-width `，！？：；（）` of Chinese prose into those). `、` and `。` are not ASCII
/// and never padding.
fn is_pad(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\u{3000}' | '·' | '・' | '•' | '°' | '★' | '☆' | '♥' | '❤' | '✿' | '※')
        || (c.is_ascii_punctuation() && !"()[]{}<>,!?:;'\"".contains(c))
}

/// The text with padded Han and Hangul runs joined, and the number of Han characters joined
/// (what `obfuscation.padded_han_chars` counts; Hangul runs are joined for the model and not
/// counted); `None` when there was no such run. Linear in the length of `s`.
pub fn join_padded(s: &str) -> Option<(String, usize)> {
    if s.is_ascii() || !s.chars().any(|c| run_script(c).is_some()) {
        return None;
    }
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let mut out: Option<String> = None;
    let mut copied = 0; // bytes of `s` already in `out`
    let mut joined = 0;
    let mut i = 0;
    while i < chars.len() {
        let Some(script) = run_script(chars[i].1) else {
            i += 1;
            continue;
        };
        let member = |c: char| run_script(c) == Some(script);
        // A run: Han (pad{1,MAX_PAD} Han)*. Its first character may end a word and its last may
        // start one (`请加 微 信号码`); every other member stands alone between paddings.
        let mut members = vec![i];
        let mut j = i + 1;
        loop {
            let pad_start = j;
            while j < chars.len() && is_pad(chars[j].1) {
                j += 1;
            }
            let pads = j - pad_start;
            if pads == 0 || pads > MAX_PAD || j == chars.len() || !member(chars[j].1) {
                break;
            }
            members.push(j);
            j += 1;
            if j < chars.len() && member(chars[j].1) {
                break;
            }
        }
        let min = if script == Script::Han { MIN_PADDED_RUN } else { MIN_PADDED_HANGUL_RUN };
        if members.len() >= min {
            let buf = out.get_or_insert_with(|| String::with_capacity(s.len()));
            let first = chars[members[0]].0;
            buf.push_str(&s[copied..first]);
            for &m in &members {
                buf.push(chars[m].1);
            }
            let last = *members.last().expect("a run has members");
            copied = chars[last].0 + chars[last].1.len_utf8();
            if script == Script::Han {
                joined += members.len();
            }
            i = last + 1;
        } else {
            i += 1;
        }
    }
    let mut out = out?;
    out.push_str(&s[copied..]);
    Some((out, joined))
}

/// The ASCII digit a Chinese digit character stands for.
fn chinese_digit(c: char) -> Option<char> {
    Some(match c {
        '〇' | '零' => '0',
        '一' | '壹' | '幺' => '1',
        '二' | '两' | '兩' | '贰' | '貳' => '2',
        '三' | '叁' | '參' | '参' => '3',
        '四' | '肆' => '4',
        '五' | '伍' => '5',
        '六' | '陆' | '陸' => '6',
        '七' | '柒' => '7',
        '八' | '捌' => '8',
        '九' | '玖' => '9',
        _ => return None,
    })
}

/// Whether [`fold`] can change `s`: it holds a Han character (or the digit `〇`, which is not
/// Han). False for every ASCII text, checked first.
pub fn has_han(s: &str) -> bool {
    !s.is_ascii() && s.chars().any(|c| c == '〇' || is_han(c))
}

/// `s` with Traditional characters folded to Simplified (what the signal patterns get when they
/// compile); `s` itself when it has no Han character.
pub fn fold_script(s: &str) -> Cow<'_, str> {
    if has_han(s) {
        Cow::Owned(simplet2s::convert(s))
    } else {
        Cow::Borrowed(s)
    }
}

/// `s` with Traditional characters folded to Simplified and runs of two or more Chinese digits
/// turned into ASCII digits (see the module documentation): what the signal patterns read; `s`
/// itself when it has no Han character.
pub fn fold(s: &str) -> Cow<'_, str> {
    if !has_han(s) {
        return Cow::Borrowed(s);
    }
    let simplified = simplet2s::convert(s);
    let mut out = String::with_capacity(simplified.len());
    // Chinese digits seen since the last other character: one stays a word, two or more a number.
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        if digits.chars().nth(1).is_some() {
            out.extend(digits.chars().filter_map(chinese_digit));
        } else {
            out.push_str(digits);
        }
        digits.clear();
    };
    for c in simplified.chars() {
        if chinese_digit(c).is_some() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::{fold, fold_script};
    use crate::text::canonicalize;
    #[test]
    fn padded_han_characters_are_joined_and_counted() {
        let c = canonicalize("请加 微 信 领取返利");
        assert_eq!(c.text, "请加微信领取返利");
        assert_eq!(c.obfuscation.padded_han_chars, 4, "加 微 信 领 (领 starts the next word)");
        assert_eq!(
            canonicalize("刷*单*返*利，日赚500").text,
            "刷单返利,日赚500",
            "NFKC makes the comma ASCII; not padding"
        );
        assert_eq!(canonicalize("转 · 账 · 给 · 我").text, "转账给我");
        // Full-width padding is ASCII after NFKC, and still padding.
        assert_eq!(canonicalize("验＿证＿码").text, "验证码");
        // Ordinary Chinese, lists and names: two single characters, or words, or CJK punctuation.
        for ordinary in
            ["北京 上海 广州", "张 三", "苹果、香蕉、橘子", "你好，我是小王。", "好的 明天见", "第1天 第2天"]
        {
            let c = canonicalize(ordinary);
            // Nothing removed (NFKC may still make a full-width comma ASCII).
            assert_eq!(
                (c.text.chars().count(), c.obfuscation.padded_han_chars),
                (ordinary.chars().count(), 0),
                "{ordinary}"
            );
        }
        // Idempotent.
        let once = canonicalize("加 - 微 - 信 and 刷 单");
        assert_eq!(canonicalize(&once.text).text, once.text);
    }

    #[test]
    fn korean_padded_syllable_by_syllable_is_joined_and_not_counted_as_han() {
        let c = canonicalize("고 객 님 의 계 좌 가 정 지 되 었 습 니 다 . 비 밀 번 호 를 회 신 해 주 세 요");
        assert_eq!(c.text, "고객님의계좌가정지되었습니다비밀번호를회신해주세요");
        assert_eq!(c.obfuscation.padded_han_chars, 0, "padded_han_chars counts Han only");
        assert_eq!(canonicalize("축*하*합*니*다*경*품*당*첨*되*셨*습*니*다").text, "축하합니다경품당첨되셨습니다");
        // Ordinary Korean: one-syllable words in a row (seven here), and words of several syllables.
        for ordinary in [
            "야 내일 민지 생일인데 케이크는 내가 살게, 너는 꽃 좀 사 올 수 있어?",
            "이 두 개 다 좀 더 줘",
            "고객님의 계좌가 정지되었습니다",
        ] {
            assert_eq!(canonicalize(ordinary).text, ordinary, "{ordinary}");
        }
    }

    #[test]
    fn han_fold_simplifies_and_reads_chinese_digit_runs() {
        assert_eq!(fold("驗證碼五八三二，請勿透露"), "验证码5832，请勿透露");
        assert_eq!(fold("我们一起去，一下就好，五千元"), "我们一起去，一下就好，五千元");
        assert_eq!(fold("帳號壹貳參肆"), fold_script("帳號").into_owned() + "1234");
        assert!(matches!(fold("plain ascii"), std::borrow::Cow::Borrowed(_)));
        assert!(matches!(fold("Привет"), std::borrow::Cow::Borrowed(_)));
    }
}
