//! # mollm reference implementation
//!
//! The executable meaning of every op in [`abi::SCHEMAS`], numerically mirroring llama.cpp's
//! CPU backend (AVX-512 build): see [`ggml`] for the kernel twins and each op module for the
//! order of operations. Usable three ways:
//!
//! - [`run`]: a safe-ish Rust call (`ops::compute`) on host tensors;
//! - [`backend::TABLE`] / [`backend::HEADER`] (and `mollm_backend_entry` with feature
//!   `entry`): as an ABI backend;
//! - [`ggml`], [`glue`], [`par`]: the numerics, C-table plumbing and thread-pool glue the
//!   native backends share with it (one copy of each);
//! - [`serial_host`] / [`scoped_threads_host`]: hosts for tests and tools.

pub mod backend;
pub mod ggml;
pub mod glue;
pub mod ops;
pub mod par;
pub mod tensor;

#[cfg(feature = "entry")]
pub use backend::mollm_backend_entry;
pub use backend::{HEADER, TABLE};
pub use par::{parallel_for, scoped_threads_host, serial_host};
pub use tensor::Error;

use abi::{HostApi, Op, OpParams, TensorDesc};

/// Runs one op on host memory through the reference, validating it first. Panics inside are
/// not caught here (the ABI `compute` catches them).
///
/// # Safety
/// Every descriptor's memory must be valid for its shape and strides for the call.
pub unsafe fn run(
    host: &HostApi,
    op: Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    params: &OpParams,
) -> Result<(), Error> {
    ops::compute(host, op, inputs, outputs, params)
}
