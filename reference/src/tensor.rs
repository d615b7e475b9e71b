//! Rows of tensors described by [`abi::TensorDesc`] as ndarray views, and (from
//! `backend_kit::tensor`) the checks and addressing every Rust backend shares.

use abi::TensorDesc;
pub use backend_kit::tensor::*;
use ndarray::{ArrayView1, ArrayViewMut1, ShapeBuilder};

/// An f32 row as an ndarray view.
///
/// # Safety
/// `t` is a checked f32 tensor whose memory is valid for reads.
#[inline]
pub unsafe fn row_f32<'a>(t: &TensorDesc, i1: i64, i2: i64, i3: i64) -> ArrayView1<'a, f32> {
    let p = row_ptr(t, i1, i2, i3) as *const f32;
    ArrayView1::from_shape_ptr((t.ne[0] as usize,).strides((t.nb[0] as usize / 4,)), p)
}

/// An f32 row as a mutable ndarray view.
///
/// # Safety
/// As [`row_f32`], valid for writes, and no other live view of the same row.
#[inline]
pub unsafe fn row_f32_mut<'a>(t: &TensorDesc, i1: i64, i2: i64, i3: i64) -> ArrayViewMut1<'a, f32> {
    let p = row_ptr(t, i1, i2, i3) as *mut f32;
    ArrayViewMut1::from_shape_ptr((t.ne[0] as usize,).strides((t.nb[0] as usize / 4,)), p)
}

/// Copies an f32 row out (so outputs may alias inputs).
///
/// # Safety
/// As [`row_f32`].
#[inline]
pub unsafe fn read_row(t: &TensorDesc, i1: i64, i2: i64, i3: i64) -> Vec<f32> {
    row_f32(t, i1, i2, i3).to_vec()
}

/// Writes an f32 row.
///
/// # Safety
/// As [`row_f32_mut`].
#[inline]
pub unsafe fn write_row(t: &TensorDesc, i1: i64, i2: i64, i3: i64, v: &[f32]) {
    let mut r = row_f32_mut(t, i1, i2, i3);
    for (d, s) in r.iter_mut().zip(v) {
        *d = *s;
    }
}
