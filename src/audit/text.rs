//! The text as a record keeps it (`[audit] text`): a keyed hash (HMAC-SHA256, crate `hmac`),
//! the text with personal data masked ([`redact`], in `text/redact.rs`), or the text as sent.

mod redact;

pub use redact::{luhn, redact};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// How a record keeps the screened text (`[audit] text`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TextMode {
    /// HMAC-SHA256 of the text under the deployment's key (lower-case hex): the same text gives
    /// the same value, so repeats can be found and a given text checked, but the trail alone
    /// does not reveal it (an unkeyed hash of a short message falls to a dictionary).
    #[default]
    Hash,
    /// The text with e-mail addresses, phone numbers, card numbers (Luhn-checked) and IBANs
    /// (mod-97-checked) masked.
    Redacted,
    /// The text as sent. Only for deployments that opt in.
    Full,
}

/// `text` in a record: how it was kept and the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditText {
    pub mode: TextMode,
    /// `hash`: 64 lower-case hex digits; `redacted`, `full`: text.
    pub value: String,
}

/// How this deployment keeps text: the mode and, for `hash`, the key.
#[derive(Clone)]
pub struct TextPolicy {
    mode: TextMode,
    key: Vec<u8>,
}

impl std::fmt::Debug for TextPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never reaches a log.
        f.debug_struct("TextPolicy").field("mode", &self.mode).finish_non_exhaustive()
    }
}

impl TextPolicy {
    /// `key` is used by `hash` only.
    pub fn new(mode: TextMode, key: Vec<u8>) -> TextPolicy {
        TextPolicy { mode, key }
    }

    /// The text as a record keeps it.
    pub fn render(&self, text: &str) -> AuditText {
        let value = match self.mode {
            TextMode::Hash => keyed_hash(&self.key, text),
            TextMode::Redacted => redact(text),
            TextMode::Full => text.to_string(),
        };
        AuditText { mode: self.mode, value }
    }
}

/// HMAC-SHA256 of the UTF-8 text under `key`, lower-case hex (64 digits).
pub fn keyed_hash(key: &[u8], text: &str) -> String {
    // HMAC takes keys of any length (RFC 2104): `new_from_slice` cannot fail for it.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
    mac.update(text.as_bytes());
    format!("{:x}", mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests;
