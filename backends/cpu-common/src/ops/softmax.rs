//! softmax: ggml's soft_max_f32 with the max subtracted (the sum in f64).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// Softmax of `src` (already scaled) into `w`.
#[inline(always)]
pub(crate) unsafe fn softmax_row_body(isa: Isa, src: &[f32], w: &mut [f32]) {
    let max = src.iter().fold(f32::NEG_INFINITY, |m, &v| ggml_max(m, v));
    let sum = soft_max_f32(isa, src, w, max);
    let inv = (1.0 / sum) as f32;
    for e in w.iter_mut() {
        *e *= inv;
    }
}
isa_dispatch!(softmax_row => softmax_row_body(isa_: Isa, src: &[f32], w: &mut [f32]));

pub(crate) unsafe fn softmax(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    s: f32,
) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut src = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut src);
        let mut w = vec![0f32; k];
        scale_row(isa, &mut src, s);
        softmax_row(isa, isa, &src, &mut w);
        write_from(&out, i1, i2, i3, &w);
    });
}
