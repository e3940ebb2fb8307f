//! Asking a model server and reading its answer: the chat-completions request body for a
//! policy's [`PromptSpec`], and the answer read into a probability of the stated label.

use crate::policy::PromptSpec;
use serde::Serialize;
use serde_json::{json, Value};

/// The request body asking `model` to classify `text` (OpenAI chat completions).
pub fn request_body(prompt: &PromptSpec, model: &str, text: &str) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": prompt.system},
            {"role": "user", "content": prompt.user.replace("{text}", text)},
        ],
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 5,
    })
}

/// Which probability the verdict was built from (see [`parse_completion`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbabilitySource {
    /// `exp(logprob)` of the first token of the stated label.
    Logprobs,
    /// The answer's own `confidence` field.
    Confidence,
}

/// A model server's answer, read.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCompletion {
    /// The stated label is the risk label.
    pub is_risk: bool,
    /// Probability of the stated label.
    pub probability: f64,
    pub source: ProbabilitySource,
    /// `usage.prompt_tokens`, where the server reports it.
    pub prompt_tokens: Option<usize>,
}

impl ParsedCompletion {
    /// `risk_score` is the probability of the risk label, `confidence` that of the more likely label.
    pub fn scores(&self) -> (f64, f64) {
        let risk = if self.is_risk { self.probability } else { 1.0 - self.probability };
        (risk, risk.max(1.0 - risk))
    }
}

/// Reads a chat-completions response body into a verdict.
///
/// The answer is `choices[0].message.content`: JSON `{"label": .., "confidence": ..}` (surrounding
/// whitespace, a ```` ```json ```` fence or prose around the object are tolerated) or a bare label
/// word; labels compare trimmed and ASCII case-insensitive.
///
/// The probability `p` of the stated label comes, in order of preference, from:
/// 1. **token log-probabilities** (`choices[0].logprobs.content`, which vLLM and SGLang return
///    for `logprobs: true`): the tokens are concatenated to rebuild the text, the stated label is
///    located in it (after the `"label"` key when there is one), and `p = exp(logprob)` of the
///    token that holds the label's first character. At temperature 0 that token is where the
///    model committed to the label, so its probability is the model's own belief in the label,
///    which a self-reported number is not. (Labels sharing their first token would make this
///    the probability of the shared prefix; pick labels that differ from the first character.)
/// 2. the answer's `confidence`, a number (or numeric string) in [0, 1];
/// 3. neither: an error, never a made-up 0.5.
pub fn parse_completion(body: &[u8], prompt: &PromptSpec) -> Result<ParsedCompletion, String> {
    let response: Value = serde_json::from_slice(body).map_err(|e| format!("response is not JSON: {e}"))?;
    let choice = response.pointer("/choices/0").ok_or("response has no `choices[0]`")?;
    let content = choice
        .pointer("/message/content")
        .and_then(Value::as_str)
        .ok_or("`choices[0].message.content` is missing or not a string")?;
    let answer = parse_answer(content, prompt)?;
    let prompt_tokens =
        response.pointer("/usage/prompt_tokens").and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
    let logprob_p = choice
        .pointer("/logprobs/content")
        .and_then(Value::as_array)
        .and_then(|tokens| label_token_probability(tokens, &answer.label_text));
    let (probability, source) = match (logprob_p, answer.confidence) {
        (Some(p), _) => (p, ProbabilitySource::Logprobs),
        (None, Some(Ok(c))) => (c, ProbabilitySource::Confidence),
        (None, Some(Err(e))) => return Err(e),
        (None, None) => {
            return Err(format!(
                "answer `{}` has neither token logprobs for its label nor a `confidence`",
                snippet(content)
            ))
        }
    };
    Ok(ParsedCompletion { is_risk: answer.is_risk, probability, source, prompt_tokens })
}

/// The label and confidence stated in the assistant's content.
struct Answer {
    is_risk: bool,
    /// The label as configured (what to look for in the tokens).
    label_text: String,
    /// `None`: no confidence given; `Some(Err)`: given but unusable (only fatal without logprobs).
    confidence: Option<Result<f64, String>>,
}

fn parse_answer(content: &str, prompt: &PromptSpec) -> Result<Answer, String> {
    let text = strip_fence(content.trim());
    if let Some(object) = json_object(text) {
        let label = object
            .get("label")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("answer JSON has no string `label`: `{}`", snippet(content)))?;
        let (is_risk, label_text) = match_label(label, prompt).ok_or_else(|| {
            format!("answer label `{}` is neither `{}` nor `{}`", snippet(label), prompt.risk_label, prompt.ok_label)
        })?;
        let confidence = match object.get("confidence") {
            None | Some(Value::Null) => None,
            Some(value) => {
                let number = value.as_f64().or_else(|| value.as_str().and_then(|s| s.trim().parse::<f64>().ok()));
                Some(match number {
                    Some(c) if (0.0..=1.0).contains(&c) => Ok(c),
                    _ => Err(format!(
                        "answer `confidence` must be a number in [0, 1], got `{}`",
                        snippet(&value.to_string())
                    )),
                })
            }
        };
        return Ok(Answer { is_risk, label_text, confidence });
    }
    let word = text.trim_matches(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '.' | '!'));
    match match_label(word, prompt) {
        Some((is_risk, label_text)) => Ok(Answer { is_risk, label_text, confidence: None }),
        None => Err(format!(
            "answer is neither JSON with a `label` nor a bare `{}`/`{}`: `{}`",
            prompt.risk_label,
            prompt.ok_label,
            snippet(content)
        )),
    }
}

/// Drops a Markdown code fence (```` ```json ... ``` ````) around the answer.
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else { return text };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    let rest = rest.trim();
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// The answer as a JSON object: the whole text, or the span from the first `{` to the last `}`
/// (models like to add a sentence around it).
fn json_object(text: &str) -> Option<serde_json::Map<String, Value>> {
    if let Ok(Value::Object(map)) = serde_json::from_str(text) {
        return Some(map);
    }
    let (start, end) = (text.find('{')?, text.rfind('}')?);
    if start >= end {
        return None;
    }
    match serde_json::from_str(&text[start..=end]) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

fn match_label(label: &str, prompt: &PromptSpec) -> Option<(bool, String)> {
    let label = label.trim();
    if label.eq_ignore_ascii_case(prompt.risk_label.trim()) {
        Some((true, prompt.risk_label.trim().to_string()))
    } else if label.eq_ignore_ascii_case(prompt.ok_label.trim()) {
        Some((false, prompt.ok_label.trim().to_string()))
    } else {
        None
    }
}

/// `exp(logprob)` of the token holding the first character of `label` in the rebuilt text
/// (searched after a `"label"` key when there is one). `None` when the tokens do not spell the
/// label or carry no usable logprob.
fn label_token_probability(tokens: &[Value], label: &str) -> Option<f64> {
    let mut text = String::new();
    let mut spans = Vec::with_capacity(tokens.len());
    for token in tokens {
        let piece = token.get("token").and_then(Value::as_str).unwrap_or("");
        let start = text.len();
        text.push_str(piece);
        spans.push((start, text.len()));
    }
    // ASCII lowercasing keeps byte offsets, so positions in `lower` are positions in `text`.
    let lower = text.to_ascii_lowercase();
    let from = lower.find("\"label\"").map_or(0, |key| key + "\"label\"".len());
    let at = from + lower[from..].find(&label.to_ascii_lowercase())?;
    let index = spans.iter().position(|&(start, end)| start <= at && at < end)?;
    let logprob = tokens[index].get("logprob")?.as_f64()?;
    if !logprob.is_finite() {
        // -inf (or a NaN) from a server is not a probability we can use.
        return None;
    }
    // Servers round: a logprob of 1e-7 is a probability of 1.
    Some(logprob.min(0.0).exp())
}

/// At most 120 characters of `text`, for error messages.
pub(super) fn snippet(text: &str) -> String {
    const MAX: usize = 120;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}
