//! The one step from a text to what the rules read of it: the canonical text, its language, what
//! canonicalisation undid, and the policy's signal counts. A request's text (the gateway's
//! assessment) and a window of an app's stream (the proxy's stream screen) go through it alike, so
//! a rule sees the same facts of the same words wherever they come from.

use super::{ModelView, RuleSet, RulesInput};
use crate::text::{self, LanguageCell, Obfuscation};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the rules read of one text.
#[derive(Debug, Clone)]
pub struct TextFacts {
    /// The canonical text ([`text::canonicalize`]); the original `Arc` when nothing changed.
    pub text: Arc<str>,
    /// Its language, detected on first use (the cpu worker may fill it off the async runtime).
    pub lang: LanguageCell,
    /// What canonicalisation undid.
    pub obfuscation: Obfuscation,
    /// Match counts of every policy signal over `text` ([`RuleSet::count_signals`]).
    pub signals: BTreeMap<String, i64>,
}

impl RuleSet {
    /// Canonicalises `raw` and counts the policy's signals over the result (one `RegexSet` pass,
    /// then only the patterns that matched). The language is left to detect on first use.
    pub fn read(&self, raw: &Arc<str>) -> TextFacts {
        let canonical = text::canonicalize(raw);
        let text: Arc<str> = if canonical.obfuscation.changed { Arc::from(canonical.text) } else { Arc::clone(raw) };
        let signals = self.count_signals(&text);
        TextFacts { lang: LanguageCell::new(Arc::clone(&text)), text, obfuscation: canonical.obfuscation, signals }
    }
}

impl TextFacts {
    /// The rules' input for these facts and the request's context (features, tenant, the model
    /// view of the verdict that stands, the campaign velocity). Reading the language here detects
    /// it if nobody had.
    pub fn input<'a>(
        &'a self,
        features: &'a serde_json::Map<String, serde_json::Value>,
        tenant: Option<&'a str>,
        model: Option<ModelView>,
        campaign: Option<&'a crate::campaign::Velocity>,
    ) -> RulesInput<'a> {
        RulesInput {
            text: &self.text,
            lang: self.lang.get().code,
            obfuscation: &self.obfuscation,
            signals: &self.signals,
            features,
            tenant,
            model,
            features_model: None,
            campaign,
        }
    }
}
