//! Every operator, declared once: its operands, accepted formats, attributes and shape rule.
//!
//! The schema is the contract between the engine and every backend; the `reference` crate is
//! its executable meaning. Semantics that matter for bit-level agreement with llama.cpp (where
//! activations are quantized, what accumulates in f64) are written on each op, because two
//! correct-looking implementations that differ there produce different greedy text.
//!
//! Append-only: ops get new ids at the end, attributes take unused slots, operands are only
//! ever added as optional trailing ones.

use crate::attrs::*;
use crate::{DType, TensorDesc, MAX_DIMS};

/// Operator ids. `#[repr(u32)]`: they cross the plugin boundary.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    GetRows = 0,
    RmsNorm = 1,
    Rope = 2,
    MatMul = 3,
    Attention = 4,
    SetRows = 5,
    Glu = 6,
    Add = 7,
    Mul = 8,
    Scale = 9,
    Softmax = 10,
    Argmax = 11,
    SsmConv = 12,
    GatedDeltaNet = 13,
    RwkvWkv7 = 14,
    Norm = 15,
    L2Norm = 16,
    TokenShift = 17,
}

impl Op {
    pub const ALL: &'static [Op] = &[
        Op::GetRows,
        Op::RmsNorm,
        Op::Rope,
        Op::MatMul,
        Op::Attention,
        Op::SetRows,
        Op::Glu,
        Op::Add,
        Op::Mul,
        Op::Scale,
        Op::Softmax,
        Op::Argmax,
        Op::SsmConv,
        Op::GatedDeltaNet,
        Op::RwkvWkv7,
        Op::Norm,
        Op::L2Norm,
        Op::TokenShift,
    ];

    pub fn from_id(id: u32) -> Option<Op> {
        Op::ALL.iter().copied().find(|o| *o as u32 == id)
    }

    pub fn schema(self) -> &'static OpSchema {
        &SCHEMAS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.schema().name
    }

    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL
            .iter()
            .copied()
            .find(|o| o.name().eq_ignore_ascii_case(name))
    }
}

/// Attribute storage shared by every op: float and integer slots. Each op's schema names the
/// slots it uses; unused slots must be zero. Fixed size keeps the struct `#[repr(C)]`-stable.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpParams {
    pub f: [f32; 8],
    pub i: [i64; 8],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrKind {
    F32,
    I64,
}

#[derive(Debug)]
pub struct Attr {
    pub name: &'static str,
    pub kind: AttrKind,
    /// Index into `OpParams::f` or `OpParams::i`, by `kind`.
    pub slot: usize,
    pub doc: &'static str,
}

#[derive(Debug)]
pub struct Operand {
    pub name: &'static str,
    pub dtypes: &'static [DType],
    pub doc: &'static str,
    /// May be left off (only trailing inputs are optional): the call passes fewer inputs.
    pub optional: bool,
}

pub type ShapeRule = fn(&[[i64; MAX_DIMS]], &OpParams) -> Result<Vec<[i64; MAX_DIMS]>, String>;

pub struct OpSchema {
    pub op: Op,
    pub name: &'static str,
    pub doc: &'static str,
    pub inputs: &'static [Operand],
    pub outputs: &'static [Operand],
    pub attrs: &'static [Attr],
    /// Output shapes from input shapes and attributes, or why the inputs do not fit together.
    /// It sees the inputs the call passes (optional ones may be missing).
    pub shape_rule: ShapeRule,
}

impl OpSchema {
    /// Inputs every call passes (the optional ones trail them).
    pub fn required_inputs(&self) -> usize {
        self.inputs.iter().filter(|o| !o.optional).count()
    }
}

/// Weight formats a matmul or embedding lookup accepts.
pub const WEIGHT_DTYPES: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::W4G32,
    DType::W4G128,
    DType::W8PC,
];
const F32: &[DType] = &[DType::F32];
const I32: &[DType] = &[DType::I32];
const KV_DTYPES: &[DType] = &[DType::F32, DType::F16];

pub const ROPE_NORMAL: i64 = 0;
/// GPT-NeoX style: rotate pairs `(i, i + n_dims/2)` instead of `(2i, 2i+1)`. ggml's mode bit 2.
pub const ROPE_NEOX: i64 = 2;
pub const GLU_SILU: i64 = 0;
pub const GLU_GELU_TANH: i64 = 1;

macro_rules! operand {
    ($name:expr, $dt:expr, $doc:expr) => {
        Operand {
            name: $name,
            dtypes: $dt,
            doc: $doc,
            optional: false,
        }
    };
    (optional $name:expr, $dt:expr, $doc:expr) => {
        Operand {
            name: $name,
            dtypes: $dt,
            doc: $doc,
            optional: true,
        }
    };
}

type Shapes = Result<Vec<[i64; MAX_DIMS]>, String>;

fn need(cond: bool, msg: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(msg())
    }
}

fn same_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    Ok(vec![s[0]])
}

fn broadcast_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let (a, b) = (s[0], s[1]);
    for d in 0..MAX_DIMS {
        need(b[d] > 0 && a[d] % b[d] == 0, || {
            format!("b dim {d} ({}) does not divide a dim {d} ({})", b[d], a[d])
        })?;
    }
    Ok(vec![a])
}

fn get_rows_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let (table, ids) = (s[0], s[1]);
    need(ids[1] == 1 && ids[2] == 1 && ids[3] == 1, || {
        "ids must be 1-D".into()
    })?;
    need(table[2] == 1 && table[3] == 1, || {
        "table must be 2-D".into()
    })?;
    Ok(vec![[table[0], ids[0], 1, 1]])
}

fn rms_norm_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let (x, w) = (s[0], s[1]);
    need(w[0] == x[0] && w[1] * w[2] * w[3] == 1, || {
        format!("weight must be [{}], got {:?}", x[0], w)
    })?;
    Ok(vec![x])
}

fn rope_shape(s: &[[i64; MAX_DIMS]], p: &OpParams) -> Shapes {
    let (x, pos) = (s[0], s[1]);
    need(pos[0] == x[2] && pos[1] * pos[2] * pos[3] == 1, || {
        format!(
            "positions must be [{}] (one per token), got {:?}",
            x[2], pos
        )
    })?;
    let n_dims = p.i[1];
    need(n_dims > 0 && n_dims % 2 == 0 && n_dims <= x[0], || {
        format!(
            "n_dims {n_dims} must be even and at most the head size {}",
            x[0]
        )
    })?;
    Ok(vec![x])
}

fn matmul_shape(s: &[[i64; MAX_DIMS]], p: &OpParams) -> Shapes {
    let (w, x) = (s[0], s[1]);
    need(w[2] == 1 && w[3] == 1, || "weight must be 2-D".into())?;
    let g = p.i[0];
    let m = x[1].saturating_mul(x[2]).saturating_mul(x[3]);
    need(g == 0 || (g > 0 && m % g == 0), || {
        format!("chain_cols {g} does not divide the {m} columns")
    })?;
    need(w[0] == x[0], || {
        format!("inner sizes differ: weight {} vs input {}", w[0], x[0])
    })?;
    Ok(vec![[w[1], x[1], x[2], x[3]]])
}

fn attention_shape(s: &[[i64; MAX_DIMS]], p: &OpParams) -> Shapes {
    let (q, k, v, pos) = (s[0], s[1], s[2], s[3]);
    need(k == v, || format!("k cache {k:?} and v cache {v:?} differ"))?;
    need(q[0] == k[0], || {
        format!("head size of q ({}) and k ({}) differ", q[0], k[0])
    })?;
    need(k[1] > 0 && q[1] % k[1] == 0, || {
        format!(
            "{} query heads are not a multiple of {} kv heads",
            q[1], k[1]
        )
    })?;
    need(pos[0] == q[2], || {
        format!("positions must be [{}], got {:?}", q[2], pos)
    })?;
    // Rows the sequence can address: the cache itself, or its pages.
    let page = p.i[2];
    let rows = match s.get(4) {
        None => {
            need(page == 0, || {
                format!("page_rows {page} without a block_table")
            })?;
            k[2]
        }
        Some(t) => {
            // One sequence: a 1-D table. Several (the `seqs` operand): one column each.
            let n_seq = s.get(5).map_or(1, |q| q[1]);
            if let Some(q) = s.get(5) {
                need(q[0] == 3 && q[1] > 0 && q[2] * q[3] == 1, || {
                    format!("seqs must be [3, S] with S > 0, got {q:?}")
                })?;
            }
            need(t[1] == n_seq && t[2] * t[3] == 1, || {
                format!("block_table must be [P, {n_seq}] (one column per sequence), got {t:?}")
            })?;
            need(page > 0 && k[2] % page == 0, || {
                format!(
                    "page_rows {page} must be positive and divide the {} cache rows",
                    k[2]
                )
            })?;
            t[0].saturating_mul(page)
        }
    };
    let n_kv = p.i[0];
    need(n_kv > 0 && n_kv <= rows, || {
        format!("n_kv {n_kv} outside the {rows} rows the call can address")
    })?;
    Ok(vec![q])
}

fn set_rows_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let (src, idx, dst) = (s[0], s[1], s[2]);
    need(src[0] == dst[0], || {
        format!("row sizes differ: src {} vs dst {}", src[0], dst[0])
    })?;
    need(idx[0] == src[1], || {
        format!("{} indices for {} rows", idx[0], src[1])
    })?;
    Ok(vec![dst])
}

fn glu_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    need(s[0] == s[1], || {
        format!("gate {:?} and up {:?} differ", s[0], s[1])
    })?;
    Ok(vec![s[0]])
}

fn argmax_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let x = s[0];
    Ok(vec![[x[1], x[2], x[3], 1]])
}

fn ssm_conv_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let (sx, c) = (s[0], s[1]);
    need(sx[3] == 1, || format!("sx must be 3-D, got {sx:?}"))?;
    need(c[2] == 1 && c[3] == 1, || {
        format!("c must be 2-D, got {c:?}")
    })?;
    need(c[1] == sx[1], || {
        format!("c has {} channels, sx has {}", c[1], sx[1])
    })?;
    need(c[0] >= 1, || {
        format!("c has {} taps, at least 1 needed", c[0])
    })?;
    need(sx[0] >= c[0], || {
        format!(
            "the window ({} columns of sx) is shorter than the {} taps of c",
            sx[0], c[0]
        )
    })?;
    Ok(vec![[sx[1], sx[0] - c[0] + 1, sx[2], 1]])
}

fn gated_delta_net_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let (q, k, v, g, beta, state) = (s[0], s[1], s[2], s[3], s[4], s[5]);
    let [n, h, t, seqs] = v;
    need(q == k, || format!("q {q:?} and k {k:?} differ"))?;
    need(q[0] == n, || {
        format!("head size of q and k ({}) and of v ({n}) differ", q[0])
    })?;
    need(q[1] > 0 && h % q[1] == 0, || {
        format!("{h} v heads are not a multiple of {} q/k heads", q[1])
    })?;
    need(q[2] == t && q[3] == seqs, || {
        format!(
            "q and k have {} tokens of {} sequences, v has {t} of {seqs}",
            q[2], q[3]
        )
    })?;
    need((g[0] == 1 || g[0] == n) && g[1..] == [h, t, seqs], || {
        format!("g must be [1, {h}, {t}, {seqs}] (or [{n}, {h}, {t}, {seqs}]: a gate per key), got {g:?}")
    })?;
    need(beta == [1, h, t, seqs], || {
        format!("beta must be [1, {h}, {t}, {seqs}], got {beta:?}")
    })?;
    need(state == [n, n, h, seqs], || {
        format!("state must be [{n}, {n}, {h}, {seqs}], got {state:?}")
    })?;
    Ok(vec![v, state])
}

fn rwkv_wkv7_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let names = ["r", "w", "k", "v", "a", "b"];
    let x = s[0];
    let [n, h, _, seqs] = x;
    for (i, name) in names.iter().enumerate().skip(1) {
        let y = s[i];
        need(y == x, || format!("{name} {y:?} and r {x:?} differ"))?;
    }
    let state = s[6];
    need(state == [n, n, h, seqs], || {
        format!("state must be [{n}, {n}, {h}, {seqs}], got {state:?}")
    })?;
    Ok(vec![x, state])
}

fn norm_shape(s: &[[i64; MAX_DIMS]], p: &OpParams) -> Shapes {
    let (x, w, b) = (s[0], s[1], s[2]);
    for (name, t) in [("weight", w), ("bias", b)] {
        need(t[0] == x[0] && t[1] * t[2] * t[3] == 1, || {
            format!("{name} must be [{}], got {t:?}", x[0])
        })?;
    }
    let g = NormAttrs::from_params(p).group_len(x[0]);
    need(g > 0 && x[0] % g == 0, || {
        format!("group {g} must be positive and divide the row of {}", x[0])
    })?;
    Ok(vec![x])
}

fn token_shift_shape(s: &[[i64; MAX_DIMS]], _: &OpParams) -> Shapes {
    let (x, state) = (s[0], s[1]);
    let [e, _, seqs, rest] = x;
    need(rest == 1, || format!("x must be 3-D [E, T, S], got {x:?}"))?;
    need(state == [e, seqs, 1, 1], || {
        format!("state must be [{e}, {seqs}], got {state:?}")
    })?;
    Ok(vec![x, state])
}

/// Indexed by `Op as usize`; a test checks the order.
pub static SCHEMAS: [OpSchema; 18] = [
    OpSchema {
        op: Op::GetRows,
        name: "get_rows",
        doc: "out[:, m] = dequantize(table[:, ids[m]]). Embedding lookup; exact dequantization.",
        inputs: &[
            operand!("table", WEIGHT_DTYPES, "[K, V] rows to pick from"),
            operand!("ids", I32, "[M] row indices, each in 0..V"),
        ],
        outputs: &[operand!("out", F32, "[K, M]")],
        attrs: &[],
        shape_rule: get_rows_shape,
    },
    OpSchema {
        op: Op::RmsNorm,
        name: "rms_norm",
        doc: "Per row of ne[0]: y = (x * 1/sqrt(mean(x^2) + eps)) * w. The sum of squares \
              accumulates in f64 (as ggml does); the scale is computed in f32.",
        inputs: &[
            operand!("x", F32, "[K, ...] rows to normalize"),
            operand!("weight", F32, "[K] per-channel gain"),
        ],
        outputs: &[operand!("out", F32, "same shape as x")],
        attrs: RmsNormAttrs::ATTRS,
        shape_rule: rms_norm_shape,
    },
    OpSchema {
        op: Op::Rope,
        name: "rope",
        doc: "Rotary position embedding on x [D, H, T], token t at positions[t]. The first \
              n_dims of each head rotate; the rest pass through. theta_i = pos * \
              freq_scale * base^(-2i/n_dims), with ggml's YaRN ramp when ext_factor != 0; \
              the per-dimension theta is formed by repeated f32 multiplication by \
              base^(-2/n_dims), as ggml's rope cache does.",
        inputs: &[
            operand!("x", F32, "[D, H, T]"),
            operand!("positions", I32, "[T]"),
        ],
        outputs: &[operand!("out", F32, "[D, H, T]")],
        attrs: RopeAttrs::ATTRS,
        shape_rule: rope_shape,
    },
    OpSchema {
        op: Op::MatMul,
        name: "mat_mul",
        doc: "out[n, m] = dot(w[:, n], x[:, m]). Activations are first converted per row to \
              the weight's dot format, exactly as ggml's CPU backend does: Q4_0/Q5_0/Q8_0 -> \
              Q8_0; Q4_1/Q5_1 -> Q8_1; K-quants -> Q8_K; F16 -> F16; BF16 -> BF16; F32 stays \
              F32. Integer block dot products are exact; per-block scaling and the sum over \
              blocks are f32. Which of ggml's chains computes a column (vec_dot, tinyBLAS, \
              repacked GEMM/GEMV, tiled) depends on the call's column count M, as in ggml; \
              chain_cols = g > 0 computes the columns as independent calls of g columns each \
              (column c takes the chain of column c % g of a g-column call; g divides M), so \
              one call can serve the single tokens of many sequences with the chain each would \
              get alone (batch invariance).",
        inputs: &[
            operand!("w", WEIGHT_DTYPES, "[K, N] weight, one row per output"),
            operand!("x", F32, "[K, M, ...] activations"),
        ],
        outputs: &[operand!("out", F32, "[N, M, ...]")],
        attrs: MatMulAttrs::ATTRS,
        shape_rule: matmul_shape,
    },
    OpSchema {
        op: Op::Attention,
        name: "attention",
        doc: "Causal multi-head attention of queries q [D, Hq, T] over cache rows 0..n_kv of k \
              and v [D, Hkv, C]; query head h reads kv head h / (Hq/Hkv) (GQA). With a \
              block_table the caches are a pool of pages of page_rows rows and the sequence's \
              row j is pool row block_table[j / page_rows] * page_rows + j % page_rows (its \
              C is then len(block_table) * page_rows); results equal the unpaged call on the \
              gathered rows. With seqs (ABI 1.4) the call holds S sequences: sequence s has \
              queries seqs[0, s] .. seqs[0, s] + seqs[1, s] (in order, together 0..T), its \
              own n_kv = seqs[2, s] (at most the n_kv attribute) and block table column s, \
              and its results equal the one-sequence call with those. Query t sees \
              cache row j iff j <= positions[t] and (window == 0 or positions[t] - j < window). \
              s_j = dot(k_j, q) (f32; with an f16 cache q is rounded to f16 first); if \
              softcap > 0, s = softcap * tanh(s / softcap); then s = s * scale (this order is \
              llama.cpp's); p = softmax(s) with the \
              exponent sum in f64; out = sum_j p_j v_j (with an f16 cache p is rounded to f16 \
              first). This is ggml's non-flash-attention path.",
        inputs: &[
            operand!("q", F32, "[D, Hq, T]"),
            operand!("k_cache", KV_DTYPES, "[D, Hkv, C]"),
            operand!("v_cache", KV_DTYPES, "[D, Hkv, C]"),
            operand!(
                "positions",
                I32,
                "[T] absolute position of each query = its cache row"
            ),
            operand!(
                optional "block_table",
                I32,
                "[P] pool page of each page of the sequence (ABI 1.2); [P, S] with seqs"
            ),
            operand!(
                optional "seqs",
                I32,
                "[3, S] first query, query count and n_kv of each sequence (ABI 1.4)"
            ),
        ],
        outputs: &[operand!("out", F32, "[D, Hq, T]")],
        attrs: AttentionAttrs::ATTRS,
        shape_rule: attention_shape,
    },
    OpSchema {
        op: Op::SetRows,
        name: "set_rows",
        doc: "dst[:, idx[m]] = convert(src[:, m]). Writes keys/values into a cache; rounding \
              to f16 is round-to-nearest-even. dst is both read and written: rows not named \
              keep their contents.",
        inputs: &[
            operand!("src", F32, "[K, M]"),
            operand!("idx", I32, "[M] destination rows"),
            operand!("dst", KV_DTYPES, "[K, R] (same tensor as the output)"),
        ],
        outputs: &[operand!("dst", KV_DTYPES, "[K, R], updated in place")],
        attrs: &[],
        shape_rule: set_rows_shape,
    },
    OpSchema {
        op: Op::Glu,
        name: "glu",
        doc: "Gated activation: out = act(gate) * up. silu(x) = x / (1 + exp(-x)); \
              gelu_tanh(x) = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))).",
        inputs: &[
            operand!("gate", F32, "[K, ...]"),
            operand!("up", F32, "same shape"),
        ],
        outputs: &[operand!("out", F32, "same shape")],
        attrs: GluAttrs::ATTRS,
        shape_rule: glu_shape,
    },
    OpSchema {
        op: Op::Add,
        name: "add",
        doc: "out = a + b, b broadcast over a (each b dim divides a's).",
        inputs: &[
            operand!("a", F32, "any"),
            operand!("b", F32, "broadcastable to a"),
        ],
        outputs: &[operand!("out", F32, "shape of a")],
        attrs: &[],
        shape_rule: broadcast_shape,
    },
    OpSchema {
        op: Op::Mul,
        name: "mul",
        doc: "out = a * b, b broadcast over a (each b dim divides a's).",
        inputs: &[
            operand!("a", F32, "any"),
            operand!("b", F32, "broadcastable to a"),
        ],
        outputs: &[operand!("out", F32, "shape of a")],
        attrs: &[],
        shape_rule: broadcast_shape,
    },
    OpSchema {
        op: Op::Scale,
        name: "scale",
        doc: "out = x * s.",
        inputs: &[operand!("x", F32, "any")],
        outputs: &[operand!("out", F32, "same shape")],
        attrs: ScaleAttrs::ATTRS,
        shape_rule: same_shape,
    },
    OpSchema {
        op: Op::Softmax,
        name: "softmax",
        doc: "Per row: p = exp(x*scale - max) / sum, the sum accumulated in f64.",
        inputs: &[operand!("x", F32, "[K, ...]")],
        outputs: &[operand!("out", F32, "same shape")],
        attrs: SoftmaxAttrs::ATTRS,
        shape_rule: same_shape,
    },
    OpSchema {
        op: Op::Argmax,
        name: "argmax",
        doc: "Per row: index of the largest value; the first one on ties; NaN is never chosen \
              unless the whole row is NaN (then 0). Exact.",
        inputs: &[operand!("x", F32, "[K, M, ...]")],
        outputs: &[operand!("out", I32, "[M, ...]")],
        attrs: &[],
        shape_rule: argmax_shape,
    },
    OpSchema {
        op: Op::SsmConv,
        name: "ssm_conv",
        doc: "Depthwise causal convolution (ggml_ssm_conv: Mamba, Qwen3.5's linear attention, \
              LFM2's short convolution): out[i, t, s] = sum over j in 0..L of sx[t + j, i, s] * \
              c[j, i]; sx holds each channel's L-1 columns of state followed by its T new \
              columns. No bias. The sum is f32 from +0, over j in order, as llama.cpp's \
              AVX-512 build compiles it (read from its binary: groups of 8 taps while 8 remain, \
              then one of 4, vectorized; the rest scalar and contracted): the first L - L mod 4 \
              taps add their rounded products one by one, the last L mod 4 are fused, acc = \
              fma(sx, c, acc). So L = 4 (Qwen3.5) is (((0 + p0) + p1) + p2) + p3, L = 3 (LFM2) \
              three fmas from 0.",
        inputs: &[
            operand!(
                "sx",
                F32,
                "[L-1+T, N, S] per channel and sequence: the state, then the new columns"
            ),
            operand!("c", F32, "[L, N] the L taps of each of the N channels"),
        ],
        outputs: &[operand!("out", F32, "[N, T, S]")],
        attrs: &[],
        shape_rule: ssm_conv_shape,
    },
    OpSchema {
        op: Op::GatedDeltaNet,
        name: "gated_delta_net",
        doc: "Gated delta rule, one token after another (ggml_gated_delta_net with K = 1: \
              Qwen3.5's and Qwen3-Next's linear attention). Per sequence s and v head h, M is \
              the state block state[:, :, h, s] (M[j][i] = state[i, j, h, s]: key index i \
              fastest, value index j); q and k are q/k head h mod Hq (tiled: Hq divides H). \
              For each token t: M *= expf(g) (every element, one f32 multiply; with a gate per \
              key, column i by expf(g[i])); d[j] = (v[j] - dot(M[j], k)) * beta (two \
              roundings); M[j][i] = fma(k[i], d[j], M[j][i]) (fused at every i); o[j, h, t, s] \
              = dot(M[j], q) * (1/sqrtf(N)) (q is not scaled first). dot is ggml_vec_dot_f32 \
              as llama.cpp's AVX-512 build compiles it (read from its binary): 4 x 16 fused \
              accumulators over 64-element steps, reduced as GGML_F32x16_REDUCE, then the \
              leftovers from that sum: their rounded products added one by one except the \
              last N mod 4, which are fused. new_state is M after the last token (T = 0: the \
              state as it was). new_state may be the state operand itself (updated in place); \
              no other operands may overlap. The work splits by (head, sequence), so the \
              result does not depend on the thread count.",
        inputs: &[
            operand!(
                "q",
                F32,
                "[N, Hq, T, S] queries (N: head size; S: sequences)"
            ),
            operand!("k", F32, "[N, Hq, T, S] keys (the shape of q)"),
            operand!("v", F32, "[N, H, T, S] values: H heads, a multiple of Hq"),
            operand!(
                "g",
                F32,
                "[1, H, T, S] log decay per head and token, or [N, H, T, S]: one per key (KDA)"
            ),
            operand!(
                "beta",
                F32,
                "[1, H, T, S] write strength per head and token"
            ),
            operand!(
                "state",
                F32,
                "[N, N, H, S] each head's state before the first token"
            ),
        ],
        outputs: &[
            operand!("out", F32, "[N, H, T, S] the output o"),
            operand!(
                "new_state",
                F32,
                "[N, N, H, S] each head's state after the last token"
            ),
        ],
        attrs: &[],
        shape_rule: gated_delta_net_shape,
    },
    OpSchema {
        op: Op::RwkvWkv7,
        name: "rwkv_wkv7",
        doc: "RWKV-7's generalized delta rule, one token after another (ggml_rwkv_wkv7: the \
              RWKV7 architecture's time mixing). Per sequence s and head h, M is the state \
              block state[:, :, h, s] (M[i][j] = state[j, i, h, s]: key index j fastest, row i \
              the value/output index; ggml's state row h*N*N + i*N + j of sequence s). r, w, \
              k, v, a, b [N, H, T, S] are ggml's [N, H, T*S] tensors with token t of sequence \
              s at t + s*T (ggml's sequence of a token is its index / T); out [N, H, T, S] is \
              the first N*H*T*S floats of ggml's result and new_state its state rows. For \
              each token and each row i (all from the row before the token): sa = dot(a, \
              M[i]); M[i][j] = fma(sa, b[j], fma(M[i][j], w[j], v[i]*k[j])) (v[i]*k[j] \
              rounded, then two fused steps); out[i] = dot(M[i], r) over the new row. dot is \
              the AVX-512 build's GGML_F32 loop: 4 x 16 fused accumulators over 64-element \
              steps, reduced as GGML_F32x16_REDUCE (ggml_vec_dot_f32's order); the N mod 64 \
              leftovers (llama.cpp supports only N a multiple of 64: RWKV-7 has 64) are \
              defined here as fused into that sum one by one, in order, and updated like the \
              rest. w is the decay itself (the model's exp(-exp(.)) is computed before). \
              new_state is M after the last token (T = 0: the state as it was). new_state \
              may be the state operand itself (updated in place); no other operands may \
              overlap. The work splits by (head, sequence), so the result does not depend \
              on the thread count.",
        inputs: &[
            operand!(
                "r",
                F32,
                "[N, H, T, S] receptance (N: head size; S: sequences)"
            ),
            operand!(
                "w",
                F32,
                "[N, H, T, S] decay per key (multiplies the state)"
            ),
            operand!("k", F32, "[N, H, T, S] keys"),
            operand!("v", F32, "[N, H, T, S] values"),
            operand!(
                "a",
                F32,
                "[N, H, T, S] in-context learning rate side: sa = dot(a, M[i])"
            ),
            operand!(
                "b",
                F32,
                "[N, H, T, S] what sa writes: M[i][j] += sa * b[j]"
            ),
            operand!(
                "state",
                F32,
                "[N, N, H, S] each head's state before the first token"
            ),
        ],
        outputs: &[
            operand!("out", F32, "[N, H, T, S] the output"),
            operand!(
                "new_state",
                F32,
                "[N, N, H, S] each head's state after the last token"
            ),
        ],
        attrs: &[],
        shape_rule: rwkv_wkv7_shape,
    },
    OpSchema {
        op: Op::Norm,
        name: "norm",
        doc: "LayerNorm, or group norm (RWKV-7's ln_x over each head): each group of `group` \
              values of a row (the whole row for 0) normalized as ggml_norm, then times weight \
              and plus bias (ggml_mul, then ggml_add: two roundings). ggml_norm as the AVX-512 \
              build computes it: mean = (float)(f64 sum of the values) / n; then each \
              16-block's x - mean stored and its rounded squares added by \
              _mm512_reduce_add_ps (lanes 8-15 onto 0-7, then 4-7 onto 0-3, then (0+2)+(1+3)) \
              into an f64 sum, the tail's squares one at a time; var = (float)(sum / n); the \
              centred values times 1/sqrtf(var + eps).",
        inputs: &[
            operand!("x", F32, "[K, ...] rows of K values, in groups of `group`"),
            operand!("weight", F32, "[K] gain per value of a row"),
            operand!("bias", F32, "[K] added after the gain"),
        ],
        outputs: &[operand!("out", F32, "same shape as x")],
        attrs: NormAttrs::ATTRS,
        shape_rule: norm_shape,
    },
    OpSchema {
        op: Op::L2Norm,
        name: "l2_norm",
        doc: "Per row of ne[0] (ggml_l2_norm: RWKV-7's key normalization): the squares, each \
              rounded to f32, summed in f64 in order; y = x * (1 / fmaxf(sqrtf((float)sum), \
              eps)).",
        inputs: &[operand!("x", F32, "[K, ...] rows to normalize")],
        outputs: &[operand!("out", F32, "same shape as x")],
        attrs: L2NormAttrs::ATTRS,
        shape_rule: same_shape,
    },
    OpSchema {
        op: Op::TokenShift,
        name: "token_shift",
        doc: "RWKV's token shift with its state (llama.cpp's concat of the saved column and \
              the step's columns, then ggml_sub): out[:, t, s] = x[:, t - 1, s] - x[:, t, s], \
              where column -1 is state[:, s] (the sequence's last column of its step before, \
              zero for a new one); new_state[:, s] = x[:, T - 1, s] (T = 0: the state as it \
              was). Exact: one f32 subtraction per value. new_state may be the state operand \
              itself (updated in place); no other operands may overlap.",
        inputs: &[
            operand!("x", F32, "[E, T, S] the step's columns per sequence"),
            operand!(
                "state",
                F32,
                "[E, S] each sequence's column before its first"
            ),
        ],
        outputs: &[
            operand!("out", F32, "[E, T, S] previous column minus the column"),
            operand!("new_state", F32, "[E, S] each sequence's last column"),
        ],
        attrs: &[],
        shape_rule: token_shift_shape,
    },
];

/// Checks a call against its schema: operand counts, formats, attribute hygiene and shapes.
/// Backends and the engine run the same check, so a malformed call is refused the same way
/// everywhere.
pub fn validate(
    op: Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    params: &OpParams,
) -> Result<(), String> {
    let s = op.schema();
    let (lo, hi) = (s.required_inputs(), s.inputs.len());
    if !(lo..=hi).contains(&inputs.len()) || outputs.len() != s.outputs.len() {
        let want = if lo == hi {
            format!("{hi}")
        } else {
            format!("{lo} to {hi}")
        };
        return Err(format!(
            "{}: expects {want} inputs and {} outputs, got {} and {}",
            s.name,
            s.outputs.len(),
            inputs.len(),
            outputs.len()
        ));
    }
    for (kind, descs, decl) in [("input", inputs, s.inputs), ("output", outputs, s.outputs)] {
        for (t, o) in descs.iter().zip(decl) {
            let dt = t.dtype().ok_or_else(|| {
                format!(
                    "{}: {kind} '{}' has unknown dtype id {}",
                    s.name, o.name, t.dtype
                )
            })?;
            if !o.dtypes.contains(&dt) {
                return Err(format!(
                    "{}: {kind} '{}' does not accept {dt}",
                    s.name, o.name
                ));
            }
            if t.numel().is_none() || t.ne[0] % dt.info().block_len as i64 != 0 {
                return Err(format!(
                    "{}: {kind} '{}' has bad shape {:?}",
                    s.name, o.name, t.ne
                ));
            }
        }
    }
    let shapes: Vec<[i64; MAX_DIMS]> = inputs.iter().map(|t| t.ne).collect();
    let want = (s.shape_rule)(&shapes, params).map_err(|e| format!("{}: {e}", s.name))?;
    for ((t, o), w) in outputs.iter().zip(s.outputs).zip(want) {
        if t.ne != w {
            return Err(format!(
                "{}: output '{}' has shape {:?}, the inputs give {:?}",
                s.name, o.name, t.ne, w
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_table_is_indexed_by_op_and_names_are_unique() {
        for (i, s) in SCHEMAS.iter().enumerate() {
            assert_eq!(s.op as usize, i, "{} out of order", s.name);
            assert_eq!(Op::from_name(s.name), Some(s.op));
            assert_eq!(Op::from_id(i as u32), Some(s.op));
        }
        assert_eq!(Op::ALL.len(), SCHEMAS.len());
    }

    #[test]
    fn attr_slots_do_not_collide() {
        for s in &SCHEMAS {
            for (i, a) in s.attrs.iter().enumerate() {
                for b in &s.attrs[i + 1..] {
                    assert!(
                        !(a.kind == b.kind && a.slot == b.slot),
                        "{}: {} vs {}",
                        s.name,
                        a.name,
                        b.name
                    );
                }
            }
        }
    }

    fn desc(dt: DType, shape: &[i64]) -> TensorDesc {
        TensorDesc::contiguous(core::ptr::null_mut(), dt, shape)
    }

    #[test]
    fn validate_catches_shape_and_dtype_errors() {
        let w = desc(DType::Q4_0, &[64, 10]);
        let x = desc(DType::F32, &[64, 3]);
        let good = desc(DType::F32, &[10, 3]);
        let p = OpParams::default();
        assert!(validate(Op::MatMul, &[w, x], &[good], &p).is_ok());
        let bad_out = desc(DType::F32, &[10, 4]);
        let e = validate(Op::MatMul, &[w, x], &[bad_out], &p).unwrap_err();
        assert!(e.contains("shape"), "{e}");
        let x_wrong = desc(DType::F32, &[32, 3]);
        assert!(validate(Op::MatMul, &[w, x_wrong], &[good], &p)
            .unwrap_err()
            .contains("inner"));
        let x_q = desc(DType::Q8_0, &[64, 3]);
        assert!(validate(Op::MatMul, &[w, x_q], &[good], &p)
            .unwrap_err()
            .contains("accept"));
        let mut unknown = x;
        unknown.dtype = 999;
        assert!(validate(Op::MatMul, &[w, unknown], &[good], &p)
            .unwrap_err()
            .contains("999"));
        // ssm_conv: L = 4 taps, T = 7 new columns, N = 5 channels, S = 2 sequences.
        let sx = desc(DType::F32, &[10, 5, 2]);
        let c = desc(DType::F32, &[4, 5]);
        let out = desc(DType::F32, &[5, 7, 2]);
        assert!(validate(Op::SsmConv, &[sx, c], &[out], &p).is_ok());
        // A window exactly L wide: one column out (a decode step).
        let one = desc(DType::F32, &[4, 5, 2]);
        let out1 = desc(DType::F32, &[5, 1, 2]);
        assert!(validate(Op::SsmConv, &[one, c], &[out1], &p).is_ok());
        let e = validate(Op::SsmConv, &[sx, c], &[desc(DType::F32, &[5, 6, 2])], &p).unwrap_err();
        assert!(e.contains("shape"), "{e}");
        let c6 = desc(DType::F32, &[4, 6]);
        let e = validate(Op::SsmConv, &[sx, c6], &[out], &p).unwrap_err();
        assert!(e.contains("channels"), "{e}");
        let short = desc(DType::F32, &[3, 5, 2]);
        let e = validate(Op::SsmConv, &[short, c], &[out1], &p).unwrap_err();
        assert!(e.contains("shorter"), "{e}");
        let e = validate(Op::SsmConv, &[sx, desc(DType::F32, &[0, 5])], &[out], &p).unwrap_err();
        assert!(e.contains("taps"), "{e}");
        let c3d = desc(DType::F32, &[4, 5, 2]);
        let e = validate(Op::SsmConv, &[sx, c3d], &[out], &p).unwrap_err();
        assert!(e.contains("2-D"), "{e}");
        let sx4d = desc(DType::F32, &[10, 5, 2, 2]);
        let e = validate(Op::SsmConv, &[sx4d, c], &[out], &p).unwrap_err();
        assert!(e.contains("3-D"), "{e}");
        let c16 = desc(DType::F16, &[4, 5]);
        let e = validate(Op::SsmConv, &[sx, c16], &[out], &p).unwrap_err();
        assert!(e.contains("accept"), "{e}");
    }

    /// norm: weight and bias of the row's length, a group that divides it; l2_norm any rows;
    /// token_shift: a state column per sequence.
    #[test]
    fn norm_and_token_shift_shapes() {
        let f = |s: &[i64]| desc(DType::F32, s);
        let (x, w) = (f(&[8, 3]), f(&[8]));
        let p = |group| NormAttrs { eps: 1e-5, group }.to_params();
        assert!(validate(Op::Norm, &[x, w, w], &[x], &p(0)).is_ok());
        assert!(validate(Op::Norm, &[x, w, w], &[x], &p(4)).is_ok());
        let e = validate(Op::Norm, &[x, w, w], &[x], &p(3)).unwrap_err();
        assert!(e.contains("group 3"), "{e}");
        let e = validate(Op::Norm, &[x, w, w], &[x], &p(-1)).unwrap_err();
        assert!(e.contains("positive"), "{e}");
        let e = validate(Op::Norm, &[x, w, f(&[4])], &[x], &p(0)).unwrap_err();
        assert!(e.contains("bias must be [8]"), "{e}");
        let l2 = L2NormAttrs { eps: 1e-12 }.to_params();
        assert!(validate(Op::L2Norm, &[x], &[x], &l2).is_ok());
        let q = OpParams::default();
        let (xs, st) = (f(&[8, 3, 2]), f(&[8, 2]));
        assert!(validate(Op::TokenShift, &[xs, st], &[xs, st], &q).is_ok());
        let e = validate(Op::TokenShift, &[xs, f(&[8, 3])], &[xs, f(&[8, 3])], &q).unwrap_err();
        assert!(e.contains("state must be [8, 2]"), "{e}");
        let e = validate(Op::TokenShift, &[f(&[8, 3, 2, 2]), st], &[xs, st], &q).unwrap_err();
        assert!(e.contains("3-D"), "{e}");
    }

    /// gated_delta_net: head size 8, 4 v heads over 2 q/k heads, 3 tokens of 2 sequences.
    #[test]
    fn gated_delta_net_shapes() {
        let p = OpParams::default();
        let f = |s: &[i64]| desc(DType::F32, s);
        let (q, v, g, beta, st) = (
            f(&[8, 2, 3, 2]),
            f(&[8, 4, 3, 2]),
            f(&[1, 4, 3, 2]),
            f(&[1, 4, 3, 2]),
            f(&[8, 8, 4, 2]),
        );
        let ins = [q, q, v, g, beta, st];
        let outs = [v, st];
        let check =
            |ins: &[TensorDesc], outs: &[TensorDesc]| validate(Op::GatedDeltaNet, ins, outs, &p);
        assert!(check(&ins, &outs).is_ok());
        assert_eq!(
            (Op::GatedDeltaNet.schema().shape_rule)(&ins.map(|t| t.ne), &p),
            Ok(vec![v.ne, st.ne])
        );
        // A gate per key (KDA), and q/k with as many heads as v.
        let mut kda = ins;
        kda[3] = f(&[8, 4, 3, 2]);
        assert!(check(&kda, &outs).is_ok());
        let mut full = ins;
        (full[0], full[1]) = (v, v);
        assert!(check(&full, &outs).is_ok());
        // One output is not enough: o and the new state.
        let e = check(&ins, &outs[..1]).unwrap_err();
        assert!(e.contains("2 outputs"), "{e}");
        let bad = |i: usize, t: TensorDesc, what: &str| {
            let mut x = ins;
            x[i] = t;
            let e = check(&x, &outs).unwrap_err();
            assert!(e.contains(what), "input {i}: {e}");
        };
        bad(1, f(&[8, 1, 3, 2]), "differ");
        bad(0, f(&[8, 3, 3, 2]), "differ");
        let mut three = ins;
        (three[0], three[1]) = (f(&[8, 3, 3, 2]), f(&[8, 3, 3, 2]));
        let e = check(&three, &outs).unwrap_err();
        assert!(e.contains("not a multiple of 3"), "{e}");
        let mut wide = ins;
        (wide[0], wide[1]) = (f(&[16, 2, 3, 2]), f(&[16, 2, 3, 2]));
        let e = check(&wide, &outs).unwrap_err();
        assert!(e.contains("head size"), "{e}");
        let mut short = ins;
        (short[0], short[1]) = (f(&[8, 2, 2, 2]), f(&[8, 2, 2, 2]));
        let e = check(&short, &outs).unwrap_err();
        assert!(e.contains("tokens"), "{e}");
        bad(3, f(&[2, 4, 3, 2]), "g must be");
        bad(3, f(&[1, 4, 3, 1]), "g must be");
        bad(4, f(&[8, 4, 3, 2]), "beta must be");
        bad(5, f(&[8, 8, 4, 1]), "state must be");
        bad(5, f(&[8, 4, 4, 2]), "state must be");
        bad(2, desc(DType::F16, &[8, 4, 3, 2]), "accept");
        let e = check(&ins, &[v, f(&[8, 8, 4, 1])]).unwrap_err();
        assert!(e.contains("new_state"), "{e}");
        let e = check(&ins, &[f(&[8, 4, 3, 1]), st]).unwrap_err();
        assert!(e.contains("'out'"), "{e}");
    }

    /// rwkv_wkv7: head size 8, 3 heads, 4 tokens of 2 sequences.
    #[test]
    fn rwkv_wkv7_shapes() {
        let p = OpParams::default();
        let f = |s: &[i64]| desc(DType::F32, s);
        let (x, st) = (f(&[8, 3, 4, 2]), f(&[8, 8, 3, 2]));
        let ins = [x, x, x, x, x, x, st];
        let outs = [x, st];
        let check = |ins: &[TensorDesc], outs: &[TensorDesc]| validate(Op::RwkvWkv7, ins, outs, &p);
        assert!(check(&ins, &outs).is_ok());
        assert_eq!(
            (Op::RwkvWkv7.schema().shape_rule)(&ins.map(|t| t.ne), &p),
            Ok(vec![x.ne, st.ne])
        );
        // No tokens: the state passes through.
        let none = f(&[8, 3, 0, 2]);
        assert!(check(&[none, none, none, none, none, none, st], &[none, st]).is_ok());
        let e = check(&ins, &outs[..1]).unwrap_err();
        assert!(e.contains("2 outputs"), "{e}");
        for (i, name) in ["w", "k", "v", "a", "b"].iter().enumerate() {
            let mut y = ins;
            y[i + 1] = f(&[8, 3, 3, 2]);
            let e = check(&y, &outs).unwrap_err();
            assert!(
                e.contains(&format!("{name} ")) && e.contains("differ"),
                "{e}"
            );
        }
        let bad = |i: usize, t: TensorDesc, what: &str| {
            let mut y = ins;
            y[i] = t;
            let e = check(&y, &outs).unwrap_err();
            assert!(e.contains(what), "input {i}: {e}");
        };
        bad(6, f(&[8, 8, 3, 1]), "state must be");
        bad(6, f(&[8, 4, 3, 2]), "state must be");
        bad(6, f(&[8, 8, 2, 2]), "state must be");
        bad(3, desc(DType::F16, &[8, 3, 4, 2]), "accept");
        let e = check(&ins, &[x, f(&[8, 8, 3, 1])]).unwrap_err();
        assert!(e.contains("new_state"), "{e}");
        let e = check(&ins, &[f(&[8, 3, 4, 1]), st]).unwrap_err();
        assert!(e.contains("'out'"), "{e}");
    }
}
