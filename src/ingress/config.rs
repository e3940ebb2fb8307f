//! `[admin]` in the config file: the admin listener.

use serde::Deserialize;
use std::net::SocketAddr;

/// `[admin]`: the admin listener (`/admin/*`), never served on the public listener.
///
/// `/metrics`, the details of `/readyz` (tier state, thresholds, signals) and `?explain=true`
/// (thresholds and word attributions) are served on the admin listener; on the public one they
/// would let a client probe the cascade for inputs that just pass (an evasion oracle). The
/// `public_*` flags put them back on the public listener for deployments that want that.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Listen address; loopback only by default. Env `TIERGATE_ADMIN_LISTEN`.
    pub listen: SocketAddr,
    /// Bearer token required on `/admin/*` when set. Env `TIERGATE_ADMIN_TOKEN` overrides it.
    pub token: Option<String>,
    /// Serve `/metrics` on the public listener too (else 404 there). Default false.
    pub public_metrics: bool,
    /// Serve `/readyz`'s full body on the public listener (else only `{"status": ...}`, with the
    /// same status code). Default false.
    pub public_readyz_details: bool,
    /// Honour `?explain=true` on the public listener (else 422 naming this setting). Default false.
    pub public_explain: bool,
}

/// What the public listener serves of the admin listener's views (from [`AdminConfig`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicViews {
    pub metrics: bool,
    pub readyz_details: bool,
    pub explain: bool,
}

impl AdminConfig {
    pub fn public_views(&self) -> PublicViews {
        PublicViews {
            metrics: self.public_metrics,
            readyz_details: self.public_readyz_details,
            explain: self.public_explain,
        }
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            token: None,
            public_metrics: false,
            public_readyz_details: false,
            public_explain: false,
        }
    }
}
