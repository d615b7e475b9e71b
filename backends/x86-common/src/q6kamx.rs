//! Q6_K prompt GEMMs on AMX int8 tiles (Sapphire Rapids and later): ggml's tiled Q6_K chain
//! (quant's `Tiled`, the one [`crate::kq512`]'s `gemm_q6k_t16` runs on VNNI) with each
//! block's exact integer sum for 16 weight rows by 16 activation columns from tile products.
//!
//! Per block the chain takes `tot = Σ_g sc_g · (dot_g - 32 · bsum_g)` in i32 (exact: at most
//! 2^27), then `res = f32(tot) · d` and `acc = fma(res, yd, acc)`. The same integer is
//! `Σ_k w_k · a_k` with `w_k = (q_k - 32) · sc_g` (the signed code times its sub-block's
//! scale, -4064..4096), and with `w = 256 h + l` (`l` its low byte, unsigned; `h` in
//! -16..16) it is `256 · Σ h·a + Σ l·a`: two tile products over the whole block, K = 64 at a
//! time (`tdpbssd` for `h`, `tdpbsud` for `l`), with no per-sub-block work. Both sums and
//! `256 · Σ h·a` (below 2^28) fit i32, so `tot` is the same integer bit for bit, and the
//! float chain after it is unchanged; one register holds one column's 16 rows.
//!
//! The weights stay row-major in the file; [`pack_rows`] puts one task's 16-row groups into
//! the two byte planes once, for all the columns it meets. (Before, a tile product per
//! 16-element sub-block with K = 16, its sums stored and scaled with `vpmulld` per column:
//! 15% of Qwen2.5-1.5B's pp256, where a Q6_K block's 16 columns took 16 tile products and 16
//! tile stores against 8 and 2 now.)

use core::arch::x86_64::*;

const Q6_K_B: usize = 210;
const Q8_K_B: usize = 292;

/// Bytes of one block of 16 packed activation columns: per 64-element chunk `kc` an A tile
/// (column `c`'s 64 quants at `1024 kc + 64 c`), then the columns' `d` as f32.
pub const ACT_BLOCK: usize = 4 * 1024 + 64;
const ACT_D: usize = 4 * 1024;

/// Bytes of one block of 16 packed weight rows: per 64-element chunk `kc` and plane `p` (0:
/// low bytes, 1: high bytes of `w`) a B tile (quad `j` of row `n` at
/// `2048 kc + 1024 p + 64 j + 4 n`), then the rows' `d` as f32.
pub const ROW_BLOCK: usize = 8 * 1024 + 64;
const ROW_D: usize = 8 * 1024;

/// Packs 16 Q8_K activation rows (row `c` at `a + c * as_`, `nb` blocks) for [`tile`].
///
/// # Safety
/// The rows hold `nb` blocks; `dst` covers `nb * ACT_BLOCK` bytes.
pub unsafe fn pack_act(a: *const u8, as_: usize, nb: usize, dst: *mut u8) {
    for i in 0..nb {
        let d = dst.add(i * ACT_BLOCK);
        for c in 0..16 {
            let y = a.add(c * as_ + i * Q8_K_B);
            for kc in 0..4 {
                core::ptr::copy_nonoverlapping(y.add(4 + 64 * kc), d.add(1024 * kc + 64 * c), 64);
            }
            core::ptr::copy_nonoverlapping(y, d.add(ACT_D + 4 * c), 4);
        }
    }
}

/// Packs 16 Q6_K weight rows (row `n` at `w + n * ws`, `nb` blocks) for [`tile`].
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL; the rows hold `nb` blocks; `dst` covers `nb * ROW_BLOCK`
/// bytes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn pack_rows(w: *const u8, ws: usize, nb: usize, dst: *mut u8) {
    /// Row `n`'s 256 bytes of one plane, as 64 quads.
    #[repr(align(64))]
    struct Plane([[u32; 64]; 16]);
    let mut lo = Plane([[0; 64]; 16]);
    let mut hi = Plane([[0; 64]; 16]);
    let c32 = _mm512_set1_epi16(32);
    for i in 0..nb {
        let d = dst.add(i * ROW_BLOCK);
        for n in 0..16 {
            let x = w.add(n * ws + i * Q6_K_B);
            // The codes in element order (as `gemm_q6k_t16` stores them).
            let b = crate::kq512::q6k_decode(x);
            let sc = x.add(192) as *const i8;
            for m in 0..8 {
                // Elements 32m .. 32m + 32: sub-blocks 2m and 2m + 1.
                let u = b.u[m / 2];
                let q = _mm512_cvtepu8_epi16(match m % 2 {
                    0 => _mm512_castsi512_si256(u),
                    _ => _mm512_extracti64x4_epi64::<1>(u),
                });
                let s = _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_set1_epi16(*sc.add(2 * m) as i16)),
                    _mm256_set1_epi16(*sc.add(2 * m + 1) as i16),
                );
                let v = _mm512_mullo_epi16(_mm512_sub_epi16(q, c32), s);
                let l = _mm512_cvtepi16_epi8(v);
                let h = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(v));
                _mm256_storeu_si256(lo.0[n].as_mut_ptr().add(8 * m) as *mut __m256i, l);
                _mm256_storeu_si256(hi.0[n].as_mut_ptr().add(8 * m) as *mut __m256i, h);
            }
            let h = (x.add(208) as *const u16).read_unaligned();
            (d.add(ROW_D + 4 * n) as *mut f32).write_unaligned(quant::fp16_to_f32(h));
        }
        // Quad m = 16 kc + j of every row: B row j of chunk kc's tile of each plane.
        for (p, plane) in [&lo, &hi].into_iter().enumerate() {
            for m in 0..64 {
                let t = d.add(2048 * (m / 16) + 1024 * p + 64 * (m % 16)) as *mut u32;
                for (n, row) in plane.0.iter().enumerate() {
                    t.add(n).write_unaligned(row[m]);
                }
            }
        }
    }
}

/// 16 rows (packed by [`pack_rows`] at `w`) by `16 T` columns (`T` tiles packed by
/// [`pack_act`], tile `t` at `p + t * ps`), `nb` blocks: `out[c * ostride + n]` for row `n`
/// and column `c`. The weights' B tiles serve every column tile.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL; `nb >= 1`; `w` holds `nb` packed blocks and `p` `T` packed
/// tiles of `nb` blocks, `ps` bytes apart; `out` covers `(16 T - 1) * ostride + 16` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn tile<const T: usize>(
    _tiles: &crate::amx::Tiles<64>,
    w: *const u8,
    nb: usize,
    p: *const u8,
    ps: usize,
    out: *mut f32,
    ostride: usize,
) {
    use crate::amx;
    const {
        assert!(
            T == 1 || T == 2,
            "one or two column tiles (four accumulator tiles)"
        )
    };
    // Tile sums of one block: `[2 t + plane][column][row]` (plane 0: Σ l·a, 1: Σ h·a).
    #[repr(align(64))]
    struct Sums([[[i32; 16]; 16]; 4]);
    let mut cs = core::mem::MaybeUninit::<Sums>::uninit();
    let cs = (&raw mut (*cs.as_mut_ptr()).0) as *mut [[i32; 16]; 16];
    debug_assert!(nb >= 1, "the accumulators start in the first block");
    // The chains' accumulators, started by the first block's FMAs onto a zero register
    // instead of zeroed per call (as `q4k16::tile_amx`).
    let mut acc = core::mem::MaybeUninit::<[[__m512; 16]; T]>::uninit();
    let acc = acc.as_mut_ptr() as *mut __m512;
    for i in 0..nb {
        let (wb, ab) = (w.add(i * ROW_BLOCK), p.add(i * ACT_BLOCK));
        amx::zero4();
        for kc in 0..4 {
            amx::load2::<6, 7>(wb.add(2048 * kc), wb.add(2048 * kc + 1024));
            amx::dot_planes::<0>(ab.add(1024 * kc));
            if T == 2 {
                amx::dot_planes::<1>(ab.add(ps + 1024 * kc));
            }
        }
        amx::store4(cs as *mut u8, T);
        let dr = _mm512_loadu_ps(wb.add(ROW_D) as *const f32);
        for t in 0..T {
            let yd = p.add(t * ps + i * ACT_BLOCK + ACT_D) as *const f32;
            let (l, h) = (&*cs.add(2 * t), &*cs.add(2 * t + 1));
            for c in 0..16 {
                let lv = _mm512_load_si512(l[c].as_ptr() as *const _);
                let hv = _mm512_load_si512(h[c].as_ptr() as *const _);
                let tot = _mm512_add_epi32(_mm512_slli_epi32::<8>(hv), lv);
                let res = _mm512_mul_ps(_mm512_cvtepi32_ps(tot), dr);
                let a = acc.add(16 * t + c);
                let prev = if i == 0 {
                    _mm512_setzero_ps()
                } else {
                    a.read()
                };
                a.write(_mm512_fmadd_ps(res, _mm512_set1_ps(*yd.add(c)), prev));
            }
        }
    }
    for t in 0..T {
        for c in 0..16 {
            _mm512_storeu_ps(out.add((16 * t + c) * ostride), acc.add(16 * t + c).read());
        }
    }
}
