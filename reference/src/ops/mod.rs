//! The ops, one module per family. Each entry point assumes [`crate::ops::compute`] already
//! validated the call against its schema and checked layouts and pointers.

pub mod argmax;
pub mod attention;
pub mod elementwise;
pub mod gated_delta_net;
pub mod get_rows;
pub mod glu;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod rwkv_wkv7;
pub mod set_rows;
pub mod softmax;
pub mod ssm_conv;
pub mod token_shift;

use crate::tensor::{check_data, check_layout, Error, Result};
use abi::{HostApi, Op, OpParams, TensorDesc};
use backend_kit::par::parallel_for_shared as parallel_for;

/// Validation that needs no data: the schema, then what the reference can address.
pub fn check(op: Op, inputs: &[TensorDesc], outputs: &[TensorDesc], p: &OpParams) -> Result<()> {
    abi::validate(op, inputs, outputs, p).map_err(Error::Invalid)?;
    let s = op.schema();
    for (t, o) in inputs.iter().zip(s.inputs) {
        check_layout(t, o.name)?;
    }
    for (t, o) in outputs.iter().zip(s.outputs) {
        check_layout(t, o.name)?;
    }
    match op {
        Op::Rope => {
            let mode = abi::RopeAttrs::from_params(p).mode;
            if !matches!(mode, abi::ROPE_NORMAL | abi::ROPE_NEOX) {
                return Err(Error::Invalid(format!("rope: unknown mode {mode}")));
            }
        }
        Op::Glu => {
            let act = abi::GluAttrs::from_params(p).act;
            if !matches!(act, abi::GLU_SILU | abi::GLU_GELU_TANH) {
                return Err(Error::Invalid(format!("glu: unknown activation {act}")));
            }
        }
        Op::Attention => {
            let window = abi::AttentionAttrs::from_params(p).window;
            if window < 0 {
                return Err(Error::Invalid(format!(
                    "attention: negative window {window}"
                )));
            }
        }
        Op::MatMul => matmul::check_formats(inputs)?,
        _ => {}
    }
    Ok(())
}

/// Runs one op on host memory, validating it first.
pub fn compute(
    host: &HostApi,
    op: Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<()> {
    check(op, inputs, outputs, p)?;
    let s = op.schema();
    for (t, o) in inputs.iter().zip(s.inputs) {
        check_data(t, o.name)?;
    }
    for (t, o) in outputs.iter().zip(s.outputs) {
        check_data(t, o.name)?;
    }
    // SAFETY: validated shapes and layouts; the caller guarantees the memory behind each
    // descriptor for the duration of the call (the ABI contract).
    unsafe {
        match op {
            Op::GetRows => get_rows::run(host, inputs, outputs),
            Op::RmsNorm => norm::run(host, inputs, outputs, p),
            Op::Rope => rope::run(host, inputs, outputs, p),
            Op::MatMul => matmul::run(host, inputs, outputs, p),
            Op::Attention => attention::run(host, inputs, outputs, p),
            Op::SetRows => set_rows::run(host, inputs, outputs),
            Op::Glu => glu::run(host, inputs, outputs, p),
            Op::Add => elementwise::binary(host, inputs, outputs, |a, b| a + b),
            Op::Mul => elementwise::binary(host, inputs, outputs, |a, b| a * b),
            Op::Scale => elementwise::scale(host, inputs, outputs, p),
            Op::Softmax => softmax::run(host, inputs, outputs, p),
            Op::Argmax => argmax::run(host, inputs, outputs),
            Op::SsmConv => ssm_conv::run(host, inputs, outputs),
            Op::GatedDeltaNet => gated_delta_net::run(host, inputs, outputs),
            Op::RwkvWkv7 => rwkv_wkv7::run(host, inputs, outputs),
            Op::Norm => norm::run_norm(host, inputs, outputs, p),
            Op::L2Norm => norm::run_l2(host, inputs, outputs, p),
            Op::TokenShift => token_shift::run(host, inputs, outputs),
        }
    }
}

/// Runs `f(row)` for every row in `0..nrows`, in parallel tasks when the work is large.
pub(crate) unsafe fn for_rows<F: Fn(i64)>(host: &HostApi, nrows: i64, row_len: i64, f: F) {
    let total = nrows.saturating_mul(row_len.max(1));
    let n_tasks = if total < 32 * 1024 || host.n_threads <= 1 {
        1
    } else {
        (host.n_threads as i64 * 4).min(nrows).max(1)
    };
    let per = (nrows + n_tasks - 1) / n_tasks.max(1);
    parallel_for(host, n_tasks as u32, |t| {
        let start = t as i64 * per;
        for r in start..(start + per).min(nrows) {
            f(r);
        }
    });
}
