//! ssm_conv, as `ggml_compute_forward_ssm_conv_f32`: each channel's taps slid over its window.

use super::for_rows;
use crate::tensor::{read_row, row_f32, split_row, write_row, Result};
use abi::{HostApi, TensorDesc};
use numerics::ssm_conv_dot;

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<()> {
    let (sx, c, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let (taps, n) = (c.ne[0] as usize, c.ne[1]);
    let weights: Vec<Vec<f32>> = (0..n).map(|i| read_row(c, i, 0, 0)).collect();
    // One output row per (token, sequence): every channel's window at that token.
    for_rows(host, out.nrows(), n * taps as i64, |r| {
        let (t, s, _) = split_row(out, r);
        let mut win = vec![0f32; taps];
        let y: Vec<f32> = (0..n)
            .map(|i| {
                let row = row_f32(sx, i, s, 0);
                for (j, w) in win.iter_mut().enumerate() {
                    *w = row[t as usize + j];
                }
                ssm_conv_dot(&win, &weights[i as usize])
            })
            .collect();
        write_row(out, t, s, 0, &y);
    });
    Ok(())
}
