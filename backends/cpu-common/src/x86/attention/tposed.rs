//! The AVX-512 task of [`crate::ops::attention::tposed`]: attention over K and V blocks
//! transposed into lanes.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;
use crate::ops::attention::tposed::*;
use crate::ops::attention::*;
use crate::ops::*;
use ::numerics::round_f16;

/// Row blocks per p·V stretch: a stretch of V (16 KiB for 16 outputs) is used by every query
/// and head of the task before the next.
pub(crate) const SB: usize = 16;

/// `v` at least `n` long (what it held stays).
pub(crate) fn grow<T: Copy>(v: &mut Vec<T>, n: usize, x: T) {
    if v.len() < n {
        v.resize(n, x);
    }
}

/// One query of a task: its position, first and last visible rows, and its score row length
/// (through the last visible row, rounded up to 16).
#[derive(Clone, Copy)]
pub(crate) struct Query {
    pub(crate) pt: i64,
    pub(crate) lo: usize,
    pub(crate) last: usize,
    pub(crate) len: usize,
}

/// A task's working memory, kept per thread between tasks.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) qv: Vec<f32>,
    pub(crate) w: Vec<f32>,
    pub(crate) src: Vec<f32>,
    pub(crate) acc: Vec<Line>,
    pub(crate) res: Vec<f32>,
}

thread_local! {
    static SCRATCH: core::cell::Cell<Scratch> = core::cell::Cell::new(Scratch::default());
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn task512(a: &Attn, hk: i64, grp: i64) {
    use core::arch::x86_64::*;
    let du = a.q.ne[0] as usize;
    let nh = a.group as usize;
    let h0 = hk * a.group;
    let hku = hk as usize;
    let t0 = grp * QG;
    let t1 = (t0 + QG).min(a.q.ne[2]);
    let nq = (t1 - t0) as usize;
    let mut qs = [Query {
        pt: 0,
        lo: 0,
        last: 0,
        len: 0,
    }; QG as usize];
    let mut woff = [0usize; QG as usize + 1];
    for (i, q) in qs.iter_mut().enumerate().take(nq) {
        let pt = a.positions[t0 as usize + i];
        let last = (a.n_kv - 1).min(pt) as usize;
        q.pt = pt;
        q.lo = if a.window > 0 {
            (pt - a.window + 1).max(0) as usize
        } else {
            0
        };
        q.last = last;
        q.len = (round_up(last as i64 + 1, 16).min(a.n_eff)) as usize;
        woff[i + 1] = woff[i] + q.len * nh;
    }
    let qs = &qs[..nq];
    let mut sc = SCRATCH.with(|c| c.take());
    let Scratch {
        qv,
        w,
        src,
        acc,
        res,
    } = &mut sc;
    grow(qv, nq * nh * du, 0.0);
    for (i, g) in (0..nq).flat_map(|i| (0..nh).map(move |g| (i, g))) {
        let dst = &mut qv[(i * nh + g) * du..(i * nh + g + 1) * du];
        read_into(&a.q, h0 + g as i64, t0 + i as i64, 0, dst);
        if a.k_f16 {
            for x in dst.iter_mut() {
                *x = round_f16(*x);
            }
        }
    }
    // Scores: -inf outside each query's visible rows, which the blocks below write.
    grow(w, woff[nq], 0.0);
    for (i, q) in qs.iter().enumerate() {
        for g in 0..nh {
            let hw = &mut w[woff[i] + g * q.len..woff[i] + (g + 1) * q.len];
            hw[..q.lo.min(q.len)].fill(f32::NEG_INFINITY);
            hw[q.last + 1..].fill(f32::NEG_INFINITY);
        }
    }
    let bmin = qs.iter().map(|q| q.lo / 16).min().unwrap_or(0);
    let bmax = qs.iter().map(|q| q.last / 16 + 1).max().unwrap_or(0);
    for b in bmin..bmax {
        let kb = a.kt.add(k_line(a, hku, b, 0)) as *const f32;
        for (i, q) in qs.iter().enumerate() {
            if b < q.lo / 16 || b > q.last / 16 {
                continue;
            }
            let j0 = 16 * b;
            let n = (q.last + 1 - j0).min(16);
            // Heads in pairs: each K line load serves two chains.
            let mut g = 0;
            while g < nh {
                let qp = |g: usize| qv.as_ptr().add((i * nh + g) * du);
                macro_rules! blocks {
                    ($n:literal, $q:expr) => {
                        match (a.k_f16, du) {
                            (false, 64) => score_blocks::<64, false, $n>(kb, $q, du),
                            (false, 128) => score_blocks::<128, false, $n>(kb, $q, du),
                            (false, 256) => score_blocks::<256, false, $n>(kb, $q, du),
                            (false, _) => score_blocks::<0, false, $n>(kb, $q, du),
                            (true, 64) => score_blocks::<64, true, $n>(kb, $q, du),
                            (true, 128) => score_blocks::<128, true, $n>(kb, $q, du),
                            (true, 256) => score_blocks::<256, true, $n>(kb, $q, du),
                            (true, _) => score_blocks::<0, true, $n>(kb, $q, du),
                        }
                    };
                }
                let (sums, k) = if g + 1 < nh {
                    (blocks!(2, [qp(g), qp(g + 1)]), 2)
                } else {
                    let [x] = blocks!(1, [qp(g)]);
                    ([x, x], 1)
                };
                for (h, &sums) in sums.iter().enumerate().take(k) {
                    let hw = w.as_mut_ptr().add(woff[i] + (g + h) * q.len);
                    store_scores(a, sums, q.pt, j0, n, hw);
                }
                g += k;
            }
        }
    }
    for (i, q) in qs.iter().enumerate() {
        for g in 0..nh {
            let o = woff[i] + g * q.len;
            probabilities(a, &mut w[o..o + q.len], src);
        }
    }
    // p·V, 16 outputs at a time: every (query, head) chain over a stretch of SB blocks before
    // the next stretch, its 16 accumulators kept in `acc` between stretches.
    // (Every element of both is written before it is read: no clearing.)
    grow(res, nq * nh * du, 0.0);
    grow(acc, nq * nh * 16, Line::default());
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for e0 in (0..du).step_by(16) {
        let vb = a.vt.add(v_line(a, hku, 0, e0)) as *const f32;
        let mut s0 = bmin;
        while s0 < bmax {
            let s1 = (s0 + SB).min(bmax);
            for (i, q) in qs.iter().enumerate() {
                let (b0, b1) = (s0.max(q.lo / 16), s1.min(q.len / 16));
                if b0 >= b1 {
                    continue;
                }
                for g in 0..nh {
                    let wp = w.as_ptr().add(woff[i] + g * q.len);
                    let first = b0 == q.lo / 16;
                    pv_stretch(
                        vb,
                        wp,
                        b0,
                        b1,
                        first,
                        acc.as_mut_ptr().add((i * nh + g) * 16),
                    );
                }
            }
            s0 = s1;
        }
        for ig in 0..nq * nh {
            let mut b = [_mm512_setzero_ps(); 16];
            for (l, b) in b.iter_mut().enumerate() {
                *b = _mm512_load_ps(acc[ig * 16 + l].0.as_ptr());
            }
            let r = _mm512_permutexvar_ps(order, reduce_rows16(&b));
            _mm512_storeu_ps(res.as_mut_ptr().add(ig * du + e0), r);
        }
    }
    let out = &a.out;
    for i in 0..nq {
        for g in 0..nh {
            let t = t0 + i as i64;
            let h = h0 + g as i64;
            for (e, &x) in res[(i * nh + g) * du..(i * nh + g + 1) * du]
                .iter()
                .enumerate()
            {
                let off = e as i64 * out.nb[0] + h * out.nb[1] + t * out.nb[2];
                // each (h, t) output row is written by one task only.
                (out.data.wrapping_offset(off as isize) as *mut f32).write(x);
            }
        }
    }
    SCRATCH.with(|c| c.set(sc));
}

/// One (query, head) chain of tinyBLAS's p·V for 16 outputs over blocks `b0 .. b1` of the
/// transposed V at `vb` (16 lines a block): lane `l` of accumulator `i` is output `i`'s lane
/// `l`, one masked FMA per block and output (a row whose probability is 0 is skipped, as the
/// reference does). `acc`: the 16 accumulators, read (unless this is the chain's `first`
/// stretch) and written back.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn pv_stretch(
    vb: *const f32,
    wp: *const f32,
    b0: usize,
    b1: usize,
    first: bool,
    acc: *mut Line,
) {
    use core::arch::x86_64::*;
    let mut c = [_mm512_setzero_ps(); 16];
    if !first {
        for (i, c) in c.iter_mut().enumerate() {
            *c = _mm512_load_ps((*acc.add(i)).0.as_ptr());
        }
    }
    for b in b0..b1 {
        let p = _mm512_loadu_ps(wp.add(16 * b));
        let m = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(p, _mm512_setzero_ps());
        let v = vb.add(256 * b);
        for (i, c) in c.iter_mut().enumerate() {
            *c = _mm512_mask3_fmadd_ps(_mm512_load_ps(v.add(16 * i)), p, *c, m);
        }
    }
    for (i, c) in c.iter().enumerate() {
        _mm512_store_ps((*acc.add(i)).0.as_mut_ptr(), *c);
    }
}

/// Lane `l` of 16 rows' `ggml_vec_dot_f32` chains (`du` elements, transposed block `kb`) for
/// each of `N` queries `q` (each K line loaded once for all of them): four accumulators over
/// 64-steps folded `(a0 + a2) + (a1 + a3)`; with `T`, tinyBLAS's one accumulator over
/// 16-steps.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn lane<const T: bool, const N: usize>(
    kb: *const f32,
    q: [*const f32; N],
    du: usize,
    l: usize,
) -> [core::arch::x86_64::__m512; N] {
    use core::arch::x86_64::*;
    if T {
        let mut acc = [_mm512_setzero_ps(); N];
        for s in (0..du).step_by(16) {
            let c = _mm512_load_ps(kb.add(16 * (s + l)));
            for n in 0..N {
                acc[n] = _mm512_fmadd_ps(c, _mm512_set1_ps(*q[n].add(s + l)), acc[n]);
            }
        }
        acc
    } else {
        let mut c = [[_mm512_setzero_ps(); 4]; N];
        for i in (0..du).step_by(64) {
            for k in 0..4 {
                let e = i + 16 * k + l;
                let x = _mm512_load_ps(kb.add(16 * e));
                for n in 0..N {
                    c[n][k] = _mm512_fmadd_ps(x, _mm512_set1_ps(*q[n].add(e)), c[n][k]);
                }
            }
        }
        let mut x = [_mm512_setzero_ps(); N];
        for n in 0..N {
            let c = &c[n];
            x[n] = _mm512_add_ps(_mm512_add_ps(c[0], c[2]), _mm512_add_ps(c[1], c[3]));
        }
        x
    }
}

/// `N` queries' scores for the 16 rows of transposed block `kb` (before the scale): each
/// [`lane`], then `reduce16` across them, t8[i] = x[8 + i] + x[i], t4[i] = t8[4 + i] + t8[i],
/// (t4[0] + t4[2]) + (t4[1] + t4[3]), taken in the order that keeps the fewest registers
/// live. `D`: the head size at compile time, so that everything unrolls into registers (0:
/// `du` at run time).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn score_blocks<const D: usize, const T: bool, const N: usize>(
    kb: *const f32,
    q: [*const f32; N],
    du: usize,
) -> [core::arch::x86_64::__m512; N] {
    use core::arch::x86_64::*;
    // (Macros, not closures: a closure does not inherit this function's target features, so
    // it was compiled as a call returning through memory, at half the speed.)
    let du = if D > 0 { D } else { du };
    macro_rules! add {
        ($a:expr, $b:expr) => {{
            let (a, b) = ($a, $b);
            let mut r = a;
            for n in 0..N {
                r[n] = _mm512_add_ps(a[n], b[n]);
            }
            r
        }};
    }
    macro_rules! t4 {
        ($i:expr) => {{
            let t8a = add!(lane::<T, N>(kb, q, du, 8 + $i), lane::<T, N>(kb, q, du, $i));
            let t8b = add!(
                lane::<T, N>(kb, q, du, 12 + $i),
                lane::<T, N>(kb, q, du, 4 + $i)
            );
            add!(t8b, t8a)
        }};
    }
    add!(add!(t4!(0), t4!(2)), add!(t4!(1), t4!(3)))
}
