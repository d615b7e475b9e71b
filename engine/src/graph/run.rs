//! The executor: runs a [`Program`] for one step of tokens from one or more sequences, in the
//! arena of its [`Plan`], calling every op through the backends' tables.
//!
//! A step's tokens are grouped by sequence, sequence after sequence. Row-wise ops see all of
//! them at once. A matmul's columns are split so that each sequence's columns get the kernel
//! chain they would get if that sequence ran alone (batch invariance): a prompt chunk is its
//! own call; the single tokens of decoding sequences share one call whose columns each take
//! the one-column chain (`chain_cols = 1`), so one pass over the weights serves them all.
//! Attention runs per sequence over that sequence's cache.

use super::matmul::{col_groups, matmul_grouped, ColGroup};
use super::plan::Plan;
use super::program::{Kind, Program, Src};
use crate::error::{EngineError, Result};
use crate::exec::Exec;
use crate::kv::{KvCache, KvPool, KV_PAGE};
use abi::{DType, Op, OpParams, TensorDesc};

/// One sequence's part of a step: `n_tokens` consecutive tokens of the step, appended to its
/// cache at positions `kv.n_past..`; the last `n_out` of them produce logits.
pub struct SeqStep<'a> {
    pub kv: &'a mut KvCache,
    pub n_tokens: usize,
    pub n_out: usize,
}

/// A 1-D I32 tensor over `v` (step inputs, cache rows).
fn i32d(v: &[i32]) -> TensorDesc {
    TensorDesc::contiguous(v.as_ptr() as *mut u8, DType::I32, &[v.len() as i64])
}

/// Runs a program's steps: the plan and the per-step scratch, sized at creation for steps of
/// up to `max_t` tokens and `max_o` logit rows. The plan's arena is the executor's
/// ([`Exec::arena`]: a backend's buffer where one lends host memory).
pub struct Runner {
    plan: Plan,
    /// Per node: its shape in the current step.
    shapes: Vec<[i64; 4]>,
    tokens: Vec<i32>,
    positions: Vec<i32>,
    /// Non-causal attention's query positions: each token at its sequence's last position,
    /// so that it sees every row of the sequence.
    attn_pos: Vec<i32>,
    /// Every token's type (segment) id: zeros.
    token_types: Vec<i32>,
    /// The pool row each token's keys and values go to.
    kv_rows: Vec<i32>,
    /// Those rows per KV head, as set_rows indices (`kv::head_rows`), made per attention call
    /// into this one buffer (a decode step allocates nothing).
    head_rows: std::cell::RefCell<Vec<i32>>,
    out_ids: Vec<i32>,
    tok_groups: Vec<ColGroup>,
    out_groups: Vec<ColGroup>,
    /// Attention of all sequences in one call (ABI 1.4): their block tables as columns of
    /// one width, and (first query, query count, n_kv) of each.
    seq_tables: Vec<i32>,
    seq_info: Vec<i32>,
    /// Per product node: the weight of the next product (posted for warming before the node
    /// runs, see [`Exec::warm_weight`]).
    warm_next: Vec<Option<usize>>,
    /// The arena's buffer this step (0: host memory; else device memory, where node tensors
    /// carry offsets).
    arena_buf: u64,
    /// The logits read back from device memory.
    logits: Vec<f32>,
}

impl Runner {
    pub fn new(p: &Program, max_t: usize, max_o: usize) -> Runner {
        // Programs are checked for steps of up to MAX_STEP tokens.
        let cap = super::program::MAX_STEP as usize;
        let plan = Plan::new(p, max_t.clamp(1, cap), max_o.clamp(1, cap));
        Runner {
            shapes: vec![[0; 4]; p.nodes.len()],
            tokens: Vec::with_capacity(plan.max_t),
            positions: Vec::with_capacity(plan.max_t),
            attn_pos: Vec::new(),
            token_types: Vec::new(),
            kv_rows: Vec::with_capacity(plan.max_t),
            head_rows: std::cell::RefCell::new(Vec::with_capacity(plan.max_t * 8)),
            out_ids: Vec::with_capacity(plan.max_o),
            tok_groups: Vec::with_capacity(64),
            out_groups: Vec::with_capacity(64),
            seq_tables: Vec::new(),
            seq_info: Vec::new(),
            warm_next: warm_targets(p),
            arena_buf: 0,
            logits: Vec::new(),
            plan,
        }
    }

    pub fn max_tokens(&self) -> usize {
        self.plan.max_t
    }
    pub fn max_outputs(&self) -> usize {
        self.plan.max_o
    }
    pub fn arena_bytes(&self) -> usize {
        self.plan.arena_bytes
    }

    /// Runs one step and returns the logits, `n_vocab` values per output row, rows in the
    /// order of `seqs` (each sequence's last `n_out` tokens). Advances each cache, whose pages
    /// live in `pool`.
    pub fn step(
        &mut self,
        p: &Program,
        ex: &Exec,
        pool: &mut KvPool,
        mut experts: Option<&mut super::moe::Experts>,
        tokens: &[u32],
        seqs: &mut [SeqStep],
    ) -> Result<&[f32]> {
        let t = tokens.len();
        let n_seq_tokens: usize = seqs.iter().map(|s| s.n_tokens).sum();
        let o: usize = seqs.iter().map(|s| s.n_out).sum();
        if n_seq_tokens != t {
            return Err(EngineError::Invalid(format!(
                "step of {t} tokens, but its sequences account for {n_seq_tokens}"
            )));
        }
        if t > self.plan.max_t || o > self.plan.max_o {
            return Err(EngineError::Invalid(format!(
                "step of {t} tokens / {o} outputs exceeds this runner's {} / {}",
                self.plan.max_t, self.plan.max_o
            )));
        }
        let n_vocab = match p.file.consts.get("n_vocab") {
            Some(&v) if v > 0 => v as u32,
            _ => p.nodes[p.output].shape[0].c as u32,
        };
        let n_row = p.nodes[p.output].shape[0].c as usize;
        if let Some(&bad) = tokens.iter().find(|&&x| x >= n_vocab) {
            return Err(EngineError::Invalid(format!(
                "token id {bad} outside the vocabulary of {n_vocab}"
            )));
        }
        if pool.layers.len() != p.kv_layers.len() {
            return Err(EngineError::Invalid("cache built for another graph".into()));
        }
        for s in seqs.iter() {
            if s.n_out > s.n_tokens {
                return Err(EngineError::Invalid(format!(
                    "{} outputs asked of {} tokens",
                    s.n_out, s.n_tokens
                )));
            }
            if s.kv.n_past + s.n_tokens > s.kv.n_ctx {
                return Err(EngineError::ContextFull {
                    need: s.kv.n_past + s.n_tokens,
                    n_ctx: s.kv.n_ctx,
                });
            }
        }
        // A table looked up by position has a row for each position a sequence may reach.
        if let Some(max) = p.max_positions {
            if let Some(s) = seqs.iter().find(|s| s.kv.n_past + s.n_tokens > max) {
                return Err(EngineError::Invalid(format!(
                    "an input of {} tokens is longer than this model's {max} positions",
                    s.kv.n_past + s.n_tokens
                )));
            }
        }
        let non_causal = p.non_causal;
        if let Some(s) = seqs.iter().find(|s| non_causal && s.kv.n_past > 0) {
            return Err(EngineError::Invalid(format!(
                "this model's attention is not causal: an input must come whole in one step, and a sequence already holds {} tokens",
                s.kv.n_past
            )));
        }
        for s in seqs.iter_mut() {
            pool.prepare(s.kv, s.n_tokens)?;
        }
        self.tokens.clear();
        self.tokens.extend(tokens.iter().map(|&x| x as i32));
        self.positions.clear();
        self.kv_rows.clear();
        self.out_ids.clear();
        let mut row = 0;
        for s in seqs.iter() {
            let p0 = s.kv.n_past;
            self.positions
                .extend((p0..p0 + s.n_tokens).map(|x| x as i32));
            self.kv_rows
                .extend((p0..p0 + s.n_tokens).map(|x| s.kv.row(x)));
            self.out_ids
                .extend((row + s.n_tokens - s.n_out..row + s.n_tokens).map(|x| x as i32));
            row += s.n_tokens;
        }
        self.attn_pos.clear();
        if non_causal {
            for s in seqs.iter() {
                let last = (s.kv.n_past + s.n_tokens) as i32 - 1;
                self.attn_pos.extend((0..s.n_tokens).map(|_| last));
            }
        }
        self.token_types.clear();
        self.token_types.resize(t, 0);
        self.seq_info.clear();
        self.seq_tables.clear();
        let width = seqs.iter().map(|s| s.kv.n_pages()).max().unwrap_or(0);
        let mut t0 = 0;
        for s in seqs.iter().filter(|s| s.n_tokens > 0) {
            let (n, n_kv) = (s.n_tokens as i32, (s.kv.n_past + s.n_tokens) as i32);
            self.seq_info.extend([t0, n, n_kv]);
            t0 += n;
            // Past a sequence's own pages: page 0, never read (its n_kv ends before).
            let table = s.kv.table();
            self.seq_tables.extend(table);
            self.seq_tables.extend((table.len()..width).map(|_| 0));
        }
        col_groups(seqs.iter().map(|s| s.n_tokens), &mut self.tok_groups);
        col_groups(seqs.iter().map(|s| s.n_out), &mut self.out_groups);

        let (ti, oi) = (t as i64, o as i64);
        let (base, arena_buf) = ex.arena(self.plan.arena_bytes)?;
        self.arena_buf = arena_buf;
        if arena_buf != 0 {
            pool.flush_copies(ex)?;
        }
        ex.count_step();
        for (i, node) in p.nodes.iter().enumerate() {
            let shape = super::dim::eval_shape(&node.shape, ti, oi);
            self.shapes[i] = shape;
            if matches!(node.kind, Kind::Reshape) || shape.iter().product::<i64>() == 0 {
                continue;
            }
            // The plan gives every node a slot inside the arena sized for max_t/max_o (an
            // offset from null in device memory).
            let mut out =
                TensorDesc::contiguous(base.wrapping_add(self.plan.offset[i]), node.dtype, &shape);
            out.buffer = arena_buf;
            let mut ins = [out; super::program::MAX_INPUTS];
            for (k, s) in node.inputs.iter().enumerate() {
                ins[k] = self.desc(p, *s, base);
            }
            let ins = &ins[..node.inputs.len()];
            // Before a product starts: the next one's weight, which the workers warm when they
            // run out of this one's tasks and through the gap after it.
            if let (Some(w), true) = (self.warm_next[i], t <= WARM_TOKENS) {
                ex.warm_weight(&p.weights[w]);
            }
            let res = match node.kind {
                Kind::Abi(Op::MatMul, params) => {
                    let Src::Weight(wi) = node.inputs[0] else {
                        unreachable!("compile binds mat_mul weights")
                    };
                    let xs = p.nodes.get(match node.inputs[1] {
                        Src::Node(j) => j,
                        _ => usize::MAX,
                    });
                    let col = xs.map(|x| x.shape[1]).unwrap_or_default();
                    let groups = if ins[1].ne[2] * ins[1].ne[3] != 1 {
                        None
                    } else if col.t != 0 && col.o == 0 {
                        Some(&self.tok_groups)
                    } else if col.o != 0 && col.t == 0 {
                        Some(&self.out_groups)
                    } else {
                        None
                    };
                    matmul_grouped(
                        ex,
                        &p.weights[wi],
                        ins[1],
                        out,
                        params,
                        groups.map(|g| &g[..]),
                    )
                }
                Kind::Abi(Op::GetRows, params) if matches!(node.inputs[0], Src::Weight(_)) => {
                    let Src::Weight(wi) = node.inputs[0] else {
                        unreachable!("matched above")
                    };
                    ex.table_rows(&p.weights[wi], ins, out, params)
                }
                Kind::Abi(op, params) => ex.call_desc(op, ins, &[out], params),
                Kind::Reshape => Ok(()),
                Kind::KvAttention {
                    layer,
                    window,
                    scale,
                    softcap,
                    causal,
                } => {
                    let at = Attn {
                        layer,
                        window,
                        scale,
                        softcap,
                        causal,
                    };
                    self.attention(ex, pool, seqs, ins, out, at)
                }
                Kind::Moe {
                    n_used,
                    norm,
                    act,
                    gating,
                    biased,
                } => super::moe::run(
                    ex,
                    experts.as_deref_mut(),
                    &p.weights,
                    &node.inputs[1..],
                    ins[0],
                    out,
                    super::moe::Routing {
                        k: n_used,
                        norm,
                        act,
                        sigmoid: gating == 1,
                        biased,
                    },
                    &self.tok_groups_for(ins[0], node, p),
                ),
                Kind::ShortConv { state } => {
                    let Src::Weight(wi) = node.inputs[1] else {
                        unreachable!("compile binds short_conv weights")
                    };
                    let states = seqs
                        .iter_mut()
                        .map(|s| (&mut s.kv.states[state][..], s.n_tokens));
                    super::recurrent::short_conv(ex, states, ins[0], &p.weights[wi], out)
                }
                Kind::SharedExpert { act, sigmoid } => super::moe::shared(
                    ex,
                    &p.weights,
                    &node.inputs[1..],
                    ins[0],
                    out,
                    act,
                    sigmoid,
                    &self.tok_groups_for(ins[0], node, p),
                ),
                Kind::CausalConv { state, silu } => {
                    let Src::Weight(wi) = node.inputs[1] else {
                        unreachable!("compile binds causal_conv weights")
                    };
                    let states = seqs
                        .iter_mut()
                        .map(|s| (&mut s.kv.states[state][..], s.n_tokens));
                    super::recurrent::causal_conv(ex, states, ins[0], &p.weights[wi], out, silu)
                }
                Kind::DeltaNet {
                    state,
                    k_heads,
                    head_dim,
                    eps,
                    grouped,
                } => {
                    let (Src::Weight(dt), Src::Weight(a)) = (node.inputs[3], node.inputs[4]) else {
                        unreachable!("compile binds delta_net weights")
                    };
                    let states = seqs
                        .iter_mut()
                        .map(|s| (&mut s.kv.states[state][..], s.n_tokens));
                    super::recurrent::delta_net(
                        ex,
                        states,
                        ins[0],
                        ins[1],
                        ins[2],
                        &p.weights[dt],
                        &p.weights[a],
                        out,
                        super::recurrent::DeltaNetShape {
                            k_heads,
                            head_dim,
                            eps,
                            grouped,
                        },
                    )
                }
                Kind::Rows {
                    period,
                    offset,
                    len,
                } => {
                    super::recurrent::rows(ins[0], out, period, offset, len);
                    Ok(())
                }
                Kind::Sigmoid => {
                    super::recurrent::sigmoid_node(ins[0], out);
                    Ok(())
                }
                Kind::Gelu => super::recurrent::gelu_node(ex, ins[0], out),
                Kind::TokenShift { state } => {
                    let states = seqs
                        .iter_mut()
                        .map(|s| (&mut s.kv.states[state][..], s.n_tokens));
                    super::rwkv::token_shift(ex, states, ins[0], out)
                }
                Kind::Lerp { index } => {
                    let Src::Weight(mi) = node.inputs[2] else {
                        unreachable!("compile binds lerp weights")
                    };
                    super::rwkv::lerp(ins[0], ins[1], &p.weights[mi], index, out);
                    Ok(())
                }
                Kind::Unary(f) => {
                    super::rwkv::unary(ins[0], out, f);
                    Ok(())
                }
                Kind::TimeMix {
                    state,
                    head_size,
                    v_first,
                } => {
                    let wt = |k: usize| match node.inputs[k] {
                        Src::Weight(i) => &p.weights[i],
                        _ => unreachable!("compile binds rwkv7_time_mix weights"),
                    };
                    let m = super::rwkv::TimeMix {
                        r: ins[0],
                        w: ins[1],
                        k: ins[2],
                        v: ins[3],
                        a: ins[4],
                        g: ins[5],
                        v_first: v_first.then(|| (ins[13], ins[14], wt(15))),
                        w0: wt(6),
                        a0: wt(7),
                        k_k: wt(8),
                        k_a: wt(9),
                        r_k: wt(10),
                        ln_w: wt(11),
                        ln_b: wt(12),
                        head_size,
                    };
                    let states = seqs
                        .iter_mut()
                        .map(|s| (&mut s.kv.states[state][..], s.n_tokens));
                    super::rwkv::time_mix(ex, states, &m, out)
                }
            };
            res.map_err(|e| match e {
                EngineError::Backend { backend, op, msg } => EngineError::Backend {
                    backend,
                    op,
                    msg: format!("{msg} (graph node '{}')", node.name),
                },
                other => other,
            })?;
        }
        for s in seqs.iter_mut() {
            s.kv.n_past += s.n_tokens;
        }
        let n = n_row * o;
        if arena_buf != 0 {
            // The step's one wait: its logits into host memory.
            self.logits.resize(n, 0.0);
            let src = self.desc(p, Src::Node(p.output), base);
            let dst =
                TensorDesc::contiguous(self.logits.as_mut_ptr() as *mut u8, DType::F32, &src.ne);
            ex.device_copy(&dst, &src)?;
            return Ok(&self.logits[..n]);
        }
        // SAFETY: the output node's slot holds n f32 values written by this step.
        Ok(unsafe {
            std::slice::from_raw_parts(base.add(self.plan.offset[p.output]) as *const f32, n)
        })
    }

    /// Column groups of a MoE node's input (tokens or output rows).
    fn tok_groups_for(
        &self,
        _x: TensorDesc,
        node: &super::program::PNode,
        p: &Program,
    ) -> Vec<ColGroup> {
        let col = match node.inputs[0] {
            Src::Node(j) => p.nodes[j].shape[1],
            _ => Default::default(),
        };
        if col.o != 0 {
            self.out_groups.clone()
        } else {
            self.tok_groups.clone()
        }
    }

    fn desc(&self, p: &Program, s: Src, base: *mut u8) -> TensorDesc {
        match s {
            Src::Node(j) => {
                // Inside the arena (see step).
                let mut d = TensorDesc::contiguous(
                    base.wrapping_add(self.plan.offset[j]),
                    p.nodes[j].dtype,
                    &self.shapes[j],
                );
                d.buffer = self.arena_buf;
                d
            }
            Src::Weight(w) => p.weights[w].desc,
            Src::Tokens => i32d(&self.tokens),
            Src::Positions => i32d(&self.positions),
            Src::TokenTypes => i32d(&self.token_types),
            Src::OutIds => i32d(&self.out_ids),
        }
    }

    fn attention(
        &self,
        ex: &Exec,
        pool: &mut KvPool,
        seqs: &mut [SeqStep],
        ins: &[TensorDesc],
        out: TensorDesc,
        at: Attn,
    ) -> Result<()> {
        let Attn {
            layer,
            window,
            scale,
            softcap,
            causal,
        } = at;
        // The query positions the attention op masks by.
        let positions = if causal {
            &self.positions
        } else {
            &self.attn_pos
        };
        let (q, k, v) = (ins[0], ins[1], ins[2]);
        let t = self.kv_rows.len();
        // q and out: f32, contiguous, one token's heads after another.
        let tok_bytes = (q.ne[0] * q.ne[1]) as usize * 4;
        let out = f32_view(&out, out.data, &[q.ne[0], q.ne[1], t as i64]);
        // Every token's keys and values into its cache rows, one row per KV head (the pool is
        // stored by head, see `CacheTensor::desc`): one call each for the step.
        let (hd, nh) = (k.ne[0], k.ne[1]);
        let cache = &mut pool.layers[layer];
        let mut idx = self.head_rows.borrow_mut();
        crate::kv::head_rows(&self.kv_rows, nh as usize, cache.k.rows(), &mut idx);
        let rd = i32d(&idx);
        let kc = cache.k.desc_2d();
        let kd = f32_view(&k, k.data, &[hd, nh * t as i64]);
        ex.call_desc(Op::SetRows, &[kd, rd, kc], &[kc], OpParams::default())?;
        let vc = cache.v.desc_2d();
        let vd = f32_view(&v, v.data, &[hd, nh * t as i64]);
        ex.call_desc(Op::SetRows, &[vd, rd, vc], &[vc], OpParams::default())?;
        drop(idx);
        let (kc, vc) = (cache.k.desc(), cache.v.desc());
        let attrs = |n_kv: i64| {
            abi::AttentionAttrs {
                n_kv,
                window: window as i64,
                page_rows: KV_PAGE as i64,
                scale,
                softcap,
            }
            .to_params()
        };

        // All sequences in one call (ABI 1.4), when the backend that would take one sequence's
        // call takes it: a decode step's sequences have one query each, too little work to
        // split across threads one at a time.
        let n_seq = self.seq_info.len() / 3;
        if n_seq > 1 {
            let width = self.seq_tables.len() / n_seq;
            let table = TensorDesc::contiguous(
                self.seq_tables.as_ptr() as *mut u8,
                DType::I32,
                &[width as i64, n_seq as i64],
            );
            let info = TensorDesc::contiguous(
                self.seq_info.as_ptr() as *mut u8,
                DType::I32,
                &[3, n_seq as i64],
            );
            let all = attrs(
                self.seq_info
                    .chunks(3)
                    .map(|c| c[2] as i64)
                    .max()
                    .unwrap_or(1),
            );
            let pd = i32d(positions);
            let ins = [q, kc, vc, pd, table, info];
            let (s0, c0) = (&seqs[0], self.seq_info[1] as i64);
            let p0 = attrs(self.seq_info[2] as i64);
            let one = [
                f32_view(&q, q.data, &[q.ne[0], q.ne[1], c0]),
                kc,
                vc,
                i32d(&positions[..c0 as usize]),
                s0.kv.table_desc(),
            ];
            let o1 = f32_view(&out, out.data, &[q.ne[0], q.ne[1], c0]);
            if ex.same_taker(Op::Attention, (&ins, &[out], &all), (&one, &[o1], &p0)) {
                return ex.call_desc(Op::Attention, &ins, &[out], all);
            }
        }
        let mut t0 = 0usize;
        for s in seqs.iter_mut() {
            let n = s.n_tokens;
            if n == 0 {
                continue;
            }
            let cols = |d: &TensorDesc| {
                f32_view(
                    d,
                    d.data.wrapping_add(t0 * tok_bytes),
                    &[q.ne[0], q.ne[1], n as i64],
                )
            };
            let prm = attrs((s.kv.n_past + n) as i64);
            let pd = i32d(&positions[t0..t0 + n]);
            let ins = [cols(&q), kc, vc, pd, s.kv.table_desc()];
            ex.call_desc(Op::Attention, &ins, &[cols(&out)], prm)?;
            t0 += n;
        }
        Ok(())
    }
}

/// A `kv_attention` node's attributes.
#[derive(Clone, Copy)]
struct Attn {
    layer: usize,
    window: usize,
    scale: f32,
    softcap: f32,
    causal: bool,
}

/// Packed f32 `shape` at `data` in `like`'s memory (host, or the same device buffer).
fn f32_view(like: &TensorDesc, data: *mut u8, shape: &[i64]) -> TensorDesc {
    let mut d = TensorDesc::contiguous(data, DType::F32, shape);
    d.buffer = like.buffer;
    d
}

/// Steps of at most this many tokens warm each product's successor: their products stream
/// the weights (decoding, alone or in a batch; a single sequence's decode: 4-10% faster on
/// the four test models). Prompt chunks compute far longer per weight byte: no gain there.
const WARM_TOKENS: usize = 16;

/// The weight of a matrix product node.
fn matmul_weight(n: &super::program::PNode) -> Option<usize> {
    match (n.kind, n.inputs.first()) {
        (Kind::Abi(Op::MatMul, _), Some(&Src::Weight(w))) => Some(w),
        _ => None,
    }
}

/// Per product node: the weight of the product after it (the last one's: the first one's, of
/// the next step); `None` for other nodes.
pub(crate) fn warm_targets(p: &Program) -> Vec<Option<usize>> {
    let n = &p.nodes;
    let first = n.iter().find_map(matmul_weight);
    (0..n.len())
        .map(|i| {
            matmul_weight(&n[i])?;
            n[i + 1..].iter().find_map(matmul_weight).or(first)
        })
        .collect()
}
