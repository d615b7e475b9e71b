//! rope, as `ggml_compute_forward_rope_flt` with `ggml_rope_cache_init` / `rope_yarn`.

use super::for_rows;
use crate::tensor::{read_i32, read_row, split_row, write_row, Result};
use abi::{HostApi, OpParams, TensorDesc};

/// The YaRN / rope attributes (the op's, declared in `abi`).
pub use abi::RopeAttrs as RopeParams;
pub use numerics::rope::{corr_dims, rope_cache};

/// Rotates one head in place with a cache from [`rope_cache`]. As compiled by GCC:
/// `y0 = fma(x0, cos, -(x1*sin))`, `y1 = fma(x0, sin, x1*cos)`.
pub fn rotate(x: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    for i0 in (0..n_dims).step_by(2) {
        let (c, s) = (cache[i0], cache[i0 + 1]);
        let (a, b) = if neox {
            (i0 / 2, i0 / 2 + n_dims / 2)
        } else {
            (i0, i0 + 1)
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0.mul_add(c, -(x1 * s));
        x[b] = x0.mul_add(s, x1 * c);
    }
}

/// # Safety
/// Validated call on valid memory.
pub unsafe fn run(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    op: &OpParams,
) -> Result<()> {
    let (x, pos, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let p = RopeParams::from_params(op);
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    let corr = corr_dims(&p);
    let caches: Vec<Vec<f32>> = (0..x.ne[2])
        .map(|t| rope_cache(read_i32(pos, t), &p, corr, theta_scale))
        .collect();
    let neox = p.mode == abi::ROPE_NEOX;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(x, r);
        let mut v = read_row(x, i1, i2, i3);
        rotate(&mut v, &caches[i2 as usize], p.n_dims as usize, neox);
        write_row(out, i1, i2, i3, &v);
    });
    Ok(())
}
