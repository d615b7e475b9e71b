//! rwkv_wkv7, as `ggml_compute_forward_rwkv_wkv7_f32` (its GGML_SIMD path): each (head,
//! sequence) runs its tokens in order on its own state block.

use super::for_rows;
use crate::tensor::{read_row, write_row, Result};
use abi::{HostApi, TensorDesc};
use numerics::rwkv_wkv7_token_dispatch;

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let [r, w, k, v, a, b, state] = [0, 1, 2, 3, 4, 5, 6].map(|i| &inputs[i]);
    let (o, new_state) = (&outputs[0], &outputs[1]);
    let [n, heads, tokens, seqs] = r.ne;
    // One task per (head, sequence): ggml splits the heads across threads, and every row of
    // a head's state is its own recurrence.
    for_rows(host, heads * seqs, n * n * tokens.max(1), |x| {
        let (h, s) = (x % heads, x / heads);
        // The whole block is read before any of it is written: new_state may be state.
        let mut m: Vec<f32> = (0..n).flat_map(|i| read_row(state, i, h, s)).collect();
        let mut out = vec![0f32; n as usize];
        for t in 0..tokens {
            let [rv, wv, kv, vv, av, bv] = [r, w, k, v, a, b].map(|x| read_row(x, h, t, s));
            rwkv_wkv7_token_dispatch(&mut m, &rv, &wv, &kv, &vv, &av, &bv, &mut out);
            write_row(o, h, t, s, &out);
        }
        for (i, row) in m.chunks_exact(n as usize).enumerate() {
            write_row(new_state, i as i64, h, s, row);
        }
    });
    Ok(())
}
