//! Static configuration: listeners, limits, model and policy locations.
//!
//! Read from a TOML file (`config/tiergate.toml` by default). Relative paths in the file
//! are resolved against the file's own directory, so the bundled config works from any
//! working directory. Unknown keys are errors: a typo must not silently keep a default.

use crate::audit::AuditConfig;
use crate::drift::DriftConfig;
use crate::gateway::{AbConfig, AdmissionConfig, CacheConfig, GatewayConfig, ShadowConfig};
use crate::ingress::AdminConfig;
use crate::policy::PoliciesConfig;
use crate::proxy::config::{ProxyConfig, RouteConfig};
use crate::proxy::Proxy;
use crate::readings::ReadingsConfig;
use crate::tenant::TenantsConfig;
use crate::tier::{GpuConfig, ModelConfig, Provider};
use crate::trace::TracingConfig;
use crate::web::ServerConfig;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Why a config could not be loaded. Every message names the key or the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The inner errors are fields named `error`, not `source`: the message already holds them,
    // and as error sources `{:#}` would print them a second time.
    /// The file could not be read.
    #[error("reading config {}: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    /// TOML syntax (with the line), an unknown key, a wrong type or an unset `${VAR}`, as
    /// `key.path: problem`.
    #[error("{0}")]
    Parse(String),
    /// A value out of range or an inconsistent combination, naming the key.
    #[error("{0}")]
    Invalid(String),
    /// One of the above, in the named file.
    #[error("config {}: {error}", path.display())]
    InFile { path: PathBuf, error: Box<ConfigError> },
}

/// The whole config file: each section's type is defined by the component that uses it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelConfig,
    /// `[confirm]`: the confirm model, a larger classifier on the CPU that gives an unsure cpu
    /// risk verdict a second opinion (`[cascade] confirm_from` in the policy); the `[model]`
    /// keys, `dir` required. Absent: none.
    pub confirm: Option<ModelConfig>,
    pub policies: PoliciesConfig,
    pub gpu: GpuConfig,
    /// `[readings]`: how load is sampled (the old name `[signals]` is still read).
    #[serde(alias = "signals")]
    pub readings: ReadingsConfig,
    pub admission: AdmissionConfig,
    /// Tenants: identity sources, classes, quotas (`crate::tenant`).
    pub tenants: TenantsConfig,
    pub admin: AdminConfig,
    pub shadow: ShadowConfig,
    /// A candidate policy deciding a share of live traffic, rolled back automatically.
    pub ab: AbConfig,
    /// The live drift monitor.
    pub drift: DriftConfig,
    /// The app client settings for `routes`.
    pub proxy: ProxyConfig,
    /// Reverse-proxy routes, matched in order before tiergate's own endpoints.
    pub routes: Vec<RouteConfig>,
    /// The audit trail; absent: off.
    pub audit: Option<AuditConfig>,
    /// OpenTelemetry traces (`[tracing]`); off by default.
    pub tracing: TracingConfig,
    /// `[features_model]`: the features model's directory; absent: none.
    pub features_model: Option<crate::features_model::FeaturesModelConfig>,
    /// The verdict cache (`[cache]`); off by default.
    pub cache: CacheConfig,
    /// Campaign and entity velocity (`[campaign]`); off by default.
    pub campaign: crate::campaign::CampaignConfig,
    /// Labels and live quality (`[feedback]`); on with `[audit]`.
    pub feedback: crate::feedback::FeedbackConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            model: ModelConfig::default(),
            confirm: None,
            policies: PoliciesConfig::default(),
            gpu: GpuConfig::default(),
            readings: ReadingsConfig::default(),
            admission: AdmissionConfig::default(),
            tenants: TenantsConfig::default(),
            admin: AdminConfig::default(),
            shadow: ShadowConfig::default(),
            ab: AbConfig::default(),
            drift: DriftConfig::default(),
            proxy: Default::default(),
            routes: Vec::new(),
            audit: None,
            tracing: TracingConfig::default(),
            features_model: None,
            cache: CacheConfig::default(),
            campaign: Default::default(),
            feedback: Default::default(),
        }
    }
}

impl Config {
    /// Reads and validates a config file; relative paths become relative to its directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let in_file = |e: ConfigError| ConfigError::InFile { path: path.to_path_buf(), error: Box::new(e) };
        let text =
            std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.to_path_buf(), error })?;
        let mut config = Config::parse(&text).map_err(in_file)?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.model.dir = base.join(&config.model.dir);
        config.model.onnxruntime = config.model.onnxruntime.map(|p| base.join(p));
        // Lexically normalised (`a/./b` is `a/b`): route policies are told apart by directory.
        let normal = |p: PathBuf| -> PathBuf { p.components().collect() };
        config.policies.dir = normal(base.join(&config.policies.dir));
        config.gpu.onnx.dir = base.join(&config.gpu.onnx.dir);
        config.shadow.dir = config.shadow.dir.map(|d| base.join(d));
        config.shadow.log = config.shadow.log.map(|d| base.join(d));
        for m in config.shadow.model.iter_mut().chain(config.confirm.iter_mut()) {
            m.dir = base.join(&m.dir);
            m.onnxruntime = m.onnxruntime.take().map(|p| base.join(p));
        }
        config.ab.dir = config.ab.dir.map(|d| base.join(d));
        if let Some(f) = &mut config.features_model {
            f.dir = base.join(&f.dir);
        }
        if let Some(audit) = &mut config.audit {
            audit.dir = base.join(&audit.dir);
            audit.key_file = audit.key_file.take().map(|p| base.join(p));
        }
        config.drift.reference = config.drift.reference.map(|d| base.join(d));
        for route in &mut config.routes {
            if let Some(screen) = &mut route.screen {
                screen.policy = screen.policy.take().map(|d| normal(base.join(d)));
            }
        }
        config.validate().map_err(in_file)?;
        Ok(config)
    }

    /// Parses config text: TOML, then `${VAR}` / `${VAR:-default}` in string values replaced
    /// from the environment (`$${` is a literal `${`), then the typed config. Errors name the
    /// key (`routes[0].upstream[0]: ...`); TOML syntax errors carry the line.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        // `[shadow.model]` without `dir` would shadow the live model with itself (the `[model]` default).
        if table.get("shadow").and_then(|s| s.get("model")).is_some_and(|m| m.get("dir").is_none()) {
            return Err(ConfigError::Invalid("`shadow.model.dir` is required: the candidate model's directory".into()));
        }
        if table.get("confirm").is_some_and(|m| m.get("dir").is_none()) {
            return Err(ConfigError::Invalid("`confirm.dir` is required: the confirm model's directory".into()));
        }
        for (key, value) in table.iter_mut() {
            interpolate(value, key).map_err(ConfigError::Parse)?;
            check_durations(value, key).map_err(ConfigError::Invalid)?;
        }
        serde_path_to_error::deserialize(table).map_err(|e| {
            let at = e.path().to_string();
            ConfigError::Parse(if at == "." { e.inner().to_string() } else { format!("{at}: {}", e.inner()) })
        })
    }

    /// The sections the gateway starts from.
    pub fn gateway(&self) -> GatewayConfig<'_> {
        GatewayConfig {
            model: &self.model,
            confirm: self.confirm.as_ref(),
            gpu: &self.gpu,
            policies: &self.policies,
            readings: &self.readings,
            admission: &self.admission,
            tenants: &self.tenants,
            shadow: &self.shadow,
            ab: &self.ab,
            limits: crate::policy::Limits { max_deadline_ms: self.server.max_deadline_ms },
            drift: &self.drift,
            route_policies: self.routes.iter().filter_map(|r| r.screen.as_ref()?.policy.clone()).collect(),
            audit: self.audit.as_ref(),
            tracing: &self.tracing,
            features_model: self.features_model.as_ref(),
            cache: &self.cache,
            campaign: &self.campaign,
            feedback: &self.feedback,
            admin_token: self.admin.token.as_deref(),
        }
    }

    /// The reverse proxy for `routes` (`None` without routes), with its app clients.
    pub fn proxy(&self) -> Result<Option<Proxy>, ConfigError> {
        Proxy::new(&self.proxy, &self.routes).map_err(ConfigError::Invalid)
    }

    /// Checks ranges and combinations across sections; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check().map_err(ConfigError::Invalid)
    }

    fn check(&self) -> Result<(), String> {
        self.tracing.check()?;
        self.cache.validate()?;
        self.campaign.validate()?;
        self.feedback.validate()?;
        let s = &self.server;
        let positive = [
            ("server.max_body_bytes", s.max_body_bytes as u64),
            ("server.max_text_bytes", s.max_text_bytes as u64),
            ("server.default_deadline_ms", s.default_deadline_ms),
            ("server.request_timeout_ms", s.request_timeout_ms),
            ("server.max_header_bytes", s.max_header_bytes as u64),
            // 0 would close every connection before its first request, or never ping.
            ("server.header_read_timeout_ms", s.header_read_timeout_ms),
            ("server.idle_timeout_ms", s.idle_timeout_ms),
            ("server.http2_keep_alive_interval_ms", s.http2_keep_alive_interval_ms),
            ("server.http2_keep_alive_timeout_ms", s.http2_keep_alive_timeout_ms),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be at least 1"));
        }
        // Every in-process cpu model: the cpu tier's, the shadow candidate, the confirm model.
        let models = [
            ("model", Some(&self.model)),
            ("shadow.model", self.shadow.model.as_ref()),
            ("confirm", self.confirm.as_ref()),
        ];
        for (key, c) in models.iter().filter_map(|(key, c)| Some((*key, (*c)?))) {
            let counts = [
                ("intra_threads", c.intra_threads),
                ("sessions", c.sessions),
                ("max_batch", c.max_batch),
                ("queue_capacity", c.queue_capacity),
            ];
            if let Some((name, _)) = counts.iter().find(|(_, v)| *v == 0) {
                return Err(format!("`{key}.{name}` must be at least 1"));
            }
            if c.provider != Provider::Cpu {
                return Err(format!(
                    "`{key}.provider` must be \"cpu\": the cpu tier runs on the CPU (use [gpu.onnx] for CUDA)"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.shadow.share) {
            return Err(format!("`shadow.share` must be in [0, 1], got {}", self.shadow.share));
        }
        self.ab.validate()?;
        crate::tier::gpu::validate(&self.gpu)?;
        self.drift.validate()?;
        self.admission.validate()?;
        self.tenants.check(self.admission.quota())?;
        for (i, route) in self.routes.iter().enumerate() {
            if let Some(tenant) = route.screen.as_ref().and_then(|s| s.tenant_name.as_deref()) {
                self.tenants.check_route_tenant(&format!("routes[{i}].screen.tenant_name"), tenant)?;
            }
        }
        crate::proxy::validate(&self.proxy, &self.routes)?;
        if let Some(audit) = &self.audit {
            audit.validate()?;
        }
        if !(0..=19).contains(&s.runtime_nice) {
            return Err(format!("`server.runtime_nice` must be in 0..=19 (a nice value), got {}", s.runtime_nice));
        }
        if s.default_deadline_ms > s.max_deadline_ms {
            return Err("`server.default_deadline_ms` must not exceed `server.max_deadline_ms`".into());
        }
        Ok(())
    }
}

/// Replaces `${VAR}` and `${VAR:-default}` in every string under `value`; `at` is its key path.
fn interpolate(value: &mut toml::Value, at: &str) -> Result<(), String> {
    match value {
        toml::Value::String(s) => {
            *s = expand_env(s, |name| std::env::var(name).ok()).map_err(|e| format!("{at}: {e}"))?
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                interpolate(item, &format!("{at}[{i}]"))?;
            }
        }
        toml::Value::Table(table) => {
            for (key, item) in table.iter_mut() {
                interpolate(item, &format!("{at}.{key}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The longest duration any setting may name: one day. Durations become `Duration`s added to
/// `Instant`s, and a huge one (up to `i64::MAX` ms in TOML) overflows that addition and panics
/// on a request path; no timeout, interval or ejection in tiergate needs to be longer.
pub const MAX_DURATION_MS: u64 = 24 * 60 * 60 * 1000;

/// Errors on any key ending in `_ms` (milliseconds) or `_us` (microseconds), at any depth,
/// whose value is over [`MAX_DURATION_MS`], naming the key and the limit.
fn check_durations(value: &toml::Value, at: &str) -> Result<(), String> {
    match value {
        toml::Value::Integer(n) => {
            let limit = match at.rsplit('.').next().unwrap_or(at) {
                k if k.ends_with("_ms") => MAX_DURATION_MS,
                k if k.ends_with("_us") => MAX_DURATION_MS * 1000,
                _ => return Ok(()),
            };
            if u64::try_from(*n).is_ok_and(|n| n > limit) {
                let unit = if limit == MAX_DURATION_MS { "ms" } else { "µs" };
                return Err(format!("{at}: {n} is over the limit of {limit} {unit} (1 day)"));
            }
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check_durations(item, &format!("{at}[{i}]"))?;
            }
        }
        toml::Value::Table(table) => {
            for (key, item) in table {
                check_durations(item, &format!("{at}.{key}"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Shell-style expansion of `${NAME}` and `${NAME:-default}` (the default when unset or empty);
/// `$${` stays a literal `${`. An unset variable without a default is an error.
fn expand_env(s: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(literal) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(inner) = after.strip_prefix("${") {
            let end = inner.find('}').ok_or_else(|| format!("unclosed `${{` in `{s}`"))?;
            let (name, default) = match inner[..end].split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (&inner[..end], None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("`${{{}}}` is not a variable name", &inner[..end]));
            }
            match (lookup(name).filter(|v| !v.is_empty()), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                    "environment variable `{name}` is not set or is empty (write `${{{name}:-default}}` for a default)"
                ))
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_nice_value_is_a_nice_value() {
        let config = Config::parse("[server]\nruntime_nice = 10").unwrap();
        assert!(config.validate().is_ok());
        assert_eq!(config.server.runtime_nice, 10);
        for bad in ["-1", "20"] {
            let config = Config::parse(&format!("[server]\nruntime_nice = {bad}")).unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains("server.runtime_nice") && err.contains("0..=19"), "{err}");
        }
    }

    #[test]
    fn durations_over_a_day_are_refused_naming_the_key() {
        // Without the check this parses, and `Instant::now() + request_timeout` panics.
        let err = Config::parse("[server]\nrequest_timeout_ms = 9223372036854775807").unwrap_err().to_string();
        assert!(err.contains("server.request_timeout_ms") && err.contains("86400000"), "{err}");
        let err = Config::parse("[model]\nmax_queue_delay_us = 86400000001").unwrap_err().to_string();
        assert!(err.contains("model.max_queue_delay_us") && err.contains("µs"), "{err}");
        assert!(Config::parse("[gpu]\ntimeout_ms = 86400000").is_ok());
    }

    #[test]
    fn a_shadow_model_is_checked_like_the_live_one_and_found_beside_the_config() {
        let err = Config::parse("[shadow.model]\nsessions = 1").unwrap_err().to_string();
        assert!(err.contains("`shadow.model.dir` is required"), "{err}");
        let c = Config::parse("[shadow.model]\ndir = \"m\"\nsessions = 0").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("`shadow.model.sessions` must be at least 1"));
        let c = Config::parse("[shadow.model]\ndir = \"m\"\nprovider = \"cuda\"").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("`shadow.model.provider` must be \"cpu\""));
        let dir = std::env::temp_dir().join(format!("tiergate-config-shadow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.toml"), "[shadow.model]\ndir = \"../cand\"\n").unwrap();
        let c = Config::load(&dir.join("t.toml")).unwrap();
        assert_eq!(c.shadow.model.unwrap().dir, dir.join("../cand"), "relative to the config file, as every path");
    }

    #[test]
    fn a_confirm_model_is_checked_like_the_live_one_and_found_beside_the_config() {
        let err = Config::parse("[confirm]\nsessions = 1").unwrap_err().to_string();
        assert!(err.contains("`confirm.dir` is required"), "{err}");
        let c = Config::parse("[confirm]\ndir = \"m\"\nqueue_capacity = 0").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("`confirm.queue_capacity` must be at least 1"));
        let c = Config::parse("[confirm]\ndir = \"m\"\nprovider = \"cuda\"").unwrap();
        assert!(c.validate().unwrap_err().to_string().contains("`confirm.provider` must be \"cpu\""));
        let dir = std::env::temp_dir().join(format!("tiergate-config-confirm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("t.toml"), "[confirm]\ndir = \"../big\"\nsessions = 1\n").unwrap();
        let c = Config::load(&dir.join("t.toml")).unwrap();
        assert_eq!(c.confirm.unwrap().dir, dir.join("../big"), "relative to the config file, as every path");
        assert!(Config::parse("").unwrap().confirm.is_none(), "none unless configured");
    }

    #[test]
    fn readings_is_also_read_under_its_old_name_signals() {
        assert_eq!(Config::parse("[readings]\ncpu_interval_ms = 55").unwrap().readings.cpu_interval_ms, 55);
        assert_eq!(Config::parse("[signals]\ncpu_interval_ms = 56").unwrap().readings.cpu_interval_ms, 56);
        assert!(Config::parse("[signals]\ncpu_interval_ms = 1\n[readings]\ncpu_interval_ms = 2").is_err());
    }

    #[test]
    fn env_expansion() {
        let env = |name: &str| (name == "APP").then(|| "http://127.0.0.1:3000".to_string());
        assert_eq!(expand_env("${APP}", env).unwrap(), "http://127.0.0.1:3000");
        assert_eq!(expand_env("x ${NOPE:-d} $${APP} $5", env).unwrap(), "x d ${APP} $5");
        assert!(expand_env("${NOPE}", env).unwrap_err().contains("`NOPE` is not set"));
        assert!(expand_env("${APP", env).unwrap_err().contains("unclosed"));
        assert!(expand_env("${A-B}", env).unwrap_err().contains("not a variable name"));
    }

    #[test]
    fn errors_name_the_key() {
        let err = Config::parse("[[routes]]\nname = \"r\"\nupstream = [\"${TIERGATE_TEST_UNSET_VAR}\"]")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("routes[0].upstream[0]: environment variable"), "{err}");
        let err = Config::parse("[server]\nmax_body_bytes = \"big\"").unwrap_err().to_string();
        assert!(err.starts_with("server.max_body_bytes: invalid type"), "{err}");
        let err = Config::parse("[server]\nlisten = \"127.0.0.1:8080\"\nbogus = 1").unwrap_err().to_string();
        assert!(err.contains("unknown field `bogus`"), "{err}");
    }
}
