//! A graph file checked against the model's weights and the ABI schemas, ready to run: every
//! operand resolved, every attribute in its slot, every node's output shape linear in the
//! step's `T` and `O`. Anything wrong is refused here, naming the node.

use super::dim::{self, Lin, Shape};
use super::error::{AttrError, GraphError, NodeError};
use super::ir::{graph_op, GraphFile, NodeDef};
use crate::tensor::Weight;
use abi::{AttrKind, DType, Op, OpParams, TensorDesc};
use std::collections::HashMap;

/// Where an operand comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    Node(usize),
    Weight(usize),
    Tokens,
    Positions,
    /// Each token's type (segment) id: 0 for every token, as llama.cpp passes BERT's.
    TokenTypes,
    OutIds,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Abi(Op, OpParams),
    Reshape,
    KvAttention {
        layer: usize,
        window: usize,
        scale: f32,
        softcap: f32,
        /// false: every query sees its whole sequence (an encoder).
        causal: bool,
    },
    Moe {
        n_used: usize,
        norm: bool,
        act: i64,
        /// The router's probabilities: 0 softmax, 1 sigmoid.
        gating: i64,
        /// A selection bias follows the four weights.
        biased: bool,
    },
    SharedExpert {
        act: i64,
        /// The gate's sigmoid as 1 / (1 + expf(-g)) rather than silu(g) / g.
        sigmoid: bool,
    },
    /// A causal convolution over each sequence's window, kept in recurrent state `state`.
    CausalConv {
        state: usize,
        silu: bool,
    },
    /// The gated delta-net core on recurrent state `state`.
    DeltaNet {
        state: usize,
        k_heads: usize,
        head_dim: usize,
        eps: f32,
        grouped: bool,
    },
    /// Rows `offset..offset + len` of each `period`.
    Rows {
        period: usize,
        offset: usize,
        len: usize,
    },
    Sigmoid,
    /// ggml_gelu, as the ABI's glu against ones.
    Gelu,
    /// RWKV's token shift against recurrent state `state`.
    TokenShift {
        state: usize,
    },
    /// `sx * mu[index] + x`.
    Lerp {
        index: usize,
    },
    /// An elementwise function of one value.
    Unary(super::rwkv::Unary),
    /// RWKV-7's time-mix core on recurrent state `state`; `v_first`: after layer 0.
    TimeMix {
        state: usize,
        head_size: usize,
        v_first: bool,
    },
    /// A short convolution over each sequence's window, kept in recurrent state `state`.
    ShortConv {
        state: usize,
    },
}

#[derive(Clone, Debug)]
pub struct PNode {
    pub name: String,
    pub kind: Kind,
    pub inputs: Vec<Src>,
    pub shape: Shape,
    pub dtype: DType,
}

/// A checked graph bound to the weights of one model file.
pub struct Program {
    /// The graph as written (what `mollm convert` stores in a package).
    pub file: GraphFile,
    pub nodes: Vec<PNode>,
    pub weights: Vec<Weight>,
    pub weight_names: Vec<String>,
    pub output: usize,
    /// The final hidden states embeddings pool ([`GraphFile::embd`]), where the graph names them.
    pub embd: Option<usize>,
    /// `[head_dim, n_head_kv]` per cached layer.
    pub kv_layers: Vec<[usize; 2]>,
    /// f32 values per recurrent state each sequence keeps.
    pub states: Vec<usize>,
    /// Some attention is not causal (an encoder): each sequence must come whole in one step.
    pub non_causal: bool,
    /// The positions a sequence may reach: the rows of a table looked up by position (BERT's
    /// learned position embeddings), where the graph has one.
    pub max_positions: Option<usize>,
}

impl Program {
    /// Whether its output is logits (not an embedding model's hidden states).
    pub fn has_logits(&self) -> bool {
        self.embd != Some(self.output)
    }

    /// Whether it routes experts (MoE and shared-expert nodes: host code between calls).
    pub fn has_moe(&self) -> bool {
        self.nodes
            .iter()
            .any(|n| matches!(n.kind, Kind::Moe { .. } | Kind::SharedExpert { .. }))
    }

    /// Whether nodes run host code on their operands (routing, recurrent layers, the small
    /// elementwise graph ops): then activations must live in host memory.
    pub fn runs_host_code(&self) -> bool {
        !self.states.is_empty()
            || self.nodes.iter().any(|n| {
                !matches!(
                    n.kind,
                    Kind::Abi(..) | Kind::Reshape | Kind::KvAttention { .. }
                )
            })
    }

    /// What its KV pool needs to know: the cached layers' geometry, the weights token columns
    /// are multiplied with, and whether chunks can share rows at all (not with MoE routing).
    pub fn kv_spec(&self) -> crate::kv::KvSpec {
        let mut mats = Vec::new();
        for n in &self.nodes {
            if let (Kind::Abi(Op::MatMul, _), Some(Src::Weight(w))) = (n.kind, n.inputs.first()) {
                let d = &self.weights[*w].desc;
                if let Some(dt) = d.dtype() {
                    let m = (dt, d.ne[0] as usize, d.ne[1] as usize);
                    if !mats.contains(&m) {
                        mats.push(m);
                    }
                }
            }
        }
        crate::kv::KvSpec {
            layers: self.kv_layers.clone(),
            mats,
            // Recurrent state is not a cache of rows: a prefix's rows alone do not resume it.
            chunks_comparable: !self.has_moe() && self.states.is_empty(),
            states: self.states.clone(),
        }
    }
}

/// Limits that keep a hostile graph from costing more than a real one.
const MAX_NODES: usize = 1 << 20;
/// The most operands a graph op declares (`rwkv7_time_mix`).
pub(crate) const MAX_INPUTS: usize = 16;
const MAX_KV_LAYERS: usize = 4096;
/// The most f32 values one recurrent state may hold (64 MiB).
const MAX_STATE: i64 = 1 << 24;
/// (T, O) points the shapes are evaluated at: three fix a linear form, the rest check it.
/// The most tokens (and logit rows) one step may carry.
pub const MAX_STEP: i64 = 1 << 16;
/// The most elements one value may have at the largest step.
const MAX_ELEMS: i64 = 1 << 38;
const POINTS: [(i64, i64); 5] = [(1, 1), (2, 1), (1, 2), (7, 3), (3, 5)];

pub type Weights<'a> = &'a dyn Fn(&str) -> Option<Weight>;

fn sample_desc(dt: DType, s: [i64; 4]) -> TensorDesc {
    let mut d = TensorDesc::contiguous(core::ptr::null_mut(), DType::F32, &[1]);
    d.dtype = dt.id();
    d.ndim = 4;
    d.ne = s;
    let info = dt.info();
    d.nb[0] = info.block_bytes as i64;
    d.nb[1] = d.nb[0] * (s[0] / info.block_len as i64);
    for i in 2..4 {
        d.nb[i] = d.nb[i - 1] * s[i - 1];
    }
    d
}

/// The linear form through the values at [`POINTS`], if they lie on one.
fn fit(vals: &[[i64; 4]; 5]) -> Option<Shape> {
    let mut s = [Lin::k(0); 4];
    for d in 0..4 {
        let (v11, v21, v12) = (vals[0][d], vals[1][d], vals[2][d]);
        let l = Lin {
            t: v21.wrapping_sub(v11),
            o: v12.wrapping_sub(v11),
            c: v11
                .wrapping_sub(v21.wrapping_sub(v11))
                .wrapping_sub(v12.wrapping_sub(v11)),
        };
        if l.c < 0 || l.t < 0 || l.o < 0 {
            return None;
        }
        for (i, &(t, o)) in POINTS.iter().enumerate() {
            if l.eval(t, o) != vals[i][d] {
                return None;
            }
        }
        s[d] = l;
    }
    Some(s)
}

fn params_for(op: Op, n: &NodeDef) -> Result<OpParams, AttrError> {
    let schema = op.schema();
    let mut p = OpParams::default();
    for (k, &v) in &n.attrs {
        let a = schema.attrs.iter().find(|a| a.name == k).ok_or_else(|| {
            let names: Vec<&str> = schema.attrs.iter().map(|a| a.name).collect();
            AttrError::Unknown {
                op: schema.name,
                attr: k.clone(),
                has: names.join(", "),
            }
        })?;
        if !v.is_finite() {
            return Err(AttrError::NotFinite { attr: k.clone() });
        }
        if a.kind == AttrKind::I64 && (v.fract() != 0.0 || v.abs() > (1u64 << 53) as f64) {
            return Err(AttrError::NotInteger {
                attr: k.clone(),
                value: v,
            });
        }
        p.set(a, v);
    }
    Ok(p)
}

/// A graph op's attribute, or its declared default ([`GraphOp::defaults`]) where left out.
fn graph_attr(n: &NodeDef, k: &'static str) -> Result<f64, AttrError> {
    let default = || {
        let op = super::ir::graph_op(&n.op)?;
        op.defaults.iter().find(|(name, _)| *name == k).map(|d| d.1)
    };
    let v = n
        .attrs
        .get(k)
        .copied()
        .or_else(default)
        .ok_or(AttrError::Missing { attr: k })?;
    if !v.is_finite() {
        return Err(AttrError::NotFinite { attr: k.into() });
    }
    Ok(v)
}

fn graph_int(n: &NodeDef, k: &'static str, max: u64) -> Result<u64, AttrError> {
    let v = graph_attr(n, k)?;
    if v.fract() != 0.0 || v < 0.0 || v > max as f64 {
        return Err(AttrError::OutOfRange {
            attr: k,
            max,
            value: v,
        });
    }
    Ok(v as u64)
}

/// Checks `g` and binds it to the weights `weights` finds by name. `file` names the source in
/// errors.
pub fn compile(g: GraphFile, weights: Weights, file: &str) -> Result<Program, GraphError> {
    let err = |node: &str, error: NodeError| GraphError::Node {
        file: file.into(),
        node: node.into(),
        error,
    };
    if g.version != super::ir::GRAPH_VERSION {
        return Err(GraphError::Version {
            file: file.into(),
            found: g.version as u64,
            runs: super::ir::GRAPH_VERSION,
        });
    }
    if g.nodes.len() > MAX_NODES || g.kv_layers.len() > MAX_KV_LAYERS {
        return Err(GraphError::TooLarge {
            file: file.into(),
            nodes: g.nodes.len(),
            kv_layers: g.kv_layers.len(),
            max_nodes: MAX_NODES,
            max_kv_layers: MAX_KV_LAYERS,
        });
    }
    let mut kv_layers = Vec::with_capacity(g.kv_layers.len());
    for (i, &[d, h]) in g.kv_layers.iter().enumerate() {
        if !(1..=1 << 16).contains(&d) || !(1..=1 << 12).contains(&h) {
            return Err(GraphError::KvGeometry {
                file: file.into(),
                layer: i,
                geometry: [d as i64, h as i64],
            });
        }
        kv_layers.push([d as usize, h as usize]);
    }
    if g.states.len() > MAX_KV_LAYERS {
        return Err(GraphError::TooLarge {
            file: file.into(),
            nodes: g.nodes.len(),
            kv_layers: g.states.len(),
            max_nodes: MAX_NODES,
            max_kv_layers: MAX_KV_LAYERS,
        });
    }
    let mut states = Vec::with_capacity(g.states.len());
    for (i, &n) in g.states.iter().enumerate() {
        if !(1..=MAX_STATE).contains(&n) {
            return Err(GraphError::StateSize {
                file: file.into(),
                state: i,
                values: n,
                max: MAX_STATE,
            });
        }
        states.push(n as usize);
    }
    let mut state_used = vec![false; states.len()];
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if n.name.is_empty() || n.name.len() > 256 || n.name.starts_with(['$', '@']) {
            return Err(GraphError::NodeName {
                file: file.into(),
                index: i,
                name: n.name.clone(),
            });
        }
        if by_name.insert(&n.name, i).is_some() {
            return Err(err(&n.name, "defined twice".into()));
        }
    }
    let mut weight_names: Vec<String> = Vec::new();
    let mut weight_idx: HashMap<String, usize> = HashMap::new();
    let mut bound: Vec<Weight> = Vec::new();
    let mut nodes: Vec<PNode> = Vec::with_capacity(g.nodes.len());
    // Per node, its concrete shape at each of POINTS.
    let mut at: Vec<[[i64; 4]; 5]> = Vec::with_capacity(g.nodes.len());
    let mut kv_used = vec![false; kv_layers.len()];

    for (i, n) in g.nodes.iter().enumerate() {
        let e = |msg: String| err(&n.name, NodeError::Check(msg));
        if n.inputs.len() > MAX_INPUTS {
            return Err(e(format!("{} inputs (limit {MAX_INPUTS})", n.inputs.len())));
        }
        let mut inputs = Vec::with_capacity(n.inputs.len());
        // Per input: dtype and shapes at POINTS.
        let mut in_info: Vec<(DType, [[i64; 4]; 5])> = Vec::with_capacity(n.inputs.len());
        for r in &n.inputs {
            let (src, info) = match r.as_str() {
                "$tokens" | "$positions" | "$token_types" => {
                    let s = POINTS.map(|(t, _)| [t, 1, 1, 1]);
                    let src = match r.as_str() {
                        "$tokens" => Src::Tokens,
                        "$positions" => Src::Positions,
                        _ => Src::TokenTypes,
                    };
                    (src, (DType::I32, s))
                }
                "$out_ids" => (Src::OutIds, (DType::I32, POINTS.map(|(_, o)| [o, 1, 1, 1]))),
                w if w.starts_with('@') => {
                    let name = &w[1..];
                    let idx = match weight_idx.get(name) {
                        Some(&k) => k,
                        None => {
                            let wt = weights(name)
                                .ok_or_else(|| e(format!("weight '{name}' is not in the model")))?;
                            bound.push(wt);
                            weight_names.push(name.to_string());
                            weight_idx.insert(name.to_string(), bound.len() - 1);
                            bound.len() - 1
                        }
                    };
                    let wt = &bound[idx];
                    (Src::Weight(idx), (wt.dtype(), [wt.ne(); 5]))
                }
                node => match by_name.get(node) {
                    Some(&j) if j < i => (Src::Node(j), (nodes[j].dtype, at[j])),
                    Some(_) => {
                        return Err(e(format!(
                            "uses '{node}', which is not computed before it (a cycle, or nodes out of order)"
                        )))
                    }
                    None => return Err(e(format!("input '{node}' is not a node, weight or step input"))),
                },
            };
            inputs.push(src);
            in_info.push(info);
        }
        let (kind, dtype, shapes) = if let Some(gop) = graph_op(&n.op) {
            let least = gop.inputs.len() - gop.optional;
            if !(least..=gop.inputs.len()).contains(&n.inputs.len()) {
                return Err(e(format!(
                    "{} takes {} inputs ({}), got {}",
                    gop.name,
                    if least == gop.inputs.len() {
                        least.to_string()
                    } else {
                        format!("{least} to {}", gop.inputs.len())
                    },
                    gop.inputs.join(", "),
                    n.inputs.len()
                )));
            }
            if let Some(k) = n.attrs.keys().find(|k| !gop.attrs.contains(&k.as_str())) {
                return Err(e(format!("{} has no attribute '{k}'", gop.name)));
            }
            if gop.name != "reshape" && !n.shape.is_empty() {
                return Err(e("only reshape takes a shape".into()));
            }
            for (k, (dt, _)) in in_info.iter().enumerate() {
                let is_weight = matches!(inputs[k], Src::Weight(_));
                if !is_weight && *dt != DType::F32 {
                    return Err(e(format!("input '{}' must be f32, is {dt}", gop.inputs[k])));
                }
            }
            let mem = Memory {
                kv_layers: &kv_layers,
                kv_used: &mut kv_used,
                states: &states,
                state_used: &mut state_used,
            };
            compile_graph_op(n, &inputs, &in_info, mem, &g).map_err(|x| err(&n.name, x))?
        } else {
            let op = Op::from_name(&n.op).ok_or_else(|| e(format!("unknown op '{}'", n.op)))?;
            if matches!(op, Op::SetRows | Op::Attention) {
                return Err(e(format!(
                    "{} is run by kv_attention, not as a node",
                    op.name()
                )));
            }
            if !n.shape.is_empty() {
                return Err(e("only reshape takes a shape".into()));
            }
            let schema = op.schema();
            if n.inputs.len() != schema.inputs.len() {
                return Err(e(format!(
                    "{} takes {} inputs, got {}",
                    schema.name,
                    schema.inputs.len(),
                    n.inputs.len()
                )));
            }
            if op == Op::MatMul && !matches!(inputs[0], Src::Weight(_)) {
                return Err(e(
                    "mat_mul's first operand must be a weight (`@name`)".into()
                ));
            }
            let params = params_for(op, n).map_err(|a| err(&n.name, a.into()))?;
            let out_dt = schema.outputs[0].dtypes[0];
            let mut shapes = [[0i64; 4]; 5];
            for (pi, s) in shapes.iter_mut().enumerate() {
                let descs: Vec<TensorDesc> = in_info
                    .iter()
                    .map(|(dt, sh)| {
                        if sh[pi][0] % dt.info().block_len as i64 != 0 {
                            return Err(e(format!(
                                "an input of shape {:?} is not whole {dt} blocks",
                                sh[pi]
                            )));
                        }
                        Ok(sample_desc(*dt, sh[pi]))
                    })
                    .collect::<Result<_, GraphError>>()?;
                let shp: Vec<[i64; 4]> = descs.iter().map(|d| d.ne).collect();
                let out = (schema.shape_rule)(&shp, &params)
                    .map_err(|m| e(format!("{}: {m}", schema.name)))?;
                let od = sample_desc(out_dt, out[0]);
                abi::validate(op, &descs, &[od], &params).map_err(e)?;
                *s = out[0];
            }
            (Kind::Abi(op, params), out_dt, shapes)
        };
        let shape = fit(&shapes).ok_or_else(|| e("its shape is not linear in T and O".into()))?;
        // Bounded at the largest step a runner takes, so that planning cannot overflow and
        // no graph asks for an absurd arena.
        let big = shape.iter().try_fold(1i64, |acc, l| {
            let d =
                l.c.checked_add(l.t.checked_mul(MAX_STEP)?)?
                    .checked_add(l.o.checked_mul(MAX_STEP)?)?;
            acc.checked_mul(d)
        });
        if big.is_none_or(|n| n > MAX_ELEMS) {
            return Err(e(format!(
                "its shape [{}] is too large for steps of {MAX_STEP} tokens (limit {MAX_ELEMS} elements)",
                shape_str(&shape)
            )));
        }
        at.push(shapes);
        nodes.push(PNode {
            name: n.name.clone(),
            kind,
            inputs,
            shape,
            dtype,
        });
    }
    // The logits, or the hidden states embeddings pool: a row per output token.
    let rows = |name: &str, what: &str, dim: &str| -> Result<usize, GraphError> {
        let i = *by_name.get(name).ok_or_else(|| GraphError::NoOutput {
            file: file.into(),
            name: name.to_string(),
        })?;
        let s = nodes[i].shape;
        if nodes[i].dtype != DType::F32
            || !s[0].is_const()
            || s[1] != Lin::O
            || s[2] != Lin::k(1)
            || s[3] != Lin::k(1)
        {
            return Err(err(
                name,
                format!("{what} must be f32 [{dim}, O], is [{}]", shape_str(&s)).into(),
            ));
        }
        Ok(i)
    };
    let output = rows(&g.output, "the output", "n_vocab")?;
    let embd = match g.embd.as_str() {
        "" => None,
        name => Some(rows(name, "embd", "n_embd")?),
    };
    // Checked by every step: worked out once here.
    let non_causal =
        (nodes.iter()).any(|n| matches!(n.kind, Kind::KvAttention { causal: false, .. }));
    let max_positions = (nodes.iter())
        .filter_map(|n| match (n.kind, &n.inputs[..]) {
            (Kind::Abi(Op::GetRows, _), [Src::Weight(w), Src::Positions]) => {
                Some(bound[*w].desc.ne[1] as usize)
            }
            _ => None,
        })
        .min();
    Ok(Program {
        file: g,
        nodes,
        weights: bound,
        weight_names,
        output,
        embd,
        kv_layers,
        states,
        non_causal,
        max_positions,
    })
}

pub fn shape_str(s: &Shape) -> String {
    s.iter().map(|l| l.to_expr()).collect::<Vec<_>>().join(", ")
}

/// A node check's message, formatted.
macro_rules! check {
    ($($t:tt)*) => {
        NodeError::Check(format!($($t)*))
    };
}

type Compiled = (Kind, DType, [[i64; 4]; 5]);

/// The per-sequence memory a graph declares, and which of it nodes already write.
struct Memory<'a> {
    kv_layers: &'a [[usize; 2]],
    kv_used: &'a mut [bool],
    states: &'a [usize],
    state_used: &'a mut [bool],
}

fn compile_graph_op(
    n: &NodeDef,
    inputs: &[Src],
    info: &[(DType, [[i64; 4]; 5])],
    mem: Memory,
    g: &GraphFile,
) -> Result<Compiled, NodeError> {
    let Memory {
        kv_layers,
        kv_used,
        states,
        state_used,
    } = mem;
    match n.op.as_str() {
        "reshape" => {
            if n.shape.is_empty() || n.shape.len() > 4 {
                return Err(check!(
                    "reshape needs 1 to 4 dimensions, got {}",
                    n.shape.len()
                ));
            }
            let mut target = [Lin::k(1); 4];
            for (d, ex) in n.shape.iter().enumerate() {
                target[d] = dim::parse(ex, &g.consts)
                    .map_err(|source| NodeError::Dim { dim: d, source })?;
            }
            let mut shapes = [[0i64; 4]; 5];
            for (pi, &(t, o)) in POINTS.iter().enumerate() {
                let s = dim::eval_shape(&target, t, o);
                let src = info[0].1[pi];
                let n = |v: &[i64; 4]| v.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
                if n(&s).is_none() || n(&s) != n(&src) {
                    return Err(check!(
                        "reshape of {src:?} to {s:?} changes the element count"
                    ));
                }
                shapes[pi] = s;
            }
            Ok((Kind::Reshape, info[0].0, shapes))
        }
        "kv_attention" => {
            let layer = graph_int(n, "layer", kv_layers.len().saturating_sub(1) as u64)? as usize;
            if kv_layers.is_empty() {
                return Err("the graph declares no kv layers".into());
            }
            if std::mem::replace(&mut kv_used[layer], true) {
                return Err(check!("kv layer {layer} is written by two nodes"));
            }
            let window = graph_int(n, "window", 1 << 40)? as usize;
            let scale = graph_attr(n, "scale")? as f32;
            let softcap = graph_attr(n, "softcap")? as f32;
            let causal = graph_int(n, "causal", 1)? == 1;
            let [d, h] = kv_layers[layer];
            let mut shapes = [[0i64; 4]; 5];
            for (pi, &(t, _)) in POINTS.iter().enumerate() {
                let (q, k, v) = (info[0].1[pi], info[1].1[pi], info[2].1[pi]);
                let want = [d as i64, h as i64, t, 1];
                if k != want || v != want {
                    return Err(check!("k {k:?} and v {v:?} must be [head_dim, n_head_kv, T] = {want:?} (kv layer {layer})"));
                }
                if q[0] != d as i64 || q[1] % h as i64 != 0 || q[2] != t || q[3] != 1 {
                    return Err(check!("q {q:?} must be [{d}, a multiple of {h}, T]"));
                }
                shapes[pi] = [q[0] * q[1], t, 1, 1];
            }
            Ok((
                Kind::KvAttention {
                    layer,
                    window,
                    scale,
                    softcap,
                    causal,
                },
                DType::F32,
                shapes,
            ))
        }
        "moe_ffn" => {
            let [x, r, ga, up, dn] = ffn_operands(inputs, info, "router, gate, up and down")?;
            let (e, nx, f) = (x[0], r[1], ga[1]);
            if r != [e, nx, 1, 1] || ga != [e, f, nx, 1] || up != ga || dn != [f, e, nx, 1] {
                return Err(check!(
                    "expert shapes do not fit: x {x:?}, router {r:?}, gate {ga:?}, up {up:?}, down {dn:?}"
                ));
            }
            let n_used = graph_int(n, "n_used", nx as u64)? as usize;
            if n_used == 0 {
                return Err("n_used must be at least 1".into());
            }
            let norm = graph_int(n, "norm_weights", 1)? == 1;
            let act = graph_int(n, "act", 1)? as i64;
            let gating = match n.attrs.contains_key("gating") {
                true => graph_int(n, "gating", 1)? as i64,
                false => 0,
            };
            let biased = inputs.len() == 6;
            if biased {
                let b = info[5].1[0];
                if !matches!(inputs[5], Src::Weight(_))
                    || info[5].0 != DType::F32
                    || b != [nx, 1, 1, 1]
                {
                    return Err(check!(
                        "selection_bias must be an f32 weight [{nx}], is {} {b:?}",
                        info[5].0
                    ));
                }
            }
            Ok((
                Kind::Moe {
                    n_used,
                    norm,
                    act,
                    gating,
                    biased,
                },
                DType::F32,
                like_x(info, e)?,
            ))
        }
        "shared_expert" => {
            let [x, gi, ga, up, dn] = ffn_operands(inputs, info, "gate_inp, gate, up and down")?;
            let (e, f) = (x[0], ga[1]);
            if gi != [e, 1, 1, 1] || ga != [e, f, 1, 1] || up != ga || dn != [f, e, 1, 1] {
                return Err(check!(
                    "shared-expert shapes do not fit: x {x:?}, gate_inp {gi:?}, gate {ga:?}, up {up:?}, down {dn:?}"
                ));
            }
            if info[1].0 != DType::F32 {
                return Err(check!("gate_inp must be f32, is {}", info[1].0));
            }
            let act = graph_int(n, "act", 1)? as i64;
            let sigmoid = match n.attrs.contains_key("gate") {
                true => graph_int(n, "gate", 1)? == 1,
                false => false,
            };
            Ok((
                Kind::SharedExpert { act, sigmoid },
                DType::F32,
                like_x(info, e)?,
            ))
        }
        "causal_conv" => {
            let state = take_state(n, states, state_used)?;
            let (l, ch) = conv_weight(inputs, info)?;
            if states[state] as i64 != (l - 1) * ch {
                return Err(check!(
                    "state {state} holds {} values, the window needs (L-1)*C = {}",
                    states[state],
                    (l - 1) * ch
                ));
            }
            let silu = match n.attrs.contains_key("silu") {
                true => graph_int(n, "silu", 1)? == 1,
                false => false,
            };
            let mut shapes = [[0i64; 4]; 5];
            for (pi, &(t, _)) in POINTS.iter().enumerate() {
                let x = info[0].1[pi];
                if x != [ch, t, 1, 1] {
                    return Err(check!("x {x:?} must be [C, T] = [{ch}, {t}]"));
                }
                shapes[pi] = [ch, t, 1, 1];
            }
            Ok((Kind::CausalConv { state, silu }, DType::F32, shapes))
        }
        "delta_net" => {
            let state = take_state(n, states, state_used)?;
            let k_heads = graph_int(n, "k_heads", 1 << 16)? as i64;
            let s = graph_int(n, "head_dim", 1 << 12)? as i64;
            let eps = graph_attr(n, "eps")? as f32;
            let grouped = match n.attrs.contains_key("grouped") {
                true => graph_int(n, "grouped", 1)? == 1,
                false => false,
            };
            for k in 3..5 {
                let wt = info[k].1[0];
                if !matches!(inputs[k], Src::Weight(_))
                    || info[k].0 != DType::F32
                    || wt[1..] != [1, 1, 1]
                {
                    return Err(check!(
                        "{} must be an f32 weight [H], is {} {wt:?}",
                        ["dt_bias", "a"][k - 3],
                        info[k].0
                    ));
                }
            }
            let h = info[3].1[0][0];
            if k_heads == 0 || s == 0 || h % k_heads != 0 || info[4].1[0][0] != h {
                return Err(check!(
                    "{h} value heads (dt_bias) and {} (a) over {k_heads} key heads of {s}: the value heads must match and be a multiple of the key heads",
                    info[4].1[0][0]
                ));
            }
            if states[state] as i64 != s * s * h {
                return Err(check!(
                    "state {state} holds {} values, {h} heads of [{s}, {s}] need {}",
                    states[state],
                    s * s * h
                ));
            }
            let c = (2 * k_heads + h) * s;
            let mut shapes = [[0i64; 4]; 5];
            for (pi, &(t, _)) in POINTS.iter().enumerate() {
                let (x, b, a) = (info[0].1[pi], info[1].1[pi], info[2].1[pi]);
                if x != [c, t, 1, 1] || b != [h, t, 1, 1] || a != [h, t, 1, 1] {
                    return Err(check!(
                        "qkv {x:?}, beta {b:?} and alpha {a:?} must be [{c}, {t}], [{h}, {t}] and [{h}, {t}]"
                    ));
                }
                shapes[pi] = [s * h, t, 1, 1];
            }
            Ok((
                Kind::DeltaNet {
                    state,
                    k_heads: k_heads as usize,
                    head_dim: s as usize,
                    eps,
                    grouped,
                },
                DType::F32,
                shapes,
            ))
        }
        "rows" => {
            let period = graph_int(n, "period", 1 << 30)? as i64;
            let offset = graph_int(n, "offset", 1 << 30)? as i64;
            let len = graph_int(n, "len", 1 << 30)? as i64;
            if period == 0 || len == 0 || offset + len > period {
                return Err(check!(
                    "rows {offset}..{} of each {period} are not a part of it",
                    offset + len
                ));
            }
            let mut shapes = [[0i64; 4]; 5];
            for (pi, s) in shapes.iter_mut().enumerate() {
                let x = info[0].1[pi];
                if x[0] % period != 0 || x[2] != 1 || x[3] != 1 {
                    return Err(check!(
                        "x {x:?} must be [R, T] with R a multiple of {period}"
                    ));
                }
                *s = [x[0] / period * len, x[1], 1, 1];
            }
            Ok((
                Kind::Rows {
                    period: period as usize,
                    offset: offset as usize,
                    len: len as usize,
                },
                DType::F32,
                shapes,
            ))
        }
        "sigmoid" | "gelu" => {
            if matches!(inputs[0], Src::Weight(_)) {
                return Err(check!("x must be a node"));
            }
            let kind = match n.op.as_str() {
                "sigmoid" => Kind::Sigmoid,
                _ => Kind::Gelu,
            };
            Ok((kind, DType::F32, info[0].1))
        }
        "token_shift" => {
            let state = take_state(n, states, state_used)?;
            let e = column_of(inputs, info, true)?;
            if states[state] as i64 != e {
                return Err(check!(
                    "state {state} holds {} values, a column of x has {e}",
                    states[state]
                ));
            }
            Ok((Kind::TokenShift { state }, DType::F32, info[0].1))
        }
        "lerp" => {
            let e = column_of(inputs, info, false)?;
            same_as_x(inputs, info, &[1])?;
            let index = graph_int(n, "index", 64)? as usize;
            let mu = info[2].1[0];
            let count = mu.iter().product::<i64>();
            if !matches!(inputs[2], Src::Weight(_))
                || info[2].0 != DType::F32
                || mu[0] != e
                || count < (index as i64 + 1) * e
            {
                return Err(check!(
                    "mu must be an f32 weight [{e}, ..] with at least {} values, is {} {mu:?}",
                    (index + 1) as i64 * e,
                    info[2].0
                ));
            }
            Ok((Kind::Lerp { index }, DType::F32, info[0].1))
        }
        "tanh" | "relu_sqr" => {
            if matches!(inputs[0], Src::Weight(_)) {
                return Err(check!("x must be a node"));
            }
            let f = match n.op.as_str() {
                "tanh" => super::rwkv::Unary::Tanh,
                _ => super::rwkv::Unary::ReluSqr,
            };
            Ok((Kind::Unary(f), DType::F32, info[0].1))
        }
        "rwkv7_time_mix" => {
            let state = take_state(n, states, state_used)?;
            let e = column_of(inputs, info, true)?;
            let head_size = graph_int(n, "head_size", 1 << 12)? as i64;
            if head_size == 0 || e % head_size != 0 {
                return Err(check!(
                    "head_size {head_size} does not divide the width {e}"
                ));
            }
            let v_first = match inputs.len() {
                13 => false,
                16 => true,
                k => {
                    return Err(check!(
                        "takes 13 operands, or 16 with v_first, v_mix and v0; got {k}"
                    ))
                }
            };
            same_as_x(inputs, info, &[1, 2, 3, 4, 5])?;
            f32_vectors(inputs, info, &[6, 7, 8, 9, 10, 11, 12], e)?;
            if v_first {
                same_as_x(inputs, info, &[13, 14])?;
                f32_vectors(inputs, info, &[15], e)?;
            }
            if states[state] as i64 != e * head_size {
                return Err(check!(
                    "state {state} holds {} values, {} heads of [{head_size}, {head_size}] need {}",
                    states[state],
                    e / head_size,
                    e * head_size
                ));
            }
            Ok((
                Kind::TimeMix {
                    state,
                    head_size: head_size as usize,
                    v_first,
                },
                DType::F32,
                info[0].1,
            ))
        }
        "short_conv" => {
            let state = take_state(n, states, state_used)?;
            let (l, ch) = conv_weight(inputs, info)?;
            if states[state] as i64 != (l - 1) * ch {
                return Err(check!(
                    "state {state} holds {} values, the window needs (L-1)*n = {}",
                    states[state],
                    (l - 1) * ch
                ));
            }
            let mut shapes = [[0i64; 4]; 5];
            for (pi, &(t, _)) in POINTS.iter().enumerate() {
                let x = info[0].1[pi];
                if x != [3 * ch, t, 1, 1] {
                    return Err(check!("bcx {x:?} must be [3n, T] = [{}, {t}]", 3 * ch));
                }
                shapes[pi] = [ch, t, 1, 1];
            }
            Ok((Kind::ShortConv { state }, DType::F32, shapes))
        }
        other => unreachable!("graph op {other} is declared but not compiled"),
    }
}

/// The recurrent state a node's `state` attribute names, which no other node may write.
fn take_state(n: &NodeDef, states: &[usize], used: &mut [bool]) -> Result<usize, NodeError> {
    let state = graph_int(n, "state", states.len().saturating_sub(1) as u64)? as usize;
    if states.is_empty() {
        return Err("the graph declares no recurrent states".into());
    }
    if std::mem::replace(&mut used[state], true) {
        return Err(check!("state {state} is written by two nodes"));
    }
    Ok(state)
}

/// A convolution's weight (operand 1): f32 `[L >= 2, C]`; returns (L, C).
/// The column length E of operand 0, a node `[E, N]` at every evaluation point (`N` the
/// step's tokens where `per_token`: an op that keeps per-sequence state sees every token).
fn column_of(
    inputs: &[Src],
    info: &[(DType, [[i64; 4]; 5])],
    per_token: bool,
) -> Result<i64, NodeError> {
    if matches!(inputs[0], Src::Weight(_)) {
        return Err(check!("x must be a node"));
    }
    let e = info[0].1[0][0];
    for (pi, &(t, _)) in POINTS.iter().enumerate() {
        let x = info[0].1[pi];
        if x[0] != e || x[2] != 1 || x[3] != 1 || (per_token && x[1] != t) {
            let n = if per_token { "T" } else { "N" };
            return Err(check!("x {x:?} must be [E, {n}]"));
        }
    }
    Ok(e)
}

/// Operands `which` are nodes of operand 0's shape at every evaluation point.
fn same_as_x(
    inputs: &[Src],
    info: &[(DType, [[i64; 4]; 5])],
    which: &[usize],
) -> Result<(), NodeError> {
    for &k in which {
        if matches!(inputs[k], Src::Weight(_)) || info[k].1 != info[0].1 {
            return Err(check!(
                "operand {k} {:?} must be a node shaped as operand 0 {:?}",
                info[k].1[0],
                info[0].1[0]
            ));
        }
    }
    Ok(())
}

/// Operands `which` are f32 weights of `e` values.
fn f32_vectors(
    inputs: &[Src],
    info: &[(DType, [[i64; 4]; 5])],
    which: &[usize],
    e: i64,
) -> Result<(), NodeError> {
    for &k in which {
        let s = info[k].1[0];
        if !matches!(inputs[k], Src::Weight(_)) || info[k].0 != DType::F32 || s != [e, 1, 1, 1] {
            return Err(check!(
                "operand {k} must be an f32 weight [{e}], is {} {s:?}",
                info[k].0
            ));
        }
    }
    Ok(())
}

fn conv_weight(inputs: &[Src], info: &[(DType, [[i64; 4]; 5])]) -> Result<(i64, i64), NodeError> {
    if !matches!(inputs[1], Src::Weight(_)) || info[1].0 != DType::F32 {
        return Err(check!("weight must be an f32 weight, is {}", info[1].0));
    }
    let wt = info[1].1[0];
    if wt[0] < 2 || wt[2] != 1 || wt[3] != 1 {
        return Err(check!("weight {wt:?} must be [L >= 2, C]"));
    }
    Ok((wt[0], wt[1]))
}

/// The FFN ops' operands: `x` then four weights (`what` names them in the error); their
/// shapes at the first evaluation point.
fn ffn_operands(
    inputs: &[Src],
    info: &[(DType, [[i64; 4]; 5])],
    what: &str,
) -> Result<[[i64; 4]; 5], NodeError> {
    if inputs[1..].iter().any(|s| !matches!(s, Src::Weight(_))) {
        return Err(check!("{what} must be weights"));
    }
    Ok(std::array::from_fn(|i| info[i].1[0]))
}

/// The output shapes of an FFN op: x's, which must be `[e, N]` at every point.
fn like_x(info: &[(DType, [[i64; 4]; 5])], e: i64) -> Result<[[i64; 4]; 5], NodeError> {
    let mut shapes = [[0i64; 4]; 5];
    for (pi, s) in shapes.iter_mut().enumerate() {
        let xs = info[0].1[pi];
        if xs[0] != e || xs[2] != 1 || xs[3] != 1 {
            return Err(check!("x must be [{e}, N], is {xs:?}"));
        }
        *s = xs;
    }
    Ok(shapes)
}
