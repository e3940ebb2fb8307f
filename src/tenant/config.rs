//! `[tenants]`: where a request's tenant comes from, the known tenants and their classes, and
//! what each class may use (request rate, a fair share of the gpu tier, a daily gpu budget).
//!
//! ```toml
//! [tenants]
//! default_class = "standard"          # unknown and unauthenticated requests, all sharing one limit
//! trusted_header = "x-client-tenant"  # set by a front proxy; honoured only when named here
//! accept_claimed = false              # the body's `tenant` / `x-tiergate-tenant` (off: ignored)
//! [tenants.api_keys]                  # sha256 hex of an API key -> tenant
//! "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" = "payments"
//! [tenants.known]                     # tenant -> class
//! payments = "gold"
//! [tenants.classes.gold]
//! rate = { per_second = 200, burst = 400 }
//! gpu_share = 0.5                     # of the policy's [gpu] max_in_flight
//! gpu_daily_budget = 100000           # gpu-tier calls per UTC day
//! [tenants.classes.standard]
//! rate = { per_second = 20, burst = 40 }
//! gpu_share = 0.1
//! ```

use super::quota::Quota;
use super::shared::RedisConfig;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The metrics label, and the rate key's tenant part, of every tenant that is not known.
pub const OTHER: &str = "other";
/// The header an API key may come in (besides `authorization: Bearer`).
pub const API_KEY_HEADER: &str = "x-api-key";
/// The header a request may claim its tenant in (`web::headers::TENANT` is this one).
pub const CLAIM_HEADER: &str = "x-tiergate-tenant";
/// Longest tenant (and class) name, bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Checks a tenant or class name: 1 to [`MAX_NAME_BYTES`] bytes of ASCII letters, digits, `.`,
/// `_`, `-`. The error says which rule it broke (the caller names the field).
pub fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(format!("must be 1 to {MAX_NAME_BYTES} bytes, got {}", name.len()));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(format!("may hold only ASCII letters, digits, `.`, `_`, `-`; got {c:?}"));
    }
    Ok(())
}

/// The class unknown tenants get when `default_class` is not set.
pub const DEFAULT_CLASS: &str = "default";

/// `[tenants]`: identity sources, known tenants, classes. Absent: every request is the unknown
/// tenant of an unlimited `default` class (or of `[admission]`'s rate, see [`TenantsConfig::check`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsConfig {
    /// The class of requests whose tenant is unknown or unauthenticated. They share ONE rate,
    /// gpu-share and budget key, so rotating tenant names gains nothing.
    pub default_class: String,
    /// A header a trusted front proxy sets to the tenant's name (e.g. `x-client-tenant`); unset:
    /// no header is trusted. Only name it when every request passes that proxy, which must
    /// strip the header from what clients send.
    pub trusted_header: Option<String>,
    /// Honour the tenant the request names itself (the body's `tenant`, `x-tiergate-tenant`, a
    /// proxy route's `screen.tenant` source). Off by default: an unauthenticated claim would let
    /// a client pick another tenant's class.
    pub accept_claimed: bool,
    /// API keys, as the lowercase hex SHA-256 of the key (never the key itself) -> tenant. Read
    /// from `x-api-key` or `authorization: Bearer <key>`; the tenant must be in `known`.
    pub api_keys: BTreeMap<String, String>,
    /// Known tenants -> their class. Only these get their own limits and their own metrics
    /// label; every other name is `other`.
    pub known: BTreeMap<String, String>,
    /// Classes by name.
    pub classes: BTreeMap<String, ClassConfig>,
    /// `[tenants.redis]`: rate and daily-budget state shared by a fleet of replicas through
    /// Redis ([`super::shared`]); absent: each replica keeps its own.
    pub redis: Option<RedisConfig>,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig {
            default_class: DEFAULT_CLASS.into(),
            trusted_header: None,
            accept_claimed: false,
            api_keys: BTreeMap::new(),
            known: BTreeMap::new(),
            classes: BTreeMap::new(),
            redis: None,
        }
    }
}

/// `[tenants.classes.NAME]`: what one tenant of this class may use. Every limit is optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Requests per tenant (GCRA): over it, 429 with `Retry-After`.
    pub rate: Option<RateConfig>,
    /// The share of the gpu tier's concurrency (the policy's `[gpu] max_in_flight`) one tenant
    /// may hold, (0, 1], at least one request. At its share a tenant's requests are routed down
    /// the cascade (cpu, then rules); other tenants are not held back.
    pub gpu_share: Option<f64>,
    /// gpu-tier calls per tenant per UTC day; once spent, its requests are routed down the
    /// cascade until midnight UTC (screening goes on; nothing is refused).
    pub gpu_daily_budget: Option<u32>,
}

/// A class's GCRA quota, `{ per_second, burst }`, both at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    pub per_second: u32,
    pub burst: u32,
}

impl From<RateConfig> for Quota {
    fn from(r: RateConfig) -> Quota {
        Quota { per_second: r.per_second, burst: r.burst }
    }
}

impl TenantsConfig {
    /// Checks names, hashes and ranges. `admission` is `[admission]`'s per-tenant rate when set
    /// (the older way to limit tenants): it becomes the default class's rate, and may not be
    /// combined with a rate on that class. Errors name the key.
    pub fn check(&self, admission: Option<Quota>) -> Result<(), String> {
        for (name, class) in &self.classes {
            let at = format!("tenants.classes.{name}");
            valid_name(name).map_err(|e| format!("`{at}`: class name {e}"))?;
            if let Some(r) = class.rate {
                if r.per_second == 0 || r.burst == 0 {
                    return Err(format!("`{at}.rate`: per_second and burst must be at least 1"));
                }
            }
            if let Some(share) = class.gpu_share {
                if !(share > 0.0 && share <= 1.0) {
                    return Err(format!("`{at}.gpu_share` must be in (0, 1], got {share}"));
                }
            }
            if class.gpu_daily_budget == Some(0) {
                return Err(format!("`{at}.gpu_daily_budget` must be at least 1 (leave it out for no budget)"));
            }
        }
        let default_defined = self.classes.contains_key(&self.default_class);
        if !default_defined && self.default_class != DEFAULT_CLASS {
            return Err(format!(
                "`tenants.default_class`: class `{}` is not defined in [tenants.classes]",
                self.default_class
            ));
        }
        if admission.is_some() && self.classes.get(&self.default_class).is_some_and(|c| c.rate.is_some()) {
            return Err(format!(
                "`admission.tenant_rps` and `tenants.classes.{}.rate` both set the default class's rate; \
                 keep only the [tenants] one",
                self.default_class
            ));
        }
        for (tenant, class) in &self.known {
            valid_name(tenant).map_err(|e| format!("`tenants.known.{tenant}`: tenant name {e}"))?;
            if tenant == OTHER {
                return Err("`tenants.known.other`: `other` is the metrics label of unknown tenants".into());
            }
            if !self.classes.contains_key(class) && class != &self.default_class {
                return Err(format!("`tenants.known.{tenant}`: class `{class}` is not defined in [tenants.classes]"));
            }
        }
        for (hash, tenant) in &self.api_keys {
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(format!(
                    "`tenants.api_keys.{hash}`: must be the key's SHA-256 as 64 lowercase hex digits \
                     (`printf %s KEY | sha256sum`), never the key itself"
                ));
            }
            if !self.known.contains_key(tenant) {
                return Err(format!("`tenants.api_keys.{hash}`: tenant `{tenant}` is not in [tenants.known]"));
            }
        }
        if let Some(redis) = &self.redis {
            redis.validate()?;
        }
        if let Some(h) = &self.trusted_header {
            let name = http::HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| format!("`tenants.trusted_header`: `{h}` is not a valid header name"))?;
            if name == http::header::AUTHORIZATION || name.as_str() == API_KEY_HEADER {
                return Err(format!("`tenants.trusted_header`: `{h}` carries API keys; name another header"));
            }
        }
        Ok(())
    }

    /// The route tenant a `[routes.screen] tenant_name` names must be known (`at`: its key).
    pub fn check_route_tenant(&self, at: &str, tenant: &str) -> Result<(), String> {
        if self.known.contains_key(tenant) {
            Ok(())
        } else {
            Err(format!("`{at}`: tenant `{tenant}` is not in [tenants.known]"))
        }
    }

    /// The same tenants with every class's limits off: for offline replays (`check-policy`,
    /// `drift`), which must not be rate limited.
    pub fn without_limits(&mut self) {
        for class in self.classes.values_mut() {
            *class = ClassConfig::default();
        }
        self.redis = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<TenantsConfig, String> {
        let config: TenantsConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.check(None)?;
        Ok(config)
    }

    const KEY_HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_full_section_parses() {
        let c = parse(&format!(
            "default_class = \"std\"\ntrusted_header = \"x-client-tenant\"\n[api_keys]\n\"{KEY_HASH}\" = \"pay\"\n\
             [known]\npay = \"gold\"\n[classes.gold]\nrate = {{ per_second = 5, burst = 10 }}\ngpu_share = 0.5\n\
             gpu_daily_budget = 100\n[classes.std]\n"
        ))
        .unwrap();
        assert_eq!(c.classes["gold"].rate, Some(RateConfig { per_second: 5, burst: 10 }));
        assert_eq!(c.classes["std"], ClassConfig::default());
        assert!(!c.accept_claimed, "claims are ignored unless the config opts in");
    }

    #[test]
    fn every_error_names_its_key() {
        let cases = [
            ("[classes.a]\nrate = { per_second = 1, burst = 1, extra = 2 }", "extra"),
            ("[classes.a]\nshare = 0.5", "share"),
            ("[classes.a]\nrate = { per_second = 0, burst = 1 }", "`tenants.classes.a.rate`"),
            ("[classes.a]\ngpu_share = 1.5", "`tenants.classes.a.gpu_share` must be in (0, 1]"),
            ("[classes.a]\ngpu_share = 0.0", "`tenants.classes.a.gpu_share`"),
            ("[classes.a]\ngpu_daily_budget = 0", "`tenants.classes.a.gpu_daily_budget`"),
            ("default_class = \"gold\"", "`tenants.default_class`: class `gold`"),
            ("[known]\npay = \"gold\"", "`tenants.known.pay`: class `gold` is not defined"),
            ("[known]\n\"a b\" = \"default\"", "`tenants.known.a b`: tenant name"),
            ("[known]\nother = \"default\"", "`tenants.known.other`"),
            ("[api_keys]\nsecret = \"pay\"\n[known]\npay = \"default\"", "`tenants.api_keys.secret`: must be"),
            (&format!("[api_keys]\n\"{KEY_HASH}\" = \"pay\""), "tenant `pay` is not in [tenants.known]"),
            ("trusted_header = \"bad header\"", "`tenants.trusted_header`"),
            ("trusted_header = \"authorization\"", "carries API keys"),
            ("unknown_key = 1", "unknown_key"),
        ];
        for (text, expected) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn admission_rate_and_a_default_class_rate_conflict() {
        let quota = Some(Quota { per_second: 1, burst: 1 });
        assert!(TenantsConfig::default().check(quota).is_ok(), "[admission] alone is the default class's rate");
        let c: TenantsConfig = toml::from_str("[classes.default]\nrate = { per_second = 2, burst = 2 }").unwrap();
        let err = c.check(quota).unwrap_err();
        assert!(err.contains("admission.tenant_rps") && err.contains("tenants.classes.default.rate"), "{err}");
    }
}
