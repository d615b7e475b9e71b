//! x86 twin of [`crate::ops::norm`]'s sums of squares: eight rows at once.

/// The f64 sums of squares of 8 rows of `k` floats at once, row `r` at `base + offs[r]`
/// floats, one row per lane: each lane adds its row's squares in order, as
/// [`rms_row_body`] does (that chain is sequential, so a row alone waits an f64 addition's
/// latency per element; eight rows share those waits).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn sums8(base: *const f32, offs: &[i32; 8], k: usize) -> [f64; 8] {
    use core::arch::x86_64::*;
    let vidx = _mm256_loadu_si256(offs.as_ptr() as *const __m256i);
    let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    for i in 0..k {
        let v = _mm256_i32gather_ps::<4>(base.add(i), vidx);
        let sq = _mm256_mul_ps(v, v);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(sq)));
    }
    let mut out = [0f64; 8];
    _mm256_storeu_pd(out.as_mut_ptr(), lo);
    _mm256_storeu_pd(out.as_mut_ptr().add(4), hi);
    out
}
