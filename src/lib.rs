//! tiergate: a tiered model router and load-balancing proxy for risk-control inference.
//!
//! One request flows through the modules in this order (the map: `docs/ARCHITECTURE.md`):
//! a front door — [`ingress`] (tiergate's own endpoints) or [`proxy`] (screened routes to an
//! app), both on the HTTP floor [`web`] — builds one [`request::ClassifyRequest`]; the
//! [`gateway`] rates it ([`complexity`]), asks [`select`] (pure tier selection) where to start
//! and what comes after each stage, runs the [`tier`]s (cpu model, gpu model) with
//! [`calibrate`]d scores, falls back to [`rules`], and returns a [`decision`], whose signals
//! also feed the [`drift`] monitor. [`policy`] and
//! [`signals`] are its inputs, [`metrics`], [`trace`]s and the [`audit`] trail its side outputs
//! ([`feedback`] labels join the trail's records; analysts label in the review [`console`]), [`error`] the one place errors
//! become HTTP responses, and [`config`] composes every component's own config section.

pub mod action;
pub mod audit;
pub mod balance;
pub mod breaker;
pub mod calibrate;
pub mod campaign;
pub mod complexity;
pub mod config;
pub mod console;
pub mod decision;
pub mod drift;
pub mod error;
pub mod features_model;
pub mod feedback;
pub mod gateway;
pub mod ingress;
pub mod malloc;
pub mod metrics;
pub mod ort_lib;
pub mod plot;
pub mod policy;
pub mod proxy;
pub mod readings;
pub mod request;
pub mod rules;
pub mod select;
pub mod tenant;
#[cfg(test)]
mod test_support;
pub mod text;
pub mod tier;
pub mod trace;
pub mod web;

pub use config::Config;
pub use gateway::Gateway;
pub use ingress::{serve, App, Role};
pub use request::ClassifyRequest;
