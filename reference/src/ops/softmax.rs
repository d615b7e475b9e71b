//! softmax, as `ggml_compute_forward_soft_max_f32` without mask or sinks.

use super::for_rows;
use crate::tensor::{read_row, split_row, write_row, Result};
use abi::{HostApi, OpParams, TensorDesc};
use numerics::{ggml_max, soft_max_f32};

/// One row in place: `w = x*scale`, `max`, exps and their f64 sum ([`soft_max_f32`]), then
/// every exp times `(float)(1.0/sum)`.
pub fn soft_max_row(w: &mut [f32]) {
    let max = w.iter().fold(f32::NEG_INFINITY, |m, &v| ggml_max(m, v));
    let src = w.to_vec();
    let sum = soft_max_f32(&src, w, max);
    let inv = (1.0 / sum) as f32;
    for v in w.iter_mut() {
        *v *= inv;
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
    let (x, out, scale) = (
        &inputs[0],
        &outputs[0],
        abi::SoftmaxAttrs::from_params(p).scale,
    );
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(x, r);
        let mut w: Vec<f32> = read_row(x, i1, i2, i3).iter().map(|&v| v * scale).collect();
        soft_max_row(&mut w);
        write_row(out, i1, i2, i3, &w);
    });
    Ok(())
}
