//! attention's `p·V`: the probabilities of a KV head's query heads times its V rows, with
//! ggml's lanes (row `j` in accumulator lane `j % lanes`, then its fold of the lanes).

use super::*;

/// `p·V` of heads `hk * group ..` + `nh` (their probabilities `w`, `len` per head) into `res`:
/// `lanes` accumulators per output (ggml_vec_dot_f32's 64, or tinyBLAS's 16) over rows
/// `0..v_end`, row `j` in lane `j % lanes`, then ggml's fold of the lanes. The accumulators
/// of all outputs live in memory, lane-major (`acc[lane][i]`), so each row is one contiguous
/// FMA over the head; any V format (f16 rows widened once per row).
#[inline(always)]
pub(super) unsafe fn pv_in_memory(
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
pub(super) unsafe fn pv_in_registers(
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
    #[cfg(target_arch = "x86_64")]
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
    #[cfg(target_arch = "x86_64")]
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

/// Outputs `c0 .. c0 + 64` of one head's p·V (see [`pv_in_registers`]) into `out`, on AVX2:
/// [`pv_heads512`]'s order for one head with `NC = 4` (the 64 outputs of one lane chain are
/// eight 256-bit accumulators), so each row visit reads 256 contiguous bytes once, instead
/// of the generic loop's four passes of 64 bytes over every row. `M` = lanes / 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pv_chunk256<const M: usize, const H: bool>(
    vp: &[*const u8],
    wg: &[f32],
    c0: usize,
    lo: usize,
    v_end: usize,
    out: &mut [f32],
) {
    use core::arch::x86_64::*;
    let mut gl = [[_mm256_setzero_ps(); 8]; 16];
    for l in 0..16 {
        let mut lanes = [[_mm256_setzero_ps(); 8]; M];
        for (mg, lane) in lanes.iter_mut().enumerate() {
            let mut acc = [_mm256_setzero_ps(); 8];
            // From the 16·M-row block holding `lo` (rows before it have p = 0: skipped anyway).
            let mut j = l + lo / (16 * M) * (16 * M) + 16 * mg;
            while j < v_end {
                let pj = *wg.get_unchecked(j);
                if pj != 0.0 {
                    let vr = *vp.get_unchecked(j);
                    let p = _mm256_set1_ps(pj);
                    for c in 0..8 {
                        acc[c] = _mm256_fmadd_ps(load8::<H>(vr, c0 + 8 * c), p, acc[c]);
                    }
                }
                j += 16 * M;
            }
            *lane = acc;
        }
        for c in 0..8 {
            gl[l][c] = if M == 4 {
                _mm256_add_ps(
                    _mm256_add_ps(lanes[0][c], lanes[2 % M][c]),
                    _mm256_add_ps(lanes[1 % M][c], lanes[3 % M][c]),
                )
            } else {
                lanes[0][c]
            };
        }
    }
    for c in 0..8 {
        for q in 0..8 {
            gl[q][c] = _mm256_add_ps(gl[q + 8][c], gl[q][c]);
        }
        for q in 0..4 {
            gl[q][c] = _mm256_add_ps(gl[q + 4][c], gl[q][c]);
        }
        let r = _mm256_add_ps(
            _mm256_add_ps(gl[0][c], gl[2][c]),
            _mm256_add_ps(gl[1][c], gl[3][c]),
        );
        _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), r);
    }
}

/// How many row visits ahead [`pv_heads512`] prefetches.
#[cfg(target_arch = "x86_64")]
const PV_AHEAD: usize = 8;

/// Outputs `c0 .. c0 + 16 * NC` of heads `g0 .. g0 + HB` (probabilities `w`, `len` per head)
/// into `res` (`du` per head), on AVX-512; `M` = lanes / 16 (4 for ggml_vec_dot_f32's 64
/// lanes, 1 for tinyBLAS's 16). For each `l` in 0..16, the `M` lanes whose first fold meets
/// (`l`, `16 + l`, `32 + l`, `48 + l`, or `l` alone) run their FMA chains over rows
/// `l, l + 16, ..` (row `j` in lane `j % lanes`), one lane at a time: each row visit is one
/// FMA per head and 16-block into `HB x NC` live accumulators (constant indices, so they stay
/// in registers), and the folds happen once per `l`. All heads of the pass share each visit
/// of a row, where a head at a time re-read all of V per head, in strided order (Qwen2.5-1.5B,
/// 6 heads per KV head, decoding 2048 deep: 17.3-17.6 -> 18.1-18.3 t/s). A head whose
/// probability is 0 skips the row, as the reference does. Each chain is the same FMAs in the
/// same order as the reference's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn pv_heads512<const HB: usize, const NC: usize, const M: usize, const H: bool>(
    (vp, w, len, g0, c0, lo, v_end, du, res): (
        &[*const u8],
        &[f32],
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        &mut [f32],
    ),
) {
    use core::arch::x86_64::*;
    let mut gl = [[[_mm512_setzero_ps(); NC]; HB]; 16];
    let wp = w.as_ptr().add(g0 * len);
    for l in 0..16 {
        let mut lanes = [[[_mm512_setzero_ps(); NC]; HB]; M];
        for (mg, lane) in lanes.iter_mut().enumerate() {
            let mut acc = [[_mm512_setzero_ps(); NC]; HB];
            // From the 16·M-row block holding `lo` (rows before it have p = 0: skipped anyway).
            let mut j = l + lo / (16 * M) * (16 * M) + 16 * mg;
            while j < v_end {
                let vr = *vp.get_unchecked(j);
                // Rows 16·M apart are too far apart for the hardware prefetcher: ask for the
                // row PV_AHEAD visits ahead (its chunk's lines), now.
                let jp = j + PV_AHEAD * 16 * M;
                if jp < v_end {
                    let pr = (*vp.get_unchecked(jp)).wrapping_add(c0 * if H { 2 } else { 4 });
                    for b in (0..NC * if H { 32 } else { 64 }).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(pr.wrapping_add(b) as *const i8);
                    }
                }
                for h in 0..HB {
                    let pj = *wp.add(h * len + j);
                    if pj != 0.0 {
                        let p = _mm512_set1_ps(pj);
                        for c in 0..NC {
                            let x = load16::<H>(vr, c0 + 16 * c);
                            acc[h][c] = _mm512_fmadd_ps(x, p, acc[h][c]);
                        }
                    }
                }
                j += 16 * M;
            }
            *lane = acc;
        }
        for h in 0..HB {
            for c in 0..NC {
                gl[l][h][c] = if M == 4 {
                    _mm512_add_ps(
                        _mm512_add_ps(lanes[0][h][c], lanes[2 % M][h][c]),
                        _mm512_add_ps(lanes[1 % M][h][c], lanes[3 % M][h][c]),
                    )
                } else {
                    lanes[0][h][c]
                };
            }
        }
    }
    for h in 0..HB {
        for c in 0..NC {
            for q in 0..8 {
                gl[q][h][c] = _mm512_add_ps(gl[q + 8][h][c], gl[q][h][c]);
            }
            for q in 0..4 {
                gl[q][h][c] = _mm512_add_ps(gl[q + 4][h][c], gl[q][h][c]);
            }
            let r = _mm512_add_ps(
                _mm512_add_ps(gl[0][h][c], gl[2][h][c]),
                _mm512_add_ps(gl[1][h][c], gl[3][h][c]),
            );
            _mm512_storeu_ps(res.as_mut_ptr().add((g0 + h) * du + c0 + 16 * c), r);
        }
    }
}
