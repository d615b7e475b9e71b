//! rope: normal and NeoX rotations from a per-position cos/sin cache (no YaRN).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// Rotation of one head: `y0 = fma(x0, cos, -(x1*sin))`, `y1 = fma(x0, sin, x1*cos)`.
#[inline(always)]
pub(super) unsafe fn rope_row_body(v: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    for i0 in (0..n_dims).step_by(2) {
        let (c, s) = (cache[i0], cache[i0 + 1]);
        let (a, b) = if neox {
            (i0 / 2, i0 / 2 + n_dims / 2)
        } else {
            (i0, i0 + 1)
        };
        let (x0, x1) = (v[a], v[b]);
        v[a] = x0.mul_add(c, -(x1 * s));
        v[b] = x0.mul_add(s, x1 * c);
    }
}
isa_dispatch!(rope_row => rope_row_body(v: &mut [f32], cache: &[f32], n_dims: usize, neox: bool));

pub(super) unsafe fn rope(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) {
    let (x, pos, out) = (inputs[0], inputs[1], outputs[0]);
    let (mode, n_dims) = (p.i[0], p.i[1] as usize);
    let (freq_base, freq_scale, attn_factor) = (p.f[0], p.f[1], p.f[3]);
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    // ggml_rope_cache_init without YaRN (ext_factor == 0: checked).
    let caches: Vec<Vec<f32>> = (0..x.ne[2])
        .map(|t| {
            let mut cache = vec![0f32; n_dims];
            let mut theta = read_i32(&pos, t) as f32;
            for i0 in (0..n_dims).step_by(2) {
                let th = freq_scale * theta;
                cache[i0] = th.cos() * attn_factor;
                cache[i0 + 1] = th.sin() * attn_factor;
                theta *= theta_scale;
            }
            cache
        })
        .collect();
    let neox = mode == abi::ROPE_NEOX;
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        rope_row(isa, &mut v, &caches[i2 as usize], n_dims, neox);
        write_from(&out, i1, i2, i3, &v);
    });
}
