//! Q4_1 weights repacked at load (`prepare_weight`, AVX-512) into groups of 16 rows, so that
//! one `vpdpbusd` with four broadcast activation bytes gives one of ggml's eight lane sums for
//! 16 rows at once: no per-row nibble unpacking, scale conversion or broadcast, and one
//! product `dx · dy` per 16 rows instead of one per row.
//!
//! The chain is ggml's (`ggml_vec_dot_q4_1_q8_1`, x86 build; quant's reference and
//! `simd::dot_q4_1`): per block the eight exact lane sums `s_l` (lane `l` covers elements
//! `4l .. 4l + 4`: the low nibbles of code bytes `4l ..` for `l < 4`, the high nibbles of code
//! bytes `4(l - 4) ..` for `l >= 4`), `lane[l] = fma(dx · dy, f32(s_l), lane[l])`, beside it
//! `summs = fma(mx, sy, summs)`; the result `hsum_float_8(lanes) + summs`. Here a register
//! holds one lane (or the `summs`) of 16 rows, so every row runs exactly that chain: the
//! results are bit-identical to the row-wise kernels, for any number of columns (Q4_1 has
//! one chain for decode and prompts: `quant::matmul_kernel`).
//!
//! Layout of one 16-row group: per block, [`BLOCK`] bytes: four 64-byte code lines, line `t`
//! holding code bytes `4t .. 4t + 4` of each row (rows in order), then one line with the 16
//! rows' `d` (f16) followed by their `m` (f16). Groups follow each other, so a weight streams
//! front to back.

/// Rows per group.
pub const ROWS: usize = 16;
/// Bytes of one block of a 16-row group.
pub const BLOCK: usize = 5 * 64;
/// Bytes of one Q4_1 block (f16 d, f16 m, 16 code bytes).
const Q4_1_B: usize = 20;

/// Whether an `n x k` Q4_1 weight can be repacked.
pub fn fits(k: usize, n: usize) -> bool {
    k > 0 && k % 32 == 0 && n > 0 && n % ROWS == 0
}

/// Bytes of a repacked `n x k` weight.
pub fn repacked_bytes(k: usize, n: usize) -> usize {
    n / ROWS * (k / 32) * BLOCK
}

/// Repacks `n` rows of `k` elements (row `r` at `src[r * rs..]`) into `dst`.
pub fn repack(src: &[u8], rs: usize, k: usize, n: usize, dst: &mut [u8]) {
    assert!(fits(k, n));
    let nb = k / 32;
    assert!(dst.len() >= repacked_bytes(k, n));
    assert!(src.len() >= (n - 1) * rs + nb * Q4_1_B);
    for g in 0..n / ROWS {
        for i in 0..nb {
            let out = &mut dst[(g * nb + i) * BLOCK..][..BLOCK];
            for r in 0..ROWS {
                let b = &src[(g * ROWS + r) * rs + i * Q4_1_B..][..Q4_1_B];
                for t in 0..4 {
                    out[64 * t + 4 * r..][..4].copy_from_slice(&b[4 + 4 * t..][..4]);
                }
                out[256 + 2 * r..][..2].copy_from_slice(&b[..2]);
                out[288 + 2 * r..][..2].copy_from_slice(&b[2..4]);
            }
        }
    }
}

/// Columns `0..cols` (Q8_1 activation rows, column `c` at `a + c * as_`) of the `ng` row
/// groups at `w` (group `g` at `w + g * nb * BLOCK`): `out[c * os + 16 g + r]`.
///
/// # Safety
/// The CPU runs AVX-512 F/BW/VL/VNNI; `w` holds `ng` repacked groups of `nb` blocks, each
/// activation row `nb` Q8_1 blocks; `out` covers every written element.
#[allow(clippy::too_many_arguments)]
pub unsafe fn columns(
    w: *const u8,
    ng: usize,
    nb: usize,
    a: *const u8,
    as_: usize,
    cols: usize,
    out: *mut f32,
    os: usize,
) {
    #[cfg(target_arch = "x86_64")]
    for g in 0..ng {
        let wg = w.add(g * nb * BLOCK);
        let o = out.add(g * ROWS);
        let mut c = 0;
        // Two columns share each block's unpacked codes and scales: their 2 x 9 lane
        // registers and the eight code registers just fit (measured on SmolLM2's 576 x 1536,
        // 16 columns, one thread: runs of 2 and 4 alike, 1.37x the row layout's column pairs;
        // 16 columns with their lanes in memory 1.18x, runs of 8 below).
        macro_rules! run {
            ($n:literal) => {
                while c + $n <= cols {
                    x86::group::<$n>(wg, nb, a.add(c * as_), as_, o.add(c * os), os);
                    c += $n;
                }
            };
        }
        run!(2);
        run!(1);
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, ng, nb, a, as_, cols, out, os);
        unreachable!("repacked weights are x86-64 only")
    }
}

#[cfg(target_arch = "x86_64")]
pub mod x86 {
    use super::BLOCK;
    use core::arch::x86_64::*;

    /// Bytes of one Q8_1 activation block (f16 d, f16 s, 32 codes).
    const Q8_1_B: usize = 36;
    /// One column streams each weight once: lines are prefetched into L2 this far ahead
    /// (measured on SmolLM2 decode, 2 threads, three rounds: 2 KiB 113-123 t/s, 4 KiB
    /// 95-116, 16 KiB as `wr16` 100-107, none 101-103).
    const PREFETCH: usize = 2048;

    #[inline(always)]
    unsafe fn h16(p: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
            (p as *const u16).read_unaligned() as i32,
        )))
    }

    /// 16 rows x `C` columns of one row group: `out[c * os + r]`.
    ///
    /// # Safety
    /// As [`super::columns`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn group<const C: usize>(
        w: *const u8,
        nb: usize,
        a: *const u8,
        as_: usize,
        out: *mut f32,
        os: usize,
    ) {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut lanes = [[_mm512_setzero_ps(); 8]; C];
        let mut summs = [_mm512_setzero_ps(); C];
        for i in 0..nb {
            let p = w.add(i * BLOCK);
            if C == 1 {
                for l in 0..5 {
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * l + PREFETCH) as *const i8);
                }
            }
            let dx = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(256) as *const __m256i));
            let mx = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(288) as *const __m256i));
            let mut q = [_mm512_setzero_si512(); 8];
            for t in 0..4 {
                let v = _mm512_loadu_si512(p.add(64 * t) as *const __m512i);
                q[t] = _mm512_and_si512(v, m4);
                q[t + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            }
            for c in 0..C {
                let y = a.add(c * as_ + i * Q8_1_B);
                summs[c] = _mm512_fmadd_ps(mx, _mm512_set1_ps(h16(y.add(2))), summs[c]);
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(h16(y)));
                let yq = y.add(4) as *const i32;
                for l in 0..8 {
                    let s = _mm512_dpbusd_epi32(
                        _mm512_setzero_si512(),
                        q[l],
                        _mm512_set1_epi32(yq.add(l).read_unaligned()),
                    );
                    lanes[c][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), lanes[c][l]);
                }
            }
        }
        for c in 0..C {
            // hsum_float_8 lane by lane, then the offsets' sum (ggml's order).
            let l = &lanes[c];
            let r0 = _mm512_add_ps(l[4], l[0]);
            let r1 = _mm512_add_ps(l[5], l[1]);
            let r2 = _mm512_add_ps(l[6], l[2]);
            let r3 = _mm512_add_ps(l[7], l[3]);
            let v = _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3));
            _mm512_storeu_ps(out.add(c * os), _mm512_add_ps(v, summs[c]));
        }
    }
}
