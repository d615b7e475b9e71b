//! x86 twins of [`crate::ops::attention`]'s dots, score rows and loads.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

pub(crate) mod pv;
pub(crate) mod tposed;

use crate::ops::attention::*;
use crate::ops::numerics::*;
use crate::ops::*;
use crate::x86::numerics::*;

#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn dot512(x: *const f32, y: *const f32, n: usize) -> f32 {
    use core::arch::x86_64::*;
    let np = n & !63;
    let mut acc = [0f32; 16];
    _mm512_storeu_ps(
        acc.as_mut_ptr(),
        lanes512::<false, false>(x as *const u8, y, np),
    );
    let mut sumf = reduce16(&acc);
    for i in np..n {
        sumf = (*x.add(i)).mul_add(*y.add(i), sumf);
    }
    sumf
}

/// Elements `i .. i + 16` of a cache row at `p`: f32, or f16 widened exactly (`H`).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn load16<const H: bool>(p: *const u8, i: usize) -> core::arch::x86_64::__m512 {
    use core::arch::x86_64::*;
    match H {
        true => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i)),
        false => _mm512_loadu_ps((p as *const f32).add(i)),
    }
}

/// [`load16`] with 256-bit registers: elements `i .. i + 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn load8<const H: bool>(p: *const u8, i: usize) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    match H {
        true => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i)),
        false => _mm256_loadu_ps((p as *const f32).add(i)),
    }
}

/// `ggml_vec_dot_f32`'s 16 lanes over the first `np` (a multiple of 64) elements: four
/// 16-lane FMA accumulators from zero over 64-element steps, then `(a0 + a2) + (a1 + a3)`.
/// `x` is an f32 row, or (`H`) an f16 one: `ggml_vec_dot_f16` sums the widened elements in
/// the same lanes and order (its f64 tail is empty when `np` is the whole row). `T`: the 16
/// lanes of tinyBLAS's f16 chain instead (`numerics::dot_tile`, `np` a multiple of 16),
/// which `reduce16` ends the same way.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn lanes512<const H: bool, const T: bool>(
    x: *const u8,
    y: *const f32,
    np: usize,
) -> core::arch::x86_64::__m512 {
    use core::arch::x86_64::*;
    if T {
        // tinyBLAS's chain (`dot_tile`): one 16-lane accumulator over 16-element steps.
        let mut acc = _mm512_setzero_ps();
        for i in (0..np).step_by(16) {
            acc = _mm512_fmadd_ps(load16::<H>(x, i), _mm512_loadu_ps(y.add(i)), acc);
        }
        return acc;
    }
    let mut a = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        for j in 0..4 {
            a[j] = _mm512_fmadd_ps(
                load16::<H>(x, i + 16 * j),
                _mm512_loadu_ps(y.add(i + 16 * j)),
                a[j],
            );
        }
        i += 64;
    }
    _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]))
}

#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn dot256(x: *const f32, y: *const f32, n: usize) -> f32 {
    use core::arch::x86_64::*;
    let np = n & !63;
    let mut acc = [0f32; 16];
    // 16-lane accumulator j = (a[2j], a[2j+1]).
    let mut a = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < np {
        for j in 0..8 {
            a[j] = _mm256_fmadd_ps(
                _mm256_loadu_ps(x.add(i + 8 * j)),
                _mm256_loadu_ps(y.add(i + 8 * j)),
                a[j],
            );
        }
        i += 64;
    }
    for h in 0..2 {
        a[h] = _mm256_add_ps(a[h], a[4 + h]);
        a[2 + h] = _mm256_add_ps(a[2 + h], a[6 + h]);
        a[h] = _mm256_add_ps(a[h], a[2 + h]);
    }
    _mm256_storeu_ps(acc.as_mut_ptr(), a[0]);
    _mm256_storeu_ps(acc.as_mut_ptr().add(8), a[1]);
    let mut sumf = reduce16(&acc);
    for i in np..n {
        sumf = (*x.add(i)).mul_add(*y.add(i), sumf);
    }
    sumf
}

/// V bytes (all rows of a task) up to which a decode query's scores kernel asks for its V
/// rows into L2 ahead of p·V (see [`scores_rows16`]). Deeper, those prefetches evict each
/// other and K before p·V comes: Qwen2.5-1.5B's heads 2048 deep (1 MiB of V a task) took
/// 1.21-1.22 s of attention for 128 decode steps without them, 1.38-1.51 s with them, and
/// 229 against 256 us a call in `--bench ops` (Sapphire Rapids, interleaved). Shallow
/// queries keep them: SmolLM2's 16 sequences ~200 deep (50 KiB a task) spend 7% more time in
/// attention without.
pub(crate) const V_PREFETCH_MAX: usize = 256 << 10;

/// The V bytes per row [`scores_rows16`] and [`scores_rows8`] prefetch for rows `lo..=last`.
pub(crate) fn v_prefetch_bytes(a: &Attn, lo: usize, last: i64) -> usize {
    let row = a.q.ne[0] as usize * if a.v_f16 { 2 } else { 4 };
    let rows = (last + 1 - lo as i64).max(0) as usize;
    if a.q.ne[2] == 1 && rows * row <= V_PREFETCH_MAX {
        row
    } else {
        0
    }
}

/// The scaled scores of heads `h0..h0 + nh` (queries `qv`, `du` each) against K rows
/// `lo & !15 ..= last` into `w` (`len` per head, each of those rows written once, nothing
/// else; invisible rows keep -inf), 16 rows at a time:
/// each row's `ggml_vec_dot_f32` lanes as [`dot512`] builds them ([`lanes512`]), then the 16
/// rows' `reduce16` trees at once, each addition of a tree one lane of a vector addition (the
/// same operand pairs: the same bits), instead of 15 scalar additions per score. f32 K, or
/// f16 (`H`) widened as loaded; `du % 64 == 0` (no scalar leftovers), or with tinyBLAS's
/// lanes (`T`, see [`lanes512`]) `du % 16 == 0`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn scores_rows16<const H: bool, const T: bool>(
    a: &Attn,
    hk: i64,
    pt: i64,
    lo: usize,
    last: i64,
    qv: &[f32],
    nh: usize,
    len: usize,
    w: *mut f32,
) {
    use core::arch::x86_64::*;
    let du = a.q.ne[0] as usize;
    // Final lane 4k + e holds row 4e + k (see `reduce_rows16`).
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut rows = [core::ptr::null::<u8>(); 16];
    let mut b = [_mm512_setzero_ps(); 16];
    // V bytes per row to prefetch (see below): none for a prompt chunk, nor for a query whose
    // V rows would not stay in L2 until p·V reads them.
    let vb = v_prefetch_bytes(a, lo, last);
    let mut j0 = (lo & !15) as i64;
    while j0 <= last {
        let n = (last + 1 - j0).min(16) as usize;
        for (r, p) in rows.iter_mut().enumerate().take(n) {
            let jr = a.rows.get(j0 + r as i64);
            *p = row_ptr(&a.k, hk, jr, 0);
            // p·V visits V rows in lane order (rows l, l + 16, .. for each l), too scattered
            // for the hardware prefetcher: ask for them into L2 now (Zen 4, SmolLM2, 16
            // sequences decoding: attention 663-811 -> 544-576 ms). Not for a prompt chunk:
            // its queries' tasks read the same V rows over and over, already cached, and the
            // prefetches were a fifth of its scores' time (64 queries 2048 deep, Qwen2.5-1.5B's
            // heads: 145 -> 118 us a task).
            let v = row_ptr(&a.v, hk, jr, 0);
            for off in (0..vb).step_by(64) {
                _mm_prefetch::<_MM_HINT_T1>(v.wrapping_add(off) as *const i8);
            }
        }
        // No software prefetch of the next block's K rows: measured equal or slower (each
        // prefetch instruction costs about a nanosecond here, 64 of them per block; Zen 4,
        // 16 sequences: 20-40% slower).
        for g in 0..nh {
            let q = qv.as_ptr().add(g * du);
            for r in 0..16 {
                if r >= n {
                    b[r] = _mm512_setzero_ps();
                    continue;
                }
                b[r] = lanes512::<H, T>(rows[r], q, du);
            }
            let sums = _mm512_permutexvar_ps(order, reduce_rows16(&b));
            store_scores(a, sums, pt, j0 as usize, n, w.add(g * len));
        }
        j0 += 16;
    }
}

/// Scaled scores (soft-capped where the model says so) of rows `j0 .. j0 + n` into `hw`
/// (rows a sliding window hides keep their -inf).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn store_scores(
    a: &Attn,
    sums: core::arch::x86_64::__m512,
    pt: i64,
    j0: usize,
    n: usize,
    hw: *mut f32,
) {
    use core::arch::x86_64::*;
    let mut s = [0f32; 16];
    if a.softcap > 0.0 {
        _mm512_storeu_ps(s.as_mut_ptr(), sums);
        for x in s.iter_mut() {
            *x = ((*x * (1.0 / a.softcap)).tanh() * a.softcap) * a.scale;
        }
    } else {
        _mm512_storeu_ps(s.as_mut_ptr(), _mm512_mul_ps(sums, _mm512_set1_ps(a.scale)));
    }
    for r in 0..n {
        let j = j0 + r;
        // j <= last <= pt: only the window hides a row here.
        if a.window == 0 || pt - (j as i64) < a.window {
            *hw.add(j) = s[r];
        }
    }
}

/// [`scores_rows16`] with 256-bit registers (AVX2): 8 K rows at a time, each row's
/// `ggml_vec_dot_f32` lanes as [`dot256`] builds them (the 16 lanes as two halves), then the
/// 8 rows' `reduce16` trees at once ([`reduce_rows8`]): the same operand pairs, the same bits.
/// `H` and `T` as there.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn scores_rows8<const H: bool, const T: bool>(
    a: &Attn,
    hk: i64,
    pt: i64,
    lo: usize,
    last: i64,
    qv: &[f32],
    nh: usize,
    len: usize,
    w: *mut f32,
) {
    use core::arch::x86_64::*;
    let du = a.q.ne[0] as usize;
    let mut rows = [core::ptr::null::<u8>(); 8];
    let mut b = [_mm256_setzero_ps(); 8];
    // V bytes per row to prefetch (see below): none for a prompt chunk, nor for a query whose
    // V rows would not stay in L2 until p·V reads them.
    let vb = v_prefetch_bytes(a, lo, last);
    let mut j0 = (lo & !7) as i64;
    while j0 <= last {
        let n = (last + 1 - j0).min(8) as usize;
        for (r, p) in rows.iter_mut().enumerate().take(n) {
            let jr = a.rows.get(j0 + r as i64);
            *p = row_ptr(&a.k, hk, jr, 0);
            // p·V visits V rows in lane order, too scattered for the hardware prefetcher:
            // ask for them into L2 now (the row loop's L1 prefetch, which this kernel
            // replaces, did the same); not for a prompt chunk (see scores_rows16).
            let v = row_ptr(&a.v, hk, jr, 0);
            for off in (0..vb).step_by(64) {
                _mm_prefetch::<_MM_HINT_T1>(v.wrapping_add(off) as *const i8);
            }
        }
        for g in 0..nh {
            let q = qv.as_ptr().add(g * du);
            for r in 0..8 {
                b[r] = if r < n {
                    lanes256_t8::<H, T>(rows[r], q, du)
                } else {
                    _mm256_setzero_ps()
                };
            }
            let sums = reduce_rows8(&b);
            let mut s = [0f32; 8];
            if a.softcap > 0.0 {
                _mm256_storeu_ps(s.as_mut_ptr(), sums);
                for x in s.iter_mut() {
                    *x = ((*x * (1.0 / a.softcap)).tanh() * a.softcap) * a.scale;
                }
            } else {
                _mm256_storeu_ps(s.as_mut_ptr(), _mm256_mul_ps(sums, _mm256_set1_ps(a.scale)));
            }
            for r in 0..n {
                let j = j0 + r as i64;
                // j <= last <= pt: only the window hides a row here.
                if a.window == 0 || pt - j < a.window {
                    *w.add(g * len + j as usize) = s[r];
                }
            }
        }
        j0 += 8;
    }
}

/// [`dot256`]'s lanes over `np` (a multiple of 64) elements, as the first step of `reduce16`:
/// `t8[i] = v[i + 8] + v[i]`, one vector.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn lanes256_t8<const H: bool, const T: bool>(
    x: *const u8,
    y: *const f32,
    np: usize,
) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    if T {
        // tinyBLAS's chain: one 16-lane accumulator (two halves) over 16-element steps.
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for i in (0..np).step_by(16) {
            lo = _mm256_fmadd_ps(load8::<H>(x, i), _mm256_loadu_ps(y.add(i)), lo);
            hi = _mm256_fmadd_ps(load8::<H>(x, i + 8), _mm256_loadu_ps(y.add(i + 8)), hi);
        }
        return _mm256_add_ps(hi, lo);
    }
    let mut a = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < np {
        for j in 0..8 {
            a[j] = _mm256_fmadd_ps(
                load8::<H>(x, i + 8 * j),
                _mm256_loadu_ps(y.add(i + 8 * j)),
                a[j],
            );
        }
        i += 64;
    }
    for h in 0..2 {
        a[h] = _mm256_add_ps(a[h], a[4 + h]);
        a[2 + h] = _mm256_add_ps(a[2 + h], a[6 + h]);
        a[h] = _mm256_add_ps(a[h], a[2 + h]);
    }
    _mm256_add_ps(a[1], a[0])
}

/// The rest of `reduce16` for 8 rows (`t8` of row `r` in `b[r]`): `t4 = t8[4 + i] + t8[i]`,
/// then `(t4[0] + t4[2]) + (t4[1] + t4[3])`; lane `r` of the result is row `r`'s sum.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn reduce_rows8(
    b: &[core::arch::x86_64::__m256; 8],
) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    // u[p]: t4 of rows 2p (low half) and 2p + 1 (high half).
    let mut u = [_mm256_setzero_ps(); 4];
    for p in 0..4 {
        let (x, y) = (b[2 * p], b[2 * p + 1]);
        u[p] = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x31>(x, y),
            _mm256_permute2f128_ps::<0x20>(x, y),
        );
    }
    // [t0 + t2, t1 + t3] of four rows per vector: rows (0, 2 | 1, 3) and (4, 6 | 5, 7).
    let pair = |x: __m256, y: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
            _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
        )
    };
    let (s0, s1) = (pair(u[0], u[1]), pair(u[2], u[3]));
    // Lanes [0, 2, 4, 6 | 1, 3, 5, 7], then in row order.
    let sums = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(s0, s1),
        _mm256_shuffle_ps::<0b11_01_11_01>(s0, s1),
    );
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}
