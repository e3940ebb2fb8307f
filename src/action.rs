//! What a decision does with a request: the one scale every stage (model thresholds, rules,
//! guard rules, proxy dispositions) speaks in.

use serde::{Deserialize, Serialize};

/// What a decision does, in increasing severity (`Allow < Review < Block`), so verdicts merge
/// by taking the most severe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Review,
    Block,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Review => "review",
            Action::Block => "block",
        }
    }
}
