//! # mollm reference implementation
//!
//! The executable meaning of every op in [`abi::SCHEMAS`], numerically mirroring llama.cpp's
//! CPU backend (AVX-512 build): each op module gives the order of operations, computed with
//! ggml's numerics (the `numerics` crate, which the backends link too; they do not link this
//! spec except to test against it). Usable these ways:
//!
//! - [`run`]: a safe-ish Rust call (`ops::compute`) on host tensors;
//! - [`backend::TABLE`] / [`backend::HEADER`] (and `mollm_backend_entry` with feature
//!   `entry`): as an ABI backend;
//! - [`serial_host`] / [`scoped_threads_host`]: hosts for tests and tools.

pub mod backend;
pub mod ops;
pub mod tensor;

#[cfg(feature = "entry")]
pub use backend::mollm_backend_entry;
pub use backend::{HEADER, TABLE};
pub use backend_kit::{parallel_for, scoped_threads_host, serial_host};
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
