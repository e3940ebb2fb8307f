//! `[prompt]`: how the gpu tier's upstream backend asks a model server to classify a text.
//! It lives in the policy (hot-reloaded) and is passed to the tier per call.

use serde::Deserialize;

/// How to ask the model; lives in the routing policy (hot-reloaded) and is passed per call.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSpec {
    /// The system message.
    pub system: String,
    /// The user message; `{text}` is replaced by the text to classify.
    pub user: String,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// The label the model states for risky text.
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
    /// `{text}` present in `user`, labels non-empty and different (compared as the answer
    /// parser compares them: trimmed, ASCII case-insensitive), `max_tokens` at least 1.
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
        Ok(())
    }
}
