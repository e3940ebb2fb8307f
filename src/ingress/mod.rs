//! Ingress: the HTTP server, its tower stack, routing and request validation.

pub mod extract;
pub mod server;
