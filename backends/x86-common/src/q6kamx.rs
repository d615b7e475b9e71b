//! Q6_K prompt GEMMs on AMX int8 tiles (Sapphire Rapids and later): ggml's tiled Q6_K chain
//! (quant's `Tiled`, the one [`crate::kq512`]'s `gemm_q6k_t16` runs on VNNI) with each
//! 16-element sub-block's exact integer dot products for 16 weight rows by 16 activation
//! columns from one tile product, instead of 64 `vpdpbusd` per row and block.
//!
//! Per block: `tot = Σ_g sc_g · (dot_g - 32 · bsum_g)` in i32 (exact: at most 2^27), then
//! `res = f32(tot) · d` and `acc = fma(res, yd, acc)`, as there; here one register holds one
//! column's 16 rows, so `sc_g` and `d` are vectors over the rows and `32 · bsum_g` and `yd`
//! are broadcasts. Tiles: K = 16 ([`crate::amx::Tiles`]): A = 16 columns x 16 signed
//! activation bytes, B = 4 quads of the 16 rows' codes (0..63, unsigned), `tdpbsud`.
//!
//! The weights stay row-major in the file; [`pack_rows`] puts one task's 16-row groups into
//! tiles once, for all the columns it meets.

use core::arch::x86_64::*;

const Q6_K_B: usize = 210;
const Q8_K_B: usize = 292;

/// Bytes of one block of 16 packed activation columns: 16 A tiles (sub-block `g`: column `c`'s
/// 16 quants at `256 g + 16 c`), then `32 · bsum_g` of each column as i32 (`[g][c]`), then
/// the columns' `d` as f32.
pub const ACT_BLOCK: usize = 16 * 256 + 16 * 64 + 64;
const ACT_BS: usize = 16 * 256;
const ACT_D: usize = ACT_BS + 16 * 64;

/// Bytes of one block of 16 packed weight rows: 16 B tiles (sub-block `g`: quad `k` of row
/// `n` at `256 g + 64 k + 4 n`), then the rows' scale of each sub-block as i32 (`[g][n]`),
/// then the rows' `d` as f32.
pub const ROW_BLOCK: usize = 16 * 256 + 16 * 64 + 64;
const ROW_SC: usize = 16 * 256;
const ROW_D: usize = ROW_SC + 16 * 64;

/// Packs 16 Q8_K activation rows (row `c` at `a + c * as_`, `nb` blocks) for [`tile`].
///
/// # Safety
/// The rows hold `nb` blocks; `dst` covers `nb * ACT_BLOCK` bytes.
pub unsafe fn pack_act(a: *const u8, as_: usize, nb: usize, dst: *mut u8) {
    for i in 0..nb {
        let d = dst.add(i * ACT_BLOCK);
        for c in 0..16 {
            let y = a.add(c * as_ + i * Q8_K_B);
            for g in 0..16 {
                core::ptr::copy_nonoverlapping(y.add(4 + 16 * g), d.add(256 * g + 16 * c), 16);
                let bs = (y.add(260 + 2 * g) as *const i16).read_unaligned() as i32;
                (d.add(ACT_BS + 64 * g + 4 * c) as *mut i32).write_unaligned(32 * bs);
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
    #[repr(align(64))]
    struct Codes([[u32; 64]; 16]);
    let mut q = Codes([[0; 64]; 16]);
    for i in 0..nb {
        let d = dst.add(i * ROW_BLOCK);
        for (n, qn) in q.0.iter_mut().enumerate() {
            let x = w.add(n * ws + i * Q6_K_B);
            // The codes in element order (as `gemm_q6k_t16` stores them).
            let b = crate::kq512::q6k_decode(x);
            for k in 0..4 {
                _mm512_store_si512(qn.as_mut_ptr().add(16 * k) as *mut _, b.u[k]);
            }
            for g in 0..16 {
                let sc = *(x.add(192 + g) as *const i8) as i32;
                (d.add(ROW_SC + 64 * g + 4 * n) as *mut i32).write_unaligned(sc);
            }
            let h = (x.add(208) as *const u16).read_unaligned();
            (d.add(ROW_D + 4 * n) as *mut f32).write_unaligned(quant::fp16_to_f32(h));
        }
        // Quad m = 4 g + k of every row: B row k of sub-block g.
        for m in 0..64 {
            let t = d.add(64 * m) as *mut u32;
            for (n, qn) in q.0.iter().enumerate() {
                t.add(n).write_unaligned(qn[m]);
            }
        }
    }
}

/// 16 rows (packed by [`pack_rows`] at `w`) by 16 columns (packed by [`pack_act`] at `p`),
/// `nb` blocks: `out[c * ostride + n]` for row `n` and column `c`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL; `w` and `p` hold `nb` packed blocks; `out` covers
/// `15 * ostride + 16` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub unsafe fn tile(
    _tiles: &crate::amx::Tiles<16>,
    w: *const u8,
    nb: usize,
    p: *const u8,
    out: *mut f32,
    ostride: usize,
) {
    use crate::amx;
    #[repr(align(64))]
    struct Sums([[i32; 16]; 32]);
    let mut cs = Sums([[0; 16]; 32]);
    let mut acc = [_mm512_setzero_ps(); 16];
    for i in 0..nb {
        let (wb, ab) = (w.add(i * ROW_BLOCK), p.add(i * ACT_BLOCK));
        let mut tot = [_mm512_setzero_si512(); 16];
        for gp in 0..8 {
            let (g0, g1) = (2 * gp, 2 * gp + 1);
            amx::zero_acc();
            amx::dot2(
                ab.add(256 * g0),
                ab.add(256 * g1),
                16,
                wb.add(256 * g0),
                wb.add(256 * g1),
            );
            amx::store_acc(
                cs.0[0].as_mut_ptr() as *mut u8,
                cs.0[16].as_mut_ptr() as *mut u8,
            );
            for (h, g) in [g0, g1].into_iter().enumerate() {
                let sc = _mm512_loadu_si512(wb.add(ROW_SC + 64 * g) as *const _);
                let bs = ab.add(ACT_BS + 64 * g) as *const i32;
                for (c, t) in tot.iter_mut().enumerate() {
                    let dot = _mm512_load_si512(cs.0[16 * h + c].as_ptr() as *const _);
                    let v = _mm512_sub_epi32(dot, _mm512_set1_epi32(*bs.add(c)));
                    *t = _mm512_add_epi32(*t, _mm512_mullo_epi32(v, sc));
                }
            }
        }
        let dr = _mm512_loadu_ps(wb.add(ROW_D) as *const f32);
        let yd = ab.add(ACT_D) as *const f32;
        for (c, a) in acc.iter_mut().enumerate() {
            let res = _mm512_mul_ps(_mm512_cvtepi32_ps(tot[c]), dr);
            *a = _mm512_fmadd_ps(res, _mm512_set1_ps(*yd.add(c)), *a);
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(out.add(c * ostride), *a);
    }
}
