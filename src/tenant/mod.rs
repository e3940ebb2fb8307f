//! Tenants: who a request is for (`identity`, from the sources `[tenants]` configures), what
//! its class may use (`config`), and where that state lives (`quota`: the store interface;
//! `local`: this process; `shared`: Redis, shared by a fleet of replicas; `share`: the gpu
//! tier's per-tenant concurrency; `metrics`).

pub mod config;
pub mod identity;
pub mod local;
pub mod metrics;
pub mod quota;
pub mod share;
pub mod shared;

pub use config::{ClassConfig, RateConfig, TenantsConfig};
pub use identity::{Class, Identity, Source, TenantState, Tenants};
pub use local::LocalQuotas;
pub use quota::{Denied, Limit, Quota, QuotaStore};
pub use share::{fair_share_slots, GpuSlot, GpuSlots};
