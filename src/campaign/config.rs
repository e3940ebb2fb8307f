//! `[campaign]`: campaign and entity velocity (`crate::campaign`). Off unless `enabled`.
//!
//! ```toml
//! [campaign]
//! enabled = true
//! key_file = "/etc/tiergate/campaign.key"   # or key = "...", or TIERGATE_CAMPAIGN_KEY
//! source_feature = "sender_id"              # the request feature that names the sender
//! entity_features = { device = "device_id" } # entity kind -> the feature that carries it
//! ```

use super::entity::EntityKind;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The environment variable read when neither `campaign.key` nor `campaign.key_file` is set.
pub const KEY_ENV: &str = "TIERGATE_CAMPAIGN_KEY";
/// The shortest key accepted, bytes (as the audit's HMAC key).
pub const MIN_KEY_BYTES: usize = 16;

/// The `[campaign]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CampaignConfig {
    /// Track campaigns and entities and give rules `campaign.*` and `entity.*` (off: those
    /// variables read 0 and `campaign.available` is false).
    pub enabled: bool,
    /// The HMAC-SHA256 key that sources and entities are hashed with before they are stored or
    /// shown (never in clear). Every replica sharing a Redis must have the same key, else their
    /// hashes differ and nothing is shared; so with `[tenants.redis]` a key is required (here, in
    /// `key_file`, or in `TIERGATE_CAMPAIGN_KEY`). Without Redis a missing key is a random one per
    /// process. At least 16 bytes.
    pub key: Option<String>,
    /// A file holding the key (surrounding whitespace removed).
    pub key_file: Option<PathBuf>,
    /// The request feature (a string or a number) that names the sender; a source is the tenant
    /// and this value together. Absent from a request: the tenant alone is the source.
    pub source_feature: String,
    /// Entities taken from request features besides those found in the text: entity kind
    /// (`link_domain`, `phone`, `iban`, `wallet`, `device`) -> feature name.
    pub entity_features: BTreeMap<String, String>,
    /// The most campaigns and entities the in-process store keeps (the least recently seen go).
    pub max_subjects: usize,
    /// How many campaigns the top-campaigns gauge shows (`tiergate_campaign_top_sources_1h{rank}`).
    pub top_k: usize,
}

impl Default for CampaignConfig {
    fn default() -> Self {
        CampaignConfig {
            enabled: false,
            key: None,
            key_file: None,
            source_feature: "sender_id".into(),
            entity_features: BTreeMap::from([("device".to_string(), "device_id".to_string())]),
            max_subjects: 10_000,
            top_k: 10,
        }
    }
}

impl CampaignConfig {
    /// Checks the section; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        for kind in self.entity_features.keys() {
            if EntityKind::parse(kind).is_none() {
                return Err(format!(
                    "`campaign.entity_features.{kind}`: unknown entity kind; known: link_domain, phone, iban, wallet, device"
                ));
            }
        }
        if !(100..=10_000_000).contains(&self.max_subjects) {
            return Err(format!("`campaign.max_subjects` must be 100 to 10000000, got {}", self.max_subjects));
        }
        if !(1..=100).contains(&self.top_k) {
            return Err(format!("`campaign.top_k` must be 1 to 100, got {}", self.top_k));
        }
        if let Some(key) = &self.key {
            if key.trim().len() < MIN_KEY_BYTES {
                return Err(format!("`campaign.key` needs at least {MIN_KEY_BYTES} bytes"));
            }
        }
        Ok(())
    }

    /// `(kind, feature)` pairs of `entity_features` (validated kinds).
    pub fn feature_entities(&self) -> Vec<(EntityKind, String)> {
        self.entity_features.iter().filter_map(|(k, f)| Some((EntityKind::parse(k)?, f.clone()))).collect()
    }

    /// The HMAC key: `key`, `key_file`, [`KEY_ENV`], else (only without a shared store) random.
    /// Errors name where the key was to come from.
    pub fn load_key(&self, shared: bool) -> Result<Vec<u8>, String> {
        let key = if let Some(key) = &self.key {
            key.trim().to_string()
        } else if let Some(path) = &self.key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("`campaign.key_file`: reading {}: {e}", path.display()))?;
            text.trim().to_string()
        } else if let Some(key) = std::env::var(KEY_ENV).ok().filter(|k| !k.trim().is_empty()) {
            key.trim().to_string()
        } else if shared {
            return Err(format!(
                "`campaign`: with [tenants.redis] every replica needs the same HMAC key: set `campaign.key`, `campaign.key_file` or {KEY_ENV}"
            ));
        } else {
            let mut bytes = vec![0u8; 32];
            getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for the campaign HMAC key: {e}"))?;
            return Ok(bytes);
        };
        if key.len() < MIN_KEY_BYTES {
            return Err(format!("the campaign HMAC key has {} bytes; it needs at least {MIN_KEY_BYTES}", key.len()));
        }
        Ok(key.into_bytes())
    }
}
