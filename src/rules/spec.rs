//! The rule sections of a policy file, as written: `[signals.NAME]`, `[[rules]]`, `[default]`.

use crate::action::Action;
use serde::Deserialize;

/// `[signals.NAME]`: a named text signal, the number of regex matches in the text.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalSpec {
    pub patterns: Vec<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// `[[rules]]`: a CEL condition with the verdict it gives. Rules are tried in order; the
/// first that matches decides.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub name: String,
    /// CEL expression over `signals`, `features`, `tenant`, `text_len`, `model`; must yield a bool.
    pub when: String,
    pub action: Action,
    /// Risk score in [0, 1] reported when this rule decides.
    pub score: f64,
    #[serde(default)]
    pub description: Option<String>,
}

/// `[default]`: the verdict when rules decide and no rule matches.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DefaultVerdict {
    pub action: Action,
    pub score: f64,
}
