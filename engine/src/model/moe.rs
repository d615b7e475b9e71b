//! Routed mixture-of-experts FFN (Qwen3-MoE; llama.cpp's `build_moe_ffn` with softmax gating
//! and SwiGLU experts): the router's softmax over all experts, the top `k` per token, their
//! weights optionally renormalized to sum to 1, each selected expert's SwiGLU FFN on the
//! tokens that chose it, and per token the weighted expert outputs summed in slot order.
//!
//! Routing is host code between backend calls: only the experts some token selected run, each
//! once per chunk on all of its tokens (a prompt's matmuls stay matmuls).

use super::{weight, HParams};
use crate::error::Result;
use crate::exec::Exec;
use crate::tensor::{Act, Weight};
use abi::GLU_SILU;
use loader::GgufFile;

pub struct Experts {
    /// Router `[n_embd, n_expert]`.
    pub gate_inp: Weight,
    /// Stacked experts: gate and up `[n_embd, n_ff_exp, n_expert]`, down
    /// `[n_ff_exp, n_embd, n_expert]`.
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

impl Experts {
    pub fn load(g: &GgufFile, hp: &HParams, il: usize) -> Result<Experts> {
        let (e, ff, nx) = (hp.n_embd as i64, hp.n_ff_exp as i64, hp.n_expert as i64);
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        Ok(Experts {
            gate_inp: weight(g, &n("ffn_gate_inp"), &[e, nx])?,
            gate: weight(g, &n("ffn_gate_exps"), &[e, ff, nx])?,
            up: weight(g, &n("ffn_up_exps"), &[e, ff, nx])?,
            down: weight(g, &n("ffn_down_exps"), &[ff, e, nx])?,
        })
    }

    /// The routed FFN of `x` (`[n_embd, T]`, already normalized).
    pub fn forward(&self, ex: &Exec, hp: &HParams, x: &Act) -> Result<Act> {
        let logits = ex.matmul(&self.gate_inp, x)?;
        let probs = ex.softmax(&logits, 1.0)?;
        let routes = route(&probs, hp.n_expert_used, hp.expert_weights_norm);
        let (e, t, k) = (x.ne[0] as usize, x.nrows(), hp.n_expert_used);
        // slot_out[(token * k + slot) * e ..]: the selected expert's output, already weighted.
        let mut slot_out = vec![0f32; t * k * e];
        for xi in 0..hp.n_expert {
            let users: Vec<(usize, usize)> = (0..t)
                .flat_map(|tok| (0..k).map(move |s| (tok, s)))
                .filter(|&(tok, s)| routes[tok * k + s].0 == xi)
                .collect();
            if users.is_empty() {
                continue;
            }
            let rows: Vec<usize> = users.iter().map(|&(tok, _)| tok).collect();
            let xe = x.select_rows(&rows);
            let g = ex.matmul(&self.gate.slice(xi), &xe)?;
            let u = ex.matmul(&self.up.slice(xi), &xe)?;
            let h = ex.glu(&g, &u, GLU_SILU)?;
            let d = ex.matmul(&self.down.slice(xi), &h)?;
            for (i, &(tok, s)) in users.iter().enumerate() {
                let w = routes[tok * k + s].1;
                let dst = &mut slot_out[(tok * k + s) * e..(tok * k + s + 1) * e];
                for (o, &v) in dst.iter_mut().zip(d.row(i)) {
                    *o = v * w;
                }
            }
        }
        // llama.cpp adds the weighted slots in order: ((s0 + s1) + s2) + ...
        let mut out = vec![0f32; t * e];
        for tok in 0..t {
            let o = &mut out[tok * e..(tok + 1) * e];
            o.copy_from_slice(&slot_out[tok * k * e..(tok * k + 1) * e]);
            for s in 1..k {
                let src = &slot_out[(tok * k + s) * e..(tok * k + s + 1) * e];
                for (a, &b) in o.iter_mut().zip(src) {
                    *a += b;
                }
            }
        }
        Ok(Act::from_vec(out, &[e as i64, t as i64]))
    }
}

/// Per token (a row of `probs`, `[n_expert, T]`), the `k` most probable experts, most
/// probable first (ties: lower index first), with their weights: the probabilities, divided
/// by their sum when `norm`.
pub fn route(probs: &Act, k: usize, norm: bool) -> Vec<(usize, f32)> {
    let mut out = Vec::with_capacity(probs.nrows() * k);
    for tok in 0..probs.nrows() {
        let p = probs.row(tok);
        let mut idx: Vec<usize> = (0..p.len()).collect();
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let top = &idx[..k];
        // ggml_sum_rows accumulates in double.
        let sum = top.iter().map(|&i| p[i] as f64).sum::<f64>() as f32;
        out.extend(
            top.iter()
                .map(|&i| (i, if norm { p[i] / sum } else { p[i] })),
        );
    }
    out
}
