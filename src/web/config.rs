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
    /// Time allowed for a request head, ms: from accept until a connection's first request head
    /// has arrived whole (any protocol: a silent socket, or half an HTTP/2 preface, is closed
    /// after it). A later request's head is bounded by `idle_timeout_ms` instead, counted from the
    /// end of the previous response.
    pub header_read_timeout_ms: u64,
    /// A connection with no request in flight is closed after this long, ms (HTTP/1 keep-alive
    /// and HTTP/2 alike; HTTP/2 gets a GOAWAY). Counted from the end of its last response.
    /// Longer than the idle timeout of a load balancer in front (AWS ALB: 60 s), so that the
    /// balancer, not tiergate, closes its idle connections and never sends a request into one
    /// being closed; nginx's `keepalive_timeout` default.
    pub idle_timeout_ms: u64,
    /// HTTP/2: a PING is sent on a connection after this long without a frame from the client,
    /// ms; a client that does not answer within `http2_keep_alive_timeout_ms` is disconnected
    /// (a peer gone without a FIN or RST, which would otherwise hold its streams open).
    pub http2_keep_alive_interval_ms: u64,
    /// HTTP/2: how long a keep-alive PING may wait for its acknowledgement, ms.
    pub http2_keep_alive_timeout_ms: u64,
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
    /// Nice value of the async runtime's threads (HTTP, parsing, canonical text, signals, rules,
    /// answers), 0..=19, added to the process's own; the cpu tier's model workers keep the
    /// process's. Above 0 the kernel gives the workers the larger share of a contended CPU: a
    /// retry storm answered by the rules no longer halves the model's throughput, but when the
    /// rules' excess needs more CPU than its share, their answers wait instead (measured in
    /// docs/BENCHMARKS.md "A retry storm"; 0, the default, keeps excess answers fast). Raising a
    /// thread's nice value needs no privilege; threads the runtime starts inherit it.
    pub runtime_nice: i32,
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
            idle_timeout_ms: 75_000,
            http2_keep_alive_interval_ms: 20_000,
            http2_keep_alive_timeout_ms: 20_000,
            max_header_bytes: 64 * 1024,
            shutdown_grace_ms: 10_000,
            max_concurrent_requests: 4_096,
            max_connections: 16_384,
            runtime_nice: 0,
        }
    }
}
