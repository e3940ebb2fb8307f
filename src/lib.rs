//! tiergate: a tiered model router and load-balancing proxy for risk-control inference.
//!
//! One request flows through the modules in this order (see `docs/` and `../shared/DESIGN.md`):
//! [`ingress`] (HTTP, validation) -> [`gateway`] (the cascade) -> [`tier`] (cpu model) ->
//! [`calibrate`] (temperature scaling) -> [`route`] (accept or hand over) -> [`rules`]
//! (CEL fallback) -> [`decision`] (the response), with [`policy`] and [`signals`] as inputs
//! and [`metrics`] on the side. [`error`] is the one place errors become HTTP responses.

pub mod balance;
pub mod calibrate;
pub mod complexity;
pub mod config;
pub mod decision;
pub mod error;
pub mod gateway;
pub mod ingress;
pub mod metrics;
pub mod ort_lib;
pub mod policy;
pub mod proxy;
pub mod route;
pub mod rules;
pub mod signals;
pub mod tier;

pub use config::Config;
pub use gateway::{ClassifyRequest, Gateway};
pub use ingress::server::{serve, App, Role};
