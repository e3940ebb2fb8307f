//! How the cpu model reads a text: overlapping windows of `max_seq_len` tokens, so a phishing
//! sentence after a long benign paragraph is read too, up to a bound on windows per request;
//! and the bounded token count the complexity rater takes on the request path, whose encoding
//! travels with the request so no text is tokenised twice.

use anyhow::Context as _;
use serde::Deserialize;
use tokenizers::{Encoding, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

/// `[model] windows`: how long texts are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Windows {
    /// Most windows read per text; text past them is left unread and the verdict says so (the
    /// cascade then hands the request to the next stage: rules see the whole text).
    pub max: usize,
    /// Tokens each window shares with the one before it, so a sentence cut at a window's end is
    /// read whole in the next.
    pub overlap: usize,
    /// A text of two or more windows, taken alone while another session is idle, runs the second
    /// half of its windows on that session at the same time (the riskiest window still decides).
    /// It cuts a long text's latency, not the work; scores are unchanged only for a
    /// batch-invariant (static, QDQ) model, since the halves have other batch-mates and padding.
    pub parallel: bool,
}

impl Default for Windows {
    /// 8 windows of 128 tokens overlapping by 32: about 800 tokens (~3 KB of English) read, on
    /// one session.
    fn default() -> Self {
        Windows { max: 8, overlap: 32, parallel: false }
    }
}

impl Windows {
    /// Errors unless at least one window is read and each adds at least 8 new tokens to the one
    /// before it (windows of `max_seq_len` tokens).
    pub fn check(&self, max_seq_len: usize) -> anyhow::Result<()> {
        anyhow::ensure!(self.max >= 1, "`windows.max` must be at least 1");
        anyhow::ensure!(
            self.overlap + 8 <= max_seq_len,
            "`windows.overlap` must leave at least 8 new tokens per window of {max_seq_len}"
        );
        Ok(())
    }

    /// Sets the tokenizer to cut texts into these windows (tokenizers' truncation with a stride:
    /// the first window is the encoding, the rest its `overflowing` windows, each with the
    /// special tokens).
    pub fn configure(&self, tokenizer: &mut Tokenizer, max_seq_len: usize) -> anyhow::Result<()> {
        self.check(max_seq_len)?;
        let params = TruncationParams {
            max_length: max_seq_len,
            stride: self.overlap,
            strategy: TruncationStrategy::LongestFirst,
            direction: TruncationDirection::Right,
        };
        tokenizer.with_truncation(Some(params)).map_err(|e| anyhow::anyhow!("setting truncation: {e}"))?;
        Ok(())
    }

    /// Bytes worth tokenising: a WordPiece token is rarely longer than 16 bytes, so cutting the
    /// text first spares tokenising up to `max_text_bytes` for windows that would be dropped.
    fn bytes(&self, max_seq_len: usize) -> usize {
        (max_seq_len + (self.max - 1) * (max_seq_len - self.overlap)) * 16
    }
}

/// A text as the model reads it.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// One encoding per window, in order; at least one.
    pub windows: Vec<Encoding>,
    /// Text past the last window was not read.
    pub unread: bool,
    /// The whole text's lexical logit, when the model has a lexical model
    /// ([`super::lexical`]); filled by `ModelAssets::encode_reusing` on the worker, never on the
    /// request path.
    pub lexical: Option<f64>,
}

/// Encodes `text` into at most `windows.max` windows (`tokenizer` set by [`Windows::configure`]).
pub fn encode(tokenizer: &Tokenizer, text: &str, max_seq_len: usize, windows: Windows) -> anyhow::Result<Encoded> {
    let head = prefix(text, windows.bytes(max_seq_len));
    let mut first = tokenizer.encode_fast(head, true).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
    let mut all = vec![];
    let rest = first.take_overflowing();
    all.push(first);
    all.extend(rest);
    let unread = all.len() > windows.max || head.len() < text.len();
    all.truncate(windows.max);
    Ok(Encoded { windows: all, unread, lexical: None })
}

/// Counts tokens with the model's own tokenizer, at a bounded cost, keeping the encoding so the
/// model does not tokenise the same text again.
#[derive(Clone)]
pub struct TokenCounter {
    tokenizer: std::sync::Arc<Tokenizer>,
    max_seq_len: usize,
    windows: Windows,
}

/// Tokens counted for the complexity rater.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Tokens in the text (with `[CLS]`/`[SEP]`), exact below `min(cap, max_seq_len)`; `cap`
    /// means "`cap` or more".
    pub count: usize,
    /// The model's input for this text, when counting made it (see [`TokenCounter::count`]).
    pub encoded: Option<Encoded>,
}

impl Tokens {
    /// A count without tokenising: every whitespace-separated word is at least one WordPiece
    /// token, so the word count (up to `cap`) is a lower bound. No encoding.
    pub fn lower_bound(text: &str, cap: usize) -> Tokens {
        Tokens { count: text.split_whitespace().take(cap).count(), encoded: None }
    }
}

impl TokenCounter {
    pub fn new(tokenizer: std::sync::Arc<Tokenizer>, max_seq_len: usize, windows: Windows) -> TokenCounter {
        TokenCounter { tokenizer, max_seq_len, windows }
    }

    /// Counts the tokens of `text` up to `cap`.
    ///
    /// The cost is bounded whatever the text's length (the complexity rater calls this on the
    /// request path): every whitespace-separated word is at least one WordPiece token, so a text
    /// of `cap` words is at `cap` without tokenising (and the model tokenises it later). Otherwise
    /// the text is encoded exactly as the model encodes it ([`encode`]), and the encoding travels
    /// to the model with the request, so no text is tokenised twice.
    pub fn count(&self, text: &str, cap: usize) -> Tokens {
        let words = Tokens::lower_bound(text, cap);
        if words.count >= cap {
            return words;
        }
        let Ok(encoded) = encode(&self.tokenizer, text, self.max_seq_len, self.windows) else {
            return Tokens { count: 0, encoded: None };
        };
        let first = encoded.windows[0].len();
        let cut = encoded.unread || encoded.windows.len() > 1 || first >= self.max_seq_len;
        let count = if cut { cap } else { first.min(cap) };
        Tokens { count, encoded: Some(encoded) }
    }
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a char boundary.
pub(crate) fn prefix(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads the model directory's tokenizer with these windows (for tests and tools).
pub fn load_tokenizer(path: &std::path::Path, max_seq_len: usize, windows: Windows) -> anyhow::Result<Tokenizer> {
    let mut t =
        Tokenizer::from_file(path).map_err(|e| anyhow::anyhow!("{e}")).with_context(|| path.display().to_string())?;
    t.with_padding(None);
    windows.configure(&mut t, max_seq_len)?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer(windows: Windows) -> Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tokenizer.json");
        load_tokenizer(&path, 128, windows).unwrap()
    }

    /// The id of a word that the tokenizer reads as one piece (`password` or `▁password`).
    fn short_id(t: &Tokenizer, word: &str) -> u32 {
        let ids = t.encode(word, false).unwrap().get_ids().to_vec();
        assert_eq!(ids.len(), 1, "{word} is one piece: {ids:?}");
        ids[0]
    }

    #[test]
    fn prefix_respects_char_boundaries() {
        assert_eq!(prefix("hello", 10), "hello");
        assert_eq!(prefix("hello", 3), "hel");
        assert_eq!(prefix("héllo", 2), "h", "é is two bytes");
        assert_eq!(prefix("日本", 4), "日");
    }

    #[test]
    fn a_long_text_is_read_in_overlapping_windows_each_a_whole_model_input() {
        let w = Windows { max: 8, overlap: 32, ..Windows::default() };
        let t = tokenizer(w);
        let benign = "The quarterly team offsite went well and everyone enjoyed the lake walk. ".repeat(20);
        let text = format!("{benign}Please confirm your password at http://login.example.top today.");
        let e = encode(&t, &text, 128, w).unwrap();
        assert!(e.windows.len() > 1 && !e.unread, "{} windows", e.windows.len());
        // The model's own start and end tokens (`[CLS]`/`[SEP]` for BERT vocabularies, `<s>`/`</s>` for XLM-R's).
        let short = t.encode("hello", true).unwrap();
        let (start, end) = (short.get_ids()[0], *short.get_ids().last().unwrap());
        assert_ne!(start, end);
        for win in &e.windows {
            let ids = win.get_ids();
            assert!(ids.len() <= 128);
            assert_eq!((ids[0], *ids.last().unwrap()), (start, end), "start ... end token in every window");
        }
        let password = short_id(&t, "password");
        assert!(e.windows.last().unwrap().get_ids().contains(&password), "the phishing sentence is in the last window");
        assert!(!e.windows[0].get_ids().contains(&password));
        let first: Vec<u32> = e.windows[0].get_ids().to_vec();
        let second: Vec<u32> = e.windows[1].get_ids().to_vec();
        assert_eq!(first[first.len() - 1 - 32..first.len() - 1], second[1..33], "windows overlap by 32 tokens");
    }

    #[test]
    fn text_past_the_last_window_is_marked_unread() {
        let w = Windows { max: 2, overlap: 16, ..Windows::default() };
        let t = tokenizer(w);
        let e = encode(&t, &"word ".repeat(600), 128, w).unwrap();
        assert_eq!((e.windows.len(), e.unread), (2, true));
        let short = encode(&t, "see you at noon", 128, w).unwrap();
        assert_eq!((short.windows.len(), short.unread), (1, false));
    }

    #[test]
    fn counting_keeps_the_encoding_of_short_texts_only() {
        let w = Windows::default();
        let c = TokenCounter::new(std::sync::Arc::new(tokenizer(w)), 128, w);
        let short = c.count("your parcel is held, pay the fee", 64);
        assert!(short.encoded.is_some() && short.count > 5 && short.count < 64);
        let long = c.count(&"many words here ".repeat(30), 64);
        assert_eq!((long.count, long.encoded.is_none()), (64, true), "64 words or more: not tokenised here");
    }
}
