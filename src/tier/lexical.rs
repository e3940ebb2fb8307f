//! The cpu tier's lexical model: a logistic regression over hashed character n-grams of the
//! whole text, combined with the encoder's verdict. The encoder reads 128-token windows with two
//! layers; the lexical model reads every character of the text at a cost of microseconds, and
//! errs on different messages (models/MODEL_CARD.md, "Lexical model").
//!
//! Files (written by `models/recipe/ml_lexical.py`, both listed in `MANIFEST.sha256`):
//! `lexical.json` (named by `model.json`'s `"lexical"`) and its `weights` file: little-endian f32,
//! `buckets` smoothed idf values, then `buckets` coefficients.
//!
//! Features, as the recipe defines them (scikit-learn's `char_wb` analyzer and TF-IDF with a
//! hashing trick): the text lower-cased (`str::to_lowercase`, Unicode's full mappings), split on
//! Unicode White_Space, each word padded with a space on both sides; its character n-grams for n
//! in `ngram_range` (a padded word of at most n characters gives itself once and ends that word);
//! each hashed with 64-bit FNV-1a over its UTF-8 bytes modulo `buckets`; per bucket
//! `(1 + ln count) * idf`, the vector L2-normalised. Logit `z = coef · v + intercept`.
//!
//! Combination: `p(risk) = sigmoid(encoder * logit(p_encoder) + lexical * z + bias)`, where
//! `p_encoder` is the encoder's temperature-scaled risk score of the riskiest window; the three
//! weights are fitted by logistic regression on the validation split's encoder scores
//! (`ml_lexical.py combine`). A policy's `[calibration] cpu_temperature` rescales the combined
//! logit as it would the encoder's.

use anyhow::{bail, Context as _};
use serde::Deserialize;
use std::path::Path;

/// `lexical.json`.
#[derive(Debug, Clone, Deserialize)]
struct LexicalFile {
    weights: String,
    buckets: usize,
    ngram_range: [usize; 2],
    intercept: f64,
    combine: Combine,
}

/// The combination's weights (see the module docs).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
pub struct Combine {
    pub encoder: f64,
    pub lexical: f64,
    pub bias: f64,
}

/// The loaded lexical model.
#[derive(Debug)]
pub struct Lexical {
    min_n: usize,
    max_n: usize,
    /// `buckets - 1`; `buckets` is a power of two.
    mask: u64,
    idf: Vec<f32>,
    coef: Vec<f32>,
    intercept: f64,
    combine: Combine,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Lexical {
    /// Loads `dir/file` and its weights file, both of which the caller has checked against the
    /// manifest. Errors: a file missing or unparsable, `buckets` not a power of two, an empty or
    /// reversed `ngram_range`, a weights file not `2 * buckets * 4` bytes, a weight not finite.
    pub fn load(dir: &Path, file: &str) -> anyhow::Result<(Lexical, String)> {
        let path = dir.join(file);
        let meta: LexicalFile =
            serde_json::from_slice(&std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)
                .with_context(|| format!("parsing {}", path.display()))?;
        let [min_n, max_n] = meta.ngram_range;
        if !meta.buckets.is_power_of_two() || min_n == 0 || min_n > max_n {
            bail!("{}: buckets must be a power of two and ngram_range [min, max] with 1 <= min <= max", path.display());
        }
        let weights_path = dir.join(&meta.weights);
        let bytes = std::fs::read(&weights_path).with_context(|| format!("reading {}", weights_path.display()))?;
        if bytes.len() != 2 * meta.buckets * 4 {
            bail!(
                "{}: {} bytes, expected {} (idf and coefficients, f32, {} buckets each)",
                weights_path.display(),
                bytes.len(),
                2 * meta.buckets * 4,
                meta.buckets
            );
        }
        let floats: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let c = meta.combine;
        if !floats.iter().all(|w| w.is_finite())
            || ![meta.intercept, c.encoder, c.lexical, c.bias].iter().all(|w| w.is_finite())
        {
            bail!("{}: a weight is not a finite number", path.display());
        }
        let (idf, coef) = floats.split_at(meta.buckets);
        let model = Lexical {
            min_n,
            max_n,
            mask: meta.buckets as u64 - 1,
            idf: idf.to_vec(),
            coef: coef.to_vec(),
            intercept: meta.intercept,
            combine: c,
        };
        Ok((model, meta.weights))
    }

    /// The lexical logit of `text` (the intercept for a text without a word). O(characters).
    pub fn logit(&self, text: &str) -> f64 {
        let lower = text.to_lowercase();
        // About one n-gram per character for each n.
        let mut buckets: Vec<u32> = Vec::with_capacity((self.max_n - self.min_n + 1) * lower.len().min(1 << 16));
        let mut chars: Vec<char> = Vec::with_capacity(32);
        for word in lower.split(char::is_whitespace).filter(|w| !w.is_empty()) {
            chars.clear();
            chars.push(' ');
            chars.extend(word.chars());
            chars.push(' ');
            for n in self.min_n..=self.max_n {
                for gram in chars.windows(n.min(chars.len())) {
                    buckets.push(self.bucket(gram));
                }
                if chars.len() <= n {
                    break;
                }
            }
        }
        if buckets.is_empty() {
            return self.intercept;
        }
        buckets.sort_unstable();
        let (mut dot, mut norm) = (0.0f64, 0.0f64);
        for run in buckets.chunk_by(|a, b| a == b) {
            let b = run[0] as usize;
            let v = (1.0 + (run.len() as f64).ln()) * f64::from(self.idf[b]);
            dot += v * f64::from(self.coef[b]);
            norm += v * v;
        }
        // An all-zero idf (not what the recipe writes, but a file could) has no direction.
        if norm == 0.0 {
            return self.intercept;
        }
        dot / norm.sqrt() + self.intercept
    }

    fn bucket(&self, gram: &[char]) -> u32 {
        let mut h = FNV_OFFSET;
        let mut utf8 = [0u8; 4];
        for c in gram {
            for &byte in c.encode_utf8(&mut utf8).as_bytes() {
                h = (h ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
            }
        }
        (h & self.mask) as u32
    }

    /// The combined p(risk) of an encoder risk score (calibrated, in (0, 1)) and a lexical logit.
    pub fn combine(&self, encoder_risk: f64, lexical_logit: f64) -> f64 {
        let p = encoder_risk.clamp(1e-7, 1.0 - 1e-7);
        let c = self.combine;
        let z = c.encoder * (p / (1.0 - p)).ln() + c.lexical * lexical_logit + c.bias;
        1.0 / (1.0 + (-z).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this process for one test.
    fn tempdir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tiergate-lexical-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn model(dir: &Path, idf: &[f32], coef: &[f32], combine: &str) -> Lexical {
        let mut bytes = Vec::new();
        for w in idf.iter().chain(coef) {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        std::fs::write(dir.join("w.bin"), bytes).unwrap();
        std::fs::write(
            dir.join("lexical.json"),
            format!(
                r#"{{"weights":"w.bin","buckets":{},"ngram_range":[1,4],"intercept":0.5,"combine":{combine}}}"#,
                idf.len()
            ),
        )
        .unwrap();
        Lexical::load(dir, "lexical.json").unwrap().0
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        let dir = tempdir("fnv");
        let m = model(&dir, &[1.0; 4], &[0.0; 4], r#"{"encoder":1,"lexical":0,"bias":0}"#);
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the FNV reference test vectors); mod 4 = 0.
        assert_eq!(m.bucket(&['a']), (0xaf63_dc4c_8601_ec8c_u64 & 3) as u32);
        assert_eq!(m.bucket(&[]), (FNV_OFFSET & 3) as u32);
    }

    #[test]
    fn a_text_without_words_is_the_intercept_and_the_combination_is_a_logistic() {
        let dir = tempdir("combine");
        let m = model(&dir, &[1.0; 8], &[0.3; 8], r#"{"encoder":2,"lexical":1,"bias":-0.5}"#);
        assert_eq!(m.logit(" \n\t "), 0.5);
        // Every bucket weighs 0.3 and the vector is normalised: z = 0.3 * sum(v) / |v| + 0.5 > 0.5.
        assert!(m.logit("hi") > 0.5);
        let p = m.combine(0.5, 0.0);
        assert!((p - 1.0 / (1.0 + 0.5f64.exp())).abs() < 1e-12, "{p}");
        assert!(m.combine(1.0, 100.0) > 0.999 && m.combine(0.0, -100.0) < 0.001);
    }

    /// The bundled model's logits equal the recipe's (`ml_lexical.py fixture`, which computes them
    /// in Python from the same files) on 77 texts: validation messages in the served languages,
    /// and case-mapping, whitespace, full-width and empty edge cases.
    #[test]
    fn the_bundled_model_matches_the_recipe_on_every_script() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let (m, _) = Lexical::load(&root.join("models"), "lexical.json").unwrap();
        let fixture = std::fs::read_to_string(root.join("tests/data/lexical/parity.jsonl")).unwrap();
        let mut n = 0;
        for line in fixture.lines() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            let (text, want) = (row["text"].as_str().unwrap(), row["logit"].as_f64().unwrap());
            let got = m.logit(text);
            assert!((got - want).abs() < 1e-6, "{text:?}: {got} against the recipe's {want}");
            n += 1;
        }
        assert_eq!(n, 77);
    }

    #[test]
    fn refuses_weights_of_the_wrong_size() {
        let dir = tempdir("size");
        model(&dir, &[1.0; 4], &[0.0; 4], r#"{"encoder":1,"lexical":0,"bias":0}"#);
        std::fs::write(dir.join("w.bin"), [0u8; 12]).unwrap();
        let e = Lexical::load(&dir, "lexical.json").unwrap_err();
        assert!(format!("{e:#}").contains("12 bytes, expected 32"), "{e:#}");
    }
}
