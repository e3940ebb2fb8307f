//! The verdict cache's key: an HMAC-SHA256 over everything that can change a model tier's
//! verdict, so that two requests share an entry only when the model would be asked the same
//! question under the same policy, and the cache holds no clear text.
//!
//! The secret is drawn at start ([`Secret::random`]) and never leaves the process: the cache is
//! in memory only, so no key has to survive a restart, and a digest seen in a heap dump cannot be
//! tested against guessed texts without it.

use crate::decision::{Arm, TierName};
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;
use std::path::Path;

/// The HMAC secret: 32 random bytes per process.
#[derive(Clone)]
pub struct Secret([u8; 32]);

impl Secret {
    /// 32 bytes from the operating system's random source (`getrandom`).
    pub fn random() -> Secret {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).expect("the operating system's random source");
        Secret(bytes)
    }

    /// A fixed secret, for tests that compare keys.
    #[cfg(test)]
    pub fn fixed(byte: u8) -> Secret {
        Secret([byte; 32])
    }
}

/// What one request's model verdicts depend on. Every field goes into the key.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    /// The canonical text the models read (not the text as sent: two spellings that canonicalise
    /// alike are one question to the model).
    pub text: &'a str,
    /// The request's `features` (keys in sorted order, values as JSON).
    pub features: &'a Map<String, Value>,
    /// The request's `tenant` as resolved or claimed.
    pub tenant: Option<&'a str>,
    /// The tenant's limit key label (`[tenants]`): who the request counts as.
    pub limit_key: &'a str,
    /// The `[scenarios.NAME]` the request named.
    pub scenario: Option<&'a str>,
    /// The policy directory that decides: the live one, a proxy route's, or the A/B candidate's.
    pub route_policy: &'a Path,
    /// The A/B arm, with a live A/B test.
    pub arm: Option<Arm>,
    /// The policy's content hash (`policy_version`): a reload changes it, so old entries go unused.
    pub policy_version: &'a str,
    /// The models' digests: the cpu model's `MANIFEST.sha256` digest and the gpu backend's
    /// (its manifest digest, else its name and model).
    pub models: &'a str,
}

/// The part of the key one request shares between its tiers: the HMAC state after the scope.
#[derive(Clone)]
pub struct KeyBase(Hmac<Sha256>);

/// One tier's entry: HMAC-SHA256(secret, scope, tier).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Key(pub [u8; 32]);

impl KeyBase {
    /// Feeds every field of `scope`, each length-prefixed (and `None` apart from `Some("")`), so
    /// that no two scopes feed the same bytes.
    pub fn new(secret: &Secret, scope: &Scope<'_>) -> KeyBase {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&secret.0).expect("HMAC takes a key of any length");
        field(&mut mac, Some(scope.text.as_bytes()));
        let mut features: Vec<(&String, &Value)> = scope.features.iter().collect();
        features.sort_unstable_by(|a, b| a.0.cmp(b.0));
        mac.update(&(features.len() as u64).to_le_bytes());
        for (name, value) in features {
            field(&mut mac, Some(name.as_bytes()));
            field(&mut mac, Some(value.to_string().as_bytes()));
        }
        field(&mut mac, scope.tenant.map(str::as_bytes));
        field(&mut mac, Some(scope.limit_key.as_bytes()));
        field(&mut mac, scope.scenario.map(str::as_bytes));
        field(&mut mac, Some(scope.route_policy.as_os_str().as_encoded_bytes()));
        field(&mut mac, scope.arm.map(|a| a.as_str().as_bytes()));
        field(&mut mac, Some(scope.policy_version.as_bytes()));
        field(&mut mac, Some(scope.models.as_bytes()));
        KeyBase(mac)
    }

    /// The key of `tier`'s verdict.
    pub fn key(&self, tier: TierName) -> Key {
        let mut mac = self.0.clone();
        field(&mut mac, Some(tier.as_str().as_bytes()));
        Key(mac.finalize().into_bytes().into())
    }
}

/// One field: its length (u64::MAX for `None`), then its bytes.
fn field(mac: &mut Hmac<Sha256>, value: Option<&[u8]>) {
    match value {
        None => mac.update(&u64::MAX.to_le_bytes()),
        Some(bytes) => {
            mac.update(&(bytes.len() as u64).to_le_bytes());
            mac.update(bytes);
        }
    }
}
