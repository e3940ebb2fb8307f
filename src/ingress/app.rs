//! What a listener's request handlers share: the gateway, the server's limits and the listener's
//! [`Role`] (which routes it serves). Its own file so that the server and the endpoints both
//! use it without using each other.

use super::config::{AdminConfig, PublicViews};
use crate::gateway::Gateway;
use crate::proxy::{Port, Proxy};
use crate::web::ServerConfig;
use std::sync::Arc;

/// What the request handlers share.
pub struct App {
    pub gateway: Arc<Gateway>,
    /// The gateway as the proxy's routes reach it.
    pub port: Port,
    pub server: ServerConfig,
    pub role: Role,
}

impl App {
    /// The public listener's app (the proxy's routes, then tiergate's own endpoints) and the
    /// admin listener's (`[admin]`), sharing the routes' app addresses and their state.
    pub fn pair(
        gateway: Arc<Gateway>,
        server: &ServerConfig,
        admin_config: &AdminConfig,
        proxy: Option<Proxy>,
    ) -> (App, App) {
        let proxy = proxy.map(Arc::new);
        let admin = App {
            port: Port::from(Arc::clone(&gateway)),
            gateway: Arc::clone(&gateway),
            server: server.clone(),
            role: Role::Admin { token: admin_config.token.clone(), proxy: proxy.clone() },
        };
        let views = admin_config.public_views();
        let port = Port::from(Arc::clone(&gateway));
        (App { gateway, port, server: server.clone(), role: Role::Public { proxy, views } }, admin)
    }
}

/// Which routes a listener serves. Admin routes are never served on the public listener.
pub enum Role {
    /// Proxy routes (when configured, matched first), `/v1/classify`, `/healthz`, `/readyz`
    /// (its status only, unless `views`), `/metrics` (when `views` says so).
    Public { proxy: Option<Arc<Proxy>>, views: PublicViews },
    /// `/admin/policy`, `/admin/reload` (with a bearer token when one is set), the review console
    /// (`/admin/console`, `/admin/review/*`: a session or the bearer token), and without one
    /// `POST /v1/classify` and the probes `/healthz`, `/readyz`, `/metrics`.
    Admin { token: Option<String>, proxy: Option<Arc<Proxy>> },
}
