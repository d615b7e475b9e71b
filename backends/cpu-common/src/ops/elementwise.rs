//! add, mul, scale: element-wise rows (broadcasting `y` over `x`'s rows).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

#[inline(always)]
pub(super) unsafe fn add_row_body(x: &mut [f32], y: &[f32]) {
    for c in x.chunks_exact_mut(y.len()) {
        for (v, &w) in c.iter_mut().zip(y) {
            *v += w;
        }
    }
}
isa_dispatch!(add_row => add_row_body(x: &mut [f32], y: &[f32]));

#[inline(always)]
pub(super) unsafe fn mul_row_body(x: &mut [f32], y: &[f32]) {
    for c in x.chunks_exact_mut(y.len()) {
        for (v, &w) in c.iter_mut().zip(y) {
            *v *= w;
        }
    }
}
isa_dispatch!(mul_row => mul_row_body(x: &mut [f32], y: &[f32]));

#[inline(always)]
pub(super) unsafe fn scale_row_body(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}
isa_dispatch!(scale_row => scale_row_body(x: &mut [f32], s: f32));

pub(super) unsafe fn binary(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    mul: bool,
) {
    let (a, b, out) = (inputs[0], inputs[1], outputs[0]);
    let k = a.ne[0] as usize;
    let kb = b.ne[0] as usize;
    for_rows(host, a.nrows(), a.ne[0], |r| {
        let (i1, i2, i3) = split_row(&a, r);
        let mut x = vec![0f32; k];
        let mut y = vec![0f32; kb];
        read_into(&a, i1, i2, i3, &mut x);
        read_into(&b, i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3], &mut y);
        if mul {
            mul_row(isa, &mut x, &y);
        } else {
            add_row(isa, &mut x, &y);
        }
        write_from(&out, i1, i2, i3, &x);
    });
}

pub(super) unsafe fn scale(
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
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        scale_row(isa, &mut v, s);
        write_from(&out, i1, i2, i3, &v);
    });
}
