//! Static configuration: listeners, limits, model and policy locations.
//!
//! Read from a TOML file (`config/tiergate.toml` by default). Relative paths in the file
//! are resolved against the file's own directory, so the bundled config works from any
//! working directory. Unknown keys are errors: a typo must not silently keep a default.

use crate::signals::SignalsConfig;
use crate::tier::breaker::BreakerConfig;
use crate::tier::gpu::upstream::UpstreamConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelConfig,
    pub policies: PoliciesConfig,
    pub gpu: GpuConfig,
    pub signals: SignalsConfig,
    pub admission: AdmissionConfig,
    pub admin: AdminConfig,
    pub shadow: ShadowConfig,
    /// Upstream client settings for `routes`.
    pub proxy: crate::proxy::config::ProxyConfig,
    /// Reverse-proxy routes, matched in order before tiergate's own endpoints.
    pub routes: Vec<crate::proxy::config::RouteConfig>,
}

/// `[shadow]`: a candidate policy evaluated beside the live one without affecting answers.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShadowConfig {
    /// The candidate's policy directory; unset: no shadow evaluation.
    pub dir: Option<PathBuf>,
    /// Share of requests also decided by the candidate, [0, 1].
    pub share: f64,
    /// JSON-lines file for disagreements (both decisions); unset: only counted in metrics.
    pub log: Option<PathBuf>,
}

/// `[admission]`: per-tenant rate limits (GCRA, crate `governor`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Sustained requests per second per tenant; 0 turns tenant limits off.
    pub tenant_rps: u32,
    /// Burst size per tenant.
    pub tenant_burst: u32,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig { tenant_rps: 0, tenant_burst: 50 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Public listener. Env `TIERGATE_LISTEN` / `--listen` override it.
    pub listen: SocketAddr,
    /// Largest accepted request body, bytes (413 above).
    pub max_body_bytes: usize,
    /// Largest accepted `text`, bytes (422 above).
    pub max_text_bytes: usize,
    /// Most keys accepted in `features` (422 above).
    pub max_features: usize,
    /// Deadline for a decision when the request sets none (`x-tiergate-deadline-ms`), ms.
    /// Past it the model tiers are abandoned and rules decide.
    pub default_deadline_ms: u64,
    /// Largest deadline a request may ask for, ms.
    pub max_deadline_ms: u64,
    /// Hard limit on a whole request, body read included (408 above). Protects against slow clients.
    pub request_timeout_ms: u64,
    /// Time allowed to read request headers, ms.
    pub header_read_timeout_ms: u64,
    /// Largest request head (request line and headers), bytes; 431 above.
    pub max_header_bytes: usize,
    /// On SIGTERM/SIGINT: how long in-flight requests may take to finish, ms.
    pub shutdown_grace_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Directory holding `model.json`, the ONNX file, `tokenizer.json`, `calibration.json`, `ood.json`.
    pub dir: PathBuf,
    /// Path of `libonnxruntime.so`; unset: `ORT_DYLIB_PATH`, then the cache, then fetched from PyPI.
    pub onnxruntime: Option<PathBuf>,
    /// ONNX Runtime intra-op threads per session.
    pub intra_threads: usize,
    /// Whether ONNX Runtime's intra-op threads spin while waiting for work. Spinning cuts
    /// latency on an idle machine and steals CPU from everything else on a busy one.
    pub intra_op_spinning: bool,
    /// Sessions, each driven by its own blocking worker thread.
    pub sessions: usize,
    /// Most requests run together in one inference call.
    pub max_batch: usize,
    /// How long the first request of a batch may wait for more to join, µs (0: only requests
    /// already waiting join; nothing is held back).
    pub max_queue_delay_us: u64,
    /// Bounded queue in front of the workers; a full queue sheds the request to the next stage.
    pub queue_capacity: usize,
    /// ONNX Runtime execution provider: `cpu` or `cuda`.
    pub provider: Provider,
    /// CUDA device ordinal (provider `cuda`).
    pub device_id: i32,
}

/// An ONNX Runtime execution provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    #[default]
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoliciesConfig {
    /// Directory of policy files (`*.toml`), merged in file-name order.
    pub dir: PathBuf,
    /// Reload when a file in `dir` changes (SIGHUP and `POST /admin/reload` always work).
    pub watch: bool,
    /// Quiet time after the last change before reloading, ms.
    pub debounce_ms: u64,
}

/// `[admin]`: the admin listener (`/admin/*`), never served on the public listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Listen address; loopback only by default. Env `TIERGATE_ADMIN_LISTEN`.
    pub listen: SocketAddr,
    /// Bearer token required on `/admin/*` when set. Env `TIERGATE_ADMIN_TOKEN` overrides it.
    pub token: Option<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { listen: SocketAddr::from(([127, 0, 0, 1], 9090)), token: None }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// The gpu tier's backend: `none`, `onnx` (in-process) or `upstream` (model servers).
    pub backend: GpuBackend,
    /// Per-request timeout on the gpu tier, ms (the request's deadline may cut it shorter).
    pub timeout_ms: u64,
    /// Most requests on the gpu tier at once; more are refused (`shed`) and route down.
    pub max_concurrency: usize,
    pub circuit: BreakerConfig,
    /// `backend = "onnx"`: a larger or full-precision classifier with its own calibration.
    pub onnx: ModelConfig,
    /// `backend = "upstream"`: OpenAI-compatible model servers.
    pub upstream: UpstreamConfig,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            backend: GpuBackend::None,
            timeout_ms: 2000,
            max_concurrency: 32,
            circuit: BreakerConfig::default(),
            onnx: ModelConfig { provider: Provider::Cuda, sessions: 1, max_batch: 32, ..ModelConfig::default() },
            upstream: UpstreamConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuBackend {
    #[default]
    None,
    Onnx,
    Upstream,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_body_bytes: 64 * 1024,
            max_text_bytes: 16 * 1024,
            max_features: 64,
            default_deadline_ms: 200,
            max_deadline_ms: 10_000,
            request_timeout_ms: 15_000,
            header_read_timeout_ms: 5_000,
            max_header_bytes: 64 * 1024,
            shutdown_grace_ms: 10_000,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            dir: PathBuf::from("models"),
            onnxruntime: None,
            // Two single-threaded sessions beat one two-threaded session on 2 cores, raw and end to
            // end, and a batch of 4 sustains the most under a 50 ms p99 (docs/BENCHMARKS.md).
            intra_threads: 1,
            intra_op_spinning: false,
            sessions: 2,
            max_batch: 4,
            max_queue_delay_us: 0,
            queue_capacity: 256,
            provider: Provider::Cpu,
            device_id: 0,
        }
    }
}

impl Default for PoliciesConfig {
    fn default() -> Self {
        PoliciesConfig { dir: PathBuf::from("policies"), watch: true, debounce_ms: 100 }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            model: ModelConfig::default(),
            policies: PoliciesConfig::default(),
            gpu: GpuConfig::default(),
            signals: SignalsConfig::default(),
            admission: AdmissionConfig::default(),
            admin: AdminConfig::default(),
            shadow: ShadowConfig::default(),
            proxy: Default::default(),
            routes: Vec::new(),
        }
    }
}

impl Config {
    /// Reads and validates a config file; relative paths become relative to its directory.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading config {}: {e}", path.display()))?;
        let mut config = Config::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        config.model.dir = base.join(&config.model.dir);
        config.model.onnxruntime = config.model.onnxruntime.map(|p| base.join(p));
        // Lexically normalised (`a/./b` is `a/b`): route policies are told apart by directory.
        let normal = |p: PathBuf| -> PathBuf { p.components().collect() };
        config.policies.dir = normal(base.join(&config.policies.dir));
        config.gpu.onnx.dir = base.join(&config.gpu.onnx.dir);
        config.shadow.dir = config.shadow.dir.map(|d| base.join(d));
        config.shadow.log = config.shadow.log.map(|d| base.join(d));
        for route in &mut config.routes {
            if let Some(screen) = &mut route.screen {
                screen.policy = screen.policy.take().map(|d| normal(base.join(d)));
            }
        }
        config.validate().map_err(|e| format!("config {}: {e}", path.display()))?;
        Ok(config)
    }

    /// Parses config text: TOML, then `${VAR}` / `${VAR:-default}` in string values replaced
    /// from the environment (`$${` is a literal `${`), then the typed config. Errors name the
    /// key (`routes[0].upstream[0]: ...`); TOML syntax errors carry the line.
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
        for (key, value) in table.iter_mut() {
            interpolate(value, key)?;
        }
        serde_path_to_error::deserialize(table).map_err(|e| {
            let at = e.path().to_string();
            if at == "." {
                e.inner().to_string()
            } else {
                format!("{at}: {}", e.inner())
            }
        })
    }

    pub fn validate(&self) -> Result<(), String> {
        let s = &self.server;
        let m = &self.model;
        let positive = [
            ("server.max_body_bytes", s.max_body_bytes as u64),
            ("server.max_text_bytes", s.max_text_bytes as u64),
            ("server.default_deadline_ms", s.default_deadline_ms),
            ("server.request_timeout_ms", s.request_timeout_ms),
            ("server.max_header_bytes", s.max_header_bytes as u64),
            ("model.intra_threads", m.intra_threads as u64),
            ("model.sessions", m.sessions as u64),
            ("model.max_batch", m.max_batch as u64),
            ("model.queue_capacity", m.queue_capacity as u64),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be at least 1"));
        }
        if m.provider != Provider::Cpu {
            return Err(
                "`model.provider` must be \"cpu\": the cpu tier runs on the CPU (use [gpu.onnx] for CUDA)".into()
            );
        }
        if !(0.0..=1.0).contains(&self.shadow.share) {
            return Err(format!("`shadow.share` must be in [0, 1], got {}", self.shadow.share));
        }
        if self.gpu.max_concurrency == 0 {
            return Err("`gpu.max_concurrency` must be at least 1".into());
        }
        if self.gpu.backend == GpuBackend::Upstream {
            self.gpu.upstream.validate().map_err(|e| format!("[gpu.upstream]: {e}"))?;
        }
        crate::proxy::Proxy::new(&self.proxy, &self.routes)?;
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
        let err = Config::parse("[[routes]]\nname = \"r\"\nupstream = [\"${TIERGATE_TEST_UNSET_VAR}\"]").unwrap_err();
        assert!(err.starts_with("routes[0].upstream[0]: environment variable"), "{err}");
        let err = Config::parse("[server]\nmax_body_bytes = \"big\"").unwrap_err();
        assert!(err.starts_with("server.max_body_bytes: invalid type"), "{err}");
        let err = Config::parse("[server]\nlisten = \"127.0.0.1:8080\"\nbogus = 1").unwrap_err();
        assert!(err.contains("unknown field `bogus`"), "{err}");
    }
}
