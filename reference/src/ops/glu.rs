//! Gated activations: `ggml_vec_swiglu_f32` and `ggml_vec_geglu_f32` (GGML_GELU_FP16 build).

use super::for_rows;
use crate::tensor::{read_row, split_row, write_row, Result};
use abi::{HostApi, OpParams, TensorDesc};
use numerics::{gelu_fp16_table, silu_scalar, v_silu};

/// SwiGLU row: whole 16-element blocks use the AVX-512 `ggml_v_silu`, the tail `ggml_silu_f32`.
pub fn swiglu_row(x: &[f32], g: &[f32], y: &mut [f32]) {
    let n = x.len();
    let full = n & !15;
    for i in 0..n {
        let s = if i < full {
            v_silu(x[i])
        } else {
            silu_scalar(x[i])
        };
        y[i] = s * g[i];
    }
}

/// GeGLU row through ggml's f16 GELU table.
pub fn geglu_row(x: &[f32], g: &[f32], y: &mut [f32]) {
    for i in 0..x.len() {
        y[i] = if x[i] <= -10.0 {
            0.0
        } else {
            gelu_fp16_table(x[i]) * g[i]
        };
    }
}

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<()> {
    let (gate, up, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let act = abi::GluAttrs::from_params(p).act;
    for_rows(host, gate.nrows(), gate.ne[0], |r| {
        let (i1, i2, i3) = split_row(gate, r);
        let x = read_row(gate, i1, i2, i3);
        let g = read_row(up, i1, i2, i3);
        let mut y = vec![0f32; x.len()];
        if act == abi::GLU_SILU {
            swiglu_row(&x, &g, &mut y);
        } else {
            geglu_row(&x, &g, &mut y);
        }
        write_row(out, i1, i2, i3, &y);
    });
    Ok(())
}
