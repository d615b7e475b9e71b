//! 512-bit K-quant kernels (AVX-512 F/BW/VL): the same integers and float chains as the
//! 256-bit kernels in [`crate::simd`], with half the integer instructions.
//!
//! Two 32-element groups share one zmm (low 256 bits one group, high 256 the next), so the
//! activation side is a plain 64-byte load. The per-lane integer sums of the two halves are
//! added at the end, which regroups exact integers only. The 6-bit scales are decoded with
//! byte shuffles and broadcast to their lanes with `vpermw` instead of scalar loads, and the
//! float chains of four weight rows run in the four lanes of one xmm (each lane is the
//! scalar twin's `mul_add`, bit for bit).
//!
//! Everything here is `#[inline(always)]`: only callers compiled with AVX-512 F/BW/VL reach it.

#![allow(clippy::needless_range_loop)]

use core::arch::x86_64::*;

const Q4_K_B: usize = 144;
const Q6_K_B: usize = 210;
const Q8_K_B: usize = 292;

/// `[sc0..sc7, m0..m7]` of a Q4_K/Q5_K block (the 12 scale bytes at `x + 4`), as
/// `quant::scale_min_k4` decodes them.
#[inline(always)]
pub unsafe fn q4k_scales(x: *const u8) -> __m128i {
    // The 16-byte load covers the 12 scale bytes and 4 bytes of `qs` (never used).
    let q = _mm_loadu_si128(x.add(4) as *const __m128i);
    let l = _mm_shuffle_epi8(
        q,
        _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
    );
    let h = _mm_shuffle_epi8(
        q,
        _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
    );
    let m_lo = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0);
    let m_hi = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15);
    let r = _mm_or_si128(
        _mm_and_si128(l, m_lo),
        _mm_and_si128(_mm_srli_epi16::<4>(l), m_hi),
    );
    // bits 6..7 of the low-half bytes become bits 4..5 of the scales/mins 4..7
    _mm_or_si128(
        r,
        _mm_and_si128(_mm_srli_epi16::<2>(h), _mm_set1_epi8(0x30)),
    )
}

/// How many rows ahead a GEMV that walks `r` rows of stride `ws` side by side prefetches:
/// about [`prefetch_bytes`] ahead, and never a row it is already reading.
#[inline(always)]
pub fn prefetch_rows(ws: usize, r: usize) -> usize {
    (prefetch_bytes() / ws.max(1)).max(r)
}

/// How far ahead (bytes) the GEMVs prefetch their weights into L2: 8 KiB on Intel's cores,
/// 16 KiB on AMD's. On a 2.1 GHz Sapphire Rapids VM (Qwen2.5-1.5B decode, `mollm bench`
/// tg64, interleaved rounds) 8 KiB beat 16 KiB in 11 of 12 rounds, by 3-6% (6 KiB the same,
/// 4 and 12 KiB slower); on a 2.6 GHz one the two were within the noise. The AMD figure is
/// where the Zen 3 and Zen 4 measurements were made (see [`crate::q4k16`]).
pub fn prefetch_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| if amd() { 16384 } else { 8192 })
}

/// Prefetch into L2 (T1). Measured on a 56 MB Q4_K GEMV from DRAM, two threads: no
/// software prefetch 11 GB/s, into L1 (T0) 21 GB/s, into L2 34 GB/s; the L1 fill buffers
/// are the limit when they also carry the demand loads.
#[inline(always)]
pub unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
}

/// [`prefetch`] where it stands: an `asm` statement, which the compiler keeps in its place
/// among the loads around it. (LLVM moves the prefetch intrinsic freely: it sank the Q6_K pair
/// kernel's eight prefetches, written one per product, back into one burst at the block's end.)
#[inline(always)]
pub unsafe fn prefetch_here(p: *const u8) {
    core::arch::asm!("prefetcht1 [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
}

/// Whether the 16-row Q4_K GEMV ([`crate::q4k16`]) prefetches its weights 16 KiB ahead. Not
/// on AMD's cores: on Zen 4 (2 threads, Qwen2.5-1.5B decode, four interleaved rounds) it
/// ran at 28-33 t/s with, 34-40 without; the hardware prefetchers keep that stream ahead
/// themselves. (Turning off every kernel's prefetch there cost a third instead: the row-wise
/// Q6_K and the legacy 16-row kernels need theirs.) `MOLLM_Q4K_PREFETCH=0|1` decides
/// instead of the vendor.
pub fn q4k16_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        abi::settings::Q4K_PREFETCH
            .forced()
            .unwrap_or_else(|| !amd())
    })
}

/// Whether the CPU's vendor string is AMD's.
fn amd() -> bool {
    // SAFETY: cpuid leaf 0 exists on every x86-64 CPU (a safe function in newer Rust).
    #[allow(unused_unsafe)]
    let r = unsafe { __cpuid(0) };
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..].copy_from_slice(&r.ecx.to_le_bytes());
    &v == b"AuthenticAMD"
}

/// i16 lane indices `[a; 16] ++ [b; 16]` for `vpermw`.
#[inline(always)]
unsafe fn idx2(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

/// i16 lane indices, eight lanes each of `b, b+1, b+2, b+3`.
#[inline(always)]
unsafe fn idx4(b: i16) -> __m512i {
    _mm512_setr_epi64(
        0x0001_0001_0001_0001 * b as i64,
        0x0001_0001_0001_0001 * b as i64,
        0x0001_0001_0001_0001 * (b + 1) as i64,
        0x0001_0001_0001_0001 * (b + 1) as i64,
        0x0001_0001_0001_0001 * (b + 2) as i64,
        0x0001_0001_0001_0001 * (b + 2) as i64,
        0x0001_0001_0001_0001 * (b + 3) as i64,
        0x0001_0001_0001_0001 * (b + 3) as i64,
    )
}

/// Sum of the two 256-bit halves' i32 lanes (lane `l` + lane `l + 8`).
#[inline(always)]
unsafe fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// The eight-lane sums of four vectors, as four i32 lanes.
#[inline(always)]
unsafe fn hsum4(v: [__m256i; 4]) -> __m128i {
    let t0 = _mm256_hadd_epi32(v[0], v[1]);
    let t1 = _mm256_hadd_epi32(v[2], v[3]);
    let t2 = _mm256_hadd_epi32(t0, t1);
    _mm_add_epi32(
        _mm256_castsi256_si128(t2),
        _mm256_extracti128_si256::<1>(t2),
    )
}

/// The f16 at `p + off` of four rows (row `r` at `p + r * ws`) as f32 lanes.
#[inline(always)]
unsafe fn h16x4(p: *const u8, ws: usize, off: usize) -> __m128 {
    let g = |r: usize| (p.add(r * ws + off) as *const u16).read_unaligned() as i32;
    let v = _mm_setr_epi32(g(0) | g(1) << 16, g(2) | g(3) << 16, 0, 0);
    _mm_cvtph_ps(v)
}

/// Decoded Q4_K weights of one block: `u[j]` = `[nibbles of sub-block 2j | 2j+1]`, the
/// order of the Q8_K activation bytes, and the scales broadcast to match; `s` holds
/// `[sc0..7, m0..7]` as i16.
pub struct Q4kBlock {
    pub u: [__m512i; 4],
    pub sc: [__m512i; 4],
    pub s: __m256i,
}

#[inline(always)]
pub unsafe fn q4k_decode(x: *const u8) -> Q4kBlock {
    let s = _mm256_cvtepu8_epi16(q4k_scales(x));
    let s512 = _mm512_castsi256_si512(s);
    let shift = idx2(0, 4);
    let m4 = _mm512_set1_epi8(0x0F);
    let qs = x.add(16);
    let mut u = [_mm512_setzero_si512(); 4];
    let mut sc = [_mm512_setzero_si512(); 4];
    for j in 0..4 {
        let w = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * j) as *const __m256i));
        u[j] = _mm512_and_si512(_mm512_srlv_epi16(w, shift), m4);
        sc[j] = _mm512_permutexvar_epi16(idx2(2 * j as i16, 2 * j as i16 + 1), s512);
    }
    Q4kBlock { u, sc, s }
}

/// Σ_j sc[j]·dot(sub-block j, activation) in sixteen i32 lanes.
#[inline(always)]
unsafe fn q4k_isum(b: &Q4kBlock, yq: *const u8) -> __m512i {
    let mut sum = _mm512_setzero_si512();
    for j in 0..4 {
        let a = _mm512_loadu_si512(yq.add(64 * j) as *const _);
        sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(b.u[j], a), b.sc[j]);
    }
    sum
}

/// Lane s = m[s]·(bsums[2s] + bsums[2s+1]) (exact).
#[inline(always)]
unsafe fn q4k_imin(s: __m256i, bsums: __m256i) -> __m256i {
    let dup = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    _mm256_madd_epi16(_mm256_permutexvar_epi16(dup, s), bsums)
}

/// ggml's Q4_K repack GEMV chain (quant's `RepackGemv`) for rows `w + r * ws`, `r < 4`:
/// per block `acc = fma(f32(Σ sc·dot), d·yd, acc)`, `accm = fma(f32(Σ m·bsum), dmin·yd,
/// accm)`; the result is `acc - accm`.
#[inline(always)]
pub unsafe fn gemv_q4k_x4(w: *const u8, ws: usize, a: *const u8, nb: usize) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    let mut accm = _mm_setzero_ps();
    let pd = prefetch_rows(ws, 4);
    for i in 0..nb {
        let y = a.add(i * Q8_K_B);
        let yd = _mm_set1_ps(f32::from_le_bytes(*(y as *const [u8; 4])));
        let bsums = _mm256_loadu_si256(y.add(260) as *const __m256i);
        let x = w.add(i * Q4_K_B);
        for r in 0..4 {
            let p = x.wrapping_add(r * ws + pd * ws);
            prefetch(p);
            prefetch(p.wrapping_add(64));
            prefetch(p.wrapping_add(128));
        }
        let mut isum = [_mm256_setzero_si256(); 4];
        let mut imin = [_mm256_setzero_si256(); 4];
        for r in 0..4 {
            let b = q4k_decode(x.add(r * ws));
            isum[r] = fold(q4k_isum(&b, y.add(4)));
            imin[r] = q4k_imin(b.s, bsums);
        }
        let d = h16x4(x, ws, 0);
        let dmin = h16x4(x, ws, 2);
        let isf = _mm_cvtepi32_ps(hsum4(isum));
        let imf = _mm_cvtepi32_ps(hsum4(imin));
        acc = _mm_fmadd_ps(isf, _mm_mul_ps(d, yd), acc);
        accm = _mm_fmadd_ps(imf, _mm_mul_ps(dmin, yd), accm);
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), _mm_sub_ps(acc, accm));
    out
}

/// Decoded Q6_K weights of one block: `u[k]` = codes of groups `2k, 2k+1` (32 bytes each,
/// the activation order) and the 16 scales broadcast to their 16-byte lanes.
pub struct Q6kBlock {
    pub u: [__m512i; 4],
    pub sc: [__m512i; 4],
    /// The 16 scales as i16.
    pub sc16: __m256i,
}

#[inline(always)]
pub unsafe fn q6k_decode(x: *const u8) -> Q6kBlock {
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let qh_mask = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi8(0x03)),
        _mm256_set1_epi8(0x0C),
    );
    let sh_lo = idx2(4, 2);
    let sh_hi = idx2(0, 2);
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192) as *const __m128i));
    let s512 = _mm512_castsi256_si512(sc16);
    let mut u = [_mm512_setzero_si512(); 4];
    let mut sc = [_mm512_setzero_si512(); 4];
    for n in 0..2 {
        let ql = _mm512_loadu_si512(x.add(64 * n) as *const _);
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(x.add(128 + 32 * n) as *const __m256i));
        // groups 4n, 4n+1: low nibbles | (qh bits 0-1 << 4), (qh bits 2-3 << 2)
        u[2 * n] = _mm512_or_si512(
            _mm512_and_si512(ql, m4),
            _mm512_sllv_epi16(_mm512_and_si512(qh, qh_mask), sh_lo),
        );
        // groups 4n+2, 4n+3: high nibbles | qh bits 4-5, (qh bits 6-7 >> 2)
        u[2 * n + 1] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
            _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30),
        );
        sc[2 * n] = _mm512_permutexvar_epi16(idx4(8 * n as i16), s512);
        sc[2 * n + 1] = _mm512_permutexvar_epi16(idx4(8 * n as i16 + 4), s512);
    }
    Q6kBlock { u, sc, sc16 }
}

/// ggml's eight AVX2 lanes of a Q6_K block (lane `l` = quads `l` of every group, scaled,
/// minus `32·Σ bsums·sc` of the lane), exact.
#[inline(always)]
pub unsafe fn q6k_lanes(b: &Q6kBlock, y: *const u8) -> __m256i {
    let yq = y.add(4);
    let mut sum = _mm512_setzero_si512();
    for k in 0..4 {
        let a = _mm512_loadu_si512(yq.add(64 * k) as *const _);
        sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(b.u[k], a), b.sc[k]);
    }
    let bsums = _mm256_loadu_si256(y.add(260) as *const __m256i);
    let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, b.sc16));
    _mm256_sub_epi32(fold(sum), sub)
}

/// `ggml_vec_dot_q6_K_q8_K` for `R` rows (row `r` at `w + r * ws`) and `C` activation
/// columns (column `c` at `a + c * as_`): per block `acc8 = fma(yd·d, f32(lanes), acc8)`,
/// then `hsum_float_8`. Each weight block is decoded once for all the columns; every (row,
/// column) keeps its own accumulator and the one-column chain.
#[inline(always)]
pub unsafe fn vecdot_q6k_cols<const R: usize, const C: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    nb: usize,
) -> [[f32; R]; C] {
    let mut acc8 = [[_mm256_setzero_ps(); R]; C];
    let pd = prefetch_rows(ws, R);
    for i in 0..nb {
        for r in 0..R {
            let x = w.add(r * ws + i * Q6_K_B);
            let p = x.wrapping_add(pd * ws);
            for l in 0..4 {
                prefetch(p.wrapping_add(64 * l));
            }
            let b = q6k_decode(x);
            let xd = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                (x.add(208) as *const u16).read_unaligned() as i32,
            )));
            for c in 0..C {
                let y = a.add(c * as_ + i * Q8_K_B);
                let yd = f32::from_le_bytes(*(y as *const [u8; 4]));
                let lanes = q6k_lanes(&b, y);
                acc8[c][r] = _mm256_fmadd_ps(
                    _mm256_set1_ps(yd * xd),
                    _mm256_cvtepi32_ps(lanes),
                    acc8[c][r],
                );
            }
        }
    }
    let mut out = [[0f32; R]; C];
    for c in 0..C {
        for r in 0..R {
            out[c][r] = crate::hsum::hsum_float_8(acc8[c][r]);
        }
    }
    out
}

/// [`vecdot_q6k_cols`] for two rows at once (row 1 at `w + ws`), each (row, column) on its
/// own one-column chain, with the per-block tail of the chain done for both rows in one
/// 512-bit vector: low half row 0's eight lanes, high half row 1's. The two rows' 512-bit
/// sums are folded together (lane `l` = `v[l] + v[l + 8]`, as `fold`), the bsums correction
/// enters as one `vpdpwssd` with the scales times -32 (`-32·(b0·s0 + b1·s1)` exactly, as
/// ggml's `sub(lanes, madd(bsums, sc) << 5)`), then one conversion and one fma with
/// `[yd·d0; 8] ++ [yd·d1; 8]`. Integer sums are exact in any order: the same bits as
/// [`vecdot_q6k_cols`], with a third of its per-block vector work after the products.
#[inline(always)]
pub unsafe fn vecdot_q6k_pair_cols<const C: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    nb: usize,
) -> [[f32; 2]; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    let pd = prefetch_rows(ws, 2);
    let m32 = _mm512_set1_epi16(-32);
    for i in 0..nb {
        let x0 = w.add(i * Q6_K_B);
        let x1 = x0.add(ws);
        let (p0, p1) = (x0.wrapping_add(pd * ws), x1.wrapping_add(pd * ws));
        let (b0, b1) = (q6k_decode(x0), q6k_decode(x1));
        let nsc = _mm512_mullo_epi16(
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(b0.sc16), b1.sc16),
            m32,
        );
        let xd = |x: *const u8| {
            _mm256_cvtph_ps(_mm_set1_epi16((x.add(208) as *const i16).read_unaligned()))
        };
        let xdv = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(xd(x0))),
            _mm256_castps_pd(xd(x1)),
        ));
        for c in 0..C {
            let y = a.add(c * as_ + i * Q8_K_B);
            let yq = y.add(4);
            let mut s0 = _mm512_setzero_si512();
            let mut s1 = _mm512_setzero_si512();
            for k in 0..4 {
                // The block's eight prefetches spread between its products: all eight at the
                // block's start stalled there waiting for fill buffers (a quarter of the
                // kernel's samples) and the products behind them left the memory idle.
                // Spread (and kept there by `prefetch_here`), the 1.5B's 191 MB output matrix
                // ran 24.7 -> 32.0 GB/s and its Q6_K ffn_down 26.4 -> 28.8 (`MOLLM_PROFILE=2`,
                // 128 steps, 2 interleaved rounds against the previous build).
                if c == 0 {
                    prefetch_here(p0.wrapping_add(64 * k));
                    prefetch_here(p1.wrapping_add(64 * k));
                }
                let av = _mm512_loadu_si512(yq.add(64 * k) as *const _);
                s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(b0.u[k], av), b0.sc[k]);
                s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(b1.u[k], av), b1.sc[k]);
            }
            let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(s0, s1);
            let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(s0, s1);
            let bs = _mm512_broadcast_i64x4(_mm256_loadu_si256(y.add(260) as *const __m256i));
            let lanes = _mm512_dpwssd_epi32(_mm512_add_epi32(lo, hi), bs, nsc);
            let yd = f32::from_le_bytes(*(y as *const [u8; 4]));
            let d = _mm512_mul_ps(_mm512_set1_ps(yd), xdv);
            acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[c]);
        }
    }
    let mut out = [[0f32; 2]; C];
    for c in 0..C {
        out[c] = [
            crate::hsum::hsum_float_8(_mm512_castps512_ps256(acc[c])),
            crate::hsum::hsum_float_8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(acc[c]),
            ))),
        ];
    }
    out
}

// ---------------------------------------------------------------- Q4_K GEMM, 16 columns

/// Activation columns per packed tile of [`gemm_q4k_t16`].
pub const T16: usize = 16;

/// Bytes of one block of a packed 16-column Q8_K tile: 64 quads x 16 columns x 4 bytes,
/// then the 16 group sums `bsums[g]` as i32 x 16 columns, then the 16 scales `d` as f32.
pub const Q8K_T16_BLOCK: usize = 64 * 64 + 16 * 64 + 64;
const T16_BSUMS: usize = 4096;
const T16_D: usize = 4096 + 1024;

/// Packs 16 Q8_K activation rows (row `c` at `a + c * as_`, `nb` blocks each) into the
/// column-interleaved tile [`gemm_q4k_t16`] and [`gemm_q6k_t16`] read: a quad of one weight row then meets the
/// same quad of sixteen columns in one `vpdpbusd`, and every sum lands in the lane of its
/// column, so no horizontal sums are needed.
///
/// # Safety
/// `a` covers the 16 rows; `dst` covers `nb * Q8K_T16_BLOCK` bytes.
pub unsafe fn pack_q8k_t16(a: *const u8, as_: usize, nb: usize, dst: *mut u8) {
    for i in 0..nb {
        let d = dst.add(i * Q8K_T16_BLOCK);
        for c in 0..T16 {
            let y = a.add(c * as_ + i * Q8_K_B);
            let yq = y.add(4) as *const u32;
            for q in 0..64 {
                (d.add(q * 64 + c * 4) as *mut u32).write_unaligned(yq.add(q).read_unaligned());
            }
            let bs = y.add(260) as *const i16;
            for g in 0..16 {
                let v = bs.add(g).read_unaligned() as i32;
                (d.add(T16_BSUMS + g * 64 + c * 4) as *mut i32).write_unaligned(v);
            }
            core::ptr::copy_nonoverlapping(y, d.add(T16_D + c * 4), 4);
        }
    }
}

/// ggml's Q4_K repack GEMM chain (quant's `RepackGemm`) for `R` weight rows (row `r` at
/// `w + r * ws`) against one packed 16-column tile: per block and sub-block pair `sb`,
/// `acc = fma(f32(sc·dot + sc·dot), d·yd, acc)` and `accm = fma(f32(m·bsum + m·bsum),
/// dmin·yd, accm)`, one column per lane; the result is `acc - accm`, written to
/// `out[c * ostride + r]`.
#[inline(always)]
unsafe fn gemm_q4k_t16<const R: usize>(
    w: *const u8,
    ws: usize,
    p: *const u8,
    nb: usize,
    out: *mut f32,
    ostride: usize,
) {
    #[repr(align(64))]
    struct Bytes([u8; 256]);
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut accm = [_mm512_setzero_ps(); R];
    let mut q = [Bytes([0; 256]), Bytes([0; 256])];
    for i in 0..nb {
        let pb = p.add(i * Q8K_T16_BLOCK);
        let yd = _mm512_loadu_ps(pb.add(T16_D) as *const f32);
        let mut sm = [[0u8; 16]; R];
        let mut dw = [_mm512_setzero_ps(); R];
        let mut dm = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let x = w.add(r * ws + i * Q4_K_B);
            for j in 0..4 {
                let bits = _mm256_loadu_si256(x.add(16 + 32 * j) as *const __m256i);
                let qp = q[r].0.as_mut_ptr().add(64 * j) as *mut __m256i;
                _mm256_store_si256(qp, _mm256_and_si256(bits, m4));
                _mm256_store_si256(
                    qp.add(1),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                );
            }
            _mm_storeu_si128(sm[r].as_mut_ptr() as *mut __m128i, q4k_scales(x));
            let xd = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                (x as *const u16).read_unaligned() as i32,
            )));
            let xdmin = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                (x.add(2) as *const u16).read_unaligned() as i32,
            )));
            dw[r] = _mm512_mul_ps(_mm512_set1_ps(xd), yd);
            dm[r] = _mm512_mul_ps(_mm512_set1_ps(xdmin), yd);
        }
        for sb in 0..4 {
            let mut s = [[_mm512_setzero_si512(); 2]; R];
            for h in 0..2 {
                let sub = 2 * sb + h;
                for qd in 0..8 {
                    let a = _mm512_loadu_si512(pb.add((8 * sub + qd) * 64) as *const _);
                    for r in 0..R {
                        let wq = (q[r].0.as_ptr().add(32 * sub + 4 * qd) as *const i32).read();
                        s[r][h] = _mm512_dpbusd_epi32(s[r][h], _mm512_set1_epi32(wq), a);
                    }
                }
            }
            // bsums of sub-blocks 2sb and 2sb+1 (two 16-element groups each)
            let bs = pb.add(T16_BSUMS + 4 * sb * 64);
            let b0 = _mm512_add_epi32(
                _mm512_loadu_si512(bs as *const _),
                _mm512_loadu_si512(bs.add(64) as *const _),
            );
            let b1 = _mm512_add_epi32(
                _mm512_loadu_si512(bs.add(128) as *const _),
                _mm512_loadu_si512(bs.add(192) as *const _),
            );
            for r in 0..R {
                let hs = _mm512_add_epi32(
                    _mm512_mullo_epi32(s[r][0], _mm512_set1_epi32(sm[r][2 * sb] as i32)),
                    _mm512_mullo_epi32(s[r][1], _mm512_set1_epi32(sm[r][2 * sb + 1] as i32)),
                );
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hs), dw[r], acc[r]);
                let im = _mm512_add_epi32(
                    _mm512_mullo_epi32(b0, _mm512_set1_epi32(sm[r][8 + 2 * sb] as i32)),
                    _mm512_mullo_epi32(b1, _mm512_set1_epi32(sm[r][8 + 2 * sb + 1] as i32)),
                );
                accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), dm[r], accm[r]);
            }
        }
    }
    for r in 0..R {
        let mut v = [0f32; T16];
        _mm512_storeu_ps(v.as_mut_ptr(), _mm512_sub_ps(acc[r], accm[r]));
        for c in 0..T16 {
            *out.add(c * ostride + r) = v[c];
        }
    }
}

/// The tiled matmul's Q6_K chain (quant's `Tiled`) for `R` weight rows against one packed
/// 16-column tile: per block `res = f32(Σ_g sc_g·(dot_g - 32·bsum_g)) · d`, `acc = fma(res,
/// yd, acc)`, one column per lane, written to `out[c * ostride + r]`.
#[inline(always)]
unsafe fn gemm_q6k_t16<const R: usize>(
    w: *const u8,
    ws: usize,
    p: *const u8,
    nb: usize,
    out: *mut f32,
    ostride: usize,
) {
    #[repr(align(64))]
    struct Bytes([u8; 256]);
    let mut acc = [_mm512_setzero_ps(); R];
    let mut q = [Bytes([0; 256]), Bytes([0; 256])];
    for i in 0..nb {
        let pb = p.add(i * Q8K_T16_BLOCK);
        let yd = _mm512_loadu_ps(pb.add(T16_D) as *const f32);
        let mut xd = [0f32; R];
        let mut sc = [[0i8; 16]; R];
        for r in 0..R {
            let x = w.add(r * ws + i * Q6_K_B);
            let b = q6k_decode(x);
            for k in 0..4 {
                _mm512_store_si512(q[r].0.as_mut_ptr().add(64 * k) as *mut _, b.u[k]);
            }
            sc[r] = (x.add(192) as *const [i8; 16]).read_unaligned();
            xd[r] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                (x.add(208) as *const u16).read_unaligned() as i32,
            )));
        }
        let mut tot = [_mm512_setzero_si512(); R];
        for g in 0..16 {
            let mut dg = [_mm512_setzero_si512(); R];
            for qd in 0..4 {
                let a = _mm512_loadu_si512(pb.add((4 * g + qd) * 64) as *const _);
                for r in 0..R {
                    let wq = (q[r].0.as_ptr().add(16 * g + 4 * qd) as *const i32).read();
                    dg[r] = _mm512_dpbusd_epi32(dg[r], _mm512_set1_epi32(wq), a);
                }
            }
            let b32 =
                _mm512_slli_epi32::<5>(_mm512_loadu_si512(pb.add(T16_BSUMS + g * 64) as *const _));
            for r in 0..R {
                let v = _mm512_sub_epi32(dg[r], b32);
                tot[r] = _mm512_add_epi32(
                    tot[r],
                    _mm512_mullo_epi32(v, _mm512_set1_epi32(sc[r][g] as i32)),
                );
            }
        }
        for r in 0..R {
            let res = _mm512_mul_ps(_mm512_cvtepi32_ps(tot[r]), _mm512_set1_ps(xd[r]));
            acc[r] = _mm512_fmadd_ps(res, yd, acc[r]);
        }
    }
    for r in 0..R {
        let mut v = [0f32; T16];
        _mm512_storeu_ps(v.as_mut_ptr(), acc[r]);
        for c in 0..T16 {
            *out.add(c * ostride + r) = v[c];
        }
    }
}

/// [`gemm_q4k_t16`] (`dt` Q4_K) or [`gemm_q6k_t16`] (Q6_K) over `nr` rows, two at a time.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI, F16C; `w` covers `nr` rows of `nb` blocks of `dt` at
/// stride `ws`; `p` is a packed tile of `nb` blocks; `out` covers `15 * ostride + nr` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_t16_avx512(
    dt: abi::DType,
    w: *const u8,
    ws: usize,
    nr: usize,
    p: *const u8,
    nb: usize,
    out: *mut f32,
    ostride: usize,
) {
    let q4k = dt == abi::DType::Q4_K;
    let mut r = 0;
    while r + 2 <= nr {
        let (wr, o) = (w.add(r * ws), out.add(r));
        if q4k {
            gemm_q4k_t16::<2>(wr, ws, p, nb, o, ostride)
        } else {
            gemm_q6k_t16::<2>(wr, ws, p, nb, o, ostride)
        }
        r += 2;
    }
    if r < nr {
        let (wr, o) = (w.add(r * ws), out.add(r));
        if q4k {
            gemm_q4k_t16::<1>(wr, ws, p, nb, o, ostride)
        } else {
            gemm_q6k_t16::<1>(wr, ws, p, nb, o, ostride)
        }
    }
}
