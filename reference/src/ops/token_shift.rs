//! token_shift, as llama.cpp's RWKV graphs compute it: the saved column concatenated before the
//! step's columns, then `ggml_sub` of each column from the one before it.

use crate::tensor::{read_row, write_row, Result};
use abi::{HostApi, TensorDesc};

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(_host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (x, state) = (&inputs[0], &inputs[1]);
    let (out, new_state) = (&outputs[0], &outputs[1]);
    let [_, tokens, seqs, _] = x.ne;
    for s in 0..seqs {
        // The sequence's state is read before its new state is written: they may be one.
        let mut prev = read_row(state, s, 0, 0);
        for t in 0..tokens {
            let cur = read_row(x, t, s, 0);
            let y: Vec<f32> = prev.iter().zip(&cur).map(|(&p, &c)| p - c).collect();
            write_row(out, t, s, 0, &y);
            prev = cur;
        }
        write_row(new_state, s, 0, 0, &prev);
    }
    Ok(())
}
