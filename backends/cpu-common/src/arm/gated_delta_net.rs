//! The delta rule row by row, in NEON registers. Each row of a head's state takes its decay,
//! its dot with k, its update and its dot with q in two passes: the same operations, in the
//! same order, as the reference's four passes over the block (a row's `d` depends on that row
//! alone), so the bits are the reference's, with each row read and written twice per token
//! instead of four times. Any head size and either gate form.

use super::dot::{add_lanes, reduce, zero};
use crate::ops::gated_delta_net::run_head;
use abi::TensorDesc;
use core::arch::aarch64::*;

/// Head `h` of sequence `s`, every token (`run_head`'s scratch: the block, then `2n` floats).
///
/// # Safety
/// As `run_head`: a checked gated_delta_net call on valid memory.
pub(crate) unsafe fn head(
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
) {
    run_head(ins, outs, h, s, scratch, |m, q, k, v, g, b, scale, e, y| {
        // The decay per key, in `e` (the step's `n` floats of scratch): the reference's
        // `expf` of each key's gate (KDA), or of the head's one gate for every key (the
        // product `x * e` is the same whether `e` comes from a register or from memory).
        let n = v.len();
        if g.len() == n && n > 1 {
            for (e, g) in e.iter_mut().zip(g) {
                *e = g.exp();
            }
        } else {
            e[..n].fill(g[0].exp());
        }
        // SAFETY: `m` holds `n` rows of `n` floats and q, k, e, y `n` each (`run_head`
        // slices them from the checked operands); NEON is AArch64's baseline.
        unsafe { token(m, q, k, v, &e[..n], b, scale, y) }
    });
}

/// One token on the block `m` (`n x n`, row `j` = value `j`): per row, `x *= e` and
/// `dot(x, k)`; `d = (v[j] - dot) * beta`; `x = fma(k, d, x)` and `dot(x, q)`; the output
/// `dot * scale`. The dots are `dot_vec_f32_as_built`: 16-lane FMA accumulators over the
/// 64-element steps, then the leftovers' rounded products added one by one in groups of 4,
/// the last `n mod 4` fused.
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
unsafe fn token(
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    e: &[f32],
    beta: f32,
    scale: f32,
    o: &mut [f32],
) {
    let n = v.len();
    debug_assert!(m.len() >= n * n && q.len() >= n && k.len() >= n && e.len() >= n);
    let (np, groups) = (n & !63, n & !3);
    let (kp, qp, ep) = (k.as_ptr(), q.as_ptr(), e.as_ptr());
    for j in 0..n {
        let r = m.as_mut_ptr().add(j * n);
        // The decay and the dot with k.
        let mut acc = zero();
        for step in (0..np).step_by(64) {
            for c in 0..16 {
                let at = step + 4 * c;
                let x = vmulq_f32(vld1q_f32(r.add(at)), vld1q_f32(ep.add(at)));
                vst1q_f32(r.add(at), x);
                acc[c] = vfmaq_f32(acc[c], x, vld1q_f32(kp.add(at)));
            }
        }
        let mut sumf = reduce(&acc);
        for at in (np..groups).step_by(4) {
            let x = vmulq_f32(vld1q_f32(r.add(at)), vld1q_f32(ep.add(at)));
            vst1q_f32(r.add(at), x);
            sumf = add_lanes(sumf, vmulq_f32(x, vld1q_f32(kp.add(at))));
        }
        for i in groups..n {
            let x = *r.add(i) * e[i];
            *r.add(i) = x;
            sumf = x.mul_add(k[i], sumf);
        }
        // The update and the dot with q.
        let dj = (v[j] - sumf) * beta;
        let d = vdupq_n_f32(dj);
        let mut acc = zero();
        for step in (0..np).step_by(64) {
            for c in 0..16 {
                let at = step + 4 * c;
                let x = vfmaq_f32(vld1q_f32(r.add(at)), vld1q_f32(kp.add(at)), d);
                vst1q_f32(r.add(at), x);
                acc[c] = vfmaq_f32(acc[c], x, vld1q_f32(qp.add(at)));
            }
        }
        let mut sumf = reduce(&acc);
        for at in (np..groups).step_by(4) {
            let x = vfmaq_f32(vld1q_f32(r.add(at)), vld1q_f32(kp.add(at)), d);
            vst1q_f32(r.add(at), x);
            sumf = add_lanes(sumf, vmulq_f32(x, vld1q_f32(qp.add(at))));
        }
        for i in groups..n {
            let x = k[i].mul_add(dj, *r.add(i));
            *r.add(i) = x;
            sumf = x.mul_add(q[i], sumf);
        }
        o[j] = sumf * scale;
    }
}
