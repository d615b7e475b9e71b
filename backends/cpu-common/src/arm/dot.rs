//! The pieces of `ggml_vec_dot_f32` (AVX-512 build) that the NEON kernels share: its four
//! 16-lane accumulators as sixteen 4-lane registers, and their reduction in the reference's
//! order ([`::numerics::reduce4x16`]).

use core::arch::aarch64::*;

/// The four 16-lane accumulators of a 64-element step: `acc[c]` holds elements `4c..4c + 4`
/// of each step, i.e. lanes `4(c % 4)..` of accumulator `c / 4`.
pub(crate) type Acc = [float32x4_t; 16];

/// Sixteen zeroed registers.
#[inline(always)]
pub(crate) unsafe fn zero() -> Acc {
    [vdupq_n_f32(0.0); 16]
}

/// `GGML_F32x16_REDUCE`: `(a0 + a2) + (a1 + a3)` lane-wise, then `_mm512_reduce_add_ps` as
/// GCC compiles it ([`::numerics::reduce16`]): the 8-lane halves, the 4-lane halves, lanes
/// (2, 3) onto (0, 1), lane 1 onto lane 0. Each step is one rounded add per lane, as there
/// (NEON's pairwise `vaddvq_f32` adds in another order, so it is not used).
#[inline(always)]
pub(crate) unsafe fn reduce(acc: &Acc) -> f32 {
    // Quarter q of the summed accumulator: lanes 4q..4q + 4.
    let s: [float32x4_t; 4] = core::array::from_fn(|q| {
        vaddq_f32(
            vaddq_f32(acc[q], acc[8 + q]),
            vaddq_f32(acc[4 + q], acc[12 + q]),
        )
    });
    let t4 = vaddq_f32(vaddq_f32(s[1], s[3]), vaddq_f32(s[0], s[2]));
    let t2 = vadd_f32(vget_low_f32(t4), vget_high_f32(t4));
    vpadds_f32(t2)
}

/// `sumf += p[l]` for the four lanes of `p` in order, each add rounded: a group of the
/// leftovers GCC vectorized (one `vmulps`, then the adds one by one).
#[inline(always)]
pub(crate) unsafe fn add_lanes(sumf: f32, p: float32x4_t) -> f32 {
    let s = sumf + vgetq_lane_f32::<0>(p);
    let s = s + vgetq_lane_f32::<1>(p);
    let s = s + vgetq_lane_f32::<2>(p);
    s + vgetq_lane_f32::<3>(p)
}
