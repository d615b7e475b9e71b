//! Horizontal sums the 256-bit ([`crate::simd`]) and 512-bit ([`crate::kq512`]) kernels both
//! end with: a leaf, so that neither kernel module imports the other's helpers.

use core::arch::x86_64::*;

/// ggml's `hsum_float_8`, replayed on the stored lanes: `((x0+x4) + (x2+x6)) + ((x1+x5) +
/// (x3+x7))`.
#[inline(always)]
pub(crate) unsafe fn hsum_float_8(v: __m256) -> f32 {
    let mut x = [0f32; 8];
    _mm256_storeu_ps(x.as_mut_ptr(), v);
    let r = [x[4] + x[0], x[5] + x[1], x[6] + x[2], x[7] + x[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}
