//! Live signals about the machine. So far: which CUDA devices exist and their memory headroom.

pub mod gpu;
