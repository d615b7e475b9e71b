//! rms_norm, as `ggml_compute_forward_rms_norm_f32` followed by the weight multiply; norm
//! (LayerNorm and group norm) as `ggml_norm` followed by the gain and the bias; l2_norm as
//! `ggml_l2_norm`.

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

/// `norm`: each group of a row through [`numerics::norm_row`], then times the weight and plus
/// the bias, two roundings.
///
/// # Safety
/// Validated call on valid memory.
pub unsafe fn run_norm(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<()> {
    let (x, out) = (&inputs[0], &outputs[0]);
    let (w, b) = (read_row(&inputs[1], 0, 0, 0), read_row(&inputs[2], 0, 0, 0));
    let a = abi::NormAttrs::from_params(p);
    let g = a.group_len(x.ne[0]) as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(x, r);
        let mut v = read_row(x, i1, i2, i3);
        for grp in v.chunks_exact_mut(g) {
            numerics::norm_row(grp, a.eps);
        }
        for ((y, &wv), &bv) in v.iter_mut().zip(&w).zip(&b) {
            *y = *y * wv + bv;
        }
        write_row(out, i1, i2, i3, &v);
    });
    Ok(())
}

/// `l2_norm`: each row through [`numerics::l2_norm_row`].
///
/// # Safety
/// Validated call on valid memory.
pub unsafe fn run_l2(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<()> {
    let (x, out) = (&inputs[0], &outputs[0]);
    let eps = abi::L2NormAttrs::from_params(p).eps;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(x, r);
        let mut v = read_row(x, i1, i2, i3);
        numerics::l2_norm_row(&mut v, eps);
        write_row(out, i1, i2, i3, &v);
    });
    Ok(())
}
