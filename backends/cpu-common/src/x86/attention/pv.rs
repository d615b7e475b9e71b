//! x86 twins of [`crate::ops::attention::pv`]: p·V in registers.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// Outputs `c0 .. c0 + 64` of one head's p·V (see [`pv_in_registers`]) into `out`, on AVX2:
/// [`pv_heads512`]'s order for one head with `NC = 4` (the 64 outputs of one lane chain are
/// eight 256-bit accumulators), so each row visit reads 256 contiguous bytes once, instead
/// of the generic loop's four passes of 64 bytes over every row. `M` = lanes / 16.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn pv_chunk256<const M: usize, const H: bool>(
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
pub(crate) const PV_AHEAD: usize = 8;

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
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(crate) unsafe fn pv_heads512<
    const HB: usize,
    const NC: usize,
    const M: usize,
    const H: bool,
>(
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
