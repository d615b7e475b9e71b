//! Recurrent layers: graph ops whose result depends on state each sequence keeps from one step
//! to the next (see [`crate::kv`] on recurrent state). The state is per sequence, so each
//! sequence of a step runs on its own window; the ABI op computes, the executor keeps the
//! state.

use crate::error::Result;
use crate::exec::Exec;
use crate::tensor::Weight;
use abi::{DType, Op, OpParams, TensorDesc};

/// The `short_conv` node (LFM2's gated short convolution, llama.cpp's `build_shortconv_block`):
/// `bcx` `[3n, T]` (b, c and x, one block of rows each), `w` `[L, n]`, `out` `[n, T]`; recurrent
/// state `state` holds each sequence's last `L-1` values of `b*x` per channel, time innermost
/// (llama.cpp's conv state layout). The products are single IEEE multiplications, so the
/// host computes them; the convolution is the ABI's `ssm_conv`. `seqs`: per sequence of the
/// step, in token order, its state and its token count.
pub(crate) fn short_conv<'a>(
    ex: &Exec,
    seqs: impl Iterator<Item = (&'a mut [f32], usize)>,
    bcx: TensorDesc,
    w: &Weight,
    out: TensorDesc,
) -> Result<()> {
    let (n, t_all) = (out.ne[0] as usize, out.ne[1] as usize);
    let d = w.ne()[0] as usize - 1;
    // SAFETY: bcx is a contiguous f32 [3n, T] activation of this step and out a contiguous f32
    // [n, T] one (the plan gives them separate slots).
    let x = unsafe { std::slice::from_raw_parts(bcx.data as *const f32, 3 * n * t_all) };
    let y = unsafe { std::slice::from_raw_parts_mut(out.data as *mut f32, n * t_all) };
    let (mut win, mut conv) = (Vec::new(), Vec::new());
    let mut t0 = 0;
    for (st, ts) in seqs {
        let width = d + ts;
        // The window per channel: the kept state, then this step's b*x.
        win.clear();
        win.resize(width * n, 0f32);
        for (c, row) in win.chunks_exact_mut(width).enumerate() {
            row[..d].copy_from_slice(&st[c * d..(c + 1) * d]);
            for t in 0..ts {
                let col = &x[(t0 + t) * 3 * n..(t0 + t + 1) * 3 * n];
                row[d + t] = col[c] * col[2 * n + c];
            }
        }
        conv.clear();
        conv.resize(n * ts, 0f32);
        let wd = TensorDesc::contiguous(
            win.as_mut_ptr() as *mut u8,
            DType::F32,
            &[width as i64, n as i64, 1],
        );
        let od = TensorDesc::contiguous(
            conv.as_mut_ptr() as *mut u8,
            DType::F32,
            &[n as i64, ts as i64, 1],
        );
        ex.call_desc(Op::SsmConv, &[wd, w.desc], &[od], OpParams::default())?;
        for t in 0..ts {
            let col = &x[(t0 + t) * 3 * n..(t0 + t + 1) * 3 * n];
            for c in 0..n {
                y[(t0 + t) * n + c] = col[n + c] * conv[t * n + c];
            }
        }
        // The window's last L-1 columns carry over.
        for (c, row) in win.chunks_exact(width).enumerate() {
            st[c * d..(c + 1) * d].copy_from_slice(&row[ts..]);
        }
        t0 += ts;
    }
    Ok(())
}
