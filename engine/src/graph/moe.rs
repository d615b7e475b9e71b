//! Routed mixture-of-experts FFN (Qwen3-MoE; llama.cpp's `build_moe_ffn` with softmax gating
//! and SwiGLU experts): the router's softmax over all experts, the top `k` per token, their
//! weights optionally renormalized to sum to 1, each selected expert's FFN on the tokens that
//! chose it, and per token the weighted expert outputs summed in slot order.
//!
//! Routing is host code between backend calls (the graph's `moe_ffn` node): only the experts
//! some token selected run, each on all of its tokens of the step in one call.
//!
//! Expert matmuls take the kernels of llama.cpp's `ggml_mul_mat_id`, not those of a plain
//! matmul: `vec_dot` (or the repack GEMV for weights in the repack layout) one token at a
//! time, never tinyBLAS or the repack GEMM, whatever the number of tokens; except that a
//! K-quant weight outside the repack layout goes to the tiled K-quant kernel when at least 8
//! rows of the batch chose that expert (`ggml_compute_forward_mul_mat_id_tiled`). Here the
//! count is per sequence (a sequence's tokens of this step that chose the expert), so that each
//! sequence computes what llama.cpp computes for it alone, whatever else shares the step.
//!
//! The shared expert of Qwen2-MoE (`shared_expert` node) is an ordinary gated FFN (ordinary
//! matmuls, grouped by sequence like the dense FFNs) scaled per token by a sigmoid gate, which
//! llama.cpp computes as `silu(g) / g` of the gate's logit `g`.

use super::matmul::{matmul_grouped, ColGroup};
use crate::error::Result;
use crate::exec::Exec;
use crate::experts::{ExpertCache, ExpertStats, Retired};
use std::collections::HashMap;

/// The MoE runner's state where routed experts are read from the file into a bounded cache
/// (without it, they are read from the memory map): the cache, and each MoE node's cache
/// layer by its gate weight's index in the program.
pub struct Experts {
    cache: ExpertCache,
    layers: HashMap<usize, usize>,
}

impl Experts {
    pub fn new(cache: ExpertCache, layers: HashMap<usize, usize>) -> Experts {
        Experts { cache, layers }
    }

    /// The cache's counters.
    pub fn stats(&self) -> ExpertStats {
        self.cache.stats()
    }

    /// Where the cache posts the slots that changed tenant (see [`Exec::watch_slots`]).
    pub fn retired(&self) -> Retired {
        self.cache.retired()
    }
}
use crate::graph::program::Src;
use crate::tensor::{Act, Weight};
use abi::{OpParams, TensorDesc};

/// How a `moe_ffn` node routes: `k` experts a token, their weights renormalized when `norm`,
/// the router's probabilities by softmax or (`sigmoid`) elementwise, chosen on the
/// probabilities plus a selection bias (the node's fifth weight) when `biased`; `act` the
/// experts' activation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Routing {
    pub k: usize,
    pub norm: bool,
    pub act: i64,
    pub sigmoid: bool,
    pub biased: bool,
}

/// The `moe_ffn` node: `x` `[n_embd, N]` in, `out` the same shape; `w` the router, gate, up
/// and down weights (stacked experts), then the selection bias if any; `groups` the column
/// groups of `x` by sequence.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    ex: &Exec,
    experts: Option<&mut Experts>,
    weights: &[Weight],
    w: &[Src],
    x: TensorDesc,
    out: TensorDesc,
    r: Routing,
    groups: &[ColGroup],
) -> Result<()> {
    let Routing { k, norm, act, .. } = r;
    let [router, gate, up, down] = four_weights(weights, w);
    let (e, t) = (x.ne[0] as usize, x.ne[1] as usize);
    let n_expert = router.ne()[1] as usize;
    // SAFETY: x is a contiguous f32 [e, t] activation of this step.
    let xs = unsafe { std::slice::from_raw_parts(x.data as *const f32, e * t) };
    let xa = Act::from_vec(xs.to_vec(), &[e as i64, t as i64]);
    let logits = router_logits(ex, &router, &xa, groups)?;
    let probs = match r.sigmoid {
        false => ex.softmax(&logits, 1.0)?,
        // ggml_sigmoid: 1 / (1 + expf(-x)), elementwise with libm's expf.
        true => Act::from_vec(
            logits
                .data
                .iter()
                .map(|&v| 1.0 / (1.0 + (-v).exp()))
                .collect(),
            &logits.ne[..2],
        ),
    };
    let bias = match (r.biased, w.get(4)) {
        (true, Some(&Src::Weight(j))) => {
            // SAFETY: compile checks the selection bias is an f32 weight of n_expert values.
            Some(unsafe {
                std::slice::from_raw_parts(weights[j].desc.data as *const f32, n_expert)
            })
        }
        _ => None,
    };
    let routes = route(&probs, k, norm, bias);
    // slot_out[(token * k + slot) * e ..]: the selected expert's output, already weighted.
    let mut slot_out = vec![0f32; t * k * e];
    // Each expert's users (token, slot), in token order: one pass over the routes.
    let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_expert];
    for tok in 0..t {
        for s in 0..k {
            users[routes[tok * k + s].0].push((tok, s));
        }
    }
    let need: Vec<usize> = (0..n_expert).filter(|&xi| !users[xi].is_empty()).collect();
    // With an expert cache: the layer's experts in waves of what the cache holds at once.
    let layer = match (w[1], experts) {
        (Src::Weight(j), Some(x)) => x.layers.get(&j).map(|&l| (l, &mut x.cache)),
        _ => None,
    };
    let decode = groups.iter().all(|g| g.chain == 1 || g.len == 1);
    let mut run_expert = |xi: usize, ws: &[Weight; 3]| {
        expert(
            ex,
            &xa,
            ws,
            &users[xi],
            &routes,
            k,
            act,
            groups,
            &mut slot_out,
        )
    };
    let Some((l, c)) = layer else {
        for &xi in &need {
            run_expert(xi, &[gate.slice(xi), up.slice(xi), down.slice(xi)])?;
        }
        return finish(out, &slot_out, e, t, k);
    };
    let t_layer = std::time::Instant::now();
    let mut done = 0;
    while done < need.len() {
        if done == 0 {
            c.begin_layer(l, decode);
        }
        let wave = c.plan(l, &need[done..])?;
        if done == 0 {
            // With this layer's reads queued, guess the next layer's route.
            predict_next(ex, c, weights, l, &xa, k, groups)?;
        }
        // The experts already here first, then each missing one once its read is done.
        let n = wave.items.len();
        let ready: Vec<bool> = (0..n).map(|i| c.ready(&wave, i)).collect();
        let order = (0..n)
            .filter(|&i| ready[i])
            .chain((0..n).filter(|&i| !ready[i]));
        let mut r = Ok(());
        for i in order {
            r = c
                .wait(&wave, i)
                .and_then(|()| run_expert(wave.items[i].expert, &wave.items[i].weights));
            if r.is_err() {
                break;
            }
        }
        c.release();
        r?;
        done += n;
    }
    crate::trace::span(
        "layer",
        || format!("moe L{l}"),
        t_layer,
        // The route (the experts the step's tokens chose, in expert order) lets a trace be
        // replayed against other cache policies (scripts/moe_cache_bound.py).
        || {
            let route: Vec<String> = need.iter().map(|x| x.to_string()).collect();
            format!(
                "\"tokens\":{t},\"decode\":{decode},\"experts\":{},\"route\":[{}]",
                need.len(),
                route.join(",")
            )
        },
    );
    finish(out, &slot_out, e, t, k)
}

/// Next-layer prediction: cache layer `l + 1`'s router on this layer's FFN input `xa`; per
/// token its `k + 1` best experts, ranked, go to the cache's prefetch (when on).
fn predict_next(
    ex: &Exec,
    c: &mut ExpertCache,
    weights: &[Weight],
    l: usize,
    xa: &Act,
    k: usize,
    groups: &[ColGroup],
) -> Result<()> {
    let next = (l + 1 < c.n_layers() && c.prefetching()).then(|| c.router(l + 1));
    let Some(j) = next else { return Ok(()) };
    let t0 = std::time::Instant::now();
    let logits = router_logits(ex, &weights[j], xa, groups)?;
    // (expert, best rank over the tokens), best ranks first (ranked on the logits: the
    // softmax keeps their order).
    let n_expert = logits.ne[0] as usize;
    let ranks = (k + 1).min(n_expert);
    let mut best = vec![usize::MAX; n_expert];
    for tok in 0..logits.nrows() {
        for (r, &x) in ranked(logits.row(tok))[..ranks].iter().enumerate() {
            best[x] = best[x].min(r);
        }
    }
    let mut preds: Vec<(usize, usize)> = (0..best.len())
        .filter(|&x| best[x] != usize::MAX)
        .map(|x| (x, best[x]))
        .collect();
    preds.sort_by_key(|&(x, r)| (r, x));
    c.prefetch(l + 1, &preds);
    crate::trace::span(
        "predict",
        || format!("predict L{}", l + 1),
        t0,
        || format!("\"experts\":{}", preds.len()),
    );
    Ok(())
}

/// `out` per token: the weighted slots added in order, as llama.cpp does: ((s0 + s1) + s2) + ...
fn finish(out: TensorDesc, slot_out: &[f32], e: usize, t: usize, k: usize) -> Result<()> {
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

/// One expert (`ws`: its gate, up and down) on its `users` (token, slot) of the step: their
/// weighted outputs into `slot_out`.
#[allow(clippy::too_many_arguments)]
fn expert(
    ex: &Exec,
    xa: &Act,
    ws: &[Weight; 3],
    users: &[(usize, usize)],
    routes: &[(usize, f32)],
    k: usize,
    act: i64,
    groups: &[ColGroup],
    slot_out: &mut [f32],
) -> Result<()> {
    let e = xa.ne[0] as usize;
    // Its users per sequence (users are in token order, so each sequence's are adjacent).
    let per_seq: Vec<usize> = groups
        .iter()
        .flat_map(|g| {
            let n = users
                .iter()
                .filter(|&&(tok, _)| tok >= g.start && tok < g.start + g.len)
                .count();
            let each = if g.chain == 1 { vec![1; n] } else { vec![n] };
            each.into_iter()
        })
        .collect();
    let rows: Vec<usize> = users.iter().map(|&(tok, _)| tok).collect();
    let xe = xa.select_rows(&rows);
    let m = rows.len() as i64;
    let [gw, uw, dw] = ws;
    let ff = gw.ne()[1];
    let (mut g, mut u, mut d) = (
        Act::zeros(&[ff, m]),
        Act::zeros(&[ff, m]),
        Act::zeros(&[e as i64, m]),
    );
    let p0 = OpParams::default();
    matmul_grouped(
        ex,
        gw,
        xe.desc(),
        g.desc_mut(),
        p0,
        Some(&id_groups(gw, &per_seq)),
    )?;
    matmul_grouped(
        ex,
        uw,
        xe.desc(),
        u.desc_mut(),
        p0,
        Some(&id_groups(uw, &per_seq)),
    )?;
    let h = ex.glu(&g, &u, act)?;
    matmul_grouped(
        ex,
        dw,
        h.desc(),
        d.desc_mut(),
        p0,
        Some(&id_groups(dw, &per_seq)),
    )?;
    for (i, &(tok, s)) in users.iter().enumerate() {
        let wgt = routes[tok * k + s].1;
        let dst = &mut slot_out[(tok * k + s) * e..(tok * k + s + 1) * e];
        for (o, &v) in dst.iter_mut().zip(d.row(i)) {
            *o = v * wgt;
        }
    }
    Ok(())
}

/// The calls of one expert's matmul over its users, `per_seq[i]` of them from the i-th
/// sequence (in order): `ggml_mul_mat_id`'s kernels (see the module comment). A sequence's
/// users go to the tiled kernel together (one call of their count: mat_mul picks Tiled for
/// K-quants at 8 columns or more) when the weight is a tiled K-quant; otherwise every column
/// is its own one-column chain, all in one call.
fn id_groups(w: &Weight, per_seq: &[usize]) -> Vec<ColGroup> {
    let [k, n, ..] = w.ne();
    let tiled = |m: usize| {
        m >= 8
            && quant::matmul_kernel(w.dtype(), k as usize, n as usize, 8, 0) == quant::Kernel::Tiled
    };
    let mut out: Vec<ColGroup> = Vec::new();
    let mut start = 0;
    for &m in per_seq.iter().filter(|&&m| m > 0) {
        if tiled(m) {
            out.push(ColGroup {
                start,
                len: m,
                chain: 0,
            });
        } else {
            match out.last_mut() {
                Some(g) if g.chain == 1 => g.len += m,
                _ => out.push(ColGroup {
                    start,
                    len: m,
                    chain: 1,
                }),
            }
        }
        start += m;
    }
    out
}

/// The four weight operands of an FFN node (the program's compile checked them).
fn four_weights(weights: &[Weight], w: &[Src]) -> [Weight; 4] {
    std::array::from_fn(|i| match w[i] {
        Src::Weight(j) => weights[j],
        _ => unreachable!("compile checks FFN node weights"),
    })
}

/// The `shared_expert` node: per token `sigmoid(gate_inp . x) * down(act(gate x) * up x)`,
/// `x` `[n_embd, N]`, `w` the gate's input vector `[n_embd]` and the gate, up and down weights.
pub(crate) fn shared(
    ex: &Exec,
    weights: &[Weight],
    w: &[Src],
    x: TensorDesc,
    out: TensorDesc,
    act: i64,
    sigmoid: bool,
    groups: &[ColGroup],
) -> Result<()> {
    let [gate_inp, gate, up, down] = four_weights(weights, w);
    let (e, t) = (x.ne[0], x.ne[1]);
    let ff = gate.ne()[1];
    let p0 = OpParams::default();
    let mut logit = Act::zeros(&[1, t]);
    matmul_grouped(ex, &gate_inp, x, logit.desc_mut(), p0, Some(groups))?;
    let (mut g, mut u) = (Act::zeros(&[ff, t]), Act::zeros(&[ff, t]));
    matmul_grouped(ex, &gate, x, g.desc_mut(), p0, Some(groups))?;
    matmul_grouped(ex, &up, x, u.desc_mut(), p0, Some(groups))?;
    let h = ex.glu(&g, &u, act)?;
    matmul_grouped(ex, &down, h.desc(), out, p0, Some(groups))?;
    // SAFETY: out is a contiguous f32 [e, t] slot of this step, written just above.
    let o = unsafe { std::slice::from_raw_parts_mut(out.data as *mut f32, (e * t) as usize) };
    for (tok, row) in o.chunks_exact_mut(e as usize).enumerate() {
        let l = logit.row(tok)[0];
        let s = match sigmoid {
            true => 1.0 / (1.0 + (-l).exp()),
            // ggml_silu on one element is its scalar form, then ggml_div.
            false => numerics::silu_scalar(l) / l,
        };
        for v in row.iter_mut() {
            *v *= s;
        }
    }
    Ok(())
}

/// The router's logits `[n_expert, T]` of `xa` `[n_embd, T]`.
fn router_logits(ex: &Exec, router: &Weight, xa: &Act, groups: &[ColGroup]) -> Result<Act> {
    let mut logits = Act::zeros(&[router.ne()[1], xa.ne[1]]);
    matmul_grouped(
        ex,
        router,
        xa.desc(),
        logits.desc_mut(),
        OpParams::default(),
        Some(groups),
    )?;
    Ok(logits)
}

/// The indices of `p`, largest value first (ties: lower index first).
fn ranked(p: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    idx
}

/// Per token (a row of `probs`, `[n_expert, T]`), the `k` most probable experts (by
/// probability plus `bias` where given), most probable first (ties: lower index first), with
/// their weights: the probabilities, divided by their sum when `norm` (llama.cpp clamps the
/// sum at F16's smallest normal, 6.1e-5).
pub fn route(probs: &Act, k: usize, norm: bool, bias: Option<&[f32]>) -> Vec<(usize, f32)> {
    let mut out = Vec::with_capacity(probs.nrows() * k);
    let mut sel = Vec::new();
    for tok in 0..probs.nrows() {
        let p = probs.row(tok);
        let idx = match bias {
            None => ranked(p),
            Some(b) => {
                sel.clear();
                sel.extend(p.iter().zip(b).map(|(x, y)| x + y));
                ranked(&sel)
            }
        };
        let top = &idx[..k];
        // ggml_sum_rows accumulates in double.
        let sum = top.iter().map(|&i| p[i] as f64).sum::<f64>() as f32;
        let sum = sum.max(6.103_515_6e-5);
        out.extend(
            top.iter()
                .map(|&i| (i, if norm { p[i] / sum } else { p[i] })),
        );
    }
    out
}
