//! Pieces every graph uses the same way.

use crate::error::Result;
use crate::exec::Exec;
use crate::kv::LayerCache;
use crate::tensor::Act;

/// Positions `pos0..pos0+n` as the i32 tensor ops take.
pub fn positions(pos0: usize, n: usize) -> Vec<i32> {
    (pos0..pos0 + n).map(|p| p as i32).collect()
}

/// Stores this chunk's keys and values in the layer's cache rows `pos`, then attends over the
/// cache. `q` is `[head_dim, n_head, T]`, `k`/`v` are `[head_dim, n_head_kv, T]`; returns
/// `[head_dim * n_head, T]`.
#[allow(clippy::too_many_arguments)]
pub fn cached_attention(
    ex: &Exec,
    cache: &mut LayerCache,
    q: &Act,
    k: Act,
    v: Act,
    pos: &[i32],
    window: usize,
    scale: f32,
) -> Result<Act> {
    let t = pos.len() as i64;
    let row = k.ne[0] * k.ne[1];
    ex.set_rows(&mut cache.k, &k.reshape(&[row, t]), pos)?;
    ex.set_rows(&mut cache.v, &v.reshape(&[row, t]), pos)?;
    let n_kv = *pos.iter().max().expect("non-empty chunk") as usize + 1;
    let out = ex.attention(q, &cache.k, &cache.v, pos, n_kv, window, scale, 0.0)?;
    Ok(out.reshape(&[q.ne[0] * q.ne[1], t]))
}

/// `down(act(gate(x)) * up(x))`.
pub fn gated_ffn(
    ex: &Exec,
    x: &Act,
    gate: &crate::tensor::Weight,
    up: &crate::tensor::Weight,
    down: &crate::tensor::Weight,
    act: i64,
) -> Result<Act> {
    let g = ex.matmul(gate, x)?;
    let u = ex.matmul(up, x)?;
    let h = ex.glu(&g, &u, act)?;
    ex.matmul(down, &h)
}
