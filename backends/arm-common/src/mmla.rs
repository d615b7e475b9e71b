//! Integer sums over 16-element halves, for one weight row against one activation column
//! ([`halves`]) and for a 2×2 tile of two rows against two columns ([`pair_halves`]).
//!
//! SMMLA (Armv8.6 i8mm) multiplies a 2×8 by an 8×2 int8 matrix into a 2×2 int32 tile: one
//! instruction computes four 8-element dot products (32 multiply-adds, twice SDOT's 16). Its
//! sums are per 8 elements, so it serves exactly the chains whose integers are sums over 8 or
//! more consecutive elements (`crate::kquants::has_tile`); ggml's `vec_dot` lanes are per 4
//! elements and stay on SDOT. All paths give the same exact integers; the float chains that
//! consume them do not know which path ran.

use crate::simd::quads;
use crate::IntPath;

/// `out[h]` = Σ a·y over elements `16h..16h+16` (`H` even; `a`, `y` hold `16·H` elements).
///
/// # Safety
/// The CPU runs `path`.
#[inline(always)]
pub unsafe fn halves<const H: usize>(path: IntPath, a: &[i8], y: &[i8]) -> [i32; H] {
    let mut out = [0i32; H];
    for g in 0..H / 2 {
        let q = quads(path, &a[32 * g..32 * g + 32], &y[32 * g..32 * g + 32]);
        out[2 * g] = q[0] + q[1] + q[2] + q[3];
        out[2 * g + 1] = q[4] + q[5] + q[6] + q[7];
    }
    out
}

/// The 2×2 tile: `out[2i + j][h]` = Σ a_i·y_j over elements `16h..16h+16` (SMMLA's output
/// order: row-major over weight row `i`, activation column `j`).
///
/// # Safety
/// The CPU runs `path`.
#[inline(always)]
pub unsafe fn pair_halves<const H: usize>(
    path: IntPath,
    a: [&[i8]; 2],
    y: [&[i8]; 2],
) -> [[i32; H]; 4] {
    match path {
        #[cfg(target_arch = "aarch64")]
        IntPath::I8mm => smmla::pair_halves(a, y),
        _ => pair_halves_by_quads(path, a, y),
    }
}

/// The twin of SMMLA's tile: four [`halves`].
///
/// # Safety
/// The CPU runs `path`.
#[inline(always)]
pub unsafe fn pair_halves_by_quads<const H: usize>(
    path: IntPath,
    a: [&[i8]; 2],
    y: [&[i8]; 2],
) -> [[i32; H]; 4] {
    core::array::from_fn(|t| halves(path, a[t / 2], y[t % 2]))
}

/// SMMLA straight from a repacked Q4_K pair block's 256 interleaved `qs` bytes (see
/// `crate::repack`) against two Q8_K columns: [`pair_halves`] of its two rows.
#[cfg(target_arch = "aarch64")]
pub use smmla::q4k_pair_halves as q4k_pair_halves_i8mm;

#[cfg(target_arch = "aarch64")]
mod smmla {
    use core::arch::aarch64::*;

    /// `acc += [a0; a1] · [b0; b1]ᵀ` over 8-element rows (stable Rust has no intrinsic).
    #[inline(always)]
    unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        core::arch::asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }

    /// Two 16-byte rows as SMMLA operands: `[r0[0..8], r1[0..8]]` and `[r0[8..16], r1[8..16]]`.
    #[inline(always)]
    unsafe fn interleave(r0: *const i8, r1: *const i8) -> (int8x16_t, int8x16_t) {
        let (x0, x1) = (
            vreinterpretq_s64_s8(vld1q_s8(r0)),
            vreinterpretq_s64_s8(vld1q_s8(r1)),
        );
        (
            vreinterpretq_s8_s64(vzip1q_s64(x0, x1)),
            vreinterpretq_s8_s64(vzip2q_s64(x0, x1)),
        )
    }

    #[target_feature(enable = "neon,i8mm")]
    pub unsafe fn pair_halves<const H: usize>(a: [&[i8]; 2], y: [&[i8]; 2]) -> [[i32; H]; 4] {
        assert!(a.iter().chain(&y).all(|s| s.len() >= 16 * H));
        let mut out = [[0i32; H]; 4];
        for h in 0..H {
            let (a_lo, a_hi) = interleave(a[0].as_ptr().add(16 * h), a[1].as_ptr().add(16 * h));
            let (y_lo, y_hi) = interleave(y[0].as_ptr().add(16 * h), y[1].as_ptr().add(16 * h));
            let t = smmla(smmla(vdupq_n_s32(0), a_lo, y_lo), a_hi, y_hi);
            let mut lanes = [0i32; 4];
            vst1q_s32(lanes.as_mut_ptr(), t);
            for (o, v) in out.iter_mut().zip(lanes) {
                o[h] = v;
            }
        }
        out
    }

    #[target_feature(enable = "neon,i8mm")]
    pub unsafe fn q4k_pair_halves(qs: &[u8], y: [&[i8]; 2]) -> [[i32; 16]; 4] {
        assert!(qs.len() >= 256 && y.iter().all(|s| s.len() >= 256));
        let mut out = [[0i32; 16]; 4];
        let mask = vdupq_n_u8(0x0F);
        let yv =
            |e: usize| vcombine_s8(vld1_s8(y[0].as_ptr().add(e)), vld1_s8(y[1].as_ptr().add(e)));
        for p in 0..4 {
            for jj in 0..2 {
                let (mut lo, mut hi) = (vdupq_n_s32(0), vdupq_n_s32(0));
                for j in [2 * jj, 2 * jj + 1] {
                    let l = vld1q_u8(qs.as_ptr().add(16 * (4 * p + j)));
                    let e = 64 * p + 8 * j;
                    lo = smmla(lo, vreinterpretq_s8_u8(vandq_u8(l, mask)), yv(e));
                    hi = smmla(hi, vreinterpretq_s8_u8(vshrq_n_u8::<4>(l)), yv(e + 32));
                }
                let (mut a, mut b) = ([0i32; 4], [0i32; 4]);
                vst1q_s32(a.as_mut_ptr(), lo);
                vst1q_s32(b.as_mut_ptr(), hi);
                for t in 0..4 {
                    out[t][4 * p + jj] = a[t];
                    out[t][4 * p + 2 + jj] = b[t];
                }
            }
        }
        out
    }
}
