//! rms_norm: ggml's f64 sum of squares, then the scaled row times the weight.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// rms_norm row: f64 sum of f32 squares, in order; `y = (x * scale) * w`.
#[inline(always)]
pub(super) unsafe fn rms_row_body(v: &mut [f32], w: &[f32], eps: f32) {
    let mut sum = 0f64;
    for &e in v.iter() {
        sum += (e * e) as f64;
    }
    let mean = (sum / v.len() as f64) as f32;
    let sc = 1.0f32 / (mean + eps).sqrt();
    for (e, &g) in v.iter_mut().zip(w) {
        *e = *e * sc * g;
    }
}
isa_dispatch!(rms_row => rms_row_body(v: &mut [f32], w: &[f32], eps: f32));

pub(super) unsafe fn rms_norm(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    eps: f32,
) {
    let (x, wt, out) = (inputs[0], inputs[1], outputs[0]);
    let k = x.ne[0] as usize;
    let mut w = vec![0f32; k];
    read_into(&wt, 0, 0, 0, &mut w);
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        rms_row(isa, &mut v, &w, eps);
        write_from(&out, i1, i2, i3, &v);
    });
}
