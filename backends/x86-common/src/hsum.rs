//! Horizontal sums the 256-bit ([`crate::simd`]) and 512-bit ([`crate::kq512`], the 16-row
//! layouts) kernels end with: a leaf, so that no kernel module imports another's helpers.

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

/// [`hsum_float_8`] of 16 rows at once: `l[k]` holds lane `k` of each row's eight lanes.
///
/// # Safety
/// The CPU has AVX-512 F (inlined into a caller compiled for it).
#[inline(always)]
pub(crate) unsafe fn hsum_float_8_x16(l: &[__m512; 8]) -> __m512 {
    let r0 = _mm512_add_ps(l[4], l[0]);
    let r1 = _mm512_add_ps(l[5], l[1]);
    let r2 = _mm512_add_ps(l[6], l[2]);
    let r3 = _mm512_add_ps(l[7], l[3]);
    _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3))
}

/// [`hsum_float_8`] of 8 rows at once: `l[k]` holds lane `k` of each row's eight lanes.
///
/// # Safety
/// The CPU has AVX (inlined into a caller compiled for AVX2).
#[inline(always)]
pub(crate) unsafe fn hsum_float_8_x8(l: &[__m256; 8]) -> __m256 {
    let r0 = _mm256_add_ps(l[4], l[0]);
    let r1 = _mm256_add_ps(l[5], l[1]);
    let r2 = _mm256_add_ps(l[6], l[2]);
    let r3 = _mm256_add_ps(l[7], l[3]);
    _mm256_add_ps(_mm256_add_ps(r0, r2), _mm256_add_ps(r1, r3))
}
