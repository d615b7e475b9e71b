//! rwkv_wkv7's token step in NEON registers: per state row, the `a` dot, then the fused
//! update and the `r` dot in one pass over the new row; the reference's operations in its
//! order (`rwkv_wkv7_token`), so its bits, for any head size.

use super::dot::{reduce, zero};
use crate::ops::rwkv_wkv7::run_head;
use abi::TensorDesc;
use core::arch::aarch64::*;

/// Head `h` of sequence `s`, every token (`run_head`'s scratch: the block, then `n` floats).
///
/// # Safety
/// As `run_head`: a checked rwkv_wkv7 call on valid memory.
pub(crate) unsafe fn head(
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
) {
    run_head(ins, outs, h, s, scratch, |m, r, w, k, v, a, b, y| {
        // SAFETY: `m` holds `n` rows of `n` floats, the others `n` floats each (`run_head`
        // slices them from the checked operands); NEON is AArch64's baseline.
        unsafe { token(m, r, w, k, v, a, b, y) }
    });
}

/// One token on the block `m` (`n x n`, row `i` = output `i`): `sa = dot(a, m[i])`;
/// `m[i][j] = fma(sa, b[j], fma(m[i][j], w[j], v[i] * k[j]))` (the product rounded);
/// `o[i] = dot(m[i], r)`. The dots are `dot_vec_f32`: 16-lane FMA accumulators over the
/// 64-element steps, reduced in the reference's order, the leftovers fused one by one.
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
unsafe fn token(
    m: &mut [f32],
    r: &[f32],
    w: &[f32],
    k: &[f32],
    v: &[f32],
    a: &[f32],
    b: &[f32],
    o: &mut [f32],
) {
    let n = v.len();
    debug_assert!(m.len() >= n * n && [r, w, k, a, b].iter().all(|x| x.len() >= n));
    let np = n & !63;
    let (rp, wp, kp, ap, bp) = (r.as_ptr(), w.as_ptr(), k.as_ptr(), a.as_ptr(), b.as_ptr());
    for i in 0..n {
        let row = m.as_mut_ptr().add(i * n);
        let mut acc = zero();
        for step in (0..np).step_by(64) {
            for c in 0..16 {
                let at = step + 4 * c;
                acc[c] = vfmaq_f32(acc[c], vld1q_f32(ap.add(at)), vld1q_f32(row.add(at)));
            }
        }
        let mut sa = reduce(&acc);
        for j in np..n {
            sa = a[j].mul_add(*row.add(j), sa);
        }
        let (vi, sav) = (vdupq_n_f32(v[i]), vdupq_n_f32(sa));
        let mut acc = zero();
        for step in (0..np).step_by(64) {
            for c in 0..16 {
                let at = step + 4 * c;
                let kv = vmulq_f32(vi, vld1q_f32(kp.add(at)));
                let x = vfmaq_f32(kv, vld1q_f32(row.add(at)), vld1q_f32(wp.add(at)));
                let x = vfmaq_f32(x, sav, vld1q_f32(bp.add(at)));
                vst1q_f32(row.add(at), x);
                acc[c] = vfmaq_f32(acc[c], x, vld1q_f32(rp.add(at)));
            }
        }
        let mut sum = reduce(&acc);
        for j in np..n {
            let x = sa.mul_add(b[j], (*row.add(j)).mul_add(w[j], v[i] * k[j]));
            *row.add(j) = x;
            sum = x.mul_add(r[j], sum);
        }
        o[i] = sum;
    }
}
