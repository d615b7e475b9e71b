//! ssm_conv four channels at a time: each NEON lane runs one channel's chain
//! (`ssm_conv_dot`: rounded products added in order, then the last `taps mod 4` fused), so
//! the bits are the reference's; the lanes of a tap are gathered from the four windows and
//! weight rows (a channel's taps are contiguous, the channels are not).

use crate::ops::row_ptr;
use abi::TensorDesc;
use core::arch::aarch64::*;

/// Output row `(t, s)`: `y[i]` is the dot of `sx[t..t + taps, i, s]` with `c[.., i]`.
///
/// # Safety
/// A checked ssm_conv call on valid memory; `y` holds the output row's channels.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn row(sx: &TensorDesc, c: &TensorDesc, t: i64, s: i64, y: &mut [f32]) {
    let taps = c.ne[0] as usize;
    let rounded = taps & !3;
    let win = |i: usize| (row_ptr(sx, i as i64, s, 0) as *const f32).add(t as usize);
    let wgt = |i: usize| row_ptr(c, i as i64, 0, 0) as *const f32;
    let full = y.len() & !3;
    for i0 in (0..full).step_by(4) {
        let (ws, cs): ([*const f32; 4], [*const f32; 4]) = (
            core::array::from_fn(|l| win(i0 + l)),
            core::array::from_fn(|l| wgt(i0 + l)),
        );
        let lanes = |p: &[*const f32; 4], j: usize| {
            let v = vld1q_dup_f32(p[0].add(j));
            let v = vld1q_lane_f32::<1>(p[1].add(j), v);
            let v = vld1q_lane_f32::<2>(p[2].add(j), v);
            vld1q_lane_f32::<3>(p[3].add(j), v)
        };
        // From +0.0, as the reference's `0f32` (a first product of -0.0 gives +0.0).
        let mut acc = vdupq_n_f32(0.0);
        for j in 0..rounded {
            acc = vaddq_f32(acc, vmulq_f32(lanes(&ws, j), lanes(&cs, j)));
        }
        for j in rounded..taps {
            acc = vfmaq_f32(acc, lanes(&ws, j), lanes(&cs, j));
        }
        vst1q_f32(y.as_mut_ptr().add(i0), acc);
    }
    for i in full..y.len() {
        *y.get_unchecked_mut(i) = ::numerics::ssm_conv_dot(
            core::slice::from_raw_parts(win(i), taps),
            core::slice::from_raw_parts(wgt(i), taps),
        );
    }
}
