//! attention's `p·V`: the probabilities of a KV head's query heads times its V rows, with
//! ggml's lanes (row `j` in accumulator lane `j % lanes`, then its fold of the lanes).

use super::*;
#[cfg(x86)]
use crate::x86::attention::pv::*;

/// `p·V` of heads `hk * group ..` + `nh` (their probabilities `w`, `len` per head) into `res`:
/// `lanes` accumulators per output (ggml_vec_dot_f32's 64, or tinyBLAS's 16) over rows
/// `0..v_end`, row `j` in lane `j % lanes`, then ggml's fold of the lanes. The accumulators
/// of all outputs live in memory, lane-major (`acc[lane][i]`), so each row is one contiguous
/// FMA over the head; any V format (f16 rows widened once per row).
#[inline(always)]
pub(crate) unsafe fn pv_in_memory(
    a: &Attn,
    hk: i64,
    w: &[f32],
    len: usize,
    nh: usize,
    lanes: usize,
    v_end: usize,
    vrow: &mut [f32],
    res: &mut [f32],
) {
    let v = &a.v;
    let du = a.q.ne[0] as usize;
    let hs = du * lanes; // accumulator floats per head
    let mut acc = vec![0f32; hs * nh];
    for j in 0..v_end {
        if j + (ATTN_PREFETCH_ROWS as usize) < v_end {
            let vb = du * if a.v_f16 { 2 } else { 4 };
            let jn = (j as i64) + ATTN_PREFETCH_ROWS;
            prefetch_bytes(row_ptr(v, hk, a.rows.get(jn), 0), vb);
        }
        let vr = v_row(v, hk, a.rows.get(j as i64), du, vrow, a.v_f16);
        let lane = j % lanes;
        for g in 0..nh {
            let pj = w[g * len + j];
            if pj == 0.0 {
                continue;
            }
            let acc_l = &mut acc[g * hs + lane * du..g * hs + (lane + 1) * du];
            for i in 0..du {
                acc_l[i] = vr[i].mul_add(pj, acc_l[i]);
            }
        }
    }
    // The lane reductions (`reduce16` per output, after folding 64 lanes to 16 as
    // GGML_F32x16_REDUCE does), one element-wise step at a time over the whole head, in place:
    // the same additions per output, vectorized across outputs.
    for g in 0..nh {
        let p = acc.as_mut_ptr().add(g * hs);
        macro_rules! fold {
            ($d:expr, $x:expr, $y:expr) => {
                fold_rows(p, du, $d, $x, $y)
            };
        }
        if !a.kqv_tile {
            // g0 = A[l] + A[32+l]; g1 = A[16+l] + A[48+l]; g0 += g1
            for l in 0..16 {
                fold!(l, l, 32 + l);
                fold!(16 + l, 16 + l, 48 + l);
                fold!(l, l, 16 + l);
            }
        }
        // reduce16: t8 = v[8+i] + v[i]; t4 = t8[4+i] + t8[i]; (t4[0]+t4[2]) + (t4[1]+t4[3])
        for l in 0..8 {
            fold!(l, l + 8, l);
        }
        for l in 0..4 {
            fold!(l, l + 4, l);
        }
        fold!(0, 0, 2);
        fold!(1, 1, 3);
        fold!(0, 0, 1);
        res[g * du..(g + 1) * du].copy_from_slice(&acc[g * hs..g * hs + du]);
    }
}

/// [`pv_in_memory`] for f32 V rows and head sizes of whole 16-blocks, the same additions in
/// the same order, with the accumulators in registers: for each 16 outputs, the 64 (or 16)
/// lanes are summed one at a time over their rows (`j = lane, lane + lanes, ..`) and folded as
/// soon as the four lanes of a fold are done, so only the 16 folded lanes stay live. No
/// accumulator memory is zeroed, read back or folded in place (at 3 to 7 heads per KV head
/// those are 48-112 KiB per task, more than L1).
#[inline(always)]
pub(crate) unsafe fn pv_in_registers(
    a: &Attn,
    hk: i64,
    w: &[f32],
    len: usize,
    nh: usize,
    lanes: usize,
    lo: usize,
    v_end: usize,
    vp: &mut Vec<*const u8>,
    res: &mut [f32],
) {
    let v = &a.v;
    let du = a.q.ne[0] as usize;
    // Each row's address once (a paged row is a division away), not once per head and block.
    // Rows before `lo` (outside a sliding window) are never read.
    vp.clear();
    vp.extend((0..v_end).map(|j| {
        if j < lo {
            core::ptr::null()
        } else {
            row_ptr(v, hk, a.rows.get(j as i64), 0)
        }
    }));
    let vp = &vp[..];
    #[cfg(x86)]
    if a.isa == Isa::Avx512 {
        // Heads in passes of at most six, each pass over column chunks of `nc` 16-blocks, so
        // that one pass holds at most 24 accumulators (see pv_heads512).
        let passes = nh.div_ceil(6);
        let hb = nh.div_ceil(passes);
        let nb = du / 16;
        let nc = [16, 8, 4, 1]
            .into_iter()
            .find(|&c| c * hb <= 24 && c <= nb)
            .unwrap_or(1);
        let m = lanes / 16;
        let mut g0 = 0;
        while g0 < nh {
            let hb = hb.min(nh - g0);
            let mut b = 0;
            while b < nb {
                let nc = if b + nc <= nb { nc } else { 1 };
                let args = (vp, w, len, g0, 16 * b, lo, v_end, du, &mut *res);
                macro_rules! run {
                    ($($hb:literal, $nc:literal);*) => {
                        match (hb, nc, m, a.v_f16) {
                            $(
                                ($hb, $nc, 4, false) => pv_heads512::<$hb, $nc, 4, false>(args),
                                ($hb, $nc, 4, true) => pv_heads512::<$hb, $nc, 4, true>(args),
                                ($hb, $nc, _, false) => pv_heads512::<$hb, $nc, 1, false>(args),
                                ($hb, $nc, _, true) => pv_heads512::<$hb, $nc, 1, true>(args),
                            )*
                            _ => unreachable!("pass of {hb} heads x {nc} blocks"),
                        }
                    };
                }
                run!(1, 16; 1, 8; 1, 4; 1, 1; 2, 8; 2, 4; 2, 1; 3, 8; 3, 4; 3, 1;
                     4, 4; 4, 1; 5, 4; 5, 1; 6, 4; 6, 1);
                b += nc;
            }
            g0 += hb;
        }
        return;
    }
    #[cfg(x86)]
    if a.isa == Isa::Avx2 && du % 64 == 0 {
        // 64 outputs (one 256-byte piece of a row) per pass: eight accumulators.
        for g in 0..nh {
            let wg = &w[g * len..(g + 1) * len];
            for c0 in (0..du).step_by(64) {
                let out = &mut res[g * du + c0..];
                match (lanes, a.v_f16) {
                    (64, false) => pv_chunk256::<4, false>(&vp, wg, c0, lo, v_end, out),
                    (64, true) => pv_chunk256::<4, true>(&vp, wg, c0, lo, v_end, out),
                    (_, false) => pv_chunk256::<1, false>(&vp, wg, c0, lo, v_end, out),
                    (_, true) => pv_chunk256::<1, true>(&vp, wg, c0, lo, v_end, out),
                }
            }
        }
        return;
    }
    for g in 0..nh {
        let wg = &w[g * len..(g + 1) * len];
        for c in (0..du).step_by(16) {
            // Lane `ln`'s FMA chain over its rows, for outputs c..c+16.
            let lane = |ln: usize| -> [f32; 16] {
                let mut acc = [0f32; 16];
                // The first row of lane `ln` in or before `lo`'s lanes-block (p = 0 below lo).
                let mut j = ln + lo / lanes * lanes;
                while j < v_end {
                    let pj = wg[j];
                    if pj != 0.0 {
                        let vr = (vp[j] as *const f32).add(c);
                        for i in 0..16 {
                            acc[i] = (*vr.add(i)).mul_add(pj, acc[i]);
                        }
                    }
                    j += lanes;
                }
                acc
            };
            let mut gl = [[0f32; 16]; 16];
            for l in 0..16 {
                gl[l] = if lanes == 64 {
                    // GGML_F32x16_REDUCE's first folds: (A[l] + A[32+l]) + (A[16+l] + A[48+l]).
                    let (a0, a32) = (lane(l), lane(32 + l));
                    let (a16, a48) = (lane(16 + l), lane(48 + l));
                    let mut r = [0f32; 16];
                    for i in 0..16 {
                        r[i] = (a0[i] + a32[i]) + (a16[i] + a48[i]);
                    }
                    r
                } else {
                    lane(l)
                };
            }
            // reduce16: t8 = v[8+i] + v[i]; t4 = t8[4+i] + t8[i]; (t4[0]+t4[2]) + (t4[1]+t4[3]).
            for q in 0..8 {
                for i in 0..16 {
                    gl[q][i] = gl[q + 8][i] + gl[q][i];
                }
            }
            for q in 0..4 {
                for i in 0..16 {
                    gl[q][i] = gl[q + 4][i] + gl[q][i];
                }
            }
            for i in 0..16 {
                res[g * du + c + i] = (gl[0][i] + gl[2][i]) + (gl[1][i] + gl[3][i]);
            }
        }
    }
}
