//! Writing graphs: a [`Builder`] appends nodes and names them as llama.cpp's graph callbacks
//! do (`attn_norm-3`); the blocks every decoder shares (attention over the cache, gated FFN,
//! routed experts, the logits head) are functions here, so an architecture file only says
//! how its layers differ.

use super::ir::{GraphFile, NodeDef, GRAPH_VERSION};
use crate::exec::RopeParams;
use std::collections::{BTreeMap, HashSet};

/// A value of the graph being built: a node name, `$tokens`-style input or `@weight`.
pub type V = String;

/// A weight operand.
pub fn w(name: &str) -> V {
    format!("@{name}")
}

pub const TOKENS: &str = "$tokens";
pub const POSITIONS: &str = "$positions";
pub const TOKEN_TYPES: &str = "$token_types";
pub const OUT_IDS: &str = "$out_ids";

pub struct Builder {
    g: GraphFile,
    names: HashSet<String>,
    layer: Option<usize>,
}

impl Builder {
    pub fn new(arch: &str) -> Builder {
        Builder {
            g: GraphFile {
                version: GRAPH_VERSION,
                arch: arch.to_string(),
                consts: BTreeMap::new(),
                kv_layers: Vec::new(),
                states: Vec::new(),
                nodes: Vec::new(),
                unused: Vec::new(),
                output: String::new(),
                embd: String::new(),
            },
            names: HashSet::new(),
            layer: None,
        }
    }

    pub fn constant(&mut self, name: &str, v: usize) {
        self.g.consts.insert(name.to_string(), v as i64);
    }

    /// Declares a cached attention layer; returns its index for `kv_attention`.
    pub fn kv_layer(&mut self, head_dim: usize, n_head_kv: usize) -> usize {
        self.g.kv_layers.push([head_dim as i64, n_head_kv as i64]);
        self.g.kv_layers.len() - 1
    }

    /// Declares a recurrent state of `values` f32 each sequence keeps; returns its index.
    pub fn state(&mut self, values: usize) -> usize {
        self.g.states.push(values as i64);
        self.g.states.len() - 1
    }

    /// A file tensor the architecture requires and never reads (see `GraphFile::unused`).
    pub fn unused(&mut self, tensor: &str) {
        self.g.unused.push(tensor.to_string());
    }

    /// Nodes added from now on carry layer `il` in their names (`None`: no suffix).
    pub fn layer(&mut self, il: Option<usize>) {
        self.layer = il;
    }

    pub fn node(&mut self, name: &str, op: &str, inputs: &[&str], attrs: &[(&str, f64)]) -> V {
        self.node_shaped(name, op, inputs, attrs, Vec::new())
    }

    fn node_shaped(
        &mut self,
        name: &str,
        op: &str,
        inputs: &[&str],
        attrs: &[(&str, f64)],
        shape: Vec<String>,
    ) -> V {
        let stem = match self.layer {
            Some(il) => format!("{name}-{il}"),
            None => name.to_string(),
        };
        let mut full = stem.clone();
        let mut k = 1;
        while self.names.contains(&full) {
            full = format!("{stem}.{k}");
            k += 1;
        }
        self.names.insert(full.clone());
        self.g.nodes.push(NodeDef {
            name: full.clone(),
            op: op.to_string(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            attrs: attrs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            shape,
        });
        full
    }

    /// Names the node holding the final hidden states embeddings pool ([`GraphFile::embd`]).
    pub fn embd(&mut self, node: &str) {
        self.g.embd = node.to_string();
    }

    pub fn finish(mut self, output: V) -> GraphFile {
        self.g.output = output;
        self.g
    }

    pub fn get_rows(&mut self, name: &str, table: &str, ids: &str) -> V {
        self.node(name, "get_rows", &[table, ids], &[])
    }
    pub fn rms_norm(&mut self, name: &str, x: &str, weight: &str, eps: f32) -> V {
        self.node(name, "rms_norm", &[x, weight], &[("eps", eps as f64)])
    }
    /// LayerNorm with bias: the ABI's `norm` over whole columns (ggml_norm, then times
    /// `weight`, plus `bias`).
    pub fn layer_norm(&mut self, name: &str, x: &str, weight: &str, bias: &str, eps: f32) -> V {
        self.node(
            name,
            "norm",
            &[x, weight, bias],
            &[("eps", eps as f64), ("group", 0.0)],
        )
    }
    pub fn matmul(&mut self, name: &str, weight: &str, x: &str) -> V {
        self.node(name, "mat_mul", &[weight, x], &[])
    }
    pub fn add(&mut self, name: &str, a: &str, b: &str) -> V {
        self.node(name, "add", &[a, b], &[])
    }
    pub fn scale(&mut self, name: &str, x: &str, s: f32) -> V {
        self.node(name, "scale", &[x], &[("s", s as f64)])
    }
    pub fn glu(&mut self, name: &str, gate: &str, up: &str, act: i64) -> V {
        self.node(name, "glu", &[gate, up], &[("act", act as f64)])
    }
    pub fn rope(&mut self, name: &str, x: &str, r: &RopeParams) -> V {
        self.node(
            name,
            "rope",
            &[x, POSITIONS],
            &[
                ("mode", r.mode as f64),
                ("n_dims", r.n_dims as f64),
                ("n_ctx_orig", r.n_ctx_orig as f64),
                ("freq_base", r.freq_base as f64),
                ("freq_scale", r.freq_scale as f64),
                ("ext_factor", r.ext_factor as f64),
                ("attn_factor", r.attn_factor as f64),
                ("beta_fast", r.beta_fast as f64),
                ("beta_slow", r.beta_slow as f64),
            ],
        )
    }
    pub fn reshape(&mut self, name: &str, x: &str, dims: &[&str]) -> V {
        let shape = dims.iter().map(|s| s.to_string()).collect();
        self.node_shaped(name, "reshape", &[x], &[], shape)
    }
    #[allow(clippy::too_many_arguments)]
    pub fn kv_attention(
        &mut self,
        name: &str,
        q: &str,
        k: &str,
        v: &str,
        layer: usize,
        window: usize,
        scale: f32,
        softcap: f32,
    ) -> V {
        self.node(
            name,
            "kv_attention",
            &[q, k, v],
            &[
                ("layer", layer as f64),
                ("window", window as f64),
                ("scale", scale as f64),
                ("softcap", softcap as f64),
            ],
        )
    }
}

/// How a decoder's attention block differs between architectures.
pub struct AttnSpec {
    pub head_dim: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub eps: f32,
    pub rope: RopeParams,
    /// Sliding window (0: none).
    pub window: usize,
    /// Scale inside the attention op (1/sqrt(head_dim), or 1 where q is scaled first).
    pub kq_scale: f32,
    /// Gemma: q scaled before the attention product.
    pub q_scale: Option<f32>,
    /// Qwen2: biases on q, k and v.
    pub qkv_bias: bool,
    /// Qwen3/Gemma 3: RMS norm over each head of q and k before rope.
    pub qk_norm: bool,
    /// Qwen3.5/Qwen3-Next: `attn_q` gives each head's query and then as many values of an
    /// output gate; the attention's output is multiplied by sigmoid(gate) before `attn_output`.
    pub output_gate: bool,
}

/// `attn_output(attention(q, k, v))` of the normalized input `x` for layer `il` (GGUF tensor
/// names), its keys and values stored in the cache layer of the same index.
pub fn attention(b: &mut Builder, x: &str, il: usize, s: &AttnSpec) -> V {
    let n = |t: &str| w(&format!("blk.{il}.{t}"));
    let layer = b.kv_layer(s.head_dim, s.n_head_kv);
    let proj = |b: &mut Builder, what: &str, heads: &str| {
        let mut y = b.matmul(
            &format!("{what}cur"),
            &n(&format!("attn_{}.weight", what.to_lowercase())),
            x,
        );
        if s.qkv_bias {
            y = b.add(
                &format!("{what}cur"),
                &y,
                &n(&format!("attn_{}.bias", what.to_lowercase())),
            );
        }
        b.reshape(&format!("{what}cur"), &y, &["head_dim", heads, "T"])
    };
    let (mut q, gate) = match s.output_gate {
        false => (proj(b, "Q", "n_head"), None),
        true => {
            let d = s.head_dim as f64;
            let full = b.matmul("Qcur_full", &n("attn_q.weight"), x);
            let part = |b: &mut Builder, name: &str, offset: f64| {
                let attrs = [("period", 2.0 * d), ("offset", offset), ("len", d)];
                b.node(name, "rows", &[&full], &attrs)
            };
            let q = part(b, "Qcur", 0.0);
            let gate = part(b, "gate", d);
            let q = b.reshape("Qcur", &q, &["head_dim", "n_head", "T"]);
            (q, Some(gate))
        }
    };
    let mut k = proj(b, "K", "n_head_kv");
    let v = proj(b, "V", "n_head_kv");
    if s.qk_norm {
        q = b.rms_norm("Qcur_normed", &q, &n("attn_q_norm.weight"), s.eps);
        k = b.rms_norm("Kcur_normed", &k, &n("attn_k_norm.weight"), s.eps);
    }
    q = b.rope("Qcur", &q, &s.rope);
    k = b.rope("Kcur", &k, &s.rope);
    if let Some(qs) = s.q_scale {
        q = b.scale("Qcur_scaled", &q, qs);
    }
    let mut kqv = b.kv_attention("kqv_out", &q, &k, &v, layer, s.window, s.kq_scale, 0.0);
    if let Some(gate) = gate {
        let sg = b.node("gate_sigmoid", "sigmoid", &[&gate], &[]);
        kqv = b.node("attn_gated", "mul", &[&kqv, &sg], &[]);
    }
    b.matmul("attn_out", &n("attn_output.weight"), &kqv)
}

/// `down(act(gate(x)) * up(x))` with layer `il`'s `ffn_*` weights.
pub fn gated_ffn(b: &mut Builder, x: &str, il: usize, act: i64) -> V {
    let n = |t: &str| w(&format!("blk.{il}.{t}.weight"));
    let g = b.matmul("ffn_gate", &n("ffn_gate"), x);
    let u = b.matmul("ffn_up", &n("ffn_up"), x);
    let h = b.glu("ffn_glu", &g, &u, act);
    b.matmul("ffn_out", &n("ffn_down"), &h)
}

/// Routed experts of layer `il` (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`).
pub fn moe_ffn(b: &mut Builder, x: &str, il: usize, n_used: usize, norm: bool, act: i64) -> V {
    let n = |t: &str| w(&format!("blk.{il}.{t}.weight"));
    b.node(
        "ffn_moe_out",
        "moe_ffn",
        &[
            x,
            &n("ffn_gate_inp"),
            &n("ffn_gate_exps"),
            &n("ffn_up_exps"),
            &n("ffn_down_exps"),
        ],
        &[
            ("n_used", n_used as f64),
            ("norm_weights", if norm { 1.0 } else { 0.0 }),
            ("act", act as f64),
        ],
    )
}

/// LFM2-MoE's routed experts of layer `il`: sigmoid router probabilities, chosen with the
/// selection bias `exp_probs_b.bias` (the weights stay unbiased), renormalized.
pub fn moe_ffn_sigmoid(b: &mut Builder, x: &str, il: usize, n_used: usize, act: i64) -> V {
    let n = |t: &str| w(&format!("blk.{il}.{t}.weight"));
    b.node(
        "ffn_moe_out",
        "moe_ffn",
        &[
            x,
            &n("ffn_gate_inp"),
            &n("ffn_gate_exps"),
            &n("ffn_up_exps"),
            &n("ffn_down_exps"),
            &w(&format!("blk.{il}.exp_probs_b.bias")),
        ],
        &[
            ("n_used", n_used as f64),
            ("norm_weights", 1.0),
            ("act", act as f64),
            ("gating", 1.0),
        ],
    )
}

/// The shared expert of layer `il` (`ffn_gate_inp_shexp`, `ffn_{gate,up,down}_shexp`). Its
/// gate's sigmoid is silu(g) / g in Qwen2-MoE's graph, 1 / (1 + expf(-g)) where `sigmoid`
/// (Qwen3.5's and Qwen3-Next's).
pub fn shared_expert(b: &mut Builder, x: &str, il: usize, act: i64, sigmoid: bool) -> V {
    let n = |t: &str| w(&format!("blk.{il}.{t}.weight"));
    let mut attrs = vec![("act", act as f64)];
    if sigmoid {
        attrs.push(("gate", 1.0));
    }
    b.node(
        "ffn_shexp_out",
        "shared_expert",
        &[
            x,
            &n("ffn_gate_inp_shexp"),
            &n("ffn_gate_shexp"),
            &n("ffn_up_shexp"),
            &n("ffn_down_shexp"),
        ],
        &attrs,
    )
}

/// The rows that produce logits (llama.cpp keeps only those after the last attention).
pub fn select_outputs(b: &mut Builder, name: &str, x: &str) -> V {
    b.get_rows(name, x, OUT_IDS)
}

/// Final norm and the output matrix (tied to the embeddings when the file has none).
pub fn logits(b: &mut Builder, x: &str, eps: f32, has_output: bool) -> V {
    b.layer(None);
    let normed = b.rms_norm("result_norm", x, &w("output_norm.weight"), eps);
    b.embd(&normed);
    let out = if has_output {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    b.matmul("result_output", &w(out), &normed)
}
