//! The delta rule row by row, in x86 vector registers. Each row of a head's state takes its
//! decay, its dot with k, its update and its dot with q in one pass: the same operations, in
//! the same order, as the reference's four passes over the block (a row's `d` depends on that
//! row alone), so the bits are the reference's, with the block read and written once per
//! token instead of four times and the dots in full-width registers.

use crate::ops::gated_delta_net::*;
use crate::ops::*;
use abi::TensorDesc;
use core::arch::x86_64::*;

/// Head `h` of sequence `s` (scalar gate, a head size of whole 64-element steps).
pub(crate) unsafe fn head_rows(
    isa: Isa,
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
) {
    run_head(
        ins,
        outs,
        h,
        s,
        scratch,
        |m: &mut [f32],
         q: &[f32],
         k: &[f32],
         v: &[f32],
         g: &[f32],
         b,
         scale,
         _: &mut [f32],
         y: &mut [f32]| {
            let e = g[0].exp();
            match isa {
                Isa::Avx512 => token_avx512(m, q, k, v, e, b, scale, y),
                _ => token_avx2(m, q, k, v, e, b, scale, y),
            }
        },
    );
}

/// `_mm512_reduce_add_ps` as GCC compiles it ([`numerics::reduce16`]) of the
/// 16 lanes in `lo` (0..8) and `hi` (8..16): halves, then quarters, then lanes (2, 3)
/// onto (0, 1), then lane 1 onto lane 0.
#[inline(always)]
pub(crate) unsafe fn reduce16_halves(lo: __m256, hi: __m256) -> f32 {
    let t8 = _mm256_add_ps(hi, lo);
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps::<1>(t2, t2)))
}

/// GGML_F32x16_REDUCE of four 16-lane accumulators: (a0 + a2) + (a1 + a3), then
/// [`reduce16_halves`].
#[inline(always)]
pub(crate) unsafe fn reduce512(a: [__m512; 4]) -> f32 {
    let s = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s)));
    reduce16_halves(_mm512_castps512_ps256(s), hi)
}

/// [`reduce512`] of accumulators held as 8-lane halves (`a[2i]`, `a[2i + 1]`: lanes
/// 0..8 and 8..16 of accumulator `i`).
#[inline(always)]
pub(crate) unsafe fn reduce256(a: [__m256; 8]) -> f32 {
    let lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    reduce16_halves(lo, hi)
}

/// Four rows at a time, so that their dot chains (and reductions) overlap.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn token_avx512(
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    e: f32,
    beta: f32,
    scale: f32,
    o: &mut [f32],
) {
    const R: usize = 4;
    let n = v.len();
    let (ev, kp, qp) = (_mm512_set1_ps(e), k.as_ptr(), q.as_ptr());
    for j0 in (0..n).step_by(R) {
        let rows: [*mut f32; R] = core::array::from_fn(|r| m.as_mut_ptr().add((j0 + r) * n));
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        // Accumulator `a` takes lanes 16a.. of each 64-element step (indices known at
        // compile time, so the accumulators stay in registers).
        for step in (0..n).step_by(64) {
            for a in 0..4 {
                let at = step + 16 * a;
                let kv = _mm512_loadu_ps(kp.add(at));
                for r in 0..R {
                    let x = _mm512_mul_ps(_mm512_loadu_ps(rows[r].add(at)), ev);
                    _mm512_storeu_ps(rows[r].add(at), x);
                    acc[r][a] = _mm512_fmadd_ps(x, kv, acc[r][a]);
                }
            }
        }
        let d: [__m512; R] =
            core::array::from_fn(|r| _mm512_set1_ps((v[j0 + r] - reduce512(acc[r])) * beta));
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        for step in (0..n).step_by(64) {
            for a in 0..4 {
                let at = step + 16 * a;
                let (kv, qv) = (_mm512_loadu_ps(kp.add(at)), _mm512_loadu_ps(qp.add(at)));
                for r in 0..R {
                    let x = _mm512_fmadd_ps(kv, d[r], _mm512_loadu_ps(rows[r].add(at)));
                    _mm512_storeu_ps(rows[r].add(at), x);
                    acc[r][a] = _mm512_fmadd_ps(x, qv, acc[r][a]);
                }
            }
        }
        for r in 0..R {
            o[j0 + r] = reduce512(acc[r]) * scale;
        }
    }
}

/// As [`token_avx512`], each 16-lane accumulator in two 8-lane halves.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn token_avx2(
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    e: f32,
    beta: f32,
    scale: f32,
    o: &mut [f32],
) {
    let n = v.len();
    let (ev, kp, qp) = (_mm256_set1_ps(e), k.as_ptr(), q.as_ptr());
    for j in 0..n {
        let r = m.as_mut_ptr().add(j * n);
        let mut acc = [_mm256_setzero_ps(); 8];
        for step in (0..n).step_by(64) {
            for a in 0..8 {
                let at = step + 8 * a;
                let x = _mm256_mul_ps(_mm256_loadu_ps(r.add(at)), ev);
                _mm256_storeu_ps(r.add(at), x);
                acc[a] = _mm256_fmadd_ps(x, _mm256_loadu_ps(kp.add(at)), acc[a]);
            }
        }
        let d = _mm256_set1_ps((v[j] - reduce256(acc)) * beta);
        let mut acc = [_mm256_setzero_ps(); 8];
        for step in (0..n).step_by(64) {
            for a in 0..8 {
                let at = step + 8 * a;
                let x = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(at)), d, _mm256_loadu_ps(r.add(at)));
                _mm256_storeu_ps(r.add(at), x);
                acc[a] = _mm256_fmadd_ps(x, _mm256_loadu_ps(qp.add(at)), acc[a]);
            }
        }
        o[j] = reduce256(acc) * scale;
    }
}
