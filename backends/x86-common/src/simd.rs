//! x86-64 SIMD twins of quant's scalar x86 kernels (`quant::dot_with`).
//!
//! Integer parts are exact in every kernel (no saturation is reachable: the `maddubs` inputs
//! are unsigned quants <= 63 times i8, signed-by-signed products go through i16), so any
//! grouping of the integer sums gives the same integers. The float operations are replayed in
//! quant's order: `_mm256_fmadd_ps` into eight lanes where the twin has eight lanes
//! (`hsum_float_8` at the end), scalar `mul_add` where the twin has one lane per output.
//!
//! Every kernel body is `#[inline(always)]` and generic over `VNNI`; the public entry points
//! are compiled twice, once per ISA (`#[target_feature]`), so the AVX2 build never contains an
//! instruction outside AVX2/FMA/F16C on its reachable paths and no build needs a global
//! `-C target-cpu`.

#![allow(clippy::needless_range_loop)]

pub(crate) use crate::hsum::hsum_float_8;
use core::arch::x86_64::*;
use quant::{scale_min_k4, Kernel};

/// Bytes of one block of each format used here.
const Q4_0_B: usize = 18;
const Q4_1_B: usize = 20;
const Q5_0_B: usize = 22;
const Q8_0_B: usize = 34;
const Q8_1_B: usize = 36;
const Q4_K_B: usize = 144;
const Q6_K_B: usize = 210;
const Q8_K_B: usize = 292;

#[inline(always)]
unsafe fn ld(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// The f16 at `p` as f32 by F16C `vcvtph2ps` (exact; NaN made quiet), which is what
/// `quant::fp16_to_f32` emulates bit for bit (see `h16_matches_scalar`).
#[inline(always)]
unsafe fn h16(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    f32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

#[inline(always)]
unsafe fn i16_at(p: *const u8, i: usize) -> i32 {
    i16::from_le_bytes([*p.add(2 * i), *p.add(2 * i + 1)]) as i32
}

/// Sum of eight i32 lanes (exact up to wrapping, which is order-independent).
#[inline(always)]
unsafe fn hsum_i32_8(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// A GEMV streams its weights from memory once, and the AVX2 kernels stalled on the first
/// load of each cache line without software prefetch (Q6_K decode of Qwen2.5-1.5B on Zen 3:
/// 10 GB/s of 23). Measured there (interleaved A/B, SmolLM2, Qwen2.5-0.5B/1.5B, Gemma 3):
/// the 32-element formats do best asking for the same block two row groups ahead into L1
/// (one request per block: a block is under 64 bytes) — 16 KiB ahead into L2 lost ~10% on
/// SmolLM2 — and Q6_K, whose rows are long, every line of the block 16 KiB ahead into L2
/// as the AVX-512 kernels do ([`crate::kq512::prefetch_rows`]).
#[inline(always)]
unsafe fn prefetch_l1(x: *const u8, ahead: usize) {
    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(ahead) as *const i8);
}

/// Eight i32 lanes, lane `k` = Σ u[4k..4k+4]·s[4k..4k+4], `u` unsigned bytes (< 128 here), `s`
/// signed bytes.
#[inline(always)]
unsafe fn quads_us<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// As [`quads_us`] with each product pair scaled by the i16 lanes of `sc` (exact).
#[inline(always)]
unsafe fn quads_us_scaled(u: __m256i, s: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc)
}

/// Eight i32 lanes of quad sums of signed weight bytes `a` (any i8) and activation bytes `y`
/// (ggml's `mul_sum_i8_pairs`): `|a|` as u8 (-128 gives 128) times `sign(y, a)` through
/// `vpmaddubsw`. Exact when no byte of `y` is -128: then `sign(y, a)·|a| = y·a` and a pair
/// sums to at most 2·128·127 < 2^15. The activations are quantized by `quantize_q8_0_x86`
/// (`round(v · 127/max)`, in -127..=127; only an overflowing `127/max` saturates, and then
/// the block's f16 scale is 0, so its quads are multiplied by zero whatever they are).
#[inline(always)]
unsafe fn quads_ss(a: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(a, a);
    let sy = _mm256_sign_epi8(y, a);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// 16 packed bytes -> 32 nibbles: low nibbles (elements 0..16) then high nibbles (16..32).
#[inline(always)]
unsafe fn nibbles_32(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(q), q);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// ggml's `bytes_from_bits_32`: byte `j` is 0xFF where bit `j` of the little-endian u32 is set.
#[inline(always)]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

// ---------------------------------------------------------------- legacy formats
//
// Every kernel computes `R` weight rows (row `r` at `w + r * ws`) against one activation row
// at once: each row keeps its own accumulators and float chain (bit-identical to R = 1); the
// rows only share the activation loads and hide each other's FMA latency.

/// Bytes of a block of the format [`dot_q0`] calls `FMT` (8: Q8_0, 5: Q5_0, else Q4_0).
const fn q0_block(fmt: u8) -> usize {
    match fmt {
        8 => Q8_0_B,
        5 => Q5_0_B,
        _ => Q4_0_B,
    }
}

/// Block `x` of format `FMT` ([`q0_block`]): its scale and its 32 codes, signed for Q8_0,
/// unsigned for Q4_0 (0..16) and Q5_0 (0..32).
#[inline(always)]
unsafe fn decode_q0<const FMT: u8>(x: *const u8) -> (f32, __m256i) {
    let q = if FMT == 8 {
        ld(x.add(2))
    } else if FMT == 4 {
        nibbles_32(x.add(2))
    } else {
        let hb = _mm256_and_si256(bytes_from_bits_32(x.add(2)), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles_32(x.add(6)), hb)
    };
    (h16(x), q)
}

/// `hsum_float_8` of every (row, column) accumulator of a tile.
#[inline(always)]
unsafe fn hsum_tile<const R: usize, const C: usize>(acc: &[[__m256; R]; C]) -> [[f32; R]; C] {
    let mut out = [[0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            out[c][r] = hsum_float_8(acc[c][r]);
        }
    }
    out
}

/// `ggml_vec_dot_{q8_0,q5_0,q4_0}_q8_0` and tinyBLAS_Q0_AVX (same chain): per block
/// `acc = fma(dx*dy, quads, acc)`, then `hsum_float_8`. `C` activation columns (column `c` at
/// `a + c * as_`) at once: each (row, column) keeps its own accumulator and chain, the
/// weight decode is shared by the columns and the activation loads by the rows.
#[inline(always)]
unsafe fn dot_q0<const FMT: u8, const VNNI: bool, const R: usize, const C: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    nb: usize,
) -> [[f32; R]; C] {
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    let block = q0_block(FMT);
    for i in 0..nb {
        let mut yq = [_mm256_setzero_si256(); C];
        let mut dy = [_mm256_setzero_ps(); C];
        let mut ys = [_mm256_setzero_si256(); C];
        for c in 0..C {
            let y = a.add(c * as_ + i * Q8_0_B);
            yq[c] = ld(y.add(2));
            dy[c] = _mm256_set1_ps(h16(y));
            // Σ y per quad, for the unsigned-weight forms below.
            ys[c] = quads_us::<VNNI>(_mm256_set1_epi8(1), yq[c]);
            if VNNI {
                // The offset of the unsigned codes, negated: vpdpbusd starts from it, so
                // `codes · y - offset · Σ y` is one instruction per (row, column), exact.
                let shift = if FMT == 8 {
                    7
                } else if FMT == 4 {
                    3
                } else {
                    4
                };
                ys[c] = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_sllv_epi32(ys[c], _mm256_set1_epi32(shift)),
                );
            }
        }
        for r in 0..R {
            let x = w.add(r * ws + i * block);
            if C == 1 {
                prefetch_l1(x, 2 * R * ws);
            }
            let (dx, q) = decode_q0::<FMT>(x);
            // Q8_0 with VNNI: (q + 128) as u8 times y, minus 128 * Σ y: exact in i32.
            let qu = if FMT == 8 && VNNI {
                _mm256_xor_si256(q, _mm256_set1_epi8(-128))
            } else {
                q
            };
            let vdx = _mm256_set1_ps(dx);
            for c in 0..C {
                let quads = if VNNI {
                    _mm256_dpbusd_epi32(ys[c], qu, yq[c])
                } else if FMT == 8 {
                    quads_ss(q, yq[c])
                } else if FMT == 4 {
                    // codes times y, minus 8 * Σ y: exact.
                    _mm256_sub_epi32(quads_us::<VNNI>(qu, yq[c]), _mm256_slli_epi32::<3>(ys[c]))
                } else {
                    // codes times y, minus 16 * Σ y: exact.
                    _mm256_sub_epi32(quads_us::<VNNI>(qu, yq[c]), _mm256_slli_epi32::<4>(ys[c]))
                };
                // dx * dy in every lane: the same product as the scalar one.
                let d = _mm256_mul_ps(vdx, dy[c]);
                let p = _mm256_cvtepi32_ps(quads);
                acc[c][r] = _mm256_fmadd_ps(d, p, acc[c][r]);
            }
        }
    }
    // (no closures here: they would not inherit the target features, and the intrinsics
    // inside would become calls; `hsum_tile` is an inlined function)
    hsum_tile(&acc)
}

/// `ggml_vec_dot_q4_1_q8_1`: `acc = fma(quads, dx*dy, acc)`, `summs = fma(m, s, summs)`,
/// `hsum_float_8(acc) + summs`; `R` rows by `C` columns as [`dot_q0`].
#[inline(always)]
unsafe fn dot_q4_1<const VNNI: bool, const R: usize, const C: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    nb: usize,
) -> [[f32; R]; C] {
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    let mut summs = [[0f32; R]; C];
    for i in 0..nb {
        let mut yq = [_mm256_setzero_si256(); C];
        let mut dy = [0f32; C];
        let mut sy = [0f32; C];
        for c in 0..C {
            let y = a.add(c * as_ + i * Q8_1_B);
            dy[c] = h16(y);
            sy[c] = h16(y.add(2));
            yq[c] = ld(y.add(4));
        }
        for r in 0..R {
            let x = w.add(r * ws + i * Q4_1_B);
            if C == 1 {
                prefetch_l1(x, 2 * R * ws);
            }
            let (dx, mx) = (h16(x), h16(x.add(2)));
            let qx = nibbles_32(x.add(4));
            for c in 0..C {
                summs[c][r] = mx.mul_add(sy[c], summs[c][r]);
                let d = dx * dy[c];
                let p = _mm256_cvtepi32_ps(quads_us::<VNNI>(qx, yq[c]));
                acc[c][r] = _mm256_fmadd_ps(_mm256_set1_ps(d), p, acc[c][r]);
            }
        }
    }
    let mut out = [[0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            out[c][r] = hsum_float_8(acc[c][r]) + summs[c][r];
        }
    }
    out
}

// ---------------------------------------------------------------- column pairs (AVX-512)
//
// The legacy kernels' float chain lives in eight lanes per (row, column). Two columns fit one
// 512-bit register: the weight block broadcast to both halves, column c's activations in the
// low half and column c+1's in the high half, so one vpdpbusd, one conversion, one product and
// one FMA serve both columns, and every lane still runs exactly its own chain (a vector FMA
// lane is the scalar fused multiply-add). Only the AVX-512 backend (VNNI = true) runs these.

/// [`dot_q0`] for one activation column with row pairs in 512-bit registers (the GEMV of
/// decode): rows `2p` and `2p + 1` in the low and high halves, the activation block in both,
/// so one vpdpbusd, conversion, product and FMA serve two rows, and each lane still runs its
/// own chain (the same bits as [`dot_q0`]). Q5_0's fifth bits come from a mask register
/// (`vpaddb` under the mask of both rows' 32 bits), not from AVX2 shuffles.
#[inline(always)]
unsafe fn dot_q0_row_pairs<const FMT: u8, const P: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    nb: usize,
) -> [[f32; 2]; P] {
    let block = match FMT {
        8 => Q8_0_B,
        5 => Q5_0_B,
        _ => Q4_0_B,
    };
    let shift = _mm512_set1_epi32(match FMT {
        8 => 7,
        5 => 4,
        _ => 3,
    });
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); P];
    for i in 0..nb {
        let y = a.add(i * Q8_0_B);
        let yq = _mm512_broadcast_i64x4(ld(y.add(2)));
        let dy = _mm512_set1_ps(h16(y));
        // -(offset · Σ y) per quad: vpdpbusd starts from it (see dot_q0).
        let ys = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), yq);
        let ys = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_sllv_epi32(ys, shift));
        for p in 0..P {
            let x0 = w.add(2 * p * ws + i * block);
            let x1 = x0.add(ws);
            // Two row groups ahead (never faults): without it the 136 MB Q8_0 output layer
            // of Qwen2.5-0.5B took 1.5x as long.
            prefetch_l1(x0, 4 * P * ws);
            prefetch_l1(x1, 4 * P * ws);
            // Both rows' scales converted in one instruction (exact, as the scalar one).
            let dx = _mm512_cvtph_ps(_mm256_set_m128i(
                _mm_set1_epi16((x1 as *const i16).read_unaligned()),
                _mm_set1_epi16((x0 as *const i16).read_unaligned()),
            ));
            let q = if FMT == 8 {
                // (q + 128) as u8; the offset 128 · Σ y is in `ys`.
                let q = pair_i(ld(x0.add(2)), ld(x1.add(2)));
                _mm512_xor_si512(q, _mm512_set1_epi8(-128))
            } else {
                let qs = if FMT == 5 { 6 } else { 2 };
                // [qs0, qs0, qs1, qs1]: low nibbles in the even 128-bit lanes, high in the odd.
                let both = _mm256_set_m128i(
                    _mm_loadu_si128(x1.add(qs) as *const __m128i),
                    _mm_loadu_si128(x0.add(qs) as *const __m128i),
                );
                let v = _mm512_castsi256_si512(both);
                let v = _mm512_shuffle_i64x2::<0x50>(v, v);
                let nib = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFF00_FF00, v, 4), m4);
                if FMT == 5 {
                    let h0 = (x0.add(2) as *const u32).read_unaligned() as u64;
                    let h1 = (x1.add(2) as *const u32).read_unaligned() as u64;
                    _mm512_mask_add_epi8(nib, h0 | h1 << 32, nib, _mm512_set1_epi8(0x10))
                } else {
                    nib
                }
            };
            let quads = _mm512_dpbusd_epi32(ys, q, yq);
            let d = _mm512_mul_ps(dx, dy);
            acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(quads), acc[p]);
        }
    }
    let mut out = [[0f32; 2]; P];
    for p in 0..P {
        out[p] = [
            hsum_float_8(_mm512_castps512_ps256(acc[p])),
            hsum_float_8(high_ps(acc[p])),
        ];
    }
    out
}

/// `[lo | hi]`.
#[inline(always)]
unsafe fn pair_i(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Eight lanes of `lo`, eight of `hi`.
#[inline(always)]
unsafe fn pair_ps(lo: f32, hi: f32) -> __m512 {
    _mm512_mask_mov_ps(_mm512_set1_ps(lo), 0xFF00, _mm512_set1_ps(hi))
}

/// The high eight lanes.
#[inline(always)]
unsafe fn high_ps(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}

/// The activation side of the pair kernels, once per call instead of once per row: for each
/// block and column pair three vectors, the pair's codes `[y_c | y_c+1]`, its scales `dy` in
/// eight lanes each, and a third that holds
/// the codes' offset times Σ y per quad, negated (Q8_0/Q5_0/Q4_0, `shift` = log2 offset), or
/// for Q4_1 (`shift` = 0) in pair 0 the columns' `s` values, column c in lane c.
#[inline(always)]
unsafe fn pack_pairs<const Q81: bool>(
    a: *const u8,
    as_: usize,
    cols: usize,
    nb: usize,
    shift: u32,
    buf: &mut Vec<__m512i>,
) {
    let np = cols / 2;
    buf.clear();
    buf.resize(nb * np * 3, _mm512_setzero_si512());
    let bb = if Q81 { Q8_1_B } else { Q8_0_B };
    let qo = if Q81 { 4 } else { 2 };
    for i in 0..nb {
        let mut sy = [0f32; 16];
        for p in 0..np {
            let y0 = a.add(2 * p * as_ + i * bb);
            let y1 = a.add((2 * p + 1) * as_ + i * bb);
            let yq = pair_i(ld(y0.add(qo)), ld(y1.add(qo)));
            let o = (i * np + p) * 3;
            buf[o] = yq;
            buf[o + 1] = _mm512_castps_si512(pair_ps(h16(y0), h16(y1)));
            if Q81 {
                sy[2 * p] = h16(y0.add(2));
                sy[2 * p + 1] = h16(y1.add(2));
            } else {
                let sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), yq);
                buf[o + 2] = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_sllv_epi32(sum, _mm512_set1_epi32(shift as i32)),
                );
            }
        }
        if Q81 {
            buf[i * np * 3 + 2] = _mm512_castps_si512(_mm512_loadu_ps(sy.as_ptr()));
        }
    }
}

/// [`dot_q0`] / [`dot_q4_1`] with VNNI over packed column pairs (`C` even, at most 16): one
/// 512-bit vpdpbusd, conversion, product and FMA for two columns, every lane its own chain
/// (same bits). `FMT`: 8, 5, 4 (Q8_0, Q5_0, Q4_0) or 1 (Q4_1).
#[inline(always)]
unsafe fn dot_pairs<const FMT: u8, const R: usize, const C: usize>(
    w: *const u8,
    ws: usize,
    packed: *const __m512i,
    nb: usize,
) -> [[f32; R]; C] {
    // Pairs are indexed 0..C/2; the arrays are sized C (stable Rust has no C/2 lengths).
    let mut acc = [[_mm512_setzero_ps(); R]; C];
    let mut summs = [_mm512_setzero_ps(); R];
    for i in 0..nb {
        let pk = packed.add(i * (C / 2) * 3);
        // Every row's block decoded first, then each pair's activations loaded once for all
        // the rows (loaded per row, the 43 KiB packed tile of a 896-wide Q5_0 matrix came
        // from L2 once per row).
        let mut q2s = [_mm512_setzero_si512(); R];
        let mut vdxs = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let dx;
            let q;
            if FMT == 8 {
                let x = w.add(r * ws + i * Q8_0_B);
                dx = h16(x);
                // (q + 128) as u8; the packed offset term takes 128 * Σ y back: exact.
                q = _mm256_xor_si256(ld(x.add(2)), _mm256_set1_epi8(-128));
            } else if FMT == 4 {
                let x = w.add(r * ws + i * Q4_0_B);
                dx = h16(x);
                q = _mm256_setzero_si256();
            } else if FMT == 5 {
                let x = w.add(r * ws + i * Q5_0_B);
                dx = h16(x);
                let nib = nibbles_32(x.add(6));
                let hb = _mm256_and_si256(bytes_from_bits_32(x.add(2)), _mm256_set1_epi8(0x10));
                q = _mm256_or_si256(nib, hb);
            } else {
                // d and m converted together: [d, m, d, m] from one 4-byte broadcast.
                let x = w.add(r * ws + i * Q4_1_B);
                let dm = _mm_cvtph_ps(_mm_set1_epi32((x as *const i32).read_unaligned()));
                dx = _mm_cvtss_f32(dm);
                let mx = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
                let vsy = _mm512_castsi512_ps(*pk.add(2));
                summs[r] = _mm512_fmadd_ps(mx, vsy, summs[r]);
                q = _mm256_setzero_si256();
            }
            // Q4_0 / Q4_1: both halves' nibbles from one 16-byte broadcast (128-bit lanes 1
            // and 3 shifted to the high nibbles), instead of unpacking 256 bits and copying.
            let q2 = if FMT == 1 || FMT == 4 {
                let at = if FMT == 1 { 4 } else { 2 };
                let x = w.add(r * ws + i * if FMT == 1 { Q4_1_B } else { Q4_0_B } + at);
                let b = _mm512_broadcast_i32x4(_mm_loadu_si128(x as *const __m128i));
                let b = _mm512_mask_srli_epi32(b, 0xF0F0, b, 4);
                _mm512_and_si512(b, _mm512_set1_epi8(0x0F))
            } else {
                pair_i(q, q)
            };
            q2s[r] = q2;
            vdxs[r] = _mm512_set1_ps(dx);
        }
        for p in 0..C / 2 {
            let init = if FMT == 1 {
                _mm512_setzero_si512()
            } else {
                *pk.add(3 * p + 2)
            };
            let (yq, dy) = (*pk.add(3 * p), _mm512_castsi512_ps(*pk.add(3 * p + 1)));
            for r in 0..R {
                let quads = _mm512_dpbusd_epi32(init, q2s[r], yq);
                let d = _mm512_mul_ps(vdxs[r], dy);
                acc[p][r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(quads), acc[p][r]);
            }
        }
    }
    let mut out = [[0f32; R]; C];
    for r in 0..R {
        let mut sm = [0f32; 16];
        _mm512_storeu_ps(sm.as_mut_ptr(), summs[r]);
        for p in 0..C / 2 {
            let l = hsum_float_8(_mm512_castps512_ps256(acc[p][r]));
            let h = hsum_float_8(high_ps(acc[p][r]));
            // Q4_1 adds its `summs` after the sum (ggml's order); the others add nothing
            // (not even 0.0, which would turn a -0.0 into +0.0).
            out[2 * p][r] = if FMT == 1 { l + sm[2 * p] } else { l };
            out[2 * p + 1][r] = if FMT == 1 { h + sm[2 * p + 1] } else { h };
        }
    }
    out
}

/// `C` columns (even, at most 16) of a legacy format over `nrows` rows, in packed column pairs
/// (AVX-512 VNNI): `out[c * nrows + r]`.
#[inline(always)]
unsafe fn tile_pairs<const C: usize>(
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    nrows: usize,
    out: &mut [f32],
) {
    use abi::DType::*;
    thread_local! {
        static PACKED: core::cell::RefCell<Vec<__m512i>> = const { core::cell::RefCell::new(Vec::new()) };
    }
    let nb = n / 32;
    // Only the pointer comes out of the closure: code inside a closure would not inherit
    // this function's target features (the intrinsics would become calls). The buffer is
    // this thread's, and nothing below re-enters this function.
    let cell = PACKED.with(|c| c as *const core::cell::RefCell<Vec<__m512i>>);
    {
        let mut buf = (*cell).borrow_mut();
        match dtype {
            Q4_1 => pack_pairs::<true>(a, as_, C, nb, 0, &mut buf),
            Q8_0 => pack_pairs::<false>(a, as_, C, nb, 7, &mut buf),
            Q5_0 => pack_pairs::<false>(a, as_, C, nb, 4, &mut buf),
            _ => pack_pairs::<false>(a, as_, C, nb, 3, &mut buf),
        }
        let pk = buf.as_ptr();
        let mut r = 0;
        macro_rules! rows {
            ($rr:literal) => {
                while r + $rr <= nrows {
                    let wr = w.add(r * ws);
                    let v: [[f32; $rr]; C] = match dtype {
                        Q4_1 => dot_pairs::<1, $rr, C>(wr, ws, pk, nb),
                        Q8_0 => dot_pairs::<8, $rr, C>(wr, ws, pk, nb),
                        Q5_0 => dot_pairs::<5, $rr, C>(wr, ws, pk, nb),
                        _ => dot_pairs::<4, $rr, C>(wr, ws, pk, nb),
                    };
                    for c in 0..C {
                        out[c * nrows + r..][..$rr].copy_from_slice(&v[c]);
                    }
                    r += $rr;
                }
            };
        }
        // Sixteen columns: two rows at a time keep the 16 accumulators in registers.
        if C > 8 {
            rows!(2);
        } else {
            rows!(4);
        }
        rows!(1);
    }
}

/// ggml's Q4_0 repack GEMV/GEMM chain (quant's `dot_repack_q4_0`): per block the exact
/// sum of all 32 products, then `acc = fma(f32(sum), dx*dy, acc)`, one chain per row.
#[inline(always)]
unsafe fn dot_q4_0_repack<const VNNI: bool, const R: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    nb: usize,
) -> [f32; R] {
    let mut acc = [0f32; R];
    for i in 0..nb {
        let y = a.add(i * Q8_0_B);
        let yq = ld(y.add(2));
        let dy = h16(y);
        let ys = quads_us::<VNNI>(_mm256_set1_epi8(1), yq);
        for r in 0..R {
            let x = w.add(r * ws + i * Q4_0_B);
            let quads = _mm256_sub_epi32(
                quads_us::<VNNI>(nibbles_32(x.add(2)), yq),
                _mm256_slli_epi32::<3>(ys),
            );
            let sumi = hsum_i32_8(quads);
            acc[r] = (sumi as f32).mul_add(h16(x) * dy, acc[r]);
        }
    }
    acc
}

// ---------------------------------------------------------------- Q4_K

const Q4K_VECDOT: u8 = 0;
const Q4K_GEMV: u8 = 1;
const Q4K_GEMM: u8 = 2;
const Q4K_TILED: u8 = 3;

/// All four x86 Q4_K kernels (see quant's `repack.rs` / `tiled.rs`), by `MODE`.
#[inline(always)]
unsafe fn dot_q4_k<const MODE: u8, const R: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    nb: usize,
) -> [f32; R] {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc8 = [_mm256_setzero_ps(); R];
    let mut accm4 = [[0f32; 4]; R];
    let (mut acc, mut accm) = ([0f32; R], [0f32; R]);
    for i in 0..nb {
        let y = a.add(i * Q8_K_B);
        let yd = f32_at(y);
        let bs = y.add(260);
        let yq = y.add(4);
        let q8s: [i32; 8] =
            core::array::from_fn(|j| (i16_at(bs, 2 * j) + i16_at(bs, 2 * j + 1)) as i16 as i32);
        let bsum2: [i32; 8] = core::array::from_fn(|j| i16_at(bs, 2 * j) + i16_at(bs, 2 * j + 1));
        for r in 0..R {
            let x = w.add(r * ws + i * Q4_K_B);
            let xd = h16(x);
            let xdmin = h16(x.add(2));
            let scales: [u8; 12] = core::ptr::read_unaligned(x.add(4) as *const [u8; 12]);
            let (sc, m) = scale_min_k4(&scales);
            let qs = x.add(16);
            // pair[j] = sc[2j]*dot(sub 2j) + sc[2j+1]*dot(sub 2j+1), eight i32 quad lanes each
            let mut pair = [_mm256_setzero_si256(); 4];
            for j in 0..4 {
                let bits = ld(qs.add(32 * j));
                let lo = _mm256_and_si256(bits, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                let p0 =
                    quads_us_scaled(lo, ld(yq.add(64 * j)), _mm256_set1_epi16(sc[2 * j] as i16));
                let p1 = quads_us_scaled(
                    hi,
                    ld(yq.add(64 * j + 32)),
                    _mm256_set1_epi16(sc[2 * j + 1] as i16),
                );
                pair[j] = _mm256_add_epi32(p0, p1);
            }
            let sumi = _mm256_add_epi32(
                _mm256_add_epi32(pair[0], pair[1]),
                _mm256_add_epi32(pair[2], pair[3]),
            );
            match MODE {
                Q4K_VECDOT => {
                    let d = yd * xd;
                    let dmin = -yd * xdmin;
                    for k in 0..4 {
                        let prod =
                            m[2 * k] as i32 * q8s[2 * k] + m[2 * k + 1] as i32 * q8s[2 * k + 1];
                        accm4[r][k] = dmin.mul_add(prod as f32, accm4[r][k]);
                    }
                    acc8[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc8[r]);
                }
                _ => {
                    let imin: [i32; 8] = core::array::from_fn(|s| m[s] as i32 * bsum2[s]);
                    match MODE {
                        Q4K_GEMV => {
                            let dw = xd * yd;
                            let dm = xdmin * yd;
                            acc[r] = (hsum_i32_8(sumi) as f32).mul_add(dw, acc[r]);
                            accm[r] = (imin.iter().sum::<i32>() as f32).mul_add(dm, accm[r]);
                        }
                        Q4K_GEMM => {
                            let dw = xd * yd;
                            let dm = xdmin * yd;
                            for sb in 0..4 {
                                acc[r] = (hsum_i32_8(pair[sb]) as f32).mul_add(dw, acc[r]);
                                accm[r] =
                                    ((imin[2 * sb] + imin[2 * sb + 1]) as f32).mul_add(dm, accm[r]);
                            }
                        }
                        _ => {
                            // tiled: res = f32(s1)*d; res = fma(-dmin, f32(s2), res);
                            // acc = fma(res, da, acc)
                            let s1 = hsum_i32_8(sumi);
                            let s2 = imin.iter().fold(0i32, |a, &b| a.wrapping_add(b));
                            let mut res = s1 as f32 * xd;
                            res = (-xdmin).mul_add(s2 as f32, res);
                            acc[r] = res.mul_add(yd, acc[r]);
                        }
                    }
                }
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = match MODE {
            Q4K_VECDOT => {
                let m01 = [accm4[r][0] + accm4[r][2], accm4[r][1] + accm4[r][3]];
                hsum_float_8(acc8[r]) + (m01[0] + m01[1])
            }
            Q4K_TILED => acc[r],
            _ => acc[r] - accm[r],
        };
    }
    out
}

/// Sums of the eight i32 lanes of each of four vectors (exact up to wrapping).
#[inline(always)]
unsafe fn hsum4_i32_8(p: &[__m256i; 4]) -> [i32; 4] {
    let t0 = _mm256_hadd_epi32(p[0], p[1]);
    let t1 = _mm256_hadd_epi32(p[2], p[3]);
    let t2 = _mm256_hadd_epi32(t0, t1);
    let s = _mm_add_epi32(
        _mm256_castsi256_si128(t2),
        _mm256_extracti128_si256::<1>(t2),
    );
    let mut out = [0i32; 4];
    _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, s);
    out
}

/// The Q4_K repack GEMM (`MODE == Q4K_GEMM`) or tiled (`Q4K_TILED`) chains of [`dot_q4_k`]
/// for one weight row and `C` activation columns (column `c` at `a + c * as_`): the row's
/// nibbles, scales and mins are decoded once per block for all columns. Integer parts are
/// exact (any grouping gives the same sums); each column keeps its own float chain.
#[inline(always)]
unsafe fn dot_q4_k_cols<const MODE: u8, const C: usize>(
    w: *const u8,
    a: *const u8,
    as_: usize,
    nb: usize,
) -> [f32; C] {
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [0f32; C];
    let mut accm = [0f32; C];
    for i in 0..nb {
        let x = w.add(i * Q4_K_B);
        let xd = h16(x);
        let xdmin = h16(x.add(2));
        let scales: [u8; 12] = core::ptr::read_unaligned(x.add(4) as *const [u8; 12]);
        let (sc, m) = scale_min_k4(&scales);
        let qs = x.add(16);
        let mut lo = [_mm256_setzero_si256(); 4];
        let mut hi = [_mm256_setzero_si256(); 4];
        let mut slo = [_mm256_setzero_si256(); 4];
        let mut shi = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let bits = ld(qs.add(32 * j));
            lo[j] = _mm256_and_si256(bits, m4);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            slo[j] = _mm256_set1_epi16(sc[2 * j] as i16);
            shi[j] = _mm256_set1_epi16(sc[2 * j + 1] as i16);
        }
        let mv = _mm256_setr_epi32(
            m[0] as i32,
            m[1] as i32,
            m[2] as i32,
            m[3] as i32,
            m[4] as i32,
            m[5] as i32,
            m[6] as i32,
            m[7] as i32,
        );
        for c in 0..C {
            let y = a.add(c * as_ + i * Q8_K_B);
            let yd = f32_at(y);
            let yq = y.add(4);
            let mut pair = [_mm256_setzero_si256(); 4];
            for j in 0..4 {
                let p0 = quads_us_scaled(lo[j], ld(yq.add(64 * j)), slo[j]);
                let p1 = quads_us_scaled(hi[j], ld(yq.add(64 * j + 32)), shi[j]);
                pair[j] = _mm256_add_epi32(p0, p1);
            }
            // lane s: m[s] * (bsums[2s] + bsums[2s+1])
            let imin = _mm256_mullo_epi32(mv, _mm256_madd_epi16(ld(y.add(260)), ones));
            if MODE == Q4K_GEMM {
                let hs = hsum4_i32_8(&pair);
                let mut im = [0i32; 8];
                _mm256_storeu_si256(im.as_mut_ptr() as *mut __m256i, imin);
                let dw = xd * yd;
                let dm = xdmin * yd;
                for sb in 0..4 {
                    acc[c] = (hs[sb] as f32).mul_add(dw, acc[c]);
                    accm[c] = ((im[2 * sb] + im[2 * sb + 1]) as f32).mul_add(dm, accm[c]);
                }
            } else {
                let sumi = _mm256_add_epi32(
                    _mm256_add_epi32(pair[0], pair[1]),
                    _mm256_add_epi32(pair[2], pair[3]),
                );
                let s1 = hsum_i32_8(sumi);
                let s2 = hsum_i32_8(imin);
                let mut res = s1 as f32 * xd;
                res = (-xdmin).mul_add(s2 as f32, res);
                acc[c] = res.mul_add(yd, acc[c]);
            }
        }
    }
    let mut out = [0f32; C];
    for c in 0..C {
        out[c] = if MODE == Q4K_TILED {
            acc[c]
        } else {
            acc[c] - accm[c]
        };
    }
    out
}

// ---------------------------------------------------------------- Q6_K

/// Q6_K scales `2g` and `2g + 1` of a block (its 16 i8 scales in `sc8`) as i16 in the low
/// and high 128-bit halves: one byte shuffle and one widening (ggml's `get_scale_shuffle`)
/// instead of two scalar loads and broadcasts.
#[inline(always)]
unsafe fn q6_scale_pair(sc8: __m128i, g: usize) -> __m256i {
    let (lo, hi) = ((2 * g) as i64, (2 * g + 1) as i64);
    let idx = _mm_set_epi64x(hi * 0x0101_0101_0101_0101, lo * 0x0101_0101_0101_0101);
    _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx))
}

/// `ggml_vec_dot_q6_K_q8_K` (AVX2 lanes) or, with `TILED`, the tiled matmul's per-block chain.
#[inline(always)]
unsafe fn dot_q6_k<const TILED: bool, const R: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    nb: usize,
) -> [f32; R] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let m0c = _mm256_set1_epi8(0x0C);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc8 = [_mm256_setzero_ps(); R];
    let mut acc = [0f32; R];
    let pd = crate::kq512::prefetch_rows(ws, R) * ws;
    for i in 0..nb {
        let y = a.add(i * Q8_K_B);
        let yq = y.add(4);
        let yd = f32_at(y);
        let bsums = ld(y.add(260));
        for r in 0..R {
            let x = w.add(r * ws + i * Q6_K_B);
            let scp = x.add(192) as *const i8;
            let sc8 = _mm_loadu_si128(scp as *const __m128i);
            let mut sumi = _mm256_setzero_si256();
            for n in 0..2 {
                let ql0 = ld(x.add(64 * n));
                let ql1 = ld(x.add(64 * n + 32));
                let qh = ld(x.add(128 + 32 * n));
                let u = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16::<2>(_mm256_and_si256(qh, m0c)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        _mm256_and_si256(qh, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                    ),
                ];
                for (k, &u) in u.iter().enumerate() {
                    // The four lines from the block's start (with the next block's,
                    // every line of the row), one per two products instead of all at the
                    // block's start, where they stall waiting for fill buffers (see
                    // `kq512`'s Q6_K pair kernel); pinned by `prefetch_here`. On a
                    // Sapphire Rapids VM with this backend, the 1.5B's decode went 70.5 /
                    // 71.0% -> 76.3 / 75.9% of the probe, 21.2 -> 22.8 t/s (2 interleaved
                    // rounds against the previous build; not measured on AMD's cores).
                    if !TILED && k % 2 == 0 {
                        crate::kq512::prefetch_here(x.wrapping_add(pd + 64 * (2 * n + k / 2)));
                    }
                    let g = 4 * n + k;
                    let p = quads_us_scaled(u, ld(yq.add(32 * g)), q6_scale_pair(sc8, g));
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            // lane l: 32 * (bsums[2l]*sc[2l] + bsums[2l+1]*sc[2l+1])
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scp as *const __m128i));
            let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
            let lanes = _mm256_sub_epi32(sumi, sub);
            if TILED {
                let s1 = hsum_i32_8(lanes);
                let res = s1 as f32 * h16(x.add(208));
                acc[r] = res.mul_add(yd, acc[r]);
            } else {
                let d = yd * h16(x.add(208));
                acc8[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc8[r]);
            }
        }
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = if TILED { acc[r] } else { hsum_float_8(acc8[r]) };
    }
    out
}

/// The tiled matmul's Q6_K chain of [`dot_q6_k`] for one weight row and `C` activation
/// columns, the row's 6-bit codes and scales decoded once per block for all columns.
#[inline(always)]
unsafe fn dot_q6_k_tiled_cols<const C: usize>(
    w: *const u8,
    a: *const u8,
    as_: usize,
    nb: usize,
) -> [f32; C] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let m0c = _mm256_set1_epi8(0x0C);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [0f32; C];
    for i in 0..nb {
        let x = w.add(i * Q6_K_B);
        let scp = x.add(192) as *const i8;
        let mut u = [_mm256_setzero_si256(); 8];
        let mut sc = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            let ql0 = ld(x.add(64 * n));
            let ql1 = ld(x.add(64 * n + 32));
            let qh = ld(x.add(128 + 32 * n));
            u[4 * n] = _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
            );
            u[4 * n + 1] = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, m0c)),
            );
            u[4 * n + 2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, m30),
            );
            u[4 * n + 3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
            );
        }
        let sc8 = _mm_loadu_si128(scp as *const __m128i);
        for g in 0..8 {
            sc[g] = q6_scale_pair(sc8, g);
        }
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scp as *const __m128i));
        let xd = h16(x.add(208));
        for c in 0..C {
            let y = a.add(c * as_ + i * Q8_K_B);
            let yq = y.add(4);
            let yd = f32_at(y);
            let mut sumi = _mm256_setzero_si256();
            for g in 0..8 {
                sumi = _mm256_add_epi32(sumi, quads_us_scaled(u[g], ld(yq.add(32 * g)), sc[g]));
            }
            // lane l: 32 * (bsums[2l]*sc[2l] + bsums[2l+1]*sc[2l+1])
            let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(ld(y.add(260)), sc16));
            let s1 = hsum_i32_8(_mm256_sub_epi32(sumi, sub));
            let res = s1 as f32 * xd;
            acc[c] = res.mul_add(yd, acc[c]);
        }
    }
    acc
}

// ---------------------------------------------------------------- dispatch

/// Whether this module has a SIMD twin of `kernel` for `dtype`.
pub fn has_kernel(kernel: Kernel, dtype: abi::DType) -> bool {
    use abi::DType::*;
    match dtype {
        Q4_0 => matches!(
            kernel,
            Kernel::VecDot | Kernel::TinyBlas | Kernel::RepackGemv | Kernel::RepackGemm
        ),
        Q4_1 => kernel == Kernel::VecDot,
        Q8_0 | Q5_0 => matches!(kernel, Kernel::VecDot | Kernel::TinyBlas),
        Q6_K => matches!(kernel, Kernel::VecDot | Kernel::Tiled),
        Q4_K => matches!(
            kernel,
            Kernel::VecDot | Kernel::RepackGemv | Kernel::RepackGemm | Kernel::Tiled
        ),
        _ => false,
    }
}

#[inline(always)]
unsafe fn dot_any<const VNNI: bool, const R: usize>(
    kernel: Kernel,
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
) -> [f32; R] {
    use abi::DType::*;
    match (dtype, kernel) {
        (Q4_0, Kernel::RepackGemv | Kernel::RepackGemm) => {
            dot_q4_0_repack::<VNNI, R>(w, ws, a, n / 32)
        }
        (Q4_0, _) => dot_q0::<4, VNNI, R, 1>(w, ws, a, 0, n / 32)[0],
        (Q4_1, _) => dot_q4_1::<VNNI, R, 1>(w, ws, a, 0, n / 32)[0],
        (Q8_0, _) => dot_q0::<8, VNNI, R, 1>(w, ws, a, 0, n / 32)[0],
        (Q5_0, _) => dot_q0::<5, VNNI, R, 1>(w, ws, a, 0, n / 32)[0],
        (Q6_K, Kernel::Tiled) => dot_q6_k::<true, R>(w, ws, a, n / 256),
        (Q6_K, _) => dot_q6_k::<false, R>(w, ws, a, n / 256),
        (Q4_K, Kernel::RepackGemv) => dot_q4_k::<Q4K_GEMV, R>(w, ws, a, n / 256),
        (Q4_K, Kernel::RepackGemm) => dot_q4_k::<Q4K_GEMM, R>(w, ws, a, n / 256),
        (Q4_K, Kernel::Tiled) => dot_q4_k::<Q4K_TILED, R>(w, ws, a, n / 256),
        (Q4_K, _) => dot_q4_k::<Q4K_VECDOT, R>(w, ws, a, n / 256),
        _ => unreachable!("no SIMD kernel {kernel:?} for {dtype}"),
    }
}

/// Rows in groups of [`ROWS`] (then one at a time), each group through one kernel call.
#[inline(always)]
unsafe fn rows_any<const VNNI: bool>(
    kernel: Kernel,
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    ws: usize,
    act: *const u8,
    out: &mut [f32],
) {
    let mut r = 0;
    if VNNI {
        // 512-bit K-quant decode kernels (crate::kq512).
        use crate::kq512;
        match (dtype, kernel) {
            (abi::DType::Q4_K, Kernel::RepackGemv) => {
                while r + 4 <= out.len() {
                    let v = kq512::gemv_q4k_x4(w.add(r * ws), ws, act, n / 256);
                    out[r..r + 4].copy_from_slice(&v);
                    r += 4;
                }
            }
            (abi::DType::Q5_0 | abi::DType::Q8_0 | abi::DType::Q4_0, Kernel::VecDot) => {
                while r + 4 <= out.len() {
                    let v = match dtype {
                        abi::DType::Q5_0 => {
                            dot_q0_row_pairs::<5, 2>(w.add(r * ws), ws, act, n / 32)
                        }
                        abi::DType::Q8_0 => {
                            dot_q0_row_pairs::<8, 2>(w.add(r * ws), ws, act, n / 32)
                        }
                        _ => dot_q0_row_pairs::<4, 2>(w.add(r * ws), ws, act, n / 32),
                    };
                    out[r..r + 4].copy_from_slice(&[v[0][0], v[0][1], v[1][0], v[1][1]]);
                    r += 4;
                }
            }
            (abi::DType::Q6_K, Kernel::VecDot) => {
                while r + 2 <= out.len() {
                    let v = kq512::vecdot_q6k_pair_cols::<1>(w.add(r * ws), ws, act, 0, n / 256);
                    out[r..r + 2].copy_from_slice(&v[0]);
                    r += 2;
                }
            }
            _ => {}
        }
    }
    if dtype.info().block_len == 32 {
        while r + ROWS <= out.len() {
            let v = dot_any::<VNNI, ROWS>(kernel, dtype, n, w.add(r * ws), ws, act);
            out[r..r + ROWS].copy_from_slice(&v);
            r += ROWS;
        }
    } else {
        // K-quants keep more vectors live per row: two rows at a time avoid spills.
        while r + ROWS_K <= out.len() {
            let v = dot_any::<VNNI, ROWS_K>(kernel, dtype, n, w.add(r * ws), ws, act);
            out[r..r + ROWS_K].copy_from_slice(&v);
            r += ROWS_K;
        }
    }
    while r < out.len() {
        out[r] = dot_any::<VNNI, 1>(kernel, dtype, n, w.add(r * ws), ws, act)[0];
        r += 1;
    }
}

/// One activation block of an AVX2 legacy tile, packed once per call ([`tile_q0_avx2`]): the
/// quants, the offset term of the unsigned weight codes (`-(Σy per quad) << shift`, unused
/// by Q8_0's sign products; for Q4_1 the block's `s` as f32 in every lane) and `dy` in all
/// eight lanes.
#[repr(C)]
#[derive(Clone, Copy)]
struct PackedY {
    q: __m256i,
    off: __m256i,
    dy: __m256,
}

/// Packs `cols` activation columns of `nb` blocks (column `c` at `a + c * as_`; Q8_1 blocks
/// for Q4_1, `FMT` 1, else Q8_0) into `buf`, column-major (`buf[c * nb + i]`), the offset for
/// Q4_0 / Q5_0 codes (`FMT` 4 / 5).
#[inline(always)]
unsafe fn pack_y<const FMT: u8>(
    a: *const u8,
    as_: usize,
    cols: usize,
    nb: usize,
    buf: &mut Vec<PackedY>,
) {
    buf.clear();
    for c in 0..cols {
        for i in 0..nb {
            if FMT == 1 {
                let y = a.add(c * as_ + i * Q8_1_B);
                buf.push(PackedY {
                    q: ld(y.add(4)),
                    off: _mm256_castps_si256(_mm256_set1_ps(h16(y.add(2)))),
                    dy: _mm256_set1_ps(h16(y)),
                });
                continue;
            }
            let y = a.add(c * as_ + i * Q8_0_B);
            let q = ld(y.add(2));
            let ys = quads_us::<false>(_mm256_set1_epi8(1), q);
            let off = match FMT {
                4 => _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<3>(ys)),
                5 => _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<4>(ys)),
                _ => _mm256_setzero_si256(),
            };
            buf.push(PackedY {
                q,
                off,
                dy: _mm256_set1_ps(h16(y)),
            });
        }
    }
}

/// [`dot_q0`]'s chain (AVX2, no VNNI; [`dot_q4_1`]'s for `FMT` 1) for `R` rows by `C`
/// columns, the activation side read from [`pack_y`]'s blocks (`pk + c * nb + i`) instead of
/// rebuilt for every row pair: the same integers (the offset added instead of subtracted:
/// exact) and the same float operations in the same order, so the same bits (`dx * dy` as a
/// lane product is the scalar product).
#[inline(always)]
unsafe fn tile_q0_packed<const FMT: u8, const R: usize, const C: usize>(
    w: *const u8,
    ws: usize,
    pk: *const PackedY,
    nb: usize,
) -> [[f32; R]; C] {
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    let mut summs = [[0f32; R]; C];
    let ones = _mm256_set1_epi16(1);
    for i in 0..nb {
        let mut q = [_mm256_setzero_si256(); R];
        let mut dx = [_mm256_setzero_ps(); R];
        let mut mx = [0f32; R];
        for r in 0..R {
            if FMT == 1 {
                let x = w.add(r * ws + i * Q4_1_B);
                dx[r] = _mm256_set1_ps(h16(x));
                mx[r] = h16(x.add(2));
                q[r] = nibbles_32(x.add(4));
                continue;
            }
            let (d, qr) = decode_q0::<FMT>(w.add(r * ws + i * q0_block(FMT)));
            dx[r] = _mm256_set1_ps(d);
            q[r] = qr;
        }
        // Q8_0: |w| once per row (the sign products of `quads_ss`)
        let mut ax = [_mm256_setzero_si256(); R];
        if FMT == 8 {
            for r in 0..R {
                ax[r] = _mm256_sign_epi8(q[r], q[r]);
            }
        }
        for c in 0..C {
            let p = &*pk.add(c * nb + i);
            if FMT == 1 {
                let sy = _mm256_cvtss_f32(_mm256_castsi256_ps(p.off));
                for r in 0..R {
                    summs[c][r] = mx[r].mul_add(sy, summs[c][r]);
                    let d = _mm256_mul_ps(dx[r], p.dy);
                    let pr = _mm256_cvtepi32_ps(quads_us::<false>(q[r], p.q));
                    acc[c][r] = _mm256_fmadd_ps(d, pr, acc[c][r]);
                }
                continue;
            }
            for r in 0..R {
                let quads = if FMT == 8 {
                    let sy = _mm256_sign_epi8(p.q, q[r]);
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ax[r], sy), ones)
                } else {
                    _mm256_add_epi32(quads_us::<false>(q[r], p.q), p.off)
                };
                let d = _mm256_mul_ps(dx[r], p.dy);
                acc[c][r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(quads), acc[c][r]);
            }
        }
    }
    let mut out = hsum_tile(&acc);
    if FMT == 1 {
        for c in 0..C {
            for r in 0..R {
                out[c][r] += summs[c][r];
            }
        }
    }
    out
}

/// The AVX2 tiles of Q4_0 / Q5_0 / Q8_0 / Q4_1 for `ncols` columns (a multiple of [`TILE_COLS`]):
/// the activation columns packed once per call ([`pack_y`]), then 2-row x 4-column tiles.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_q0_avx2(
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    ws: usize,
    act: *const u8,
    as_: usize,
    ncols: usize,
    nrows: usize,
    out: &mut [f32],
) {
    use abi::DType::*;
    thread_local! {
        static PACKED: core::cell::RefCell<Vec<PackedY>> = const { core::cell::RefCell::new(Vec::new()) };
    }
    const C: usize = TILE_COLS;
    let nb = n / 32;
    // As in `tile_pairs`: only the pointer leaves the closure; nothing below re-enters.
    let cell = PACKED.with(|c| c as *const core::cell::RefCell<Vec<PackedY>>);
    let mut buf = (*cell).borrow_mut();
    match dtype {
        Q8_0 => pack_y::<8>(act, as_, ncols, nb, &mut buf),
        Q5_0 => pack_y::<5>(act, as_, ncols, nb, &mut buf),
        Q4_1 => pack_y::<1>(act, as_, ncols, nb, &mut buf),
        _ => pack_y::<4>(act, as_, ncols, nb, &mut buf),
    }
    let pk = buf.as_ptr();
    macro_rules! tile {
        ($rr:literal, $r:expr, $c0:expr) => {{
            let (wr, p) = (w.add($r * ws), pk.add($c0 * nb));
            let v: [[f32; $rr]; C] = match dtype {
                Q8_0 => tile_q0_packed::<8, $rr, C>(wr, ws, p, nb),
                Q5_0 => tile_q0_packed::<5, $rr, C>(wr, ws, p, nb),
                Q4_1 => tile_q0_packed::<1, $rr, C>(wr, ws, p, nb),
                _ => tile_q0_packed::<4, $rr, C>(wr, ws, p, nb),
            };
            for c in 0..C {
                out[($c0 + c) * nrows + $r..][..$rr].copy_from_slice(&v[c]);
            }
        }};
    }
    let mut c0 = 0;
    while c0 + C <= ncols {
        let mut r = 0;
        while r + 2 <= nrows {
            tile!(2, r, c0);
            r += 2;
        }
        if r < nrows {
            tile!(1, r, c0);
        }
        c0 += C;
    }
}

/// `R` rows by `C` columns of a 32-element format (any kernel: the legacy formats' kernels
/// share one float chain).
#[inline(always)]
unsafe fn tile_legacy<const VNNI: bool, const R: usize, const C: usize>(
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
) -> [[f32; R]; C] {
    use abi::DType::*;
    match dtype {
        Q4_1 => dot_q4_1::<VNNI, R, C>(w, ws, a, as_, n / 32),
        Q8_0 => dot_q0::<8, VNNI, R, C>(w, ws, a, as_, n / 32),
        Q5_0 => dot_q0::<5, VNNI, R, C>(w, ws, a, as_, n / 32),
        Q4_0 => dot_q0::<4, VNNI, R, C>(w, ws, a, as_, n / 32),
        _ => unreachable!("no SIMD tile for {dtype}"),
    }
}

/// `C` columns of Q6_K's one-column chain (column `c` at `a + c * as_`) over `nrows` rows:
/// `out[c * nrows + r]`, each weight block decoded once for the `C` columns (AVX-512 VNNI).
#[inline(always)]
unsafe fn q6k_vecdot_run<const C: usize>(
    n: usize,
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    nrows: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    while r < nrows {
        let v: [[f32; 2]; C] = if r + 2 <= nrows {
            crate::kq512::vecdot_q6k_pair_cols::<C>(w.add(r * ws), ws, a, as_, n / 256)
        } else {
            let v = crate::kq512::vecdot_q6k_cols::<1, C>(w.add(r * ws), ws, a, as_, n / 256);
            core::array::from_fn(|j| [v[j][0], 0.0])
        };
        for j in 0..C {
            out[j * nrows + r] = v[j][0];
            if r + 1 < nrows {
                out[j * nrows + r + 1] = v[j][1];
            }
        }
        r += 2;
    }
}

/// `out[c * nrows + r]` = element (row `r`, column `c`): `kernels[c]` on weight row `r` (at
/// `w + r * ws`) and activation column `c` (at `act + c * as_`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_any<const VNNI: bool>(
    kernels: &[Kernel],
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    ws: usize,
    act: *const u8,
    as_: usize,
    nrows: usize,
    out: &mut [f32],
) {
    let ncols = kernels.len();
    debug_assert_eq!(out.len(), nrows * ncols);
    let mut c0 = 0;
    // Q4_0's repack chain (one f32 per output) is not the shared legacy chain: per column.
    let repacked = kernels
        .iter()
        .any(|k| matches!(k, Kernel::RepackGemv | Kernel::RepackGemm));
    if dtype.info().block_len == 32 && !repacked {
        const C: usize = TILE_COLS;
        if VNNI {
            // AVX-512: columns in 512-bit pairs, the activation side packed once per call;
            // eight columns at a time share each decoded weight block (16 decoding
            // sequences: 1.2x over four at a time).
            macro_rules! pairs {
                ($cols:literal) => {
                    while c0 + $cols <= ncols {
                        let o = &mut out[c0 * nrows..];
                        tile_pairs::<$cols>(dtype, n, w, ws, act.add(c0 * as_), as_, nrows, o);
                        c0 += $cols;
                    }
                };
            }
            pairs!(16);
            pairs!(8);
            pairs!(4);
            pairs!(2);
        }
        // AVX2: two rows by four columns (with the per-column activations, scales and
        // offsets live too, four rows spill the registers; measured: 2x4 is 1.3x faster for
        // eight decode columns on Q5_0, 1.1x for prompts).
        if !VNNI
            && matches!(
                dtype,
                abi::DType::Q4_0 | abi::DType::Q5_0 | abi::DType::Q8_0 | abi::DType::Q4_1
            )
        {
            let full = (ncols - c0) / C * C;
            if full > 0 {
                tile_q0_avx2(
                    dtype,
                    n,
                    w,
                    ws,
                    act.add(c0 * as_),
                    as_,
                    full,
                    nrows,
                    &mut out[c0 * nrows..],
                );
                c0 += full;
            }
        }
        let r_tile = 2;
        while c0 + C <= ncols {
            let a = act.add(c0 * as_);
            let mut r = 0;
            while r + r_tile <= nrows {
                let wr = w.add(r * ws);
                let v = tile_legacy::<VNNI, 2, C>(dtype, n, wr, ws, a, as_);
                for c in 0..C {
                    out[(c0 + c) * nrows + r..][..2].copy_from_slice(&v[c]);
                }
                r += r_tile;
            }
            while r < nrows {
                let v = tile_legacy::<VNNI, 1, C>(dtype, n, w.add(r * ws), ws, a, as_);
                for c in 0..C {
                    out[(c0 + c) * nrows + r] = v[c][0];
                }
                r += 1;
            }
            c0 += C;
        }
        // Two or three columns left (two decoding sequences): a pair still shares the decode.
        if c0 + 2 <= ncols {
            let a = act.add(c0 * as_);
            let mut r = 0;
            while r + 2 <= nrows {
                let v = tile_legacy::<VNNI, 2, 2>(dtype, n, w.add(r * ws), ws, a, as_);
                for c in 0..2 {
                    out[(c0 + c) * nrows + r..][..2].copy_from_slice(&v[c]);
                }
                r += 2;
            }
            if r < nrows {
                let v = tile_legacy::<VNNI, 1, 2>(dtype, n, w.add(r * ws), ws, a, as_);
                for c in 0..2 {
                    out[(c0 + c) * nrows + r] = v[c][0];
                }
            }
            c0 += 2;
        }
    }
    if dtype == abi::DType::Q4_K || dtype == abi::DType::Q6_K {
        // Runs of columns of the repack GEMM or the tiled kernel, four at a time.
        const C: usize = TILE_COLS;
        let mut c = 0;
        while c < ncols {
            let kern = kernels[c];
            if c + C > ncols {
                // Fewer than four left: a pair of one-column Q6_K chains still shares the
                // decode; anything else goes one column at a time below.
                if VNNI
                    && dtype == abi::DType::Q6_K
                    && kern == Kernel::VecDot
                    && c + 2 <= ncols
                    && kernels[c + 1] == kern
                {
                    q6k_vecdot_run::<2>(
                        n,
                        w,
                        ws,
                        act.add(c * as_),
                        as_,
                        nrows,
                        &mut out[c * nrows..],
                    );
                    c += 2;
                }
                break;
            }
            let tiled = match dtype {
                abi::DType::Q4_K => matches!(kern, Kernel::RepackGemm | Kernel::Tiled),
                _ => kern == Kernel::Tiled,
            };
            let same = kernels[c..c + C].iter().all(|&k| k == kern);
            let same8 = c + 2 * C <= ncols && kernels[c..c + 2 * C].iter().all(|&k| k == kern);
            if VNNI && same8 && dtype == abi::DType::Q6_K && kern == Kernel::VecDot {
                // Eight such columns share each decoded block (measured 1.15x over two runs
                // of four on a 1536 x 32768 weight).
                q6k_vecdot_run::<{ 2 * C }>(
                    n,
                    w,
                    ws,
                    act.add(c * as_),
                    as_,
                    nrows,
                    &mut out[c * nrows..],
                );
                c += 2 * C;
                continue;
            }
            if VNNI && same && dtype == abi::DType::Q6_K && kern == Kernel::VecDot {
                // One-column chains of several columns (decode steps of several sequences):
                // each weight block decoded once for the four.
                q6k_vecdot_run::<C>(
                    n,
                    w,
                    ws,
                    act.add(c * as_),
                    as_,
                    nrows,
                    &mut out[c * nrows..],
                );
                c += C;
                continue;
            }
            if !tiled || !same {
                rows_any::<VNNI>(
                    kernels[c],
                    dtype,
                    n,
                    w,
                    ws,
                    act.add(c * as_),
                    &mut out[c * nrows..(c + 1) * nrows],
                );
                c += 1;
                continue;
            }
            let a = act.add(c * as_);
            for r in 0..nrows {
                let v = if dtype == abi::DType::Q6_K {
                    dot_q6_k_tiled_cols::<C>(w.add(r * ws), a, as_, n / 256)
                } else if kern == Kernel::RepackGemm {
                    dot_q4_k_cols::<Q4K_GEMM, C>(w.add(r * ws), a, as_, n / 256)
                } else {
                    dot_q4_k_cols::<Q4K_TILED, C>(w.add(r * ws), a, as_, n / 256)
                };
                for j in 0..C {
                    out[(c + j) * nrows + r] = v[j];
                }
            }
            c += C;
        }
        c0 = c;
    }
    for c in c0..ncols {
        rows_any::<VNNI>(
            kernels[c],
            dtype,
            n,
            w,
            ws,
            act.add(c * as_),
            &mut out[c * nrows..(c + 1) * nrows],
        );
    }
}

/// Activation columns per tile of the legacy formats' kernels.
pub const TILE_COLS: usize = 4;

/// As [`rows_avx2`] for `kernels.len()` activation columns (column `c` at `act + c * a_stride`
/// through `kernels[c]`): `out[c * nrows + r]` is (row `r`, column `c`).
///
/// # Safety
/// As [`rows_avx2`] for every column.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile_avx2(
    kernels: &[Kernel],
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    w_stride: usize,
    act: *const u8,
    a_stride: usize,
    nrows: usize,
    out: &mut [f32],
) {
    tile_any::<false>(kernels, dtype, n, w, w_stride, act, a_stride, nrows, out)
}

/// As [`tile_avx2`], compiled for AVX-512 (see [`rows_avx512`]).
///
/// # Safety
/// As [`rows_avx512`] for every column.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile_avx512(
    kernels: &[Kernel],
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    w_stride: usize,
    act: *const u8,
    a_stride: usize,
    nrows: usize,
    out: &mut [f32],
) {
    tile_any::<true>(kernels, dtype, n, w, w_stride, act, a_stride, nrows, out)
}

/// Weight rows computed together by one kernel call (32-element formats, K-quants).
pub const ROWS: usize = 4;
pub const ROWS_K: usize = 2;

/// Computes `out[r] = dot_with(kernel, dtype, n, w_row(r), act)` for each row `r` of
/// `rows`, where row `r` starts at `w + r * w_stride`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `has_kernel(kernel, dtype)`; `n` is a whole number of
/// blocks; the pointers cover the rows and one activation row of `n` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows_avx2(
    kernel: Kernel,
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    w_stride: usize,
    act: *const u8,
    out: &mut [f32],
) {
    rows_any::<false>(kernel, dtype, n, w, w_stride, act, out)
}

/// As [`rows_avx2`], compiled for AVX-512 (F, BW, VL, VNNI): the 256-bit kernels with EVEX
/// encodings, 32 vector registers and `vpdpbusd` for the unsigned-by-signed quad sums.
///
/// # Safety
/// As [`rows_avx2`], and the CPU has AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_avx512(
    kernel: Kernel,
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    w_stride: usize,
    act: *const u8,
    out: &mut [f32],
) {
    rows_any::<true>(kernel, dtype, n, w, w_stride, act, out)
}

#[cfg(test)]
mod tests {
    /// Every f16 bit pattern: F16C's conversion equals quant's scalar twin bit for bit.
    #[test]
    fn h16_matches_scalar() {
        if !is_x86_feature_detected!("f16c") {
            return;
        }
        #[target_feature(enable = "f16c")]
        unsafe fn conv(b: u16) -> f32 {
            super::h16(&b as *const u16 as *const u8)
        }
        for b in 0..=u16::MAX {
            let got = unsafe { conv(b) };
            assert_eq!(
                got.to_bits(),
                quant::fp16_to_f32(b).to_bits(),
                "f16 {b:#06x}"
            );
        }
    }
}
