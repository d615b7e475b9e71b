//! x86 twins of [`crate::ops::glu`]'s rows: SwiGLU's exps and GeGLU's table gathers in
//! registers.

use super::numerics::*;
use crate::ops::numerics::*;

/// [`swiglu_row_body`]'s 16-blocks in registers (the divisions and products 16 lanes at a
/// time: the same IEEE operations in the same order); returns how far it went.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn swiglu_avx512(x: &mut [f32], g: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !15;
    let mut nx = [0f32; 16];
    let mut e = [0f32; 16];
    for i in (0..full).step_by(16) {
        let xv = _mm512_loadu_ps(x.as_ptr().add(i));
        _mm512_storeu_ps(nx.as_mut_ptr(), _mm512_sub_ps(_mm512_setzero_ps(), xv));
        expf16_avx512(&nx, 0.0, &mut e);
        let den = _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_loadu_ps(e.as_ptr()));
        let r = _mm512_mul_ps(_mm512_div_ps(xv, den), _mm512_loadu_ps(g.as_ptr().add(i)));
        _mm512_storeu_ps(x.as_mut_ptr().add(i), r);
    }
    full
}

/// [`swiglu_avx512`] with AVX2 (eight lanes at a time).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn swiglu_avx2(x: &mut [f32], g: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !15;
    let mut nx = [0f32; 8];
    let mut e = [0f32; 8];
    for i in (0..full).step_by(8) {
        let xv = _mm256_loadu_ps(x.as_ptr().add(i));
        _mm256_storeu_ps(nx.as_mut_ptr(), _mm256_sub_ps(_mm256_setzero_ps(), xv));
        expf8_avx2(&nx, 0.0, &mut e);
        let den = _mm256_add_ps(_mm256_set1_ps(1.0), _mm256_loadu_ps(e.as_ptr()));
        let r = _mm256_mul_ps(_mm256_div_ps(xv, den), _mm256_loadu_ps(g.as_ptr().add(i)));
        _mm256_storeu_ps(x.as_mut_ptr().add(i), r);
    }
    full
}

/// ggml's f16 GELU table widened to f32 (exact), for the SIMD rows' gathers.
pub(crate) fn gelu_table_f32() -> &'static [f32] {
    static T: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        gelu_table()
            .iter()
            .map(|&h| quant::fp16_to_f32(h))
            .collect()
    })
}

/// [`geglu_row_body`]'s whole 16-blocks: `vcvtps2ph` (round to nearest even, what
/// `f32_to_fp16` does) gives the table index, a gather the widened entry; 0 at or below -10,
/// `x` itself at or above 10, as the scalar row. Returns how far it went.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn geglu_avx512(x: &mut [f32], g: &[f32], t: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !15;
    for i in (0..full).step_by(16) {
        let v = _mm512_loadu_ps(x.as_ptr().add(i));
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        let tv = _mm512_i32gather_ps::<4>(_mm512_cvtepu16_epi32(h), t.as_ptr());
        let hi = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, _mm512_set1_ps(10.0));
        let gl = _mm512_mask_blend_ps(hi, tv, v);
        let r = _mm512_mul_ps(gl, _mm512_loadu_ps(g.as_ptr().add(i)));
        let lo = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, _mm512_set1_ps(-10.0));
        _mm512_storeu_ps(
            x.as_mut_ptr().add(i),
            _mm512_mask_blend_ps(lo, r, _mm512_setzero_ps()),
        );
    }
    full
}

/// [`geglu_avx512`] with AVX2 (eight lanes at a time).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn geglu_avx2(x: &mut [f32], g: &[f32], t: &[f32]) -> usize {
    use core::arch::x86_64::*;
    let full = x.len().min(g.len()) & !7;
    for i in (0..full).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        let tv = _mm256_i32gather_ps::<4>(t.as_ptr(), _mm256_cvtepu16_epi32(h));
        let hi = _mm256_cmp_ps::<_CMP_GE_OQ>(v, _mm256_set1_ps(10.0));
        let gl = _mm256_blendv_ps(tv, v, hi);
        let r = _mm256_mul_ps(gl, _mm256_loadu_ps(g.as_ptr().add(i)));
        let lo = _mm256_cmp_ps::<_CMP_LE_OQ>(v, _mm256_set1_ps(-10.0));
        _mm256_storeu_ps(
            x.as_mut_ptr().add(i),
            _mm256_blendv_ps(r, _mm256_setzero_ps(), lo),
        );
    }
    full
}
