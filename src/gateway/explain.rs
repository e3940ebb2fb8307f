//! Word attributions for `?explain=true` and `tiergate explain`: occlusion over words — the text
//! is scored again once without each word (all variants in one go, so the cpu tier batches
//! them), and a word's attribution is how much the risk score drops without it.

use super::Gateway;
use crate::decision::Attribution;
use crate::tier::Prepared;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use unicode_segmentation::UnicodeSegmentation;

/// Most words scored (occlusion costs one model run per word).
pub const MAX_WORDS: usize = 64;
/// Attributions reported, largest effect first.
pub const TOP: usize = 12;

impl Gateway {
    /// Each word's effect on the cpu model's risk score for `text` (`risk` is the score of the whole
    /// text, read at `temperature`: the policy's cpu temperature, at which the variants are read
    /// too). Empty when the variants cannot be scored within `budget`.
    pub(super) async fn attributions(
        &self,
        text: &str,
        risk: f64,
        temperature: f64,
        budget: Duration,
    ) -> Vec<Attribution> {
        let model_t = self.cpu.info().temperature;
        let words: Vec<(usize, &str)> = text.unicode_word_indices().take(MAX_WORDS).collect();
        let deadline = Instant::now() + budget;
        let variants = words.iter().map(|&(at, word)| {
            let without: Arc<str> = Arc::from(format!("{}{}", &text[..at], &text[at + word.len()..]));
            self.cpu.classify(without, Prepared::default(), deadline)
        });
        let scores = futures_util::future::join_all(variants).await;
        let mut out: Vec<Attribution> = words
            .iter()
            .zip(scores)
            .enumerate()
            .filter_map(|(index, ((_, word), score))| {
                let without = crate::calibrate::retemper(score.ok()?.risk_score, model_t, temperature);
                Some(Attribution { word: word.to_string(), index, delta: risk - without })
            })
            .collect();
        out.sort_by(|a, b| b.delta.abs().total_cmp(&a.delta.abs()));
        out.truncate(TOP);
        out
    }
}
