//! gated_delta_net: each (head, sequence) runs its tokens in order on its own state block,
//! the reference's step (`gated_delta_net_token`: the decay, the delta rule with fused
//! updates, the output dots of `ggml_vec_dot_f32` as its binary computes them).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;
#[cfg(x86)]
use crate::x86::gated_delta_net::*;

/// Head `h` of sequence `s`: its state block into `scratch`, `step` on every token (state
/// block, q, k, v, g, beta, scale, `n` floats of scratch, the token's output), the block out.
#[inline(always)]
pub(crate) unsafe fn run_head(
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
    mut step: impl FnMut(&mut [f32], &[f32], &[f32], &[f32], &[f32], f32, f32, &mut [f32], &mut [f32]),
) {
    let (q, k, v, g, beta, state) = (&ins[0], &ins[1], &ins[2], &ins[3], &ins[4], &ins[5]);
    let (o, new_state) = (&outs[0], &outs[1]);
    let n = v.ne[0] as usize;
    let hk = h % q.ne[1];
    let scale = 1.0f32 / (n as f32).sqrt();
    let (m, rest) = scratch.split_at_mut(n * n);
    let (d, y) = rest.split_at_mut(n);
    // The whole block is read before any of it is written: new_state may be state.
    for j in 0..n {
        read_into(state, j as i64, h, s, &mut m[j * n..(j + 1) * n]);
    }
    let row = |t: &TensorDesc, i1: i64, i2: i64| {
        core::slice::from_raw_parts(row_ptr(t, i1, i2, s) as *const f32, t.ne[0] as usize)
    };
    for t in 0..v.ne[2] {
        let b = *(row_ptr(beta, h, t, s) as *const f32);
        let (qr, kr, vr, gr) = (row(q, hk, t), row(k, hk, t), row(v, h, t), row(g, h, t));
        step(m, qr, kr, vr, gr, b, scale, d, y);
        write_from(o, h, t, s, y);
    }
    for j in 0..n {
        write_from(new_state, j as i64, h, s, &m[j * n..(j + 1) * n]);
    }
}

/// [`run_head`] with the reference's step. The ISA frame vectorizes the decay and the fused
/// updates (element-wise) and makes `mul_add` one FMA instruction; each dot stays one chain
/// of the reference's order (the portable variant rounds the same through libm's `fmaf`).
#[inline(always)]
pub(crate) unsafe fn gated_delta_net_head_body(
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
) {
    run_head(ins, outs, h, s, scratch, gated_delta_net_token);
}
isa_dispatch!(gated_delta_net_head =>
    gated_delta_net_head_body(ins: &[TensorDesc], outs: &[TensorDesc], h: i64, s: i64,
        scratch: &mut [f32]));

pub(crate) unsafe fn gated_delta_net(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) {
    let [n, heads, tokens, seqs] = inputs[2].ne;
    // Whole 64-element steps and one gate per head: each row in one pass (`x86::head_rows`).
    #[cfg(x86)]
    let rows = n % 64 == 0 && inputs[3].ne[0] == 1 && matches!(isa, Isa::Avx512 | Isa::Avx2);
    #[cfg(not(x86))]
    let rows = false;
    // One task per (head, sequence), as ggml's rows `seq * H + head`; they are independent.
    for_rows(host, heads * seqs, n * n * tokens.max(1), |r| {
        let mut scratch = vec![0f32; (n * n + 2 * n) as usize];
        let (h, s) = (r % heads, r / heads);
        // Any head size, either gate: each row in two passes (`arm::gated_delta_net`).
        #[cfg(neon)]
        if isa == Isa::Neon {
            return crate::arm::gated_delta_net::head(inputs, outputs, h, s, &mut scratch);
        }
        if rows {
            #[cfg(x86)]
            head_rows(isa, inputs, outputs, h, s, &mut scratch);
        } else {
            gated_delta_net_head(isa, inputs, outputs, h, s, &mut scratch);
        }
    });
}
