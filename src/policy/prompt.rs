//! `[prompt]`: how the gpu tier's upstream backend asks a model server to classify a text.
//! It lives in the policy (hot-reloaded) and is passed to the tier per call.

use serde::Deserialize;

/// How to ask the model; lives in the routing policy (hot-reloaded) and is passed per call.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSpec {
    /// The system message.
    pub system: String,
    /// The user message; `{text}` is replaced by the text to classify as data: a JSON string
    /// between `<message>` and `</message>` lines (see `tier::gpu::upstream::data_block`).
    pub user: String,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// The label the model states for risky text (the answer must be `{"label": risk_label}`
    /// or `{"label": ok_label}`, enforced by the server through `response_format`).
    #[serde(default = "default_risk_label")]
    pub risk_label: String,
    /// The label the model states for benign text.
    #[serde(default = "default_ok_label")]
    pub ok_label: String,
}

fn default_max_tokens() -> u32 {
    16
}
fn default_risk_label() -> String {
    "risk".into()
}
fn default_ok_label() -> String {
    "ok".into()
}

impl PromptSpec {
    /// `(risk_label, ok_label)`, trimmed: what the schema allows and the answer must equal.
    pub fn labels(&self) -> (&str, &str) {
        (self.risk_label.trim(), self.ok_label.trim())
    }

    /// `{text}` present in `user`, `max_tokens` at least 1, labels non-empty, plain (no quote,
    /// backslash or control character: they are JSON string values) and different from their
    /// first character on (ASCII case-insensitive): the label's first token is where the
    /// model's probability for each label is read.
    pub fn validate(&self) -> Result<(), String> {
        if !self.user.contains("{text}") {
            return Err("`user` must contain `{text}`".into());
        }
        if self.max_tokens == 0 {
            return Err("`max_tokens` must be at least 1".into());
        }
        let (risk, ok) = (self.risk_label.trim(), self.ok_label.trim());
        if risk.is_empty() {
            return Err("`risk_label` must not be empty".into());
        }
        if ok.is_empty() {
            return Err("`ok_label` must not be empty".into());
        }
        if risk.eq_ignore_ascii_case(ok) {
            return Err(format!("`risk_label` and `ok_label` must differ (both are `{risk}`)"));
        }
        for (field, label) in [("risk_label", risk), ("ok_label", ok)] {
            if label.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
                return Err(format!("`{field}` must not contain quotes, backslashes or control characters"));
            }
        }
        let first = |s: &str| s.chars().next().map(|c| c.to_ascii_lowercase());
        if first(risk) == first(ok) {
            return Err(format!(
                "`risk_label` and `ok_label` must differ in their first character (`{risk}`, `{ok}`): \
                 the model's belief is read at the label's first token"
            ));
        }
        Ok(())
    }
}
