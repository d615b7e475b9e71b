//! rms_norm, as `ggml_compute_forward_rms_norm_f32` followed by the weight multiply.

use super::for_rows;
use crate::tensor::{read_row, split_row, write_row, Result};
use abi::{HostApi, OpParams, TensorDesc};

/// One row: the sum of squares accumulates in f64 (each square rounded to f32 first, as
/// `sum += (ggml_float)(x*x)`), `mean = (float)(sum/n)`, `scale = 1.0f/sqrtf(mean + eps)`,
/// `y = (x * scale) * w`.
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let mut sum = 0f64;
    for &v in x {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
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
    let (x, wt, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let w = read_row(wt, 0, 0, 0);
    let eps = abi::RmsNormAttrs::from_params(p).eps;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(x, r);
        let v = read_row(x, i1, i2, i3);
        let mut y = vec![0f32; v.len()];
        rms_norm_row(&v, &w, eps, &mut y);
        write_row(out, i1, i2, i3, &y);
    });
    Ok(())
}
