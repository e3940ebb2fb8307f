//! tiergate's own front door: the HTTP server (hyper HTTP/1.1 and HTTP/2 under one tower
//! stack), its endpoints (`/v1/classify`, probes, metrics, `/admin/*`), and the hand-over of
//! proxied routes to [`crate::proxy`]. Errors become responses in one place ([`server`]'s
//! `handle`).

mod app;
mod config;
mod conn;
mod endpoints;
mod feedback;
mod runtime;
mod server;

pub use app::{App, Role};
pub use config::AdminConfig;
pub use runtime::runtime;
pub use server::serve;
