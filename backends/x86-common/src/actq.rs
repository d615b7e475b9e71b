//! Activation rows converted with SIMD, byte for byte what quant's scalar conversions
//! (`quant::quantize_activations_for`) write: `quantize_row_q8_0` / `_q8_1` of ggml's x86
//! build (max |x| per block, `id = 127/max`, round half to even) and `quantize_row_q8_K`
//! (signed max, `nearest_int` by the 1.5·2^23 trick, `min(127)`, i16 block sums).
//!
//! Only finite rows take the SIMD path: a block with an infinity or NaN makes
//! [`quantize_row`] answer `false` and the caller converts the row with quant instead.

use core::arch::x86_64::*;
use quant::Kernel;

const Q8_0_B: usize = 34;
const Q8_1_B: usize = 36;
const Q8_K_B: usize = 292;

/// Whether [`quantize_row`] has a SIMD path for the activations of this kernel and format.
pub fn has_simd(kernel: Kernel, dtype: abi::DType) -> bool {
    use abi::DType::*;
    if kernel == Kernel::RepackGemm && matches!(dtype, Q2_K | Q4_K) {
        return false; // interleaved `quantize_mat_q8_K_4x8`: scalar
    }
    matches!(quant::vec_dot_type(dtype), Q8_0 | Q8_1 | Q8_K)
}

/// Converts `src` as `quant::quantize_activations_for(kernel, dtype, src, dst)` does; `false`
/// (with `dst` in an unspecified state) when there is no SIMD path or `src` is not finite.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `dst` has the converted row's size.
pub unsafe fn quantize_row(kernel: Kernel, dtype: abi::DType, src: &[f32], dst: &mut [u8]) -> bool {
    if !has_simd(kernel, dtype) {
        return false;
    }
    match quant::vec_dot_type(dtype) {
        abi::DType::Q8_0 => q8_0_row::<false>(src, dst),
        abi::DType::Q8_1 => q8_0_row::<true>(src, dst),
        abi::DType::Q8_K => q8_k_row(src, dst),
        _ => false,
    }
}

/// All-ones lanes where `v` is infinite or NaN.
#[inline(always)]
unsafe fn not_finite(v: __m256) -> __m256 {
    let z = _mm256_sub_ps(v, v);
    _mm256_cmp_ps::<_CMP_UNORD_Q>(z, z)
}

#[inline(always)]
unsafe fn hmax(m: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// 32 i32 lanes (each in i8 range) -> 32 bytes in order.
#[inline(always)]
unsafe fn pack_i8(i: [__m256i; 4]) -> __m256i {
    let a = _mm256_packs_epi32(i[0], i[1]);
    let b = _mm256_packs_epi32(i[2], i[3]);
    let p = _mm256_packs_epi16(a, b);
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_row<const Q8_1: bool>(src: &[f32], dst: &mut [u8]) -> bool {
    let bb = if Q8_1 { Q8_1_B } else { Q8_0_B };
    let nb = src.len() / 32;
    assert!(src.len() % 32 == 0 && dst.len() == nb * bb);
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..nb {
        let x = src.as_ptr().add(32 * b);
        // (no closures in these functions: they would not inherit the target features)
        let mut v = [_mm256_setzero_ps(); 4];
        for k in 0..4 {
            v[k] = _mm256_loadu_ps(x.add(8 * k));
        }
        let bad = _mm256_or_ps(
            _mm256_or_ps(not_finite(v[0]), not_finite(v[1])),
            _mm256_or_ps(not_finite(v[2]), not_finite(v[3])),
        );
        if _mm256_movemask_ps(bad) != 0 {
            return false;
        }
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
            _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
        );
        let max = hmax(m);
        let d = max / 127.0;
        let id = if max != 0.0 { 127.0 / max } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut i = [_mm256_setzero_si256(); 4];
        for k in 0..4 {
            i[k] = _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[k], idv)));
        }
        let o = dst.as_mut_ptr().add(bb * b);
        o.cast::<[u8; 2]>()
            .write_unaligned(quant::f32_to_fp16(d).to_le_bytes());
        if Q8_1 {
            let sum = hsum_i32(_mm256_add_epi32(
                _mm256_add_epi32(i[0], i[1]),
                _mm256_add_epi32(i[2], i[3]),
            ));
            o.add(2)
                .cast::<[u8; 2]>()
                .write_unaligned(quant::f32_to_fp16(d * sum as f32).to_le_bytes());
        }
        let q = o.add(if Q8_1 { 4 } else { 2 });
        _mm256_storeu_si256(q as *mut __m256i, pack_i8(i));
    }
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_k_row(src: &[f32], dst: &mut [u8]) -> bool {
    let nb = src.len() / 256;
    assert!(src.len() % 256 == 0 && dst.len() == nb * Q8_K_B);
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..nb {
        let x = src.as_ptr().add(256 * b);
        let o = dst.as_mut_ptr().add(Q8_K_B * b);
        let mut bad = _mm256_setzero_ps();
        let mut m = _mm256_setzero_ps();
        for k in 0..32 {
            let v = _mm256_loadu_ps(x.add(8 * k));
            bad = _mm256_or_ps(bad, not_finite(v));
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v));
        }
        if _mm256_movemask_ps(bad) != 0 {
            return false;
        }
        let amax = hmax(m);
        if amax == 0.0 {
            core::ptr::write_bytes(o, 0, Q8_K_B);
            continue;
        }
        // the first element of largest magnitude, with its sign
        let am = _mm256_set1_ps(amax);
        let mut first = 256;
        for k in 0..32 {
            let v = _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(8 * k)));
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, am));
            if hit != 0 {
                first = 8 * k + hit.trailing_zeros() as usize;
                break;
            }
        }
        let max = *x.add(first);
        let iscale = -127.0 / max;
        let isv = _mm256_set1_ps(iscale);
        let magic = _mm256_set1_ps(12582912.0);
        let mant = _mm256_set1_epi32(0x007f_ffff);
        let off = _mm256_set1_epi32(0x0040_0000);
        let top = _mm256_set1_epi32(127);
        let qs = o.add(4);
        let bsums = o.add(260);
        for g in 0..8 {
            let mut i = [_mm256_setzero_si256(); 4];
            for k in 0..4 {
                let v = _mm256_loadu_ps(x.add(32 * g + 8 * k));
                let t = _mm256_add_ps(_mm256_mul_ps(isv, v), magic);
                let q = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mant), off);
                i[k] = _mm256_min_epi32(q, top);
            }
            _mm256_storeu_si256(qs.add(32 * g) as *mut __m256i, pack_i8(i));
            let s0 = hsum_i32(_mm256_add_epi32(i[0], i[1])) as i16;
            let s1 = hsum_i32(_mm256_add_epi32(i[2], i[3])) as i16;
            bsums
                .add(4 * g)
                .cast::<[u8; 2]>()
                .write_unaligned(s0.to_le_bytes());
            bsums
                .add(4 * g + 2)
                .cast::<[u8; 2]>()
                .write_unaligned(s1.to_le_bytes());
        }
        o.cast::<[u8; 4]>()
            .write_unaligned((1.0 / iscale).to_le_bytes());
    }
    true
}
