//! Q4_K weights repacked at load (`prepare_weight`) into groups of 16 rows, so that one
//! 64-byte load holds the same quad of 16 rows and every integer sum lands in the lane of
//! its row: no horizontal sums, no per-row scale shuffles. The float chains are ggml's repack
//! GEMV and GEMM chains (quant's `RepackGemv` / `RepackGemm`), one row per lane, bit for bit.
//!
//! Layout of one 16-row group, per Q4_K block (`GROUP_BLOCK` bytes):
//! - 2048 bytes of nibbles: 64-byte line `8j + t` (sub-block pair `j`, quad `t`) holds bytes
//!   `qs[32j + 4t .. 32j + 4t + 4]` of rows 0..16; their low nibbles are quad `t` of
//!   sub-block `2j`, their high nibbles quad `t` of sub-block `2j + 1`;
//! - the 6-bit scales, `[s][row]` (128 bytes), then the mins `[s][row]` (128 bytes);
//! - `d` of the 16 rows (f16, 32 bytes), then `dmin` (32 bytes).

#![allow(clippy::needless_range_loop)]

/// Rows per group.
pub const ROWS: usize = 16;
/// Bytes of one block of a 16-row group.
pub const GROUP_BLOCK: usize = 2048 + 128 + 128 + 32 + 32;
const SC: usize = 2048;
const MN: usize = 2048 + 128;
const D: usize = 2048 + 256;
const DMIN: usize = 2048 + 256 + 32;

/// A block's nibble lines (the rest of it, scales, mins and `d`, follows them).
#[cfg(target_arch = "x86_64")]
const NIBBLE_LINES: usize = SC / 64;

const Q4_K_B: usize = 144;
/// How far ahead (bytes) the AVX2 kernels prefetch the weights into L2 (the AVX-512 one:
/// `kq512::prefetch_bytes`, 8 KiB on Intel's cores). On Zen 3 (AVX2, one thread, 58 MB
/// matrix) 16 KiB reached 12-14 GB/s of 14.6, 0-8 KiB 10-12.
#[cfg(target_arch = "x86_64")]
const PF: usize = 16384;
#[cfg(target_arch = "x86_64")]
const Q8_K_B: usize = 292;

/// 64-byte aligned bytes (the kernels use aligned-size lines; alignment keeps each line in
/// one cache line).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Line(pub [u8; 64]);

/// Bytes of a repacked `n_rows x k` Q4_K matrix (`n_rows % 16 == 0`, `k % 256 == 0`).
pub fn repacked_bytes(k: usize, n_rows: usize) -> usize {
    n_rows / ROWS * (k / 256) * GROUP_BLOCK
}

/// Repacks `n_rows` Q4_K rows of `k` elements (row `r` at `src[r * rs..]`) into `dst`.
pub fn repack(src: &[u8], rs: usize, k: usize, n_rows: usize, dst: &mut [u8]) {
    let nb = k / 256;
    assert!(n_rows % ROWS == 0 && k % 256 == 0);
    assert!(dst.len() >= repacked_bytes(k, n_rows));
    assert!(src.len() >= (n_rows - 1) * rs + nb * Q4_K_B);
    for g in 0..n_rows / ROWS {
        for i in 0..nb {
            let o = (g * nb + i) * GROUP_BLOCK;
            let out = &mut dst[o..o + GROUP_BLOCK];
            for r in 0..ROWS {
                let x = &src[(g * ROWS + r) * rs + i * Q4_K_B..][..Q4_K_B];
                for j in 0..4 {
                    for t in 0..8 {
                        let line = (8 * j + t) * 64 + 4 * r;
                        out[line..line + 4].copy_from_slice(&x[16 + 32 * j + 4 * t..][..4]);
                    }
                }
                let (sc, m) = quant::scale_min_k4(x[4..16].try_into().unwrap());
                for s in 0..8 {
                    out[SC + 16 * s + r] = sc[s];
                    out[MN + 16 * s + r] = m[s];
                }
                out[D + 2 * r..D + 2 * r + 2].copy_from_slice(&x[0..2]);
                out[DMIN + 2 * r..DMIN + 2 * r + 2].copy_from_slice(&x[2..4]);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use kernels::*;

#[cfg(target_arch = "x86_64")]
mod kernels {
    use super::*;
    use core::arch::x86_64::*;

    /// Column `c`'s Q8_K scale `d` in block `i` (`a + c * as_` is the column's row).
    #[inline(always)]
    unsafe fn col_d(a: *const u8, as_: usize, c: usize, i: usize) -> f32 {
        let y = a.add(c * as_ + i * Q8_K_B);
        f32::from_le_bytes(*(y as *const [u8; 4]))
    }

    /// Column `c`'s sums of sub-blocks `2j` and `2j + 1` in block `i` (each the sum of two
    /// 16-element bsums, |sum| <= 4096) as the i16 pair `(b0, b1)` of one 32-bit lane.
    #[inline(always)]
    unsafe fn col_bsum_pair(a: *const u8, as_: usize, c: usize, i: usize, j: usize) -> i32 {
        let bs = a.add(c * as_ + i * Q8_K_B + 260) as *const i16;
        let b0 = bs.add(4 * j).read_unaligned() + bs.add(4 * j + 1).read_unaligned();
        let b1 = bs.add(4 * j + 2).read_unaligned() + bs.add(4 * j + 3).read_unaligned();
        (b0 as u16 as u32 | (b1 as u16 as u32) << 16) as i32
    }

    /// Column `c`'s activation quads that meet line `8j + t` of block `i`: the low nibbles'
    /// (sub-block `2j`) and the high nibbles' (sub-block `2j + 1`), each four i8 as one i32.
    #[inline(always)]
    unsafe fn col_quads(
        a: *const u8,
        as_: usize,
        c: usize,
        i: usize,
        j: usize,
        t: usize,
    ) -> (i32, i32) {
        let yq = a.add(c * as_ + i * Q8_K_B + 4);
        (
            (yq.add(64 * j + 4 * t) as *const i32).read_unaligned(),
            (yq.add(64 * j + 32 + 4 * t) as *const i32).read_unaligned(),
        )
    }

    #[inline(always)]
    unsafe fn bytes16(p: *const u8) -> __m512i {
        _mm512_cvtepu8_epi32(_mm_load_si128(p as *const __m128i))
    }

    #[inline(always)]
    unsafe fn h16x16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_load_si256(p as *const __m256i))
    }

    /// `C` activation columns (column `c` at `a + c * as_`) against the 16-row groups
    /// `0 .. n_groups` (group `g` at `w + g * nb * GROUP_BLOCK`): `out[c * os + 16 g + r]`.
    /// `GEMM == false`: the GEMV chain (per block one fma of the whole sum, one of the mins);
    /// `true`: the GEMM chain (per sub-block pair). The nibbles of each weight line are
    /// unpacked once for all the columns; each (row, column) keeps its own chain, and the
    /// integer sums are exact in any order, so every output is the one-column result.
    #[inline(always)]
    unsafe fn columns<const GEMM: bool, const C: usize>(
        w: *const u8,
        n_groups: usize,
        nb: usize,
        a: *const u8,
        as_: usize,
        out: *mut f32,
        os: usize,
    ) {
        let m4 = _mm512_set1_epi8(0x0F);
        let mf0 = _mm512_set1_epi8(0xF0u8 as i8);
        let pf = crate::kq512::q4k16_prefetch();
        let pfd = crate::kq512::prefetch_bytes();
        // Every group uses the same columns' sub-block sum pairs: formed once per call
        // (per group they were ~10 scalar instructions each, a seventh of a block's work; at
        // decode every instruction competes with the weight stream).
        let mut pairs = PAIRS.with(|b| b.take());
        pairs.clear();
        for c in 0..C {
            for i in 0..nb {
                pairs.extend((0..4).map(|j| col_bsum_pair(a, as_, c, i, j)));
            }
        }
        let pp = pairs.as_ptr();
        for g in 0..n_groups {
            let gw = w.add(g * nb * GROUP_BLOCK);
            let mut acc = [_mm512_setzero_ps(); C];
            let mut accm = [_mm512_setzero_ps(); C];
            for i in 0..nb {
                let p = gw.add(i * GROUP_BLOCK);
                // Each nibble line's prefetch goes with its load below, the scale lines' here.
                // (All 37 at the block's start stalled retirement: samples piled up on the
                // prefetches, which wait for fill buffers, and the loads behind them could not
                // keep the memory busy. Spread out, the 1.5B's gate/up GEMVs ran 2.24-2.36 ->
                // 1.83-1.85 s per 128 decode steps: 31 GB/s, the probe's 29.8.)
                if pf {
                    for l in NIBBLE_LINES..GROUP_BLOCK / 64 {
                        crate::kq512::prefetch(p.wrapping_add(pfd + 64 * l));
                    }
                }
                // d·yd and dmin·yd of a column, formed where they are used (kept live for
                // four columns they would spill).
                let (d16, dmin16) = (h16x16(p.add(D)), h16x16(p.add(DMIN)));
                let yd = |c: usize| _mm512_set1_ps(col_d(a, as_, c, i));
                // The mins' term of sub-blocks 2j, 2j + 1 in one `vpdpwssd`: lane r holds
                // (mn[2j][r], mn[2j + 1][r]) as i16, the column's two sub-block sums
                // (|sum| <= 4096) are broadcast as an i16 pair. Integer sums are exact in any
                // order, so this is ggml's `b0 * mn0 + b1 * mn1` with half the multiplies.
                let mnp = |j: usize| {
                    let (mn0, mn1) = (
                        bytes16(p.add(MN + 32 * j)),
                        bytes16(p.add(MN + 32 * j + 16)),
                    );
                    _mm512_or_si512(mn0, _mm512_slli_epi32::<16>(mn1))
                };
                let bb = |c: usize, j: usize| _mm512_set1_epi32(*pp.add((c * nb + i) * 4 + j));
                let mut hs = [_mm512_setzero_si512(); C];
                // `jn` sub-block pairs at a time, their weight lines interleaved: each sum is a
                // chain of 8 dependent `vpdpbusd` (5 cycles each), so one pair at a time left
                // the core waiting on the chain; with few columns the registers hold four.
                let jn = match C {
                    1 => 4,
                    2 => 2,
                    _ => 1,
                };
                for j0 in (0..4).step_by(jn) {
                    let mut s0 = [[_mm512_setzero_si512(); C]; 4];
                    let mut s1 = [[_mm512_setzero_si512(); C]; 4];
                    for t in 0..8 {
                        for dj in 0..jn {
                            let j = j0 + dj;
                            if pf {
                                // The block's lines in order, one per load: the loads go
                                // through the sub-block pairs side by side (lines 8j + t), but
                                // with prefetches in address order the 1.5B's decode read 92.3%
                                // of the probe instead of 91.2% (medians; 3 of 3 interleaved
                                // rounds ahead, by 1.0-1.3 points).
                                let l = j0 * 8 + t * jn + dj;
                                crate::kq512::prefetch(p.wrapping_add(pfd + l * 64));
                            }
                            let wv = _mm512_load_si512(p.add((8 * j + t) * 64) as *const _);
                            let lo = _mm512_and_si512(wv, m4);
                            // The high nibbles in place (16 x the code): the sum is 16 x
                            // theirs, exact (at most 32·240·127 per lane), and is divided by
                            // 16 once below instead of shifting every line.
                            let hi = _mm512_and_si512(wv, mf0);
                            for c in 0..C {
                                let (q0, q1) = col_quads(a, as_, c, i, j, t);
                                let (a0, a1) = (_mm512_set1_epi32(q0), _mm512_set1_epi32(q1));
                                s0[dj][c] = _mm512_dpbusd_epi32(s0[dj][c], lo, a0);
                                s1[dj][c] = _mm512_dpbusd_epi32(s1[dj][c], hi, a1);
                            }
                        }
                    }
                    for dj in 0..jn {
                        let j = j0 + dj;
                        // scales of sub-blocks 2j and 2j + 1
                        let (sc0, sc1) = (
                            bytes16(p.add(SC + 32 * j)),
                            bytes16(p.add(SC + 32 * j + 16)),
                        );
                        for c in 0..C {
                            let h = _mm512_add_epi32(
                                _mm512_mullo_epi32(s0[dj][c], sc0),
                                _mm512_mullo_epi32(_mm512_srai_epi32::<4>(s1[dj][c]), sc1),
                            );
                            if GEMM {
                                let m =
                                    _mm512_dpwssd_epi32(_mm512_setzero_si512(), mnp(j), bb(c, j));
                                let (dw, dm) =
                                    (_mm512_mul_ps(d16, yd(c)), _mm512_mul_ps(dmin16, yd(c)));
                                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h), dw, acc[c]);
                                accm[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm, accm[c]);
                            } else {
                                hs[c] = _mm512_add_epi32(hs[c], h);
                            }
                        }
                    }
                }
                if !GEMM {
                    // The GEMV chain takes the block's mins term whole: formed here, after
                    // the weight lines, so it holds no registers across them.
                    let mn: [__m512i; 4] = core::array::from_fn(mnp);
                    for c in 0..C {
                        let mut im = _mm512_setzero_si512();
                        for j in 0..4 {
                            im = _mm512_dpwssd_epi32(im, mn[j], bb(c, j));
                        }
                        let (dw, dm) = (_mm512_mul_ps(d16, yd(c)), _mm512_mul_ps(dmin16, yd(c)));
                        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hs[c]), dw, acc[c]);
                        accm[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), dm, accm[c]);
                    }
                }
            }
            for c in 0..C {
                _mm512_storeu_ps(out.add(c * os + g * ROWS), _mm512_sub_ps(acc[c], accm[c]));
            }
        }
        PAIRS.with(|b| b.set(pairs));
    }

    std::thread_local! {
        /// [`columns`]' sub-block sum pairs of its columns, `[column][block][pair]`, kept per
        /// thread between calls.
        static PAIRS: core::cell::Cell<Vec<i32>> = const { core::cell::Cell::new(Vec::new()) };
    }

    /// [`columns`] for `C` columns, compiled for AVX-512 F/BW/VL/VNNI.
    ///
    /// # Safety
    /// As [`column_avx512`] for each of the `C` columns (`a + c * as_`, `out + c * os`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn columns_avx512<const C: usize>(
        gemm: bool,
        w: *const u8,
        n_groups: usize,
        nb: usize,
        a: *const u8,
        as_: usize,
        out: *mut f32,
        os: usize,
    ) {
        if gemm {
            columns::<true, C>(w, n_groups, nb, a, as_, out, os)
        } else {
            columns::<false, C>(w, n_groups, nb, a, as_, out, os)
        }
    }

    /// [`columns`] with 256-bit registers: the same layout and, lane by lane, the same integer
    /// sums and float operations in the same order (so the same bits), each group done as two
    /// halves of 8 rows (bytes `32h..32h + 32` of every line). No VNNI: `vpmaddubsw` (u8 x i8
    /// pair sums, never saturating here: the weights are nibbles, |pair| <= 2·15·128) and
    /// `vpmaddwd` by ones.
    #[inline(always)]
    unsafe fn columns256<const GEMM: bool, const C: usize>(
        w: *const u8,
        n_groups: usize,
        nb: usize,
        a: *const u8,
        as_: usize,
        out: *mut f32,
        os: usize,
    ) {
        let m4 = _mm256_set1_epi8(0x0F);
        let bytes8 = |p: *const u8| _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        let h8 = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        for g in 0..n_groups {
            let gw = w.add(g * nb * GROUP_BLOCK);
            for half in 0..2 {
                let (lo_b, sc_b, d_b) = (32 * half, 8 * half, 16 * half);
                let mut acc = [_mm256_setzero_ps(); C];
                let mut accm = [_mm256_setzero_ps(); C];
                for i in 0..nb {
                    let p = gw.add(i * GROUP_BLOCK);
                    if half == 0 {
                        for l in 0..GROUP_BLOCK / 64 {
                            crate::kq512::prefetch(p.wrapping_add(PF + 64 * l));
                        }
                    }
                    let (d8, dmin8) = (h8(p.add(D + d_b)), h8(p.add(DMIN + d_b)));
                    let yd = |c: usize| _mm256_set1_ps(col_d(a, as_, c, i));
                    let mnp = |j: usize| {
                        let (mn0, mn1) = (
                            bytes8(p.add(MN + 32 * j + sc_b)),
                            bytes8(p.add(MN + 32 * j + 16 + sc_b)),
                        );
                        _mm256_or_si256(mn0, _mm256_slli_epi32::<16>(mn1))
                    };
                    let bb = |c: usize, j: usize| _mm256_set1_epi32(col_bsum_pair(a, as_, c, i, j));
                    let mut hs = [_mm256_setzero_si256(); C];
                    for j in 0..4 {
                        // The eight quads' `vpmaddubsw` pair sums add up in i16 lanes (at
                        // most 8·2·15·128 = 30720: exact), widened to i32 once per sub-block.
                        let mut s0 = [_mm256_setzero_si256(); C];
                        let mut s1 = [_mm256_setzero_si256(); C];
                        for t in 0..8 {
                            let wv = _mm256_load_si256(p.add((8 * j + t) * 64 + lo_b) as *const _);
                            let lo = _mm256_and_si256(wv, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(wv), m4);
                            for c in 0..C {
                                let (q0, q1) = col_quads(a, as_, c, i, j, t);
                                let (a0, a1) = (_mm256_set1_epi32(q0), _mm256_set1_epi32(q1));
                                s0[c] = _mm256_add_epi16(s0[c], _mm256_maddubs_epi16(lo, a0));
                                s1[c] = _mm256_add_epi16(s1[c], _mm256_maddubs_epi16(hi, a1));
                            }
                        }
                        let ones = _mm256_set1_epi16(1);
                        for c in 0..C {
                            s0[c] = _mm256_madd_epi16(s0[c], ones);
                            s1[c] = _mm256_madd_epi16(s1[c], ones);
                        }
                        let (sc0, sc1) = (
                            bytes8(p.add(SC + 32 * j + sc_b)),
                            bytes8(p.add(SC + 32 * j + 16 + sc_b)),
                        );
                        for c in 0..C {
                            let h = _mm256_add_epi32(
                                _mm256_mullo_epi32(s0[c], sc0),
                                _mm256_mullo_epi32(s1[c], sc1),
                            );
                            if GEMM {
                                let m = _mm256_madd_epi16(mnp(j), bb(c, j));
                                let (dw, dm) =
                                    (_mm256_mul_ps(d8, yd(c)), _mm256_mul_ps(dmin8, yd(c)));
                                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), dw, acc[c]);
                                accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dm, accm[c]);
                            } else {
                                hs[c] = _mm256_add_epi32(hs[c], h);
                            }
                        }
                    }
                    if !GEMM {
                        let mn: [__m256i; 4] = core::array::from_fn(mnp);
                        for c in 0..C {
                            let mut im = _mm256_setzero_si256();
                            for j in 0..4 {
                                im = _mm256_add_epi32(im, _mm256_madd_epi16(mn[j], bb(c, j)));
                            }
                            let (dw, dm) = (_mm256_mul_ps(d8, yd(c)), _mm256_mul_ps(dmin8, yd(c)));
                            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hs[c]), dw, acc[c]);
                            accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), dm, accm[c]);
                        }
                    }
                }
                for c in 0..C {
                    _mm256_storeu_ps(
                        out.add(c * os + g * ROWS + 8 * half),
                        _mm256_sub_ps(acc[c], accm[c]),
                    );
                }
            }
        }
    }

    /// [`columns256`] for one column in one pass over the weights: both 8-row halves of
    /// every 64-byte line at once, so each line is read once and each activation quad
    /// broadcast once (the two-pass form re-read the group from cache in its second half,
    /// with no memory requests in flight meanwhile: on Zen 3, two threads, a 58 MB matrix
    /// went from 10-15 to 17-20 GB/s of 23, and Qwen2.5-1.5B's decode gained ~12%). Lane by lane the same integer sums and
    /// float operations in the same order as [`columns256`]: the same bits.
    #[inline(always)]
    unsafe fn column256<const GEMM: bool>(
        w: *const u8,
        n_groups: usize,
        nb: usize,
        a: *const u8,
        out: *mut f32,
    ) {
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let bytes8 = |p: *const u8| _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        let h8 = |p: *const u8| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        for g in 0..n_groups {
            let gw = w.add(g * nb * GROUP_BLOCK);
            let mut acc = [_mm256_setzero_ps(); 2];
            let mut accm = [_mm256_setzero_ps(); 2];
            for i in 0..nb {
                let p = gw.add(i * GROUP_BLOCK);
                // The scale lines' prefetches here, each nibble line's beside its load (see
                // `columns`).
                for l in NIBBLE_LINES..GROUP_BLOCK / 64 {
                    crate::kq512::prefetch(p.wrapping_add(PF + 64 * l));
                }
                let yd = _mm256_set1_ps(col_d(a, 0, 0, i));
                let mnp = |j: usize, h: usize| {
                    let (mn0, mn1) = (
                        bytes8(p.add(MN + 32 * j + 8 * h)),
                        bytes8(p.add(MN + 32 * j + 16 + 8 * h)),
                    );
                    _mm256_or_si256(mn0, _mm256_slli_epi32::<16>(mn1))
                };
                let bb = |j: usize| _mm256_set1_epi32(col_bsum_pair(a, 0, 0, i, j));
                let mut hs = [_mm256_setzero_si256(); 2];
                for j in 0..4 {
                    let mut s0 = [_mm256_setzero_si256(); 2];
                    let mut s1 = [_mm256_setzero_si256(); 2];
                    for t in 0..8 {
                        let (q0, q1) = col_quads(a, 0, 0, i, j, t);
                        let (a0, a1) = (_mm256_set1_epi32(q0), _mm256_set1_epi32(q1));
                        // Pinned (`prefetch_here`): LLVM bunched the intrinsic eight at a
                        // time. With the AVX2 backend on a Sapphire Rapids VM, the 1.5B's
                        // decode went 75.6 / 76.2% -> 84.4 / 87.8% of the probe, 22.5 -> 25.1
                        // t/s (2 interleaved rounds against the previous build).
                        crate::kq512::prefetch_here(p.wrapping_add(PF + (8 * j + t) * 64));
                        for h in 0..2 {
                            let wv =
                                _mm256_load_si256(p.add((8 * j + t) * 64 + 32 * h) as *const _);
                            let lo = _mm256_and_si256(wv, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(wv), m4);
                            s0[h] = _mm256_add_epi16(s0[h], _mm256_maddubs_epi16(lo, a0));
                            s1[h] = _mm256_add_epi16(s1[h], _mm256_maddubs_epi16(hi, a1));
                        }
                    }
                    for h in 0..2 {
                        let (sc0, sc1) = (
                            bytes8(p.add(SC + 32 * j + 8 * h)),
                            bytes8(p.add(SC + 32 * j + 16 + 8 * h)),
                        );
                        let hh = _mm256_add_epi32(
                            _mm256_mullo_epi32(_mm256_madd_epi16(s0[h], ones), sc0),
                            _mm256_mullo_epi32(_mm256_madd_epi16(s1[h], ones), sc1),
                        );
                        if GEMM {
                            let m = _mm256_madd_epi16(mnp(j, h), bb(j));
                            let d8 = h8(p.add(D + 16 * h));
                            let dmin8 = h8(p.add(DMIN + 16 * h));
                            let (dw, dm) = (_mm256_mul_ps(d8, yd), _mm256_mul_ps(dmin8, yd));
                            acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hh), dw, acc[h]);
                            accm[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dm, accm[h]);
                        } else {
                            hs[h] = _mm256_add_epi32(hs[h], hh);
                        }
                    }
                }
                if !GEMM {
                    for h in 0..2 {
                        let mut im = _mm256_setzero_si256();
                        for j in 0..4 {
                            im = _mm256_add_epi32(im, _mm256_madd_epi16(mnp(j, h), bb(j)));
                        }
                        let d8 = h8(p.add(D + 16 * h));
                        let dmin8 = h8(p.add(DMIN + 16 * h));
                        let (dw, dm) = (_mm256_mul_ps(d8, yd), _mm256_mul_ps(dmin8, yd));
                        acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hs[h]), dw, acc[h]);
                        accm[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), dm, accm[h]);
                    }
                }
            }
            for h in 0..2 {
                _mm256_storeu_ps(out.add(g * ROWS + 8 * h), _mm256_sub_ps(acc[h], accm[h]));
            }
        }
    }

    /// [`columns256`] for `C` columns, compiled for AVX2 + FMA + F16C.
    ///
    /// # Safety
    /// As [`column_avx512`], on a CPU with AVX2, FMA and F16C, for each of the `C` columns
    /// (`a + c * as_`, `out + c * os`).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn columns_avx2<const C: usize>(
        gemm: bool,
        w: *const u8,
        n_groups: usize,
        nb: usize,
        a: *const u8,
        as_: usize,
        out: *mut f32,
        os: usize,
    ) {
        match (gemm, C) {
            (true, 1) => column256::<true>(w, n_groups, nb, a, out),
            (false, 1) => column256::<false>(w, n_groups, nb, a, out),
            (true, _) => columns256::<true, C>(w, n_groups, nb, a, as_, out, os),
            (false, _) => columns256::<false, C>(w, n_groups, nb, a, as_, out, os),
        }
    }

    /// One column of [`columns`], compiled for AVX-512 F/BW/VL/VNNI: `out[r]` for the `16 * n_groups` rows
    /// of the groups at `w`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL/VNNI and F16C; `w` is 64-byte aligned and covers the
    /// groups; `a` is one Q8_K row of `nb` blocks; `out` covers `16 * n_groups` floats.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn column_avx512(
        gemm: bool,
        w: *const u8,
        n_groups: usize,
        nb: usize,
        a: *const u8,
        out: *mut f32,
    ) {
        columns_avx512::<1>(gemm, w, n_groups, nb, a, 0, out, 0)
    }

    /// A block's nibble lines of one 16-row group (at `g`) as bytes: line `8 * sub + t` of
    /// `q` is quad `t` of sub-block `sub` of the 16 rows (row r at byte 4r), the layout both
    /// 16-column tiles multiply with.
    #[inline(always)]
    unsafe fn unpack_lines(g: *const u8, q: *mut Line) {
        let m4 = _mm512_set1_epi8(0x0F);
        for j in 0..4 {
            for t in 0..8 {
                let wv = _mm512_load_si512(g.add((8 * j + t) * 64) as *const _);
                let lo = _mm512_and_si512(wv, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), m4);
                _mm512_store_si512(q.add(8 * (2 * j) + t) as *mut _, lo);
                _mm512_store_si512(q.add(8 * (2 * j + 1) + t) as *mut _, hi);
            }
        }
    }

    /// Bytes of one block of 16 activation columns packed for [`tile_amx`]: per sub-block the
    /// 16 columns' 32 quants (tile A rows, 512 bytes), then the columns' `d` (16 f32), then
    /// each column's eight sub-block sums as f32 (`[column][sub-block]`).
    pub const AMX_BLOCK: usize = 8 * 512 + 64 + 16 * 8 * 4;
    const AMX_YD: usize = 8 * 512;
    const AMX_BS: usize = 8 * 512 + 64;

    /// Packs 16 Q8_K activation rows (row `c` at `a + c * as_`, `nb` blocks) for
    /// [`tile_amx`]: contiguous tile rows (the rows themselves are a block apart, 16 cache
    /// lines per tile load) and the per-column terms converted once for all weight rows.
    ///
    /// # Safety
    /// The rows hold `nb` blocks; `dst` covers `nb * AMX_BLOCK` bytes.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn pack_amx(a: *const u8, as_: usize, nb: usize, dst: *mut u8) {
        let ones = _mm256_set1_epi16(1);
        for i in 0..nb {
            let d = dst.add(i * AMX_BLOCK);
            for c in 0..16 {
                let y = a.add(c * as_ + i * Q8_K_B);
                for s in 0..8 {
                    let q = _mm256_loadu_si256(y.add(4 + 32 * s) as *const __m256i);
                    _mm256_storeu_si256(d.add(512 * s + 32 * c) as *mut __m256i, q);
                }
                core::ptr::copy_nonoverlapping(y, d.add(AMX_YD + 4 * c), 4);
                // ggml's b0/b1: sums of pairs of 16-element bsums, exact as f32.
                let bs = _mm256_loadu_si256(y.add(260) as *const __m256i);
                let b = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, ones));
                _mm256_storeu_ps(d.add(AMX_BS + 32 * c) as *mut f32, b);
            }
        }
    }

    /// [`tile_avx512`] on AMX tiles, for `T` tiles of 16 activation columns packed by
    /// [`pack_amx`] (tile `t` at `p + t * ps`): per sub-block pair one tile product of 16
    /// columns by 16 rows for each sub-block (the exact sums `s0`, `s1` that the VNNI
    /// kernels build), then the same chain with one row per lane. `s·sc` and `b·m` (below
    /// 2^24) and their pair sums are exact in f32, so forming them as float products and one
    /// FMA gives `f32(hs)` and `f32(im)` bit for bit. The weights' unpacked sub-blocks (B
    /// tiles) serve every column tile, and each column's `d · yd` and `dmin · yd` are formed
    /// once per block (the same products the chain used per sub-block pair). Output
    /// `out[c * ostride + r]` for column `c` of `16 T`.
    ///
    /// # Safety
    /// As [`column_avx512`]; `nb >= 1`; `p` holds `T` packed tiles of `nb` blocks, `ps` bytes
    /// apart; `out` covers `(16 T - 1) * ostride + 16` floats.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile_amx<const T: usize>(
        _tiles: &crate::amx::Tiles<32>,
        w: *const u8,
        nb: usize,
        p: *const u8,
        ps: usize,
        out: *mut f32,
        ostride: usize,
    ) {
        use crate::amx;
        debug_assert!(nb >= 1, "the accumulators start in the first block");
        // The chains' accumulators (in memory for T = 2: 4T KiB), started by the first
        // sub-block pair's FMAs onto a zero register instead of zeroed per call (a memset
        // per call was ~2.5% of the 1.5B's prompt time); each FMA is the chain's own.
        let mut acc = core::mem::MaybeUninit::<[[__m512; 16]; T]>::uninit();
        let mut accm = core::mem::MaybeUninit::<[[__m512; 16]; T]>::uninit();
        let (acc, accm) = (
            acc.as_mut_ptr() as *mut __m512,
            accm.as_mut_ptr() as *mut __m512,
        );
        // Each column's d · yd and dmin · yd for the block; sub-block `s` of the 16 rows as 8
        // lines of unsigned bytes (tile B rows); the two sums of one sub-block pair (tile C
        // rows: column c's 16 row sums). Each is written before it is read: left
        // uninitialised, not zeroed per call (memsets of 13 KiB were ~6% of the 1.5B's
        // prompt time).
        let mut dd = core::mem::MaybeUninit::<[[__m512; 16]; T]>::uninit();
        let mut dm = core::mem::MaybeUninit::<[[__m512; 16]; T]>::uninit();
        let (dd, dm) = (
            dd.as_mut_ptr() as *mut __m512,
            dm.as_mut_ptr() as *mut __m512,
        );
        let mut q = core::mem::MaybeUninit::<[Line; 64]>::uninit();
        let q = q.as_mut_ptr() as *mut Line;
        let mut cs = core::mem::MaybeUninit::<[Line; 32]>::uninit();
        let cs = cs.as_mut_ptr() as *mut Line;
        for i in 0..nb {
            let g = w.add(i * GROUP_BLOCK);
            unpack_lines(g, q);
            let (d16, dmin16) = (h16x16(g.add(D)), h16x16(g.add(DMIN)));
            for t in 0..T {
                let yd = p.add(t * ps + i * AMX_BLOCK + AMX_YD) as *const f32;
                for c in 0..16 {
                    let ydc = _mm512_set1_ps(*yd.add(c));
                    dd.add(16 * t + c).write(_mm512_mul_ps(d16, ydc));
                    dm.add(16 * t + c).write(_mm512_mul_ps(dmin16, ydc));
                }
            }
            for sb in 0..4 {
                let first = i == 0 && sb == 0;
                let prev = |x: *mut __m512| match first {
                    true => _mm512_setzero_ps(),
                    false => x.read(),
                };
                amx::load2::<4, 5>(
                    q.add(8 * (2 * sb)) as *const u8,
                    q.add(8 * (2 * sb + 1)) as *const u8,
                );
                let f = |o: usize| _mm512_cvtepi32_ps(bytes16(g.add(o)));
                let (sc0, sc1) = (f(SC + 32 * sb), f(SC + 32 * sb + 16));
                let (m0, m1) = (f(MN + 32 * sb), f(MN + 32 * sb + 16));
                for t in 0..T {
                    let pb = p.add(t * ps + i * AMX_BLOCK);
                    let bf = pb.add(AMX_BS) as *const f32;
                    amx::zero_acc();
                    amx::dot2_b(pb.add(512 * (2 * sb)), pb.add(512 * (2 * sb + 1)), 32);
                    amx::store_acc(cs as *mut u8, cs.add(16) as *mut u8);
                    for c in 0..16 {
                        let s0 = _mm512_cvtepi32_ps(_mm512_load_si512(cs.add(c) as *const _));
                        let s1 = _mm512_cvtepi32_ps(_mm512_load_si512(cs.add(16 + c) as *const _));
                        let hs = _mm512_fmadd_ps(s1, sc1, _mm512_mul_ps(s0, sc0));
                        let (a, am) = (acc.add(16 * t + c), accm.add(16 * t + c));
                        a.write(_mm512_fmadd_ps(hs, dd.add(16 * t + c).read(), prev(a)));
                        let (b0, b1) = (
                            _mm512_set1_ps(*bf.add(8 * c + 2 * sb)),
                            _mm512_set1_ps(*bf.add(8 * c + 2 * sb + 1)),
                        );
                        let im = _mm512_fmadd_ps(b1, m1, _mm512_mul_ps(b0, m0));
                        am.write(_mm512_fmadd_ps(im, dm.add(16 * t + c).read(), prev(am)));
                    }
                }
            }
        }
        for t in 0..T {
            for c in 0..16 {
                let o = out.add((16 * t + c) * ostride);
                let (a, am) = (acc.add(16 * t + c).read(), accm.add(16 * t + c).read());
                _mm512_storeu_ps(o, _mm512_sub_ps(a, am));
            }
        }
    }

    /// The GEMM chain of 16 rows (one group at `w`) against a packed 16-column tile
    /// (`kq512::pack_q8k_t16`), one column per lane: `out[c * ostride + r]`.
    ///
    /// # Safety
    /// As [`column_avx512`]; `p` is a packed tile of `nb` blocks; `out` covers
    /// `15 * ostride + 16` floats.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn tile_avx512(
        w: *const u8,
        nb: usize,
        p: *const u8,
        out: *mut f32,
        ostride: usize,
    ) {
        use crate::kq512::{Q8K_T16_BLOCK, T16};
        const BS: usize = 4096;
        const YD: usize = 4096 + 1024;
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let mut accm = [_mm512_setzero_ps(); ROWS];
        let mut q = [Line([0; 64]); 64];
        for i in 0..nb {
            let g = w.add(i * GROUP_BLOCK);
            let pb = p.add(i * Q8K_T16_BLOCK);
            unpack_lines(g, q.as_mut_ptr());
            let yd = _mm512_loadu_ps(pb.add(YD) as *const f32);
            for r0 in (0..ROWS).step_by(2) {
                let mut dw = [_mm512_setzero_ps(); 2];
                let mut dm = [_mm512_setzero_ps(); 2];
                for h in 0..2 {
                    let r = r0 + h;
                    let xd = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                        (g.add(D + 2 * r) as *const u16).read() as i32,
                    )));
                    let xdm = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                        (g.add(DMIN + 2 * r) as *const u16).read() as i32,
                    )));
                    dw[h] = _mm512_mul_ps(_mm512_set1_ps(xd), yd);
                    dm[h] = _mm512_mul_ps(_mm512_set1_ps(xdm), yd);
                }
                for sb in 0..4 {
                    let mut s = [[_mm512_setzero_si512(); 2]; 2];
                    for e in 0..2 {
                        let sub = 2 * sb + e;
                        for qd in 0..8 {
                            let a = _mm512_loadu_si512(pb.add((8 * sub + qd) * 64) as *const _);
                            for h in 0..2 {
                                let wq = (q[8 * sub + qd].0.as_ptr().add(4 * (r0 + h))
                                    as *const i32)
                                    .read();
                                s[h][e] = _mm512_dpbusd_epi32(s[h][e], _mm512_set1_epi32(wq), a);
                            }
                        }
                    }
                    let bsp = pb.add(BS + 4 * sb * 64);
                    let b0 = _mm512_add_epi32(
                        _mm512_loadu_si512(bsp as *const _),
                        _mm512_loadu_si512(bsp.add(64) as *const _),
                    );
                    let b1 = _mm512_add_epi32(
                        _mm512_loadu_si512(bsp.add(128) as *const _),
                        _mm512_loadu_si512(bsp.add(192) as *const _),
                    );
                    for h in 0..2 {
                        let r = r0 + h;
                        let sc0 = *g.add(SC + 16 * (2 * sb) + r) as i32;
                        let sc1 = *g.add(SC + 16 * (2 * sb + 1) + r) as i32;
                        let m0 = *g.add(MN + 16 * (2 * sb) + r) as i32;
                        let m1 = *g.add(MN + 16 * (2 * sb + 1) + r) as i32;
                        let hs = _mm512_add_epi32(
                            _mm512_mullo_epi32(s[h][0], _mm512_set1_epi32(sc0)),
                            _mm512_mullo_epi32(s[h][1], _mm512_set1_epi32(sc1)),
                        );
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hs), dw[h], acc[r]);
                        let im = _mm512_add_epi32(
                            _mm512_mullo_epi32(b0, _mm512_set1_epi32(m0)),
                            _mm512_mullo_epi32(b1, _mm512_set1_epi32(m1)),
                        );
                        accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), dm[h], accm[r]);
                    }
                }
            }
        }
        for r in 0..ROWS {
            let mut v = [0f32; T16];
            _mm512_storeu_ps(v.as_mut_ptr(), _mm512_sub_ps(acc[r], accm[r]));
            for c in 0..T16 {
                *out.add(c * ostride + r) = v[c];
            }
        }
    }
}
