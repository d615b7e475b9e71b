//! attention: ggml's non-flash path over f32 or f16 caches, paged or not, one or several
//! sequences per call (see `reference::ops::attention`).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

mod pv;
mod tposed;
use pv::*;

/// `ggml_vec_dot_f32` (AVX-512 build): 4 x 16 FMA accumulators over 64-element steps,
/// `GGML_F32x16_REDUCE`, then scalar FMA leftovers.
#[inline(always)]
pub(super) unsafe fn dot_vec_f32(isa: Isa, x: *const f32, y: *const f32, n: usize) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => dot512(x, y, n),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => dot256(x, y, n),
        // SAFETY: `n` floats at `x` and at `y` (the caller's contract).
        _ => reference::ggml::dot_vec_f32_lanes(
            core::slice::from_raw_parts(x, n),
            core::slice::from_raw_parts(y, n),
        ),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(super) unsafe fn dot512(x: *const f32, y: *const f32, n: usize) -> f32 {
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn load16<const H: bool>(p: *const u8, i: usize) -> core::arch::x86_64::__m512 {
    use core::arch::x86_64::*;
    match H {
        true => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i)),
        false => _mm512_loadu_ps((p as *const f32).add(i)),
    }
}

/// [`load16`] with 256-bit registers: elements `i .. i + 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<const H: bool>(p: *const u8, i: usize) -> core::arch::x86_64::__m256 {
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
/// lanes of tinyBLAS's f16 chain instead (`reference::ggml::dot_tile`, `np` a multiple of 16),
/// which `reduce16` ends the same way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn lanes512<const H: bool, const T: bool>(
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn dot256(x: *const f32, y: *const f32, n: usize) -> f32 {
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

/// Row `dst` = row `x` + row `y` (rows of `du` floats at `p`), element-wise. A plain function
/// (not a closure) so that it is inlined into, and vectorized for, the ISA frame.
#[inline(always)]
pub(super) unsafe fn fold_rows(p: *mut f32, du: usize, dst: usize, x: usize, y: usize) {
    let (d, x, y) = (
        p.add(dst * du),
        p.add(x * du) as *const f32,
        p.add(y * du) as *const f32,
    );
    for i in 0..du {
        *d.add(i) = *x.add(i) + *y.add(i);
    }
}

#[inline(always)]
pub(super) fn round_up(v: i64, m: i64) -> i64 {
    (v + m - 1) / m * m
}

/// One attention call, shared by its tasks.
pub(super) struct Attn {
    isa: Isa,
    q: TensorDesc,
    k: TensorDesc,
    v: TensorDesc,
    out: TensorDesc,
    group: i64,
    n_kv: i64,
    n_eff: i64,
    window: i64,
    scale: f32,
    softcap: f32,
    kqv_tile: bool,
    /// f16 caches: q (for K) and the probabilities (for V) rounded to f16, and K's chain is
    /// tinyBLAS when `kq_tile`, ggml_vec_dot_f16 otherwise.
    k_f16: bool,
    v_f16: bool,
    kq_tile: bool,
    positions: Vec<i64>,
    /// The pool row of each of the sequence's rows (paged caches).
    rows: abi::PagedRows,
    /// K and V copied into transposed 16-row blocks for this call (`tposed`), `tblocks` per
    /// KV head; null where the call runs on the cache rows.
    kt: *mut tposed::Line,
    vt: *mut tposed::Line,
    tblocks: usize,
}

/// V row `(hk, j)` as f32: in place for an f32 cache, widened into `buf` for f16.
#[inline(always)]
pub(super) unsafe fn v_row<'a>(
    v: &TensorDesc,
    hk: i64,
    j: i64,
    du: usize,
    buf: &'a mut [f32],
    f16: bool,
) -> &'a [f32] {
    let p = row_ptr(v, hk, j, 0);
    if f16 {
        widen_f16(p, buf);
        buf
    } else {
        core::slice::from_raw_parts(p as *const f32, du)
    }
}

/// An f16 cache row of `n` packed elements, widened exactly.
#[inline(always)]
pub(super) unsafe fn widen_f16(p: *const u8, dst: &mut [f32]) {
    let p = p as *const u16;
    for (i, d) in dst.iter_mut().enumerate() {
        *d = quant::fp16_to_f32(p.add(i).read_unaligned());
    }
}

use reference::ggml::round_f16;

/// A task's working rows, kept per thread between tasks: a decode step runs one task per
/// sequence and KV head in every layer (1440 for 16 SmolLM2 sequences), each of which
/// allocated and freed six of these.
#[derive(Default)]
pub(super) struct Scratch {
    qv: Vec<f32>,
    krow: Vec<f32>,
    vrow: Vec<f32>,
    w: Vec<f32>,
    res: Vec<f32>,
    src: Vec<f32>,
    vp: Vec<*const u8>,
}

thread_local! {
    static SCRATCH: core::cell::Cell<Scratch> = core::cell::Cell::new(Scratch::default());
}

/// `v` as `n` copies of `x`.
fn filled(v: &mut Vec<f32>, n: usize, x: f32) -> &mut [f32] {
    v.clear();
    v.resize(n, x);
    v
}

/// Output rows `(h, t)` for `h` in `h0..h1` (heads of one KV head) of attention, as
/// `reference::ops::attention::run` computes each for f32 caches (same kernels, lanes and
/// order), with the `p·V` accumulators stored lane-major (`acc[lane][i]`) so the per-row
/// update is a contiguous FMA over the head. The heads share each K and V row load; every
/// head keeps its own scores, accumulators and sums.
#[inline(always)]
pub(super) unsafe fn attn_task_body(a: &Attn, h0: i64, h1: i64, t: i64) {
    let (q, k, v, out) = (&a.q, &a.k, &a.v, &a.out);
    let (n_kv, n_eff, window) = (a.n_kv, a.n_eff, a.window);
    let du = q.ne[0] as usize;
    let nh = (h1 - h0) as usize;
    let hk = h0 / a.group;
    let pt = a.positions[t as usize];
    let visible = |j: i64| j <= pt && (window == 0 || pt - j < window);
    // The first row a sliding window lets this query see: rows before it have no score and
    // probability 0, which p·V skips anyway, so the kernels start there (a window of 512
    // over a 2048-token cache reads a quarter of it).
    let lo = if window > 0 {
        (pt - window + 1).max(0) as usize
    } else {
        0
    };
    let last = (n_kv - 1).min(pt);
    let mut sc = SCRATCH.with(|c| c.take());
    let Scratch {
        qv,
        krow,
        vrow,
        w,
        res,
        src,
        vp,
    } = &mut sc;
    let qv = filled(qv, du * nh, 0.0);
    for g in 0..nh {
        read_into(q, h0 + g as i64, t, 0, &mut qv[g * du..(g + 1) * du]);
    }
    if a.k_f16 {
        for x in qv.iter_mut() {
            *x = round_f16(*x);
        }
    }
    // Widened rows of f16 caches.
    let krow = filled(krow, if a.k_f16 { du } else { 0 }, 0.0);
    let vrow = filled(vrow, if a.v_f16 { du } else { 0 }, 0.0);
    let len = if last < 0 {
        n_eff.min(16)
    } else {
        round_up(last + 1, 16).min(n_eff)
    } as usize;
    let lanes: usize = if a.kqv_tile { 16 } else { 64 };
    let np = if a.kqv_tile {
        n_eff as usize
    } else {
        n_eff as usize & !63
    };
    let span = if last < 0 {
        0
    } else {
        (round_up(last + 1, lanes as i64) as usize).min(n_eff as usize)
    };
    let simd_end = span.min(np);
    let res = filled(res, du * nh, 0.0);
    // The scores 16 rows at a time where that kernel applies, else row by row below: f32 K
    // (ggml_vec_dot_f32), f16 K for one query (ggml_vec_dot_f16, whose lanes are the f32 ones
    // on the widened rows) or a prompt chunk (tinyBLAS's 16 lanes).
    #[cfg(target_arch = "x86_64")]
    let tile = a.k_f16 && a.kq_tile;
    #[cfg(target_arch = "x86_64")]
    let rows16 = matches!(a.isa, Isa::Avx512 | Isa::Avx2)
        && du % if tile { 16 } else { 64 } == 0
        && last >= 0;
    #[cfg(not(target_arch = "x86_64"))]
    let rows16 = false;
    // The scores: -inf where no kernel below writes one. The 16-row kernels write every
    // visible row from `lo` through `last` (a prompt's later queries see a thousand rows: a
    // full fill per query was a tenth of attention's time there), the row-by-row loop only
    // visible rows.
    let w = if rows16 {
        w.resize(len * nh, 0.0);
        for g in 0..nh {
            let hw = &mut w[g * len..(g + 1) * len];
            hw[..lo.min(len)].fill(f32::NEG_INFINITY);
            hw[(last + 1) as usize..].fill(f32::NEG_INFINITY);
        }
        &mut w[..]
    } else {
        filled(w, len * nh, f32::NEG_INFINITY)
    };
    #[cfg(target_arch = "x86_64")]
    if rows16 {
        let wp = w.as_mut_ptr();
        macro_rules! scores {
            ($f:ident) => {
                match (a.k_f16, tile) {
                    (false, _) => $f::<false, false>(a, hk, pt, lo, last, qv, nh, len, wp),
                    (true, false) => $f::<true, false>(a, hk, pt, lo, last, qv, nh, len, wp),
                    (true, true) => $f::<true, true>(a, hk, pt, lo, last, qv, nh, len, wp),
                }
            };
        }
        match a.isa {
            Isa::Avx512 => scores!(scores_rows16),
            _ => scores!(scores_rows8),
        }
    }
    for j in 0..=if rows16 { -1 } else { last } {
        if !visible(j) {
            continue;
        }
        if j + ATTN_PREFETCH_ROWS <= last {
            let kb = du * if a.k_f16 { 2 } else { 4 };
            let jp = a.rows.get(j + ATTN_PREFETCH_ROWS);
            prefetch_bytes(row_ptr(k, hk, jp, 0), kb);
            if !a.v_f16 {
                // The register p·V visits V rows in lane order, too scattered for the
                // hardware prefetcher: ask for them now, with the K rows.
                prefetch_bytes(row_ptr(&a.v, hk, jp, 0), du * 4);
            }
        }
        let kr = row_ptr(k, hk, a.rows.get(j), 0) as *const f32;
        if a.k_f16 {
            widen_f16(kr as *const u8, krow);
        }
        for g in 0..nh {
            let s = if !a.k_f16 {
                dot_vec_f32(a.isa, kr, qv.as_ptr().add(g * du), du)
            } else if a.kq_tile {
                reference::ggml::dot_tile_lanes(&krow, &qv[g * du..(g + 1) * du])
            } else {
                reference::ggml::dot_vec_f16_lanes(&krow, &qv[g * du..(g + 1) * du])
            };
            let s = if a.softcap > 0.0 {
                ((s * (1.0 / a.softcap)).tanh() * a.softcap) * a.scale
            } else {
                s * a.scale
            };
            w[g * len + j as usize] = s;
        }
    }
    for g in 0..nh {
        probabilities(a, &mut w[g * len..(g + 1) * len], src);
    }
    let v_end = simd_end.min(len);
    // f16 V in registers on x86 only (widened as loaded; the other ISAs' register path
    // reads f32 rows).
    let pv_f16 = cfg!(target_arch = "x86_64")
        && (a.isa == Isa::Avx512 || (a.isa == Isa::Avx2 && du % 64 == 0));
    if du % 16 == 0 && (!a.v_f16 || pv_f16) {
        pv_in_registers(a, hk, w, len, nh, lanes, lo, v_end, vp, res);
    } else {
        pv_in_memory(a, hk, w, len, nh, lanes, v_end, vrow, res);
    }
    // ggml_vec_dot leftovers (rows past the last 64-step): f32 FMA (f32 V), or products
    // summed in f64 (f16 V, ggml_vec_dot_f16's tail).
    if !a.kqv_tile && (np as i64) < n_eff && span > np {
        let mut tail64: Vec<f64> = if a.v_f16 {
            res.iter().map(|&x| x as f64).collect()
        } else {
            Vec::new()
        };
        for j in np..(n_eff as usize) {
            if j as i64 >= n_kv {
                continue; // padding: v treated as zero
            }
            let vr = v_row(v, hk, a.rows.get(j as i64), du, vrow, a.v_f16);
            for g in 0..nh {
                let pj = if j < len { w[g * len + j] } else { 0.0 };
                if a.v_f16 {
                    let r = &mut tail64[g * du..(g + 1) * du];
                    for i in 0..du {
                        r[i] += (vr[i] * pj) as f64;
                    }
                } else {
                    let r = &mut res[g * du..(g + 1) * du];
                    for i in 0..du {
                        r[i] = vr[i].mul_add(pj, r[i]);
                    }
                }
            }
        }
        if a.v_f16 {
            for (r, &x) in res.iter_mut().zip(&tail64) {
                *r = x as f32;
            }
        }
    }
    for g in 0..nh {
        let h = h0 + g as i64;
        for (i, &x) in res[g * du..(g + 1) * du].iter().enumerate() {
            let off = i as i64 * out.nb[0] + h * out.nb[1] + t * out.nb[2];
            // each (h, t) output row is written by one task only.
            (out.data.wrapping_offset(off as isize) as *mut f32).write(x);
        }
    }
    SCRATCH.with(|c| c.set(sc));
}
isa_dispatch!(attn_task => attn_task_body(a: &Attn, h0: i64, h1: i64, t: i64));

/// One head's scaled scores `wg` into probabilities, as ggml's soft_max: the max, the
/// exponentials and their sum (`soft_max_f32`), times `1 / sum`; rounded to f16 for an f16
/// V (its `vec_dot` type). `src`: scratch.
#[inline(always)]
unsafe fn probabilities(a: &Attn, wg: &mut [f32], src: &mut Vec<f32>) {
    // The max in 16 independent lanes (vectorized), then across them: a maximum is exact,
    // so the grouping changes no output bit (a zero's sign cancels in x - max; a NaN makes
    // every probability NaN either way). One chain of 2048 dependent compares was 2.7 us
    // a head at a depth of 2048.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut rows = wg.chunks_exact(16);
    for c in &mut rows {
        for l in 0..16 {
            lanes[l] = ggml_max(lanes[l], c[l]);
        }
    }
    let max = lanes
        .iter()
        .chain(rows.remainder())
        .fold(f32::NEG_INFINITY, |m, &x| ggml_max(m, x));
    src.clear();
    src.extend_from_slice(wg);
    let sum = soft_max_f32(a.isa, src, wg, max);
    let inv = (1.0 / sum) as f32;
    for x in wg.iter_mut() {
        *x *= inv;
        if a.v_f16 {
            *x = round_f16(*x);
        }
    }
}

/// V bytes (all rows of a task) up to which a decode query's scores kernel asks for its V
/// rows into L2 ahead of p·V (see [`scores_rows16`]). Deeper, those prefetches evict each
/// other and K before p·V comes: Qwen2.5-1.5B's heads 2048 deep (1 MiB of V a task) took
/// 1.21-1.22 s of attention for 128 decode steps without them, 1.38-1.51 s with them, and
/// 229 against 256 us a call in `--bench ops` (Sapphire Rapids, interleaved). Shallow
/// queries keep them: SmolLM2's 16 sequences ~200 deep (50 KiB a task) spend 7% more time in
/// attention without.
#[cfg(target_arch = "x86_64")]
const V_PREFETCH_MAX: usize = 256 << 10;

/// The V bytes per row [`scores_rows16`] and [`scores_rows8`] prefetch for rows `lo..=last`.
#[cfg(target_arch = "x86_64")]
fn v_prefetch_bytes(a: &Attn, lo: usize, last: i64) -> usize {
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn scores_rows16<const H: bool, const T: bool>(
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(super) unsafe fn store_scores(
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scores_rows8<const H: bool, const T: bool>(
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lanes256_t8<const H: bool, const T: bool>(
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
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn reduce_rows8(b: &[core::arch::x86_64::__m256; 8]) -> core::arch::x86_64::__m256 {
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

pub(super) unsafe fn attention(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<(), Error> {
    // One call per sequence's worth of work (several with the `seqs` operand, ABI 1.4), all
    // in one parallel_for: a decode step's sequences each have one query, too little to
    // split across threads alone.
    let calls = abi::attention_seqs(inputs, &outputs[0], p).map_err(Error::Invalid)?;
    let mut parts = Vec::with_capacity(calls.len());
    for c in &calls {
        parts.push(attention_call(isa, c.inputs(), &c.out, &c.params)?);
    }
    tposed::with_transposed(host, &mut parts, |parts| run_tasks(isa, host, parts));
    Ok(())
}

/// The tasks of a call's sequences, all in one parallel_for.
unsafe fn run_tasks(isa: Isa, host: &HostApi, parts: &[Attn]) {
    // Tasks: (sequence, token, KV head, piece of its query heads). Whole groups share K/V
    // loads best; they are split only when there would be fewer tasks than threads: every
    // piece reads its KV head's whole cache. (Zen 4, 2 threads, one sequence 2048 deep:
    // SmolLM2, 3 KV heads, 3 tasks instead of 6: 60-61 -> 67-71 t/s with an f32 cache;
    // Qwen2.5-0.5B and Gemma 3 within noise.)
    let want = host.n_threads.max(1) as usize;
    let (hq, hkv) = (parts[0].q.ne[1], parts[0].k.ne[1]);
    let nt: i64 = parts.iter().map(|a| a.q.ne[2]).sum();
    let group = hq / hkv;
    let (g, kt) = (group.max(1) as usize, (hkv * nt).max(1) as usize);
    let pieces = want.div_ceil(kt).clamp(1, g);
    let per = g.div_ceil(pieces);
    let (per, pieces) = (per as i64, g.div_ceil(per) as i64);
    // The first task of each sequence, then the total.
    // A call on transposed K and V (`tposed`) has tasks of (query group, KV head) instead.
    let count = |a: &Attn| match a.kt.is_null() {
        true => hkv * pieces * a.q.ne[2],
        false => hkv * tposed::groups(a),
    } as usize;
    // Tasks write disjoint output rows.
    part_tasks(host, parts, count, |a, task| {
        let task = task as i64;
        if !a.kt.is_null() {
            tposed::task(a, task % hkv, task / hkv);
            return;
        }
        let (piece, t) = (task % (hkv * pieces), task / (hkv * pieces));
        let (hk, pc) = (piece / pieces, piece % pieces);
        let h0 = hk * group + pc * per;
        let h1 = (h0 + per).min((hk + 1) * group);
        attn_task(isa, a, h0, h1, t);
    });
}

/// Runs `f(part, i)` for `i` in `0..count(part)` of every part, all in one parallel_for.
///
/// # Safety
/// As `parallel_for_shared`: tasks may run at once, so what `f` writes is disjoint per task.
pub(super) unsafe fn part_tasks(
    host: &HostApi,
    parts: &[Attn],
    count: impl Fn(&Attn) -> usize,
    f: impl Fn(&Attn, usize),
) {
    let mut first = Vec::with_capacity(parts.len() + 1);
    let mut n = 0usize;
    for a in parts {
        first.push(n);
        n += count(a);
    }
    first.push(n);
    let shared = SyncPtr(parts.as_ptr() as *mut u8);
    let first = &first;
    parallel_for(host, n as u32, |task| {
        let _ = &shared;
        let task = task as usize;
        let s = first.partition_point(|&f| f <= task) - 1;
        // SAFETY: `parts` outlives parallel_for.
        let a = &*(shared.0 as *const Attn).add(s);
        f(a, task - first[s]);
    });
}

/// The shared state of one sequence's attention (a one-sequence call's inputs).
///
/// # Safety
/// A validated one-sequence attention call on valid memory.
pub(super) unsafe fn attention_call(
    isa: Isa,
    inputs: &[TensorDesc],
    out: &TensorDesc,
    p: &OpParams,
) -> Result<Attn, Error> {
    let (q, k, pos) = (inputs[0], inputs[1], inputs[3]);
    let (d, hq, nt) = (q.ne[0], q.ne[1], q.ne[2]);
    let hkv = k.ne[1];
    let a = abi::AttentionAttrs::from_params(p);
    let rows = abi::PagedRows::new(inputs.get(4), a.page_rows, k.ne[2]).map_err(Error::Invalid)?;
    let c = rows.len;
    let n_kv = a.n_kv;
    let n_eff = round_up(n_kv, KV_PAD).min(c).max(n_kv);
    Ok(Attn {
        isa,
        q,
        k,
        v: inputs[2],
        out: *out,
        group: hq / hkv,
        n_kv,
        n_eff,
        window: a.window,
        scale: a.scale,
        softcap: a.softcap,
        kqv_tile: nt >= 2 && n_eff % 16 == 0 && d % 4 == 0,
        k_f16: k.dtype() == Some(DType::F16),
        v_f16: inputs[2].dtype() == Some(DType::F16),
        // As reference::ops::attention: ggml's mul_mat choice for an f16 K.
        kq_tile: k.dtype() == Some(DType::F16) && nt >= 2 && d % 16 == 0 && n_eff % 4 == 0,
        positions: (0..nt).map(|t| read_i32(&pos, t) as i64).collect(),
        rows,
        kt: core::ptr::null_mut(),
        vt: core::ptr::null_mut(),
        tblocks: 0,
    })
}
