//! The gpu tier: a local large-model path behind the same verdict type as the cpu tier.

pub mod upstream;
