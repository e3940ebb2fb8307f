//! Tenants: who a request is for, what its class may use, and where that state lives
//! (`quota`).

pub mod quota;
pub mod shared;
