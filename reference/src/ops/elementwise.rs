//! add / mul (b broadcast over a) and scale.

use super::for_rows;
use crate::tensor::{read_row, split_row, write_row, Result};
use abi::{HostApi, OpParams, TensorDesc};

/// `out = op(a, b)`, b broadcast (each b dim divides a's), as ggml's binary ops.
///
/// # Safety
/// Validated call on valid memory.
pub unsafe fn binary(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    op: fn(f32, f32) -> f32,
) -> Result<()> {
    let (a, b, out) = (&inputs[0], &inputs[1], &outputs[0]);
    for_rows(host, a.nrows(), a.ne[0], |r| {
        let (i1, i2, i3) = split_row(a, r);
        let x = read_row(a, i1, i2, i3);
        let y = read_row(b, i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
        let nb0 = y.len();
        let z: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| op(v, y[i % nb0]))
            .collect();
        write_row(out, i1, i2, i3, &z);
    });
    Ok(())
}

/// `out = x * s`.
///
/// # Safety
/// Validated call on valid memory.
pub unsafe fn scale(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<()> {
    let (x, out, s) = (&inputs[0], &outputs[0], abi::ScaleAttrs::from_params(p).s);
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(x, r);
        let v: Vec<f32> = read_row(x, i1, i2, i3).iter().map(|&v| v * s).collect();
        write_row(out, i1, i2, i3, &v);
    });
    Ok(())
}
