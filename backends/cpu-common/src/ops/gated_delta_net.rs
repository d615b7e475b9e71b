//! gated_delta_net: each (head, sequence) runs its tokens in order on its own state block,
//! the reference's step (`gated_delta_net_token`: the decay, the delta rule with fused
//! updates, the output dots of `ggml_vec_dot_f32` as its binary computes them).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// Head `h` of sequence `s`: its state block into `scratch`, every token, the block out. The
/// ISA frame vectorizes the decay and the fused updates (element-wise) and makes `mul_add`
/// one FMA instruction; each dot stays one chain of the reference's order (the portable
/// variant rounds the same through libm's `fmaf`).
#[inline(always)]
pub(super) unsafe fn gated_delta_net_head_body(
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
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
        gated_delta_net_token(
            m,
            row(q, hk, t),
            row(k, hk, t),
            row(v, h, t),
            row(g, h, t),
            b,
            scale,
            d,
            y,
        );
        write_from(o, h, t, s, y);
    }
    for j in 0..n {
        write_from(new_state, j as i64, h, s, &m[j * n..(j + 1) * n]);
    }
}
isa_dispatch!(gated_delta_net_head =>
    gated_delta_net_head_body(ins: &[TensorDesc], outs: &[TensorDesc], h: i64, s: i64,
        scratch: &mut [f32]));

pub(super) unsafe fn gated_delta_net(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) {
    let [n, heads, tokens, seqs] = inputs[2].ne;
    // One task per (head, sequence), as ggml's rows `seq * H + head`; they are independent.
    for_rows(host, heads * seqs, n * n * tokens.max(1), |r| {
        let mut scratch = vec![0f32; (n * n + 2 * n) as usize];
        gated_delta_net_head(isa, inputs, outputs, r % heads, r / heads, &mut scratch);
    });
}
