//! `[server]` in the config file: the public listener and the limits every front door applies.

use serde::Deserialize;
use std::net::SocketAddr;

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
    /// Most requests a listener handles at once (each listener its own count), from arrival
    /// until the response head is sent; past it a request is shed at once with 503
    /// `overloaded` and `Retry-After: 1`, before its body is read. Bounds the memory and tasks a
    /// flood can take (tower's load-shed pattern: refuse at once rather than queue).
    pub max_concurrent_requests: usize,
    /// Most open client connections per listener; past it new connections wait in the kernel's
    /// accept backlog until one closes (nginx's `worker_connections`).
    pub max_connections: usize,
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
            max_concurrent_requests: 4_096,
            max_connections: 16_384,
        }
    }
}
