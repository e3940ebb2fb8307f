//! Campaign signals: requests that carry one template (near-duplicates of the canonical text,
//! [`minhash`]) are one *campaign*, and the entities a request names ([`entity`]: link domains,
//! phone numbers, IBANs, wallet addresses, device ids) are tracked alike; for each, the requests
//! and the distinct *sources* (tenant and sender feature) over sliding windows of 1 min, 1 h and
//! 24 h, and the time since it was first seen. Rules read them as `campaign.*` and `entity.*`
//! ([`cel`]).
//!
//! Shared by a fleet through the Redis the quotas use (`[tenants.redis]`: the same connection
//! and circuit breaker, [`crate::tenant::shared::Link`]): one Lua script per lookup
//! (`campaign.lua`: band lookup, counters in bucketed keys with TTLs — two per window, the
//! sliding-window counter — and HyperLogLog `PFADD` / `PFCOUNT` for distinct sources). The campaign id is derived from the band hashes, so two
//! replicas agree without talking: a text joins the campaign already registered for any of its
//! bands (the first in band order), else registers its own id (the least band hash) for all of
//! them. Every lookup also updates the in-process store ([`local`]), which answers alone without
//! Redis or while Redis is out of reach: counts are then this replica's own (lower than the
//! fleet's; `campaign.shared` is false, so a policy can tell).
//!
//! Sources and entities are stored and shown only as keyed hashes (HMAC-SHA256 with
//! `[campaign]`'s key), with TTLs (25 h at most), never in clear.

pub mod cel;
pub mod config;
pub mod entity;
pub mod local;
pub mod metrics;
pub mod minhash;

pub use config::CampaignConfig;
pub use entity::EntityKind;

use crate::tenant::shared::Link;
use hmac::{Hmac, Mac};
use metrics::{CampaignMetrics, StoreLabels, TopCampaigns};
use serde::Serialize;
use sha2::Sha256;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The lookup script (see the file for its arguments and reply).
pub const CAMPAIGN_LUA: &str = include_str!("campaign.lua");

/// One subject's (a campaign's or an entity's) velocity, the request itself included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub count_1m: u64,
    pub count_1h: u64,
    pub count_24h: u64,
    /// Distinct sources (HyperLogLog in Redis: about 0.81 % standard error; exact locally).
    pub sources_1m: u64,
    pub sources_1h: u64,
    pub sources_24h: u64,
    /// Seconds since the subject was first seen (0 for a new one; forgotten 25 h after it was
    /// last seen).
    pub first_seen_s: u64,
}

/// What a store answered for one request: the campaign and each entity's counts, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub campaign_id: String,
    pub campaign: Counts,
    pub entities: Vec<Counts>,
}

/// One entity of a request: its kind, its keyed hash (hex, 128 bits), its counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EntityVelocity {
    pub kind: EntityKind,
    pub hash: String,
    #[serde(flatten)]
    pub counts: Counts,
}

/// A request's campaign signals (the rule variables' source; shown in `?explain=true`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Velocity {
    /// The campaign id (16 hex digits, derived from the LSH bands).
    pub id: String,
    /// Whether the fleet's store (Redis) answered; false: this replica's counts alone.
    pub shared: bool,
    #[serde(flatten)]
    pub campaign: Counts,
    pub entities: Vec<EntityVelocity>,
}

/// The campaign tracker of a gateway; cheap to share behind an `Arc`.
pub struct Campaigns {
    key: Vec<u8>,
    source_feature: String,
    feature_entities: Vec<(EntityKind, String)>,
    local: local::LocalStore,
    shared: Option<(Arc<Link>, redis::Script, String)>,
    metrics: CampaignMetrics,
    top: TopCampaigns,
}

impl Campaigns {
    /// The tracker for `config` (`None` when off), sharing through `link` when given (its keys
    /// under `key_prefix`). Errors name the config key (a missing shared key, a bad section).
    pub fn new(
        config: &CampaignConfig,
        link: Option<(Arc<Link>, String)>,
        metrics: CampaignMetrics,
    ) -> Result<Option<Campaigns>, String> {
        config.validate()?;
        if !config.enabled {
            return Ok(None);
        }
        let key = config.load_key(link.is_some())?;
        Ok(Some(Campaigns {
            key,
            source_feature: config.source_feature.clone(),
            feature_entities: config.feature_entities(),
            local: local::LocalStore::new(config.max_subjects),
            shared: link.map(|(link, prefix)| (link, redis::Script::new(CAMPAIGN_LUA), format!("{prefix}cmp:"))),
            metrics,
            top: TopCampaigns::new(config.top_k),
        }))
    }

    /// Counts one request — its canonical `text`, `tenant` and `features` — and returns its
    /// campaign's and entities' velocity: from Redis when it answers (one EVALSHA), else from
    /// this replica's store. Never fails; its cost is in `tiergate_campaign_lookup_seconds`.
    pub async fn lookup(
        &self,
        text: &str,
        tenant: Option<&str>,
        features: &serde_json::Map<String, serde_json::Value>,
    ) -> Velocity {
        let started = Instant::now();
        let bands = minhash::bands(text).0;
        let candidate = format!("{:016x}", bands.iter().min().copied().unwrap_or(0));
        let sender = match features.get(&self.source_feature) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let source = self.hmac(&["source", tenant.unwrap_or(""), &sender]);
        let found = entity::find(text, features, &self.feature_entities);
        let hashes: Vec<String> = found.iter().map(|(k, v)| hex(&self.hmac(&[k.as_str(), v])[..16])).collect();
        let keys: Vec<String> = found.iter().zip(&hashes).map(|((k, _), h)| format!("{}:{h}", k.as_str())).collect();
        let now_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let source_u64 = u64::from_le_bytes(source[..8].try_into().unwrap_or_default());
        let local = self.local.observe(now_s, &bands, &candidate, source_u64, &keys);
        let shared = match &self.shared {
            Some(shared) => self.shared_lookup(shared, &bands, &candidate, &hex(&source[..16]), &keys).await,
            None => None,
        };
        let (observed, store) = match shared {
            Some(o) => (o, "redis"),
            None => (local, "local"),
        };
        self.metrics.lookups.get_or_create(&StoreLabels { store }).inc();
        self.top.observe(&observed.campaign_id, observed.campaign, &self.metrics);
        let counts = observed.entities.iter().copied().chain(std::iter::repeat(Counts::default()));
        let entities = found.iter().zip(hashes).zip(counts);
        let entities = entities.map(|(((kind, _), hash), counts)| EntityVelocity { kind: *kind, hash, counts });
        let velocity = Velocity {
            id: observed.campaign_id,
            shared: store == "redis",
            campaign: observed.campaign,
            entities: entities.collect(),
        };
        self.metrics.lookup_seconds.observe(started.elapsed().as_secs_f64());
        velocity
    }

    /// The script's answer, or `None` when Redis could not decide (or answered malformed).
    async fn shared_lookup(
        &self,
        (link, script, prefix): &(Arc<Link>, redis::Script, String),
        bands: &[u64],
        candidate: &str,
        source: &str,
        entities: &[String],
    ) -> Option<Observation> {
        let mut call = script.prepare_invoke();
        call.arg(prefix.as_str()).arg(source).arg(candidate).arg(bands.len());
        for b in bands {
            call.arg(format!("{b:016x}"));
        }
        call.arg(entities.len());
        for e in entities {
            call.arg(e.as_str());
        }
        let (id, numbers): (String, Vec<u64>) = link.run(call).await?;
        let mut counts = numbers.chunks_exact(7).map(|c| Counts {
            count_1m: c[0],
            count_1h: c[1],
            count_24h: c[2],
            sources_1m: c[3],
            sources_1h: c[4],
            sources_24h: c[5],
            first_seen_s: c[6],
        });
        let campaign = counts.next()?;
        Some(Observation { campaign_id: id, campaign, entities: counts.collect() })
    }

    /// HMAC-SHA256 of `parts` joined by the unit separator, under the campaign key.
    fn hmac(&self, parts: &[&str]) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts any key length");
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                mac.update(b"\x1f");
            }
            mac.update(part.as_bytes());
        }
        mac.finalize().into_bytes().into()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
