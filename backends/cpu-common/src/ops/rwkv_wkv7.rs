//! rwkv_wkv7: each (head, sequence) runs its tokens in order on its own state block, the
//! reference's step (`rwkv_wkv7_token`: per state row the `a` dot, the fused update, the `r`
//! dot, as ggml's GGML_SIMD loop computes them).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// Head `h` of sequence `s`: its state block into `scratch`, `step` on every token (state
/// block, r, w, k, v, a, b, the token's output), the block out.
#[inline(always)]
pub(crate) unsafe fn run_head(
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
    mut step: impl FnMut(&mut [f32], &[f32], &[f32], &[f32], &[f32], &[f32], &[f32], &mut [f32]),
) {
    let state = &ins[6];
    let (o, new_state) = (&outs[0], &outs[1]);
    let n = ins[0].ne[0] as usize;
    let (m, y) = scratch.split_at_mut(n * n);
    // The whole block is read before any of it is written: new_state may be state.
    for i in 0..n {
        read_into(state, i as i64, h, s, &mut m[i * n..(i + 1) * n]);
    }
    for t in 0..ins[0].ne[2] {
        let [r, w, k, v, a, b] = [0, 1, 2, 3, 4, 5]
            .map(|x| core::slice::from_raw_parts(row_ptr(&ins[x], h, t, s) as *const f32, n));
        step(m, r, w, k, v, a, b, y);
        write_from(o, h, t, s, y);
    }
    for i in 0..n {
        write_from(new_state, i as i64, h, s, &m[i * n..(i + 1) * n]);
    }
}

/// [`run_head`] with the reference's step. The ISA frame vectorizes the fused update
/// (element-wise) and the dots' 16-lane accumulators (the reference's lanes) and makes
/// `mul_add` one FMA instruction (the portable variant rounds the same through libm's `fmaf`).
#[inline(always)]
pub(crate) unsafe fn rwkv_wkv7_head_body(
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    h: i64,
    s: i64,
    scratch: &mut [f32],
) {
    run_head(ins, outs, h, s, scratch, rwkv_wkv7_token);
}
isa_dispatch!(rwkv_wkv7_head =>
    rwkv_wkv7_head_body(ins: &[TensorDesc], outs: &[TensorDesc], h: i64, s: i64,
        scratch: &mut [f32]));

pub(crate) unsafe fn rwkv_wkv7(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) {
    let [n, heads, tokens, seqs] = inputs[0].ne;
    // One task per (head, sequence); they are independent.
    for_rows(host, heads * seqs, n * n * tokens.max(1), |x| {
        let mut scratch = vec![0f32; (n * n + n) as usize];
        let (h, s) = (x % heads, x / heads);
        match isa {
            // Each row in two passes, in NEON registers (`crate::arm::rwkv_wkv7`).
            #[cfg(neon)]
            Isa::Neon => crate::arm::rwkv_wkv7::head(inputs, outputs, h, s, &mut scratch),
            _ => rwkv_wkv7_head(isa, inputs, outputs, h, s, &mut scratch),
        }
    });
}
