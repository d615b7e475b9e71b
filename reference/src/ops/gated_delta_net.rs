//! gated_delta_net, as `ggml_compute_forward_gated_delta_net_f32` with one state slot: each
//! (head, sequence) runs its tokens in order on its own state block.

use super::for_rows;
use crate::tensor::{read_row, row_f32, write_row, Result};
use abi::{HostApi, TensorDesc};
use numerics::gated_delta_net_token_dispatch;

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let [q, k, v, g, beta, state] = [0, 1, 2, 3, 4, 5].map(|i| &inputs[i]);
    let (o, new_state) = (&outputs[0], &outputs[1]);
    let [n, heads, tokens, _] = v.ne;
    let qk_heads = q.ne[1];
    let scale = 1.0f32 / (n as f32).sqrt();
    // One task per (head, sequence), as ggml's rows `ir = seq * H + head`.
    for_rows(host, heads * v.ne[3], n * n * tokens.max(1), |r| {
        let (h, s) = (r % heads, r / heads);
        let hk = h % qk_heads;
        // The whole block is read before any of it is written: new_state may be state.
        let mut m: Vec<f32> = (0..n).flat_map(|j| read_row(state, j, h, s)).collect();
        let (mut d, mut out) = (vec![0f32; n as usize], vec![0f32; n as usize]);
        for t in 0..tokens {
            let (qv, kv, vv) = (
                read_row(q, hk, t, s),
                read_row(k, hk, t, s),
                read_row(v, h, t, s),
            );
            let gate = read_row(g, h, t, s);
            let b = row_f32(beta, h, t, s)[0];
            gated_delta_net_token_dispatch(
                &mut m, &qv, &kv, &vv, &gate, b, scale, &mut d, &mut out,
            );
            write_row(o, h, t, s, &out);
        }
        for (j, row) in m.chunks_exact(n as usize).enumerate() {
            write_row(new_state, j as i64, h, s, row);
        }
    });
    Ok(())
}
