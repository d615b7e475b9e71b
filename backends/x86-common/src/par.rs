//! `HostApi::parallel_for` for Rust closures: shared with every CPU backend
//! (`mollm_cpu_common::par`).

pub use mollm_cpu_common::par::*;
