//! The shared quota store's config section (`[tenants.redis]`): where Redis is, how many
//! replicas share it, how long a check may wait, and what happens while it is out of reach.
//! Strict: unknown keys are errors, and [`RedisConfig::validate`] names the key at fault.

use serde::Deserialize;

/// Quotas shared by a fleet through one Redis (standalone, 5.0 or later; tested on 7.0).
///
/// ```toml
/// [tenants.redis]
/// url = "redis://127.0.0.1:6379"   # redis:// or rediss://, user, password and db as usual
/// replicas = 4                     # the expected number of tiergate replicas
/// on_outage = "local"              # "local" | "open" | "closed"
/// timeout_ms = 5
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// The server, as a `redis://[user:password@]host:port[/db]` URL (`rediss://` is refused:
    /// this build has no TLS).
    pub url: String,
    /// How many tiergate replicas share the limits; required, at least 1. While Redis is out of
    /// reach under `on_outage = "local"`, each replica allows 1/`replicas` of each rate (from
    /// the shared cell's last known state, `mirror.rs`) and of each daily budget (rounded up),
    /// so the fleet as a whole stays near the configured limit.
    pub replicas: u32,
    /// What a check does while Redis is out of reach (down, slower than `timeout_ms`, or its
    /// circuit open).
    #[serde(default)]
    pub on_outage: OnOutage,
    /// Bound on one check's round trip to Redis, in milliseconds (1 to 1000); past it the check
    /// takes the `on_outage` path. The command may still run on Redis: the request then counts
    /// there and locally, which errs towards refusing.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Prefix of every key the store writes (`{prefix}rate:{tenant}`, `{prefix}daily:{tenant}`),
    /// so that several fleets or environments can share one Redis.
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// Consecutive failed checks (errors or timeouts) that open the circuit breaker; while it is
    /// open no check goes to Redis at all.
    #[serde(default = "default_failure_threshold")]
    pub failure_threshold: u32,
    /// How long the circuit stays open before one check probes Redis again, in milliseconds.
    #[serde(default = "default_open_ms")]
    pub open_ms: u64,
}

/// What a quota check does while the shared store is out of reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnOutage {
    /// This replica decides alone: rates on its mirror of the shared cell at 1/`replicas` of
    /// the rate (its admissions charged to Redis when it answers), daily budgets on a local
    /// counter at 1/`replicas` of the budget.
    #[default]
    Local,
    /// Every request is allowed (no rate or budget limit until Redis is back).
    Open,
    /// Every request is refused: 429 naming the limit `quota_store_unavailable`.
    Closed,
}

impl OnOutage {
    /// The value as written in the config (`"local"`, `"open"`, `"closed"`), for logs and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            OnOutage::Local => "local",
            OnOutage::Open => "open",
            OnOutage::Closed => "closed",
        }
    }
}

fn default_timeout_ms() -> u64 {
    5
}

fn default_key_prefix() -> String {
    "tiergate:".into()
}

fn default_failure_threshold() -> u32 {
    3
}

fn default_open_ms() -> u64 {
    1000
}

/// Bound on `timeout_ms`: a quota check is on every request's path.
pub const MAX_TIMEOUT_MS: u64 = 1000;

/// Bound on `key_prefix`, in bytes.
pub const MAX_KEY_PREFIX_BYTES: usize = 64;

impl RedisConfig {
    /// A config for `url` shared by `replicas`, everything else at its default.
    pub fn new(url: impl Into<String>, replicas: u32) -> RedisConfig {
        RedisConfig {
            url: url.into(),
            replicas,
            on_outage: OnOutage::default(),
            timeout_ms: default_timeout_ms(),
            key_prefix: default_key_prefix(),
            failure_threshold: default_failure_threshold(),
            open_ms: default_open_ms(),
        }
    }

    /// Checks ranges and the URL; errors name the key as `tenants.redis.KEY`.
    pub fn validate(&self) -> Result<(), String> {
        let at = "tenants.redis";
        match redis::Client::open(self.url.as_str()) {
            Err(e) => return Err(format!("`{at}.url`: {e}")),
            Ok(_) if !self.url.starts_with("redis://") => {
                return Err(format!("`{at}.url` must start with redis:// (a TCP server; this build has no TLS)"));
            }
            Ok(_) => {}
        }
        if self.replicas == 0 {
            return Err(format!("`{at}.replicas` must be at least 1"));
        }
        if !(1..=MAX_TIMEOUT_MS).contains(&self.timeout_ms) {
            return Err(format!("`{at}.timeout_ms` must be in 1..={MAX_TIMEOUT_MS}, got {}", self.timeout_ms));
        }
        if self.failure_threshold == 0 {
            return Err(format!("`{at}.failure_threshold` must be at least 1"));
        }
        if self.open_ms == 0 {
            return Err(format!("`{at}.open_ms` must be at least 1"));
        }
        let prefix = &self.key_prefix;
        if prefix.len() > MAX_KEY_PREFIX_BYTES || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "`{at}.key_prefix` must be at most {MAX_KEY_PREFIX_BYTES} bytes with no spaces or control characters"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RedisConfig, String> {
        toml::from_str::<RedisConfig>(text).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_required_keys() {
        let c = parse("url = \"redis://127.0.0.1:6379\"\nreplicas = 3").unwrap();
        assert_eq!(c, RedisConfig::new("redis://127.0.0.1:6379", 3));
        assert_eq!((c.on_outage, c.timeout_ms, c.key_prefix.as_str()), (OnOutage::Local, 5, "tiergate:"));
        c.validate().unwrap();
        let missing = parse("url = \"redis://127.0.0.1:6379\"").unwrap_err();
        assert!(missing.contains("replicas"), "{missing}");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let unknown = parse("url = \"redis://h\"\nreplicas = 1\nreplica = 2").unwrap_err();
        assert!(unknown.contains("replica"), "{unknown}");
        let mode = parse("url = \"redis://h\"\nreplicas = 1\non_outage = \"maybe\"").unwrap_err();
        assert!(mode.contains("maybe") && mode.contains("closed"), "{mode}");
        let cases: [(&str, fn(&mut RedisConfig)); 6] = [
            ("replicas", |c| c.replicas = 0),
            ("timeout_ms", |c| c.timeout_ms = 0),
            ("timeout_ms", |c| c.timeout_ms = 5000),
            ("url", |c| c.url = "http://h:1".into()),
            ("url", |c| c.url = "rediss://h:1".into()),
            ("key_prefix", |c| c.key_prefix = "a b".into()),
        ];
        for (key, break_it) in cases {
            let mut c = RedisConfig::new("redis://127.0.0.1:6379", 2);
            break_it(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.contains(&format!("tenants.redis.{key}")), "{key}: {e}");
        }
    }

    #[test]
    fn the_whole_config_names_the_section_key() {
        use crate::config::Config;
        let base = "[tenants.redis]\nurl = \"redis://127.0.0.1:6379\"\n";
        let typo = Config::parse(&format!("{base}replicas = 2\ntimeout = 5")).unwrap_err().to_string();
        assert!(typo.contains("tenants.redis") && typo.contains("timeout"), "{typo}");
        let zero = Config::parse(&format!("{base}replicas = 0")).unwrap().validate().unwrap_err().to_string();
        assert!(zero.contains("`tenants.redis.replicas` must be at least 1"), "{zero}");
        let ok = Config::parse(&format!("{base}replicas = 3\non_outage = \"closed\"")).unwrap();
        ok.validate().unwrap();
        assert_eq!(ok.tenants.redis.map(|r| (r.replicas, r.on_outage)), Some((3, OnOutage::Closed)));
    }
}
