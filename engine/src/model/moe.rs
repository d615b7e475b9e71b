//! Routed mixture-of-experts FFN (Qwen3-MoE; llama.cpp's `build_moe_ffn` with softmax gating
//! and SwiGLU experts): the router's softmax over all experts, the top `k` per token, their
//! weights optionally renormalized to sum to 1, each selected expert's FFN on the tokens that
//! chose it, and per token the weighted expert outputs summed in slot order.
//!
//! Routing is host code between backend calls (the graph's `moe_ffn` node): only the experts
//! some token selected run, each on all of its tokens of one sequence at once (a prompt's
//! matmuls stay matmuls; a sequence's chain never depends on the other sequences of a step).

use crate::error::Result;
use crate::exec::Exec;
use crate::graph::program::Src;
use crate::graph::run::{col_groups, matmul_grouped, ColGroup};
use crate::tensor::{Act, Weight};
use abi::{OpParams, TensorDesc};

/// The `moe_ffn` node: `x` `[n_embd, N]` in, `out` the same shape; `w` the router, gate, up
/// and down weights (stacked experts); `groups` the column groups of `x` by sequence.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    ex: &Exec,
    weights: &[Weight],
    w: &[Src],
    x: TensorDesc,
    out: TensorDesc,
    k: usize,
    norm: bool,
    act: i64,
    groups: &[ColGroup],
) -> Result<()> {
    let wt = |i: usize| match w[i] {
        Src::Weight(j) => weights[j],
        _ => unreachable!("compile checks moe weights"),
    };
    let (router, gate, up, down) = (wt(0), wt(1), wt(2), wt(3));
    let (e, t) = (x.ne[0] as usize, x.ne[1] as usize);
    let n_expert = router.ne()[1] as usize;
    // SAFETY: x is a contiguous f32 [e, t] activation of this step.
    let xs = unsafe { std::slice::from_raw_parts(x.data as *const f32, e * t) };
    let xa = Act::from_vec(xs.to_vec(), &[e as i64, t as i64]);
    let mut logits = Act::zeros(&[n_expert as i64, t as i64]);
    matmul_grouped(
        ex,
        &router,
        xa.desc(),
        logits.desc_mut(),
        OpParams::default(),
        Some(groups),
    )?;
    let probs = ex.softmax(&logits, 1.0)?;
    let routes = route(&probs, k, norm);
    // slot_out[(token * k + slot) * e ..]: the selected expert's output, already weighted.
    let mut slot_out = vec![0f32; t * k * e];
    let mut lens = Vec::new();
    let mut cg = Vec::new();
    for xi in 0..n_expert {
        let users: Vec<(usize, usize)> = (0..t)
            .flat_map(|tok| (0..k).map(move |s| (tok, s)))
            .filter(|&(tok, s)| routes[tok * k + s].0 == xi)
            .collect();
        if users.is_empty() {
            continue;
        }
        // Per sequence group: its users' rows form one call (a decoding token: one column).
        lens.clear();
        for g in groups {
            let n = users
                .iter()
                .filter(|&&(tok, _)| tok >= g.start && tok < g.start + g.len)
                .count();
            if g.chain == 1 {
                lens.extend(std::iter::repeat_n(1, n));
            } else {
                lens.push(n);
            }
        }
        col_groups(lens.iter().copied(), &mut cg);
        let rows: Vec<usize> = users.iter().map(|&(tok, _)| tok).collect();
        let xe = xa.select_rows(&rows);
        let m = rows.len() as i64;
        let ff = gate.ne()[1];
        let (mut g, mut u, mut d) = (
            Act::zeros(&[ff, m]),
            Act::zeros(&[ff, m]),
            Act::zeros(&[e as i64, m]),
        );
        let p0 = OpParams::default();
        matmul_grouped(ex, &gate.slice(xi), xe.desc(), g.desc_mut(), p0, Some(&cg))?;
        matmul_grouped(ex, &up.slice(xi), xe.desc(), u.desc_mut(), p0, Some(&cg))?;
        let h = ex.glu(&g, &u, act)?;
        matmul_grouped(ex, &down.slice(xi), h.desc(), d.desc_mut(), p0, Some(&cg))?;
        for (i, &(tok, s)) in users.iter().enumerate() {
            let wgt = routes[tok * k + s].1;
            let dst = &mut slot_out[(tok * k + s) * e..(tok * k + s + 1) * e];
            for (o, &v) in dst.iter_mut().zip(d.row(i)) {
                *o = v * wgt;
            }
        }
    }
    // llama.cpp adds the weighted slots in order: ((s0 + s1) + s2) + ...
    // SAFETY: out is a contiguous f32 [e, t] slot of this step.
    let o = unsafe { std::slice::from_raw_parts_mut(out.data as *mut f32, e * t) };
    for tok in 0..t {
        let dst = &mut o[tok * e..(tok + 1) * e];
        dst.copy_from_slice(&slot_out[tok * k * e..(tok * k + 1) * e]);
        for s in 1..k {
            let src = &slot_out[(tok * k + s) * e..(tok * k + s + 1) * e];
            for (a, &b) in dst.iter_mut().zip(src) {
                *a += b;
            }
        }
    }
    Ok(())
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
