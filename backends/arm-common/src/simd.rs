//! `vec_dot` kernels for the legacy block formats, bit-identical to `quant::vec_dot` (ggml's
//! x86 `ggml_vec_dot_*` with eight f32 lanes): per block, eight exact int32 lane sums (lane k
//! = elements 4k..4k+4), one FMA per lane with the product of the two block scales, and at the
//! end `hsum_float_8` (plus, for Q4_1/Q5_1, the minimum terms summed with FMAs on the side).
//! Three ways to the integer lanes ([`IntPath`]); the float stage is the same code for all.

use crate::IntPath;
use abi::DType;
use quant::fp16_to_f32;

/// Weight formats with kernels here.
pub const FORMATS: &[DType] = &[
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
];

/// Whether [`vec_dot`] computes `kernel`'s output elements for `dt`: `vec_dot` itself, and
/// llamafile's tinyBLAS for Q4_0/Q5_0/Q8_0, whose per-element chain is the same (eight lanes,
/// one FMA per block, `hsum_float_8`; see quant/src/legacy/tinyblas.rs).
pub fn has_kernel(kernel: quant::Kernel, dt: DType) -> bool {
    match kernel {
        quant::Kernel::VecDot => FORMATS.contains(&dt),
        quant::Kernel::TinyBlas => matches!(dt, DType::Q4_0 | DType::Q5_0 | DType::Q8_0),
        _ => false,
    }
}

#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// A weight block's 32 integers, its scale and (Q4_1/Q5_1) its minimum.
#[inline(always)]
pub(crate) fn unpack(dt: DType, b: &[u8]) -> ([i8; 32], f32, f32) {
    let mut q = [0i8; 32];
    let d = f16_at(b, 0);
    let nib = |qs: &[u8], q: &mut [i8; 32], hi: u32, off: i8| {
        for j in 0..16 {
            let h0 = (((hi >> j) & 1) << 4) as u8;
            let h1 = (((hi >> (j + 16)) & 1) << 4) as u8;
            q[j] = ((qs[j] & 0x0F) | h0) as i8 - off;
            q[j + 16] = ((qs[j] >> 4) | h1) as i8 - off;
        }
    };
    let qh = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    match dt {
        DType::Q8_0 => {
            for (v, &x) in q.iter_mut().zip(&b[2..34]) {
                *v = x as i8;
            }
            (q, d, 0.0)
        }
        DType::Q4_0 => {
            nib(&b[2..18], &mut q, 0, 8);
            (q, d, 0.0)
        }
        DType::Q4_1 => {
            nib(&b[4..20], &mut q, 0, 0);
            (q, d, f16_at(b, 2))
        }
        DType::Q5_0 => {
            nib(&b[6..22], &mut q, qh(2), 16);
            (q, d, 0.0)
        }
        DType::Q5_1 => {
            nib(&b[8..24], &mut q, qh(4), 0);
            (q, d, f16_at(b, 2))
        }
        _ => unreachable!("arm vec_dot: {dt}"),
    }
}

/// Activation block: (scale, Q8_1 sum term `s` or 0, the 32 integers).
#[inline(always)]
pub(crate) fn act_block(q8_1: bool, b: &[u8]) -> (f32, f32, &[u8]) {
    if q8_1 {
        (f16_at(b, 0), f16_at(b, 2), &b[4..36])
    } else {
        (f16_at(b, 0), 0.0, &b[2..34])
    }
}

/// ggml's `hsum_float_8`.
#[inline(always)]
pub(crate) fn hsum_float_8(x: &[f32; 8]) -> f32 {
    let r = [x[4] + x[0], x[5] + x[1], x[6] + x[2], x[7] + x[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One output element: weight row `w` (whole blocks of `dt`) with activation row `act`
/// (`quant::vec_dot_type(dt)` blocks).
///
/// # Safety
/// The CPU runs `path` ([`IntPath::available`]).
pub unsafe fn vec_dot(path: IntPath, dt: DType, w: &[u8], act: &[u8]) -> f32 {
    match path {
        IntPath::Scalar => vec_dot_scalar(dt, w, act),
        #[cfg(target_arch = "aarch64")]
        IntPath::Neon => neon::vec_dot_neon(dt, w, act),
        #[cfg(target_arch = "aarch64")]
        IntPath::Dotprod | IntPath::I8mm => neon::vec_dot_dotprod(dt, w, act),
        #[cfg(not(target_arch = "aarch64"))]
        _ => unreachable!("{path:?} on a CPU that is not AArch64"),
    }
}

/// The eight quad sums of 32 elements (lane k = Σ a·b over elements 4k..4k+4), exact.
///
/// # Safety
/// The CPU runs `path`; `a` and `b` hold at least 32 elements.
pub unsafe fn quads(path: IntPath, a: &[i8], b: &[i8]) -> [i32; 8] {
    match path {
        IntPath::Scalar => quads_scalar(a, b),
        #[cfg(target_arch = "aarch64")]
        IntPath::Neon => neon::quads_neon(a, b),
        #[cfg(target_arch = "aarch64")]
        IntPath::Dotprod | IntPath::I8mm => neon::quads_sdot(a, b),
        #[cfg(not(target_arch = "aarch64"))]
        _ => unreachable!("{path:?} on a CPU that is not AArch64"),
    }
}

/// [`quads`] in plain Rust.
pub fn quads_scalar(a: &[i8], b: &[i8]) -> [i32; 8] {
    core::array::from_fn(|k| (4 * k..4 * k + 4).map(|e| a[e] as i32 * b[e] as i32).sum())
}

/// The scalar twin: portable, and what the SIMD paths are tested against (with
/// `quant::vec_dot`, the reference itself).
pub fn vec_dot_scalar(dt: DType, w: &[u8], act: &[u8]) -> f32 {
    let wb = dt.info().block_bytes as usize;
    let q8_1 = matches!(dt, DType::Q4_1 | DType::Q5_1);
    let ab = if q8_1 { 36 } else { 34 };
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (x, y) in w.chunks_exact(wb).zip(act.chunks_exact(ab)) {
        let (q, dx, m) = unpack(dt, x);
        let (dy, s, qa) = act_block(q8_1, y);
        let d = dx * dy;
        for k in 0..8 {
            let mut l = 0i32;
            for e in 4 * k..4 * k + 4 {
                l += q[e] as i32 * qa[e] as i8 as i32;
            }
            acc[k] = d.mul_add(l as f32, acc[k]);
        }
        if q8_1 {
            summs = m.mul_add(s, summs);
        }
    }
    hsum_float_8(&acc) + if q8_1 { summs } else { 0.0 }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use core::arch::aarch64::*;

    /// Lanes 0..3 of a 16-byte product by SMULL/SADDLP/ADDP.
    #[inline(always)]
    unsafe fn lanes_neon(a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
        let hi = vpaddlq_s16(vmull_s8(vget_high_s8(a), vget_high_s8(b)));
        vpaddq_s32(lo, hi)
    }

    /// The same lanes by one SDOT (stable Rust has no intrinsic for it).
    #[inline(always)]
    unsafe fn lanes_sdot(a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = vdupq_n_s32(0);
        core::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
        acc
    }

    #[inline(always)]
    unsafe fn body<const SDOT: bool>(dt: DType, w: &[u8], act: &[u8]) -> f32 {
        let wb = dt.info().block_bytes as usize;
        let q8_1 = matches!(dt, DType::Q4_1 | DType::Q5_1);
        let ab = if q8_1 { 36 } else { 34 };
        let (mut acc0, mut acc1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let mut summs = 0f32;
        for (x, y) in w.chunks_exact(wb).zip(act.chunks_exact(ab)) {
            let (dx, m) = (
                f16_at(x, 0),
                matches!(dt, DType::Q4_1 | DType::Q5_1).then(|| f16_at(x, 2)),
            );
            let (qa, qb) = match dt {
                DType::Q8_0 => (
                    vld1q_s8(x.as_ptr().add(2) as *const i8),
                    vld1q_s8(x.as_ptr().add(18) as *const i8),
                ),
                DType::Q4_0 | DType::Q4_1 => {
                    let off = if dt == DType::Q4_0 { 2 } else { 4 };
                    let v = vld1q_u8(x.as_ptr().add(off));
                    let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
                    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
                    if dt == DType::Q4_0 {
                        (vsubq_s8(lo, vdupq_n_s8(8)), vsubq_s8(hi, vdupq_n_s8(8)))
                    } else {
                        (lo, hi)
                    }
                }
                _ => {
                    let (q, _, _) = unpack(dt, x);
                    (vld1q_s8(q.as_ptr()), vld1q_s8(q.as_ptr().add(16)))
                }
            };
            let (dy, s, ya) = act_block(q8_1, y);
            let (ya0, ya1) = (
                vld1q_s8(ya.as_ptr() as *const i8),
                vld1q_s8(ya.as_ptr().add(16) as *const i8),
            );
            let (l0, l1) = if SDOT {
                (lanes_sdot(qa, ya0), lanes_sdot(qb, ya1))
            } else {
                (lanes_neon(qa, ya0), lanes_neon(qb, ya1))
            };
            let d = vdupq_n_f32(dx * dy);
            // acc + lanes * d with one rounding: `_mm256_fmadd_ps(d, q, acc)` per lane.
            acc0 = vfmaq_f32(acc0, vcvtq_f32_s32(l0), d);
            acc1 = vfmaq_f32(acc1, vcvtq_f32_s32(l1), d);
            if let Some(m) = m {
                summs = m.mul_add(s, summs);
            }
        }
        let mut lanes = [0f32; 8];
        vst1q_f32(lanes.as_mut_ptr(), acc0);
        vst1q_f32(lanes.as_mut_ptr().add(4), acc1);
        hsum_float_8(&lanes) + if q8_1 { summs } else { 0.0 }
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn quads_neon(a: &[i8], b: &[i8]) -> [i32; 8] {
        assert!(a.len() >= 32 && b.len() >= 32);
        let mut out = [0i32; 8];
        for h in 0..2 {
            let l = lanes_neon(
                vld1q_s8(a.as_ptr().add(16 * h)),
                vld1q_s8(b.as_ptr().add(16 * h)),
            );
            vst1q_s32(out.as_mut_ptr().add(4 * h), l);
        }
        out
    }

    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn quads_sdot(a: &[i8], b: &[i8]) -> [i32; 8] {
        assert!(a.len() >= 32 && b.len() >= 32);
        let mut out = [0i32; 8];
        for h in 0..2 {
            let l = lanes_sdot(
                vld1q_s8(a.as_ptr().add(16 * h)),
                vld1q_s8(b.as_ptr().add(16 * h)),
            );
            vst1q_s32(out.as_mut_ptr().add(4 * h), l);
        }
        out
    }

    #[target_feature(enable = "neon")]
    pub unsafe fn vec_dot_neon(dt: DType, w: &[u8], act: &[u8]) -> f32 {
        body::<false>(dt, w, act)
    }

    #[target_feature(enable = "neon,dotprod")]
    pub unsafe fn vec_dot_dotprod(dt: DType, w: &[u8], act: &[u8]) -> f32 {
        body::<true>(dt, w, act)
    }
}
