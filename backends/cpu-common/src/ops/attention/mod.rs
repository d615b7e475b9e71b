//! attention: ggml's non-flash path over f32 or f16 caches, paged or not, one or several
//! sequences per call (see `reference::ops::attention`).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;
#[cfg(x86)]
use crate::x86::attention::*;

pub(crate) mod pv;
pub(crate) mod tposed;
use pv::*;

/// `ggml_vec_dot_f32` (AVX-512 build): 4 x 16 FMA accumulators over 64-element steps,
/// `GGML_F32x16_REDUCE`, then scalar FMA leftovers.
#[inline(always)]
pub(crate) unsafe fn dot_vec_f32(isa: Isa, x: *const f32, y: *const f32, n: usize) -> f32 {
    match isa {
        #[cfg(x86)]
        Isa::Avx512 => dot512(x, y, n),
        #[cfg(x86)]
        Isa::Avx2 => dot256(x, y, n),
        // SAFETY: `n` floats at `x` and at `y` (the caller's contract).
        _ => ::numerics::dot_vec_f32_lanes(
            core::slice::from_raw_parts(x, n),
            core::slice::from_raw_parts(y, n),
        ),
    }
}

/// Row `dst` = row `x` + row `y` (rows of `du` floats at `p`), element-wise. A plain function
/// (not a closure) so that it is inlined into, and vectorized for, the ISA frame.
#[inline(always)]
pub(crate) unsafe fn fold_rows(p: *mut f32, du: usize, dst: usize, x: usize, y: usize) {
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
pub(crate) fn round_up(v: i64, m: i64) -> i64 {
    (v + m - 1) / m * m
}

/// One attention call, shared by its tasks.
pub(crate) struct Attn {
    pub(crate) isa: Isa,
    pub(crate) q: TensorDesc,
    pub(crate) k: TensorDesc,
    pub(crate) v: TensorDesc,
    pub(crate) out: TensorDesc,
    pub(crate) group: i64,
    pub(crate) n_kv: i64,
    pub(crate) n_eff: i64,
    pub(crate) window: i64,
    pub(crate) scale: f32,
    pub(crate) softcap: f32,
    pub(crate) kqv_tile: bool,
    /// f16 caches: q (for K) and the probabilities (for V) rounded to f16, and K's chain is
    /// tinyBLAS when `kq_tile`, ggml_vec_dot_f16 otherwise.
    pub(crate) k_f16: bool,
    pub(crate) v_f16: bool,
    pub(crate) kq_tile: bool,
    pub(crate) positions: Vec<i64>,
    /// The pool row of each of the sequence's rows (paged caches).
    pub(crate) rows: abi::PagedRows,
    /// K and V copied into transposed 16-row blocks for this call (`tposed`), `tblocks` per
    /// KV head; null where the call runs on the cache rows.
    pub(crate) kt: *mut tposed::Line,
    pub(crate) vt: *mut tposed::Line,
    pub(crate) tblocks: usize,
}

/// V row `(hk, j)` as f32: in place for an f32 cache, widened into `buf` for f16.
#[inline(always)]
pub(crate) unsafe fn v_row<'a>(
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
pub(crate) unsafe fn widen_f16(p: *const u8, dst: &mut [f32]) {
    let p = p as *const u16;
    for (i, d) in dst.iter_mut().enumerate() {
        *d = quant::fp16_to_f32(p.add(i).read_unaligned());
    }
}

use ::numerics::round_f16;

/// A task's working rows, kept per thread between tasks: a decode step runs one task per
/// sequence and KV head in every layer (1440 for 16 SmolLM2 sequences), each of which
/// allocated and freed six of these.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) qv: Vec<f32>,
    pub(crate) krow: Vec<f32>,
    pub(crate) vrow: Vec<f32>,
    pub(crate) w: Vec<f32>,
    pub(crate) res: Vec<f32>,
    pub(crate) src: Vec<f32>,
    pub(crate) vp: Vec<*const u8>,
}

thread_local! {
    static SCRATCH: core::cell::Cell<Scratch> = core::cell::Cell::new(Scratch::default());
}

/// `v` as `n` copies of `x`.
pub(crate) fn filled(v: &mut Vec<f32>, n: usize, x: f32) -> &mut [f32] {
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
pub(crate) unsafe fn attn_task_body(a: &Attn, h0: i64, h1: i64, t: i64) {
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
    #[cfg(x86)]
    let tile = a.k_f16 && a.kq_tile;
    #[cfg(x86)]
    let rows16 = matches!(a.isa, Isa::Avx512 | Isa::Avx2)
        && du % if tile { 16 } else { 64 } == 0
        && last >= 0;
    #[cfg(not(x86))]
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
    #[cfg(x86)]
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
                ::numerics::dot_tile_lanes(&krow, &qv[g * du..(g + 1) * du])
            } else {
                ::numerics::dot_vec_f16_lanes(&krow, &qv[g * du..(g + 1) * du])
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
    let pv_f16 = cfg!(x86) && (a.isa == Isa::Avx512 || (a.isa == Isa::Avx2 && du % 64 == 0));
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
pub(crate) unsafe fn probabilities(a: &Attn, wg: &mut [f32], src: &mut Vec<f32>) {
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

pub(crate) unsafe fn attention(
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
pub(crate) unsafe fn run_tasks(isa: Isa, host: &HostApi, parts: &[Attn]) {
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
pub(crate) unsafe fn part_tasks(
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
pub(crate) unsafe fn attention_call(
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
