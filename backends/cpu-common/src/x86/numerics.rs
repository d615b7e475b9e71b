//! x86 twins of [`crate::ops::numerics`]: the exps 16 (AVX-512) or 8 (AVX2) lanes at a time and
//! the reductions of 16 rows at once.

#![allow(clippy::needless_range_loop)]

/// `reduce16` of each of 16 vectors (a row's 16 lanes each), as one vector whose lane
/// `4k + e` is row `4e + k`'s sum: t8 = v[8 + i] + v[i], t4 = t8[4 + i] + t8[i],
/// (t4[0] + t4[2]) + (t4[1] + t4[3]), two rows per vector addition at first, 16 at the end.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn reduce_rows16(
    b: &[core::arch::x86_64::__m512; 16],
) -> core::arch::x86_64::__m512 {
    use core::arch::x86_64::*;
    // t8: quarters [r.q0 + r.q2, r.q1 + r.q3, r'.q0 + r'.q2, r'.q1 + r'.q3].
    let mut u = [_mm512_setzero_ps(); 8];
    for p in 0..8 {
        let (x, y) = (b[2 * p], b[2 * p + 1]);
        u[p] = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        );
    }
    // t4: one row per quarter, rows 4q .. 4q + 3.
    let mut t = [_mm512_setzero_ps(); 4];
    for q in 0..4 {
        let (x, y) = (u[2 * q], u[2 * q + 1]);
        t[q] = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        );
    }
    // Per quarter: [t0 + t2, t1 + t3] of two rows, then their sum.
    let pair = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm512_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    };
    let (s0, s1) = (pair(t[0], t[1]), pair(t[2], t[3]));
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(s0, s1),
        _mm512_shuffle_ps::<0b11_01_11_01>(s0, s1),
    )
}

/// [`soft_max_f32`]'s exps of 256 elements at `x` into `y`, and each 16-element step's
/// `reduce16` sum (in step order): the same exps, and the same additions per step as there,
/// for 16 steps at once ([`reduce_rows16`]) instead of 15 scalar additions per step.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn exp_sums256(x: *const f32, max: f32, y: *mut f32) -> [f32; 16] {
    use core::arch::x86_64::*;
    let mut v = [_mm512_setzero_ps(); 16];
    for (k, v) in v.iter_mut().enumerate() {
        let mut e = [0f32; 16];
        expf16_avx512(&*(x.add(16 * k) as *const [f32; 16]), max, &mut e);
        *v = _mm512_loadu_ps(e.as_ptr());
        _mm512_storeu_ps(y.add(16 * k), *v);
    }
    // Lane 4k + e of the reduction is step 4e + k.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut s = [0f32; 16];
    _mm512_storeu_ps(
        s.as_mut_ptr(),
        _mm512_permutexvar_ps(order, reduce_rows16(&v)),
    );
    s
}

/// `ggml_v_expf` (AVX-512 build) on `x - max`: the polynomial, `_mm512_scalef_ps`, and the
/// |n| > 192 lanes set to 0 or infinity, as [`v_expf`] replays it.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn expf16_avx512(x: &[f32; 16], max: f32, out: &mut [f32; 16]) {
    use core::arch::x86_64::*;
    let x = _mm512_sub_ps(_mm512_loadu_ps(x.as_ptr()), _mm512_set1_ps(max));
    let r = _mm512_set1_ps(f32::from_bits(0x4b40_0000));
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(f32::from_bits(0x35bf_be8e)),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(0x3f31_7200)), x),
    );
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_set1_ps(f32::from_bits(0x3c07_2010)),
                b,
                _mm512_set1_ps(f32::from_bits(0x3d2b_9f17)),
            ),
            u,
            _mm512_fmadd_ps(
                _mm512_set1_ps(f32::from_bits(0x3e2a_af33)),
                b,
                _mm512_set1_ps(f32::from_bits(0x3eff_fedb)),
            ),
        ),
        u,
        _mm512_fmadd_ps(
            _mm512_set1_ps(f32::from_bits(0x3f7f_fff6)),
            b,
            _mm512_set1_ps(1.0),
        ),
    );
    let mut res = _mm512_scalef_ps(j, n);
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    if d != 0 {
        let le = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let alt = _mm512_mask_blend_ps(le, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        res = _mm512_mask_blend_ps(d, res, alt);
    }
    _mm512_storeu_ps(out.as_mut_ptr(), res);
}

/// Four lanes of `f32(f64(j) * 2^e)` (`e` in the normal f64 exponent range).
#[inline(always)]
pub(crate) unsafe fn scale_half(
    j: core::arch::x86_64::__m128,
    e: core::arch::x86_64::__m128i,
) -> core::arch::x86_64::__m128 {
    use core::arch::x86_64::*;
    let p = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_add_epi64(
        _mm256_cvtepi32_epi64(e),
        _mm256_set1_epi64x(1023),
    )));
    _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(j), p))
}

/// [`expf16_avx512`] for eight lanes with AVX2: `scalef` replayed as `f64(j) * 2^n` rounded
/// once to f32 (exact product, so the same single rounding).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn expf8_avx2(x: &[f32; 8], max: f32, out: &mut [f32; 8]) {
    use core::arch::x86_64::*;
    let x = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr()), _mm256_set1_ps(max));
    let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000));
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35bf_be8e)),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x),
    );
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3c07_2010)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3d2b_9f17)),
            ),
            u,
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3e2a_af33)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3eff_fedb)),
            ),
        ),
        u,
        _mm256_fmadd_ps(
            _mm256_set1_ps(f32::from_bits(0x3f7f_fff6)),
            b,
            _mm256_set1_ps(1.0),
        ),
    );
    // |n| > 192 lanes are replaced below; clamp so their exponents stay harmless.
    let nc = _mm256_min_ps(
        _mm256_max_ps(n, _mm256_set1_ps(-192.0)),
        _mm256_set1_ps(192.0),
    );
    let ni = _mm256_cvtps_epi32(nc);
    let mut res = _mm256_set_m128(
        scale_half(
            _mm256_extractf128_ps::<1>(j),
            _mm256_extracti128_si256::<1>(ni),
        ),
        scale_half(_mm256_castps256_ps128(j), _mm256_castsi256_si128(ni)),
    );
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), n),
        _mm256_set1_ps(192.0),
    );
    if _mm256_movemask_ps(d) != 0 {
        let le = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
        let alt = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), le);
        res = _mm256_blendv_ps(res, alt, d);
    }
    // NaN lanes (n is NaN) stay NaN through the product, as in `v_expf`.
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(n, n);
    res = _mm256_blendv_ps(res, _mm256_set1_ps(f32::NAN), nan);
    _mm256_storeu_ps(out.as_mut_ptr(), res);
}
