//! rope: normal and NeoX rotations from a per-position cos/sin cache (no YaRN).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;

/// Rotation of one head: `y0 = fma(x0, cos, -(x1*sin))`, `y1 = fma(x0, sin, x1*cos)`.
#[inline(always)]
pub(crate) unsafe fn rope_row_body(v: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
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

pub(crate) unsafe fn rope(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) {
    let (x, pos, out) = (inputs[0], inputs[1], outputs[0]);
    let r = abi::RopeAttrs::from_params(p);
    let (mode, n_dims) = (r.mode, r.n_dims as usize);
    let (freq_base, freq_scale, attn_factor) = (r.freq_base, r.freq_scale, r.attn_factor);
    let params = [freq_base, freq_scale, attn_factor].map(f32::to_bits);
    // Every layer of a step rotates its q and k at the same positions with the same
    // parameters: the cos/sin rows are made once per step and parameter set (Gemma 3's local
    // and global layers have two), the same values each time. libm's cosf and sinf per element
    // were ~1.3 us a token per call, 60 calls a SmolLM2 step.
    let mut memo = ROPE_MEMO.with(|m| m.take());
    let at = match memo
        .iter()
        .position(|(k, _)| k.is(params, n_dims, &pos, x.ne[2]))
    {
        Some(i) => i,
        None => {
            let key = RopeKey {
                params,
                n_dims,
                positions: (0..x.ne[2]).map(|t| read_i32(&pos, t)).collect(),
            };
            // ggml_rope_cache_init without YaRN (ext_factor == 0: checked).
            let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
            let caches = key
                .positions
                .iter()
                .map(|&p| {
                    let mut cache = vec![0f32; n_dims];
                    let mut theta = p as f32;
                    for i0 in (0..n_dims).step_by(2) {
                        let th = freq_scale * theta;
                        cache[i0] = th.cos() * attn_factor;
                        cache[i0 + 1] = th.sin() * attn_factor;
                        theta *= theta_scale;
                    }
                    cache
                })
                .collect();
            if memo.len() == ROPE_MEMO_SETS {
                memo.remove(0);
            }
            memo.push((key, caches));
            memo.len() - 1
        }
    };
    let caches = &memo[at].1;
    let neox = mode == abi::ROPE_NEOX;
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        // A head's row on the stack (a heap row each was a malloc and free per head and
        // token); rows longer than any head this engine has seen take the heap.
        let mut stack = [0f32; 512];
        let mut heap = Vec::new();
        let v = if k <= stack.len() {
            &mut stack[..k]
        } else {
            heap.resize(k, 0f32);
            &mut heap[..]
        };
        read_into(&x, i1, i2, i3, v);
        rope_row(isa, v, &caches[i2 as usize], n_dims, neox);
        write_from(&out, i1, i2, i3, v);
    });
    ROPE_MEMO.with(|m| m.set(memo));
}

/// What a call's cos/sin rows depend on: the frequency parameters (as bits), the rotated
/// dimensions and each token's position.
pub(crate) struct RopeKey {
    pub(crate) params: [u32; 3],
    pub(crate) n_dims: usize,
    pub(crate) positions: Vec<i32>,
}

impl RopeKey {
    /// Whether these are the rows of a call with `params`, `n_dims` and the `n` positions in
    /// `pos` (read in place: a call that finds its rows allocates nothing).
    ///
    /// # Safety
    /// `pos` is a valid I32 descriptor of at least `n` elements.
    unsafe fn is(&self, params: [u32; 3], n_dims: usize, pos: &TensorDesc, n: i64) -> bool {
        self.params == params
            && self.n_dims == n_dims
            && self.positions.len() == n as usize
            && (0..n).all(|t| self.positions[t as usize] == read_i32(pos, t))
    }
}

/// Parameter sets whose cos/sin rows a thread keeps.
pub(crate) const ROPE_MEMO_SETS: usize = 4;

thread_local! {
    /// The calling thread's latest cos/sin rows (one per token), oldest first, with what each
    /// was made for.
    #[allow(clippy::type_complexity)]
    static ROPE_MEMO: core::cell::Cell<Vec<(RopeKey, Vec<Vec<f32>>)>> =
        const { core::cell::Cell::new(Vec::new()) };
}
