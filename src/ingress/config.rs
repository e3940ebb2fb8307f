//! `[admin]` in the config file: the admin listener.

use serde::Deserialize;
use std::net::SocketAddr;

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
