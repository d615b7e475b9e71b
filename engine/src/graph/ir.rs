//! The graph file: what a `.mollm` package carries and what the builders produce. Plain data
//! (JSON), versioned; [`super::compile`] turns it into a checked [`super::Program`].
//!
//! Operand references are strings: `$tokens`, `$positions`, `$token_types`, `$out_ids` (the
//! step's inputs),
//! `@<name>` (a weight of the model file, by tensor name), or the name of an earlier node.
//! Attributes are named as in the ABI schema of the op (`eps`, `freq_base`, ...), numbers in
//! JSON; graph-level ops (`reshape`, `kv_attention`, `moe_ffn`, `shared_expert`, `short_conv`,
//! `causal_conv`, `delta_net`, `rows`, `sigmoid`, RWKV-7's `token_shift`,
//! `lerp`, `tanh`, `relu_sqr` and `rwkv7_time_mix`) declare theirs in
//! [`GRAPH_OPS`]. Dimensions are expressions (see [`super::dim`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::error::GraphError;

/// Bumped on any change an older mollm cannot run; a newer version is refused by name.
pub const GRAPH_VERSION: u32 = 1;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GraphFile {
    pub version: u32,
    /// Provenance only (the model family it was built for): nothing selects code by it.
    pub arch: String,
    /// Named hyper-parameters dimension expressions may use.
    pub consts: BTreeMap<String, i64>,
    /// KV cache geometry, one entry per cached attention layer: `[head_dim, n_head_kv]`.
    pub kv_layers: Vec<[i64; 2]>,
    /// Recurrent state each sequence owns, one entry per state its recurrent layers keep: the
    /// number of f32 values (a short convolution's window, a recurrence's matrix).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<i64>,
    pub nodes: Vec<NodeDef>,
    /// File tensors the architecture requires and never reads (RWKV-7's layer-0 value-mix
    /// LoRA, which llama.cpp loads and ignores): binding accepts them unused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unused: Vec<String>,
    /// The node whose value is the logits `[n_vocab, O]`; an embedding model's (BERT, which
    /// has no logits) is its `embd`.
    pub output: String,
    /// The node whose value is the final hidden states `[n_embd, O]` of the output rows: what
    /// embeddings pool (after the final norm, as llama.cpp's `t_embd`). Empty where the graph
    /// has none (an older package).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub embd: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeDef {
    /// Unique within the graph; traces and errors use it.
    pub name: String,
    /// An ABI op name (`mat_mul`, `rms_norm`, ...) or a graph op of [`GRAPH_OPS`].
    pub op: String,
    pub inputs: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, f64>,
    /// `reshape` only: the target shape, ggml order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shape: Vec<String>,
}

/// A graph-level op: what the executor does itself around ABI calls.
pub struct GraphOp {
    pub name: &'static str,
    /// Its operands; the last `optional` of them may be left out.
    pub inputs: &'static [&'static str],
    pub optional: usize,
    /// Its attributes; those of `defaults` may be left out and take the value given there.
    pub attrs: &'static [&'static str],
    pub defaults: &'static [(&'static str, f64)],
    pub doc: &'static str,
}

pub const GRAPH_OPS: &[GraphOp] = &[
    GraphOp {
        name: "reshape",
        inputs: &["x"],
        optional: 0,
        attrs: &[],
        defaults: &[],
        doc: "A view of x with the node's `shape` (same element count, same memory).",
    },
    GraphOp {
        name: "kv_attention",
        inputs: &["q", "k", "v"],
        optional: 0,
        attrs: &["layer", "window", "scale", "softcap", "causal"],
        defaults: &[("causal", 1.0)],
        doc: "Stores this step's k and v [D, Hkv, T] in cache layer `layer` of each token's \
              sequence at the token's position, then runs the ABI attention of q [D, Hq, T] \
              over that sequence's cache; out [D*Hq, T]. causal = 0 (an encoder's, BERT's): \
              every query sees all of its sequence's rows, so a sequence must come whole in \
              one step.",
    },
    GraphOp {
        name: "moe_ffn",
        inputs: &["x", "router", "gate", "up", "down", "selection_bias"],
        optional: 1,
        attrs: &["n_used", "norm_weights", "act", "gating"],
        defaults: &[("gating", 0.0)],
        doc: "Routed experts: the router's probabilities (gating 0: softmax; 1: sigmoid, \
              LFM2-MoE's), the top n_used by probability plus selection_bias [n_expert] where \
              given (the weights stay unbiased), weights renormalized when norm_weights = 1 \
              (by their f64 sum, at least 6.1e-5); per token the weighted sum, in slot \
              order, of each chosen expert's down(act(gate x) * up x); x [E, N], out [E, N].",
    },
    GraphOp {
        name: "shared_expert",
        inputs: &["x", "gate_inp", "gate", "up", "down"],
        optional: 0,
        attrs: &["act", "gate"],
        defaults: &[("gate", 0.0)],
        doc: "A shared expert behind a per-token gate: sigmoid(gate_inp . x) * \
              down(act(gate x) * up x); the sigmoid as silu(g) / g (gate 0: Qwen2-MoE's graph) \
              or 1 / (1 + expf(-g)) (gate 1: Qwen3.5's and Qwen3-Next's); gate_inp f32 [E]; \
              x [E, N], out [E, N].",
    },
    GraphOp {
        name: "short_conv",
        inputs: &["bcx", "weight"],
        optional: 0,
        attrs: &["state"],
        defaults: &[],
        doc: "LFM2's gated short convolution: bcx [3n, T] holds b, c and x (rows 0..n, \
              n..2n, 2n..3n); per sequence the ABI ssm_conv of its window (state `state`, the \
              last L-1 columns of b*x before this step, zero for a new sequence) followed by \
              this step's b*x, with weight [L, n]; out = c * conv [n, T]; the window's last \
              L-1 columns become the state.",
    },
    GraphOp {
        name: "causal_conv",
        inputs: &["x", "weight"],
        optional: 0,
        attrs: &["state", "silu"],
        defaults: &[("silu", 0.0)],
        doc: "A depthwise causal convolution with its window in recurrent state: per sequence \
              the ABI ssm_conv of the window (state `state`: the last L-1 columns of x before \
              this step, zero for a new sequence) followed by this step's x [C, T], with \
              weight [L, C]; out [C, T], then silu over each column as ggml_silu computes it \
              when silu = 1 (Qwen3.5's delta-net input). The window's last L-1 columns become \
              the state.",
    },
    GraphOp {
        name: "delta_net",
        inputs: &["qkv", "beta", "alpha", "dt_bias", "a"],
        optional: 0,
        attrs: &["state", "k_heads", "head_dim", "eps", "grouped"],
        defaults: &[("grouped", 0.0)],
        doc: "Qwen3.5's gated delta-net core: qkv [C, T] holds q and k (k_heads heads of \
              head_dim each) then v (H heads); per token and head beta = sigmoid(beta), \
              g = softplus(alpha + dt_bias) * a (dt_bias, a f32 weights [H]); q and k L2-normed \
              as llama.cpp's build_gdn_l2_norm (rms_norm with eps / head_dim, then times \
              1 / sqrtf(head_dim)); v head h reads q/k head h mod k_heads (grouped 0, Qwen3.5's \
              tiled order) or h / (H / k_heads) (grouped 1, Qwen3-Next's); then per sequence \
              the ABI gated_delta_net on its state `state` ([head_dim, head_dim, H], zero for a \
              new sequence), updated in place; out [head_dim * H, T].",
    },
    GraphOp {
        name: "rows",
        inputs: &["x"],
        optional: 0,
        attrs: &["period", "offset", "len"],
        defaults: &[],
        doc: "Of each `period` consecutive rows of x [R, T], rows offset..offset+len, in \
              order: out [R / period * len, T] (a per-head part of a projection: Qwen3.5's \
              query and gate, Qwen3-Next's beta and alpha).",
    },
    GraphOp {
        name: "gelu",
        inputs: &["x"],
        optional: 0,
        attrs: &[],
        defaults: &[],
        doc: "ggml_gelu elementwise (the tanh approximation through ggml's f16 table): the \
              ABI's glu with act 1 of x times ones, an exact product; out has x's shape.",
    },
    GraphOp {
        name: "sigmoid",
        inputs: &["x"],
        optional: 0,
        attrs: &[],
        defaults: &[],
        doc: "1 / (1 + expf(-x)) elementwise (ggml_sigmoid); out has x's shape.",
    },
    GraphOp {
        name: "token_shift",
        inputs: &["x"],
        optional: 0,
        attrs: &["state"],
        defaults: &[],
        doc: "RWKV's token shift: per sequence, the ABI's token_shift on its columns and its \
              state `state` (prev - x column by column, prev being the sequence's column \
              before: for its first, the last column of its step before, zero for a new \
              sequence; the last column becomes the state). x and out [E, T].",
    },
    GraphOp {
        name: "lerp",
        inputs: &["sx", "x", "mu"],
        optional: 0,
        attrs: &["index"],
        defaults: &[],
        doc: "sx * mu[index] + x (ggml's mul, then add): sx and x [E, T], mu an f32 weight \
              whose values index*E .. (index+1)*E are the factor (RWKV-7's fused lerps); out \
              [E, T].",
    },
    GraphOp {
        name: "tanh",
        inputs: &["x"],
        optional: 0,
        attrs: &[],
        defaults: &[],
        doc: "tanhf elementwise (ggml_tanh); out has x's shape.",
    },
    GraphOp {
        name: "relu_sqr",
        inputs: &["x"],
        optional: 0,
        attrs: &[],
        defaults: &[],
        doc: "ggml_sqr(ggml_relu(x)) elementwise: x > 0 ? x * x : 0; out has x's shape.",
    },
    GraphOp {
        name: "rwkv7_time_mix",
        inputs: &[
            "r", "w", "k", "v", "a", "g", "w0", "a0", "k_k", "k_a", "r_k", "ln_w", "ln_b",
            "v_first", "v_mix", "v0",
        ],
        optional: 3,
        attrs: &["state", "head_size"],
        defaults: &[],
        doc: "RWKV-7's time mixing between its projections (r, k, v, g; w = W2 tanh(W1 x_w), \
              a = A2 (A1 x_a), v_mix = V2 (V1 x_v); all [E, T]) and its output projection, in \
              llama.cpp's order: w = expf(sigmoid(w + w0) * -0.606531); v += (v_first - v) * \
              sigmoid(v_mix + v0) when layer 0's v is given; a = sigmoid(a + a0); kk = \
              l2_norm(k * k_k) per head (eps 1e-12); k += a * (k * k_a) - k * k_a; per \
              sequence the ABI rwkv_wkv7(r, w, k, v, -kk, kk * a) on state `state` ([N, N, H], \
              zero for a new sequence), updated in place; then per head ggml_norm (eps 64e-5) \
              times ln_w plus ln_b, plus v times the head's f64 sum of k * r * r_k, times g. \
              The vectors are f32 weights [E]; head_size N divides E; out [E, T].",
    },
];

pub fn graph_op(name: &str) -> Option<&'static GraphOp> {
    GRAPH_OPS.iter().find(|g| g.name == name)
}

impl GraphFile {
    /// The graph that computes only its hidden states ([`GraphFile::embd`]) for embeddings:
    /// the output moved there and the nodes it does not need (the logits head) left out.
    /// `None` where the graph names no hidden states.
    pub fn embedding(&self) -> Option<GraphFile> {
        if self.embd.is_empty() {
            return None;
        }
        let mut need: std::collections::HashSet<&str> = [self.embd.as_str()].into();
        let mut keep = vec![false; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().rev() {
            if need.contains(n.name.as_str()) {
                keep[i] = true;
                need.extend(n.inputs.iter().map(String::as_str));
            }
        }
        let mut g = self.clone();
        g.nodes = (self.nodes.iter().zip(&keep))
            .filter(|(_, &k)| k)
            .map(|(n, _)| n.clone())
            .collect();
        g.output = self.embd.clone();
        Some(g)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("graph files serialize")
    }

    /// Parses a graph file; `what` names it in errors (a package path).
    pub fn from_json(text: &[u8], what: &str) -> Result<GraphFile, GraphError> {
        let file = || what.to_string();
        // Version first, so a newer file gets a clear message rather than a field error.
        let v: serde_json::Value =
            serde_json::from_slice(text).map_err(|source| GraphError::Json {
                file: file(),
                source,
            })?;
        match v.get("version").and_then(|x| x.as_u64()) {
            Some(n) if n == GRAPH_VERSION as u64 => {}
            Some(found) => {
                return Err(GraphError::Version {
                    file: file(),
                    found,
                    runs: GRAPH_VERSION,
                })
            }
            None => return Err(GraphError::NoVersion { file: file() }),
        }
        serde_json::from_value(v).map_err(|source| GraphError::Schema {
            file: file(),
            source,
        })
    }
}
