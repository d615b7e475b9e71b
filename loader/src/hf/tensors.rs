//! safetensors weights → GGUF tensors: llama.cpp's names, ggml shape order (a Hugging Face
//! `[out, in]` matrix is ggml `[in, out]`, the same bytes), routed experts stacked into one
//! `[in, out, n_expert]` tensor per projection, BF16 widened to F32 (exact), 1-D tensors in F32
//! (as llama.cpp's converter writes norms), and llama's q/k rows permuted for its rope layout
//! (`LlamaModel.permute` in convert_hf_to_gguf.py). Gemma 3's RMS norms scale by `1 + weight`;
//! the GGUF holds `1 + weight` (computed in f32, as Hugging Face's `Gemma3RMSNorm` does), as
//! llama.cpp's converter writes it. LFM2's convolution weights `[channels, 1, L]` lose their
//! middle dimension (the converter's squeeze). Qwen3.5 / Qwen3.5-MoE / Qwen3-Next get the
//! converter's transforms (see [`qwen35`]): shifted norms, `-exp(A_log)`, value heads
//! reordered, fused projections and experts split, MTP blocks after the layers. BERT gets the
//! names of llama.cpp's `BertModel` (see [`bert`]).

use std::collections::BTreeMap;
use std::path::Path;

use abi::DType;
use safetensors::{Dtype, SafeTensors};

use super::config::{is_qwen35, Config};
use super::{label, read_json};
use crate::gguf::{tensor_bytes, TensorInfo, DEFAULT_ALIGNMENT};
use crate::LoadError;

/// Where a checkpoint tensor goes.
enum Target {
    Plain(String),
    /// Expert `e` of a stacked tensor.
    Expert(String, usize),
    /// Not a weight (rotary caches some checkpoints carry; a multimodal checkpoint's vision
    /// tower, which llama.cpp's converter leaves to its mmproj file).
    Skip,
    /// Qwen3.5 / Qwen3-Next: one or more GGUF tensors made from this one (see [`qwen35`]).
    Made(Vec<(String, Xform)>),
}

/// Which checkpoint row each GGUF row is (rows: all dimensions but the innermost).
#[derive(Clone, Copy, Debug, PartialEq)]
enum RowMap {
    Same,
    /// llama's q/k rope permutation with this many heads.
    Llama(u64),
    /// Rows from `start` on are value heads of `hd` rows each, `r` per key head of `nk`: the
    /// checkpoint groups them by key head, the GGUF tiles them (`_LinearAttentionVReorderBase`).
    VTiled {
        start: u64,
        nk: u64,
        r: u64,
        hd: u64,
    },
    /// Qwen3-Next's `in_proj_qkvz`, per key head `[q (hk), k (hk), v (vr), z (vr)]`: the
    /// GGUF's `attn_qkv` (`z` false: all q, all k, all v) or `attn_gate` (`z` true).
    Qkvz {
        nk: u64,
        hk: u64,
        vr: u64,
        z: bool,
    },
    /// Fused experts' `gate_up_proj` `[E, 2f, n]`: the gate half (`up` false) or the up half.
    Half {
        f: u64,
        up: bool,
    },
}

/// What is done to a checkpoint tensor on its way into the GGUF.
#[derive(Clone, Copy, Debug)]
struct Xform {
    rows: RowMap,
    /// The innermost dimension's value heads tiled (`nk`, `r`, `hd`), as [`RowMap::VTiled`].
    cols: Option<(u64, u64, u64)>,
    value: ValueOp,
    /// Squeeze a middle dimension of 1 (convolution weights `[C, 1, K]`).
    squeeze: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ValueOp {
    Same,
    /// `x + c` in f32 (norms that scale by `1 + weight`).
    Add(f32),
    /// `-exp(x)` in f32 (`A_log` → `ssm_a`).
    NegExp,
}

const PLAIN: Xform = Xform {
    rows: RowMap::Same,
    cols: None,
    value: ValueOp::Same,
    squeeze: false,
};

/// llama.cpp's converter for Qwen3.5 / Qwen3.5-MoE / Qwen3-Next (`Qwen3NextModel`,
/// `_LinearAttentionVReorderBase`, `Qwen2MoeModel`, `_QwenMtpMixin` in conversion/qwen.py):
/// `name` with `language_model.` already dropped. `mtp.*` blocks go after the `n_layer`
/// layers (`mtp.fc` → `nextn.eh_proj`, its norms → `nextn.enorm`/`hnorm`/`shared_head_norm`);
/// every `*norm.weight` but the delta-net's `linear_attn.norm.weight` gets `+ 1`; `A_log`
/// becomes `-exp(A_log)`; the convolution loses its middle dimension; Qwen3.5 reorders value
/// heads from grouped-by-key-head to tiled (q/k/v's v rows, z, a, b, `A_log`, `dt_bias`, the
/// convolution's v channels, `out_proj`'s columns); Qwen3-Next's fused `in_proj_qkvz` is
/// split into `attn_qkv` and `attn_gate`, its `in_proj_ba` kept as `ssm_ba`.
fn qwen35(cfg: &Config, name: &str) -> Option<Target> {
    let l = cfg.linear;
    let n_layer = cfg.n_layer as usize;
    // The blocks: main layers, then MTP blocks.
    let (il, rest) = if let Some(r) = name.strip_prefix("mtp.") {
        if let Some(r) = r.strip_prefix("layers.") {
            let (i, rest) = r.split_once('.')?;
            (n_layer + i.parse::<usize>().ok()?, rest.to_string())
        } else {
            let (stem, kind) = r.split_once('.')?;
            let t = match stem {
                "fc" => "nextn.eh_proj",
                "pre_fc_norm_embedding" => "nextn.enorm",
                "pre_fc_norm_hidden" => "nextn.hnorm",
                "norm" => "nextn.shared_head_norm",
                _ => return None,
            };
            if kind != "weight" {
                return None;
            }
            let value = match stem {
                "fc" => ValueOp::Same,
                _ => ValueOp::Add(1.0),
            };
            let x = Xform { value, ..PLAIN };
            return Some(Target::Made(vec![(format!("blk.{n_layer}.{t}.weight"), x)]));
        }
    } else {
        match name {
            "model.embed_tokens.weight" => {
                return Some(Target::Made(vec![("token_embd.weight".into(), PLAIN)]))
            }
            "model.norm.weight" => {
                let x = Xform {
                    value: ValueOp::Add(1.0),
                    ..PLAIN
                };
                return Some(Target::Made(vec![("output_norm.weight".into(), x)]));
            }
            "lm_head.weight" => return Some(Target::Made(vec![("output.weight".into(), PLAIN)])),
            _ => {}
        }
        let r = name.strip_prefix("model.layers.")?;
        let (i, rest) = r.split_once('.')?;
        let i = i.parse::<usize>().ok().filter(|&i| i < n_layer)?;
        (i, rest.to_string())
    };
    let rest = rest.as_str();
    let blk = |t: &str| format!("blk.{il}.{t}");
    let one = |t: &str, x: Xform| Some(Target::Made(vec![(blk(t), x)]));
    // Value heads: Qwen3.5 tiles them (a no-op when there are as many as key heads).
    let tiled = cfg.arch != "qwen3next";
    let (nk, r, hd) = (l.k_heads, l.v_heads / l.k_heads, l.v_dim);
    let v_rows = |start: u64, hd: u64| match tiled {
        true => RowMap::VTiled { start, nk, r, hd },
        false => RowMap::Same,
    };
    let v_cols = |hd: u64| tiled.then_some((nk, r, hd));
    if let Some(e) = rest.strip_prefix("mlp.experts.") {
        return match e {
            "gate_up_proj" | "gate_up_proj.weight" => {
                // [E, 2f, n]: f from the shape, filled in when the shape is known.
                let half = |up| Xform {
                    rows: RowMap::Half { f: 0, up },
                    ..PLAIN
                };
                Some(Target::Made(vec![
                    (blk("ffn_gate_exps.weight"), half(false)),
                    (blk("ffn_up_exps.weight"), half(true)),
                ]))
            }
            "down_proj" | "down_proj.weight" => one("ffn_down_exps.weight", PLAIN),
            _ => {
                let (x, w) = e.split_once('.')?;
                let x: usize = x.parse().ok()?;
                let t = match w {
                    "gate_proj.weight" => "ffn_gate_exps",
                    "up_proj.weight" => "ffn_up_exps",
                    "down_proj.weight" => "ffn_down_exps",
                    _ => return None,
                };
                Some(Target::Expert(blk(&format!("{t}.weight")), x))
            }
        };
    }
    if rest == "linear_attn.A_log" {
        let x = Xform {
            cols: v_cols(1),
            value: ValueOp::NegExp,
            ..PLAIN
        };
        return one("ssm_a", x);
    }
    if rest == "linear_attn.dt_bias" {
        return one(
            "ssm_dt.bias",
            Xform {
                cols: v_cols(1),
                ..PLAIN
            },
        );
    }
    let (stem, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && !(kind == "bias" && stem == "linear_attn.dt_proj") {
        return None;
    }
    let norm = Xform {
        value: ValueOp::Add(1.0),
        ..PLAIN
    };
    let (t, x) = match stem {
        "input_layernorm" => ("attn_norm", norm),
        "post_attention_layernorm" => ("post_attention_norm", norm),
        "self_attn.q_proj" => ("attn_q", PLAIN),
        "self_attn.k_proj" => ("attn_k", PLAIN),
        "self_attn.v_proj" => ("attn_v", PLAIN),
        "self_attn.o_proj" => ("attn_output", PLAIN),
        "self_attn.q_norm" => ("attn_q_norm", norm),
        "self_attn.k_norm" => ("attn_k_norm", norm),
        "linear_attn.in_proj_qkv" => (
            "attn_qkv",
            Xform {
                rows: v_rows(2 * nk * l.k_dim, hd),
                ..PLAIN
            },
        ),
        "linear_attn.in_proj_z" => (
            "attn_gate",
            Xform {
                rows: v_rows(0, hd),
                ..PLAIN
            },
        ),
        "linear_attn.in_proj_b" => (
            "ssm_beta",
            Xform {
                rows: v_rows(0, 1),
                ..PLAIN
            },
        ),
        "linear_attn.in_proj_a" => (
            "ssm_alpha",
            Xform {
                rows: v_rows(0, 1),
                ..PLAIN
            },
        ),
        "linear_attn.in_proj_ba" => ("ssm_ba", PLAIN),
        "linear_attn.in_proj_qkvz" => {
            let q = |z| Xform {
                rows: RowMap::Qkvz {
                    nk,
                    hk: l.k_dim,
                    vr: r * hd,
                    z,
                },
                ..PLAIN
            };
            return Some(Target::Made(vec![
                (blk("attn_qkv.weight"), q(false)),
                (blk("attn_gate.weight"), q(true)),
            ]));
        }
        "linear_attn.conv1d" => (
            "ssm_conv1d",
            Xform {
                rows: v_rows(2 * nk * l.k_dim, hd),
                squeeze: true,
                ..PLAIN
            },
        ),
        "linear_attn.dt_proj" => (
            "ssm_dt",
            Xform {
                cols: v_cols(1),
                ..PLAIN
            },
        ),
        // The delta-net's own norm scales by its weight: no shift.
        "linear_attn.norm" => ("ssm_norm", PLAIN),
        "linear_attn.out_proj" => (
            "ssm_out",
            Xform {
                cols: v_cols(hd),
                ..PLAIN
            },
        ),
        "mlp.gate_proj" => ("ffn_gate", PLAIN),
        "mlp.up_proj" => ("ffn_up", PLAIN),
        "mlp.down_proj" => ("ffn_down", PLAIN),
        "mlp.gate" => ("ffn_gate_inp", PLAIN),
        "mlp.shared_expert.gate_proj" => ("ffn_gate_shexp", PLAIN),
        "mlp.shared_expert.up_proj" => ("ffn_up_shexp", PLAIN),
        "mlp.shared_expert.down_proj" => ("ffn_down_shexp", PLAIN),
        "mlp.shared_expert_gate" => ("ffn_gate_inp_shexp", PLAIN),
        "eh_proj" => ("nextn.eh_proj", PLAIN),
        _ => return None,
    };
    one(&format!("{t}.{kind}"), x)
}

/// llama.cpp's converter for BERT (`BertModel.filter_tensors` and its tensor map): an optional
/// `bert.` prefix dropped, old `gamma` / `beta` norm names read as `weight` / `bias`; the
/// position ids, the pooler and the pre-training heads (`cls.predictions`,
/// `cls.seq_relationship`) skipped; layers below `n_layer` only.
fn bert(cfg: &Config, name: &str) -> Option<Target> {
    let name = name.strip_prefix("bert.").unwrap_or(name);
    if name == "embeddings.position_ids"
        || name.starts_with("pooler.")
        || name.starts_with("cls.predictions.")
        || name.starts_with("cls.seq_relationship.")
    {
        return Some(Target::Skip);
    }
    let (stem, kind) = name.rsplit_once('.')?;
    let kind = match kind {
        "weight" | "gamma" => "weight",
        "bias" | "beta" => "bias",
        _ => return None,
    };
    let t = match (stem, kind) {
        ("embeddings.word_embeddings", "weight") => "token_embd",
        ("embeddings.position_embeddings", "weight") => "position_embd",
        ("embeddings.token_type_embeddings", "weight") => "token_types",
        ("embeddings.LayerNorm", _) => "token_embd_norm",
        _ => {
            let (il, rest) = stem.strip_prefix("encoder.layer.")?.split_once('.')?;
            let il = il.parse::<u64>().ok().filter(|&il| il < cfg.n_layer)?;
            let t = match rest {
                "attention.self.query" => "attn_q",
                "attention.self.key" => "attn_k",
                "attention.self.value" => "attn_v",
                "attention.output.dense" => "attn_output",
                "attention.output.LayerNorm" => "attn_output_norm",
                "intermediate.dense" => "ffn_up",
                "output.dense" => "ffn_down",
                "output.LayerNorm" => "layer_output_norm",
                _ => return None,
            };
            return Some(Target::Plain(format!("blk.{il}.{t}.{kind}")));
        }
    };
    Some(Target::Plain(format!("{t}.{kind}")))
}

/// Every tensor llama.cpp's BERT graph reads is there with its shape (ggml order), so a
/// checkpoint that lacks one or has another size is refused naming it; `token_types` may be
/// missing (llama.cpp's is optional), and must then not be needed.
pub fn bert_complete(dir: &Path, cfg: &Config, infos: &[TensorInfo]) -> Result<(), LoadError> {
    let n = cfg.n_embd;
    let ff = cfg
        .json
        .get("intermediate_size")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    let ctx = cfg
        .json
        .get("max_position_embeddings")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    // Hugging Face's default (the converter's 1 would not fit the checkpoint's table).
    let types = cfg
        .json
        .get("type_vocab_size")
        .and_then(|v| v.as_u64())
        .unwrap_or(2);
    let mut need: Vec<(String, String, Vec<u64>, bool)> = vec![
        (
            "token_embd.weight".into(),
            "embeddings.word_embeddings.weight".into(),
            vec![n, cfg.vocab_size],
            true,
        ),
        (
            "position_embd.weight".into(),
            "embeddings.position_embeddings.weight".into(),
            vec![n, ctx],
            true,
        ),
        (
            "token_types.weight".into(),
            "embeddings.token_type_embeddings.weight".into(),
            vec![n, types],
            false,
        ),
        (
            "token_embd_norm.weight".into(),
            "embeddings.LayerNorm.weight".into(),
            vec![n],
            true,
        ),
        (
            "token_embd_norm.bias".into(),
            "embeddings.LayerNorm.bias".into(),
            vec![n],
            true,
        ),
    ];
    for il in 0..cfg.n_layer {
        let hf = |s: &str| format!("encoder.layer.{il}.{s}");
        for (t, h, w, b) in [
            ("attn_q", "attention.self.query", vec![n, n], vec![n]),
            ("attn_k", "attention.self.key", vec![n, n], vec![n]),
            ("attn_v", "attention.self.value", vec![n, n], vec![n]),
            ("attn_output", "attention.output.dense", vec![n, n], vec![n]),
            (
                "attn_output_norm",
                "attention.output.LayerNorm",
                vec![n],
                vec![n],
            ),
            ("ffn_up", "intermediate.dense", vec![n, ff], vec![ff]),
            ("ffn_down", "output.dense", vec![ff, n], vec![n]),
            ("layer_output_norm", "output.LayerNorm", vec![n], vec![n]),
        ] {
            need.push((
                format!("blk.{il}.{t}.weight"),
                hf(&format!("{h}.weight")),
                w,
                true,
            ));
            need.push((
                format!("blk.{il}.{t}.bias"),
                hf(&format!("{h}.bias")),
                b,
                true,
            ));
        }
    }
    for (g, hf, shape, required) in need {
        let bad = |msg: String| LoadError::Format {
            file: dir.display().to_string(),
            msg: format!("tensor '{hf}': {msg}"),
        };
        match infos.iter().find(|t| t.name == g) {
            None if required => return Err(bad("missing".into())),
            None => {}
            Some(t) if t.shape != shape => {
                let hf_shape: Vec<u64> = t.shape.iter().rev().copied().collect();
                let want: Vec<u64> = shape.iter().rev().copied().collect();
                return Err(bad(format!(
                    "shape {hf_shape:?}, expected {want:?} (from config.json)"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn target(arch: &str, name: &str) -> Option<Target> {
    let plain = |s: &str| Some(Target::Plain(s.to_string()));
    match name {
        "model.embed_tokens.weight" => return plain("token_embd.weight"),
        "model.norm.weight" => return plain("output_norm.weight"),
        // LFM2's final norm.
        "model.embedding_norm.weight" => return plain("token_embd_norm.weight"),
        "lm_head.weight" => return plain("output.weight"),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (il, rest) = rest.split_once('.')?;
    let il: usize = il.parse().ok()?;
    if rest.ends_with("rotary_emb.inv_freq") {
        return Some(Target::Skip);
    }
    if let Some(r) = rest.strip_prefix("mlp.experts.") {
        let (e, r) = r.split_once('.')?;
        let e: usize = e.parse().ok()?;
        let t = match r {
            "gate_proj.weight" => "ffn_gate_exps",
            "up_proj.weight" => "ffn_up_exps",
            "down_proj.weight" => "ffn_down_exps",
            _ => return None,
        };
        return Some(Target::Expert(format!("blk.{il}.{t}.weight"), e));
    }
    let (stem, kind) = rest.rsplit_once('.')?;
    let t = match (arch, stem) {
        // Gemma's sandwich norms.
        ("gemma3", "post_attention_layernorm") => "post_attention_norm",
        ("gemma3", "pre_feedforward_layernorm") => "ffn_norm",
        ("gemma3", "post_feedforward_layernorm") => "post_ffw_norm",
        ("lfm2", "operator_norm") => "attn_norm",
        ("lfm2", "ffn_norm") => "ffn_norm",
        ("lfm2", "feed_forward.w1") => "ffn_gate",
        ("lfm2", "feed_forward.w3") => "ffn_up",
        ("lfm2", "feed_forward.w2") => "ffn_down",
        ("lfm2", "self_attn.out_proj") => "attn_output",
        ("lfm2", "self_attn.q_layernorm") => "attn_q_norm",
        ("lfm2", "self_attn.k_layernorm") => "attn_k_norm",
        ("lfm2", "conv.conv") => "shortconv.conv",
        ("lfm2", "conv.in_proj") => "shortconv.in_proj",
        ("lfm2", "conv.out_proj") => "shortconv.out_proj",
        (_, stem) => match stem {
            "input_layernorm" => "attn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "post_attention_layernorm" => "ffn_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            "mlp.gate" => "ffn_gate_inp",
            _ => return None,
        },
    };
    matches!(kind, "weight" | "bias").then(|| Target::Plain(format!("blk.{il}.{t}.{kind}")))
}

/// One GGUF tensor being assembled.
struct Entry {
    dtype: DType,
    /// ggml order.
    shape: Vec<u64>,
    /// Checkpoint tensors, in expert order for stacks: (shard, name).
    parts: Vec<(usize, String)>,
    /// Row order, column order and values (llama's q/k rope permutation; Gemma's `1 + weight`
    /// norms; Qwen3.5's transforms).
    xf: Xform,
    /// Rows (all dimensions but the innermost) of each checkpoint tensor.
    src_rows: u64,
}

/// The shard files: the index's, or the single `model.safetensors`.
fn shard_names(dir: &Path) -> Result<Vec<String>, LoadError> {
    const INDEX: &str = "model.safetensors.index.json";
    let Some(index) = read_json(dir, INDEX)? else {
        if !dir.join("model.safetensors").is_file() {
            return Err(LoadError::Format {
                file: label(dir, "model.safetensors"),
                msg: format!("missing (and no {INDEX})"),
            });
        }
        return Ok(vec!["model.safetensors".into()]);
    };
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| LoadError::Metadata {
            file: label(dir, INDEX),
            key: "weight_map".into(),
            msg: "missing or not an object".into(),
        })?;
    let mut names: Vec<String> = Vec::new();
    for (tensor, f) in map {
        let f = f
            .as_str()
            .filter(|f| !f.is_empty() && !f.contains(['/', '\\']) && *f != "." && *f != "..");
        let Some(f) = f else {
            return Err(LoadError::Metadata {
                file: label(dir, INDEX),
                key: format!("weight_map.{tensor}"),
                msg: "expected a file name inside the model directory".into(),
            });
        };
        if !names.iter().any(|n| n == f) {
            names.push(f.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Reads every shard and lays the model's tensors out in one buffer (offsets aligned to 32).
pub fn load(dir: &Path, cfg: &Config) -> Result<(Vec<TensorInfo>, Vec<u8>), LoadError> {
    let names = shard_names(dir)?;
    let maps = names
        .iter()
        .map(|n| {
            let io = |source| LoadError::Io {
                file: label(dir, n),
                source,
            };
            let f = std::fs::File::open(dir.join(n)).map_err(io)?;
            // SAFETY: read-only map; as for GGUF files, the checkpoint must not change while
            // it is read.
            unsafe { crate::gguf::map_readonly(&f) }.map_err(io)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let shards = maps
        .iter()
        .zip(&names)
        .map(|(m, n)| {
            SafeTensors::deserialize(m).map_err(|e| LoadError::Format {
                file: label(dir, n),
                msg: format!("not a valid safetensors file: {e}"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
    let qwen = is_qwen35(cfg.arch);
    for (si, st) in shards.iter().enumerate() {
        for (name, view) in st.iter() {
            let bad = |msg: String| LoadError::Format {
                file: label(dir, &names[si]),
                msg: format!("tensor '{name}': {msg}"),
            };
            let t = match qwen {
                true => {
                    let short = name.replacen("language_model.", "", 1);
                    if short.starts_with("model.visual.") || short.starts_with("visual.") {
                        Some(Target::Skip)
                    } else {
                        qwen35(cfg, &short)
                    }
                }
                false if cfg.arch == "bert" => bert(cfg, name),
                false => target(cfg.arch, name),
            };
            let Some(t) = t else {
                return Err(bad(format!("has no place in a {} model", cfg.arch)));
            };
            // Skipped before any check: BERT's position_ids are I64.
            if let Target::Skip = t {
                continue;
            }
            let mut hf: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            // LFM2's depthwise convolution `[channels, 1, L]`: the converter squeezes it.
            let squeeze = match &t {
                Target::Made(v) => v[0].1.squeeze,
                _ => cfg.arch == "lfm2" && name.ends_with("conv.conv.weight"),
            };
            if squeeze && hf.len() == 3 && hf[1] == 1 {
                hf.remove(1);
            }
            // Fused experts are 3-D.
            let max_dims = match &t {
                Target::Made(v) if v[0].0.ends_with("_exps.weight") => 3,
                _ => 2,
            };
            if hf.is_empty() || hf.len() > max_dims {
                let want = match max_dims {
                    2 => "1 or 2",
                    _ => "1 to 3",
                };
                return Err(bad(format!("shape {hf:?}: expected {want} dimensions")));
            }
            let dtype = match (view.dtype(), hf.len()) {
                (Dtype::F32 | Dtype::BF16, _) | (Dtype::F16, 1) => DType::F32,
                (Dtype::F16, _) => DType::F16,
                (d, _) => return Err(bad(format!("dtype {d:?} (supported: F32, F16, BF16)"))),
            };
            let shape: Vec<u64> = hf.iter().rev().copied().collect();
            let src_rows: u64 = hf[..hf.len() - 1].iter().product();
            match t {
                Target::Skip => {}
                Target::Made(outs) => {
                    for (g, mut xf) in outs {
                        let mut out = hf.clone();
                        let rows_of = |nk: u64, per: u64| nk * per;
                        match &mut xf.rows {
                            RowMap::Qkvz { nk, hk, vr, z } => {
                                let want = rows_of(*nk, 2 * *hk + 2 * *vr);
                                if hf.len() != 2 || hf[0] != want {
                                    return Err(bad(format!(
                                        "shape {hf:?}: expected {want} rows (per key head q, k, v, z)"
                                    )));
                                }
                                out[0] = match z {
                                    true => *nk * *vr,
                                    false => *nk * (2 * *hk + *vr),
                                };
                            }
                            RowMap::Half { f, .. } => {
                                if hf.len() != 3 || hf[1] % 2 != 0 {
                                    return Err(bad(format!(
                                        "shape {hf:?}: expected [experts, 2 x width, hidden]"
                                    )));
                                }
                                *f = hf[1] / 2;
                                out[1] = *f;
                            }
                            RowMap::VTiled { start, nk, r, hd } => {
                                let want = *start + *nk * *r * *hd;
                                if src_rows != want {
                                    return Err(bad(format!(
                                        "{src_rows} rows, expected {want} (linear_* sizes in config.json)"
                                    )));
                                }
                            }
                            _ => {}
                        }
                        if let Some((nk, r, hd)) = xf.cols {
                            let want = nk * r * hd;
                            if hf[hf.len() - 1] != want {
                                return Err(bad(format!(
                                    "shape {hf:?}: expected {want} columns (linear_* sizes in config.json)"
                                )));
                            }
                        }
                        if hf.len() == 3 && !g.ends_with("_exps.weight") {
                            return Err(bad(format!("shape {hf:?}: expected 1 or 2 dimensions")));
                        }
                        let dtype = match xf.value {
                            ValueOp::Same => dtype,
                            _ => DType::F32,
                        };
                        let e = Entry {
                            dtype,
                            shape: out.iter().rev().copied().collect(),
                            parts: vec![(si, name.to_string())],
                            xf,
                            src_rows,
                        };
                        if entries.insert(g.clone(), e).is_some() {
                            return Err(bad(format!("a second tensor for '{g}'")));
                        }
                    }
                }
                Target::Plain(g) => {
                    let permute_heads = match (cfg.arch, g.rsplit('.').nth(1)) {
                        ("llama", Some("attn_q")) => Some(cfg.n_head),
                        ("llama", Some("attn_k")) => Some(cfg.n_head_kv),
                        _ => None,
                    };
                    if let Some(h) = permute_heads {
                        if hf[0] % (2 * h) != 0 {
                            return Err(bad(format!("{} rows do not split into {h} heads", hf[0])));
                        }
                    }
                    let shift = match cfg.arch {
                        "gemma3" if g.ends_with("norm.weight") && dtype == DType::F32 => 1.0,
                        _ => 0.0,
                    };
                    let e = Entry {
                        dtype,
                        shape,
                        parts: vec![(si, name.to_string())],
                        xf: Xform {
                            rows: permute_heads.map_or(RowMap::Same, RowMap::Llama),
                            value: match shift {
                                0.0 => ValueOp::Same,
                                c => ValueOp::Add(c),
                            },
                            ..PLAIN
                        },
                        src_rows,
                    };
                    if entries.insert(g.clone(), e).is_some() {
                        return Err(bad(format!("a second tensor for '{g}'")));
                    }
                }
                Target::Expert(g, xi) => {
                    if xi as u64 >= cfg.n_expert {
                        return Err(bad(format!("expert {xi} of {}", cfg.n_expert)));
                    }
                    if hf.len() != 2 {
                        return Err(bad(format!("shape {hf:?}: expected 2 dimensions")));
                    }
                    let e = entries.entry(g.clone()).or_insert_with(|| Entry {
                        dtype,
                        shape: [shape.clone(), vec![cfg.n_expert]].concat(),
                        parts: vec![(usize::MAX, String::new()); cfg.n_expert as usize],
                        xf: PLAIN,
                        src_rows,
                    });
                    if e.shape[..2] != shape[..] || e.dtype != dtype {
                        return Err(bad(format!("expert shapes or dtypes differ within '{g}'")));
                    }
                    if e.parts[xi].0 != usize::MAX {
                        return Err(bad(format!("expert {xi} of '{g}' appears twice")));
                    }
                    e.parts[xi] = (si, name.to_string());
                }
            }
        }
    }
    for (g, e) in &entries {
        if let Some(xi) = e.parts.iter().position(|p| p.0 == usize::MAX) {
            return Err(LoadError::Format {
                file: dir.display().to_string(),
                msg: format!("'{g}': expert {xi} is missing from the checkpoint"),
            });
        }
    }

    // An encoder (BERT) has no output matrix.
    if !cfg.tie_embeddings && cfg.arch != "bert" && !entries.contains_key("output.weight") {
        return Err(LoadError::Format {
            file: dir.display().to_string(),
            msg: "lm_head.weight is missing and config.json's tie_word_embeddings is false".into(),
        });
    }

    // Layout, then fill.
    let mut infos = Vec::with_capacity(entries.len());
    let mut offset = 0u64;
    for (g, e) in &entries {
        let size = tensor_bytes(e.dtype, &e.shape).ok_or_else(|| LoadError::Format {
            file: dir.display().to_string(),
            msg: format!("'{g}': shape {:?} is too large", e.shape),
        })?;
        offset = offset.div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        infos.push(TensorInfo {
            name: g.clone(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            offset,
            size,
            expert_stride: 0,
        });
        offset = offset.checked_add(size).ok_or_else(|| LoadError::Format {
            file: dir.display().to_string(),
            msg: "model too large".into(),
        })?;
    }
    let mut data = vec![0u8; offset as usize];
    for (info, e) in infos.iter().zip(entries.values()) {
        let part_bytes = (info.size / e.parts.len() as u64) as usize;
        for (pi, (si, name)) in e.parts.iter().enumerate() {
            let view = shards[*si].tensor(name).expect("listed above");
            let dst = &mut data[info.offset as usize + pi * part_bytes..][..part_bytes];
            let row = e.shape[0] as usize;
            let dsz = e.dtype.info().block_bytes as usize;
            let rows = part_bytes / (row * dsz);
            let src_row = |r: usize| -> usize {
                match e.xf.rows {
                    RowMap::Same => r,
                    // llama: GGUF row h·hd + 2j + s is checkpoint row h·hd + s·hd/2 + j.
                    RowMap::Llama(h) => {
                        let hd = rows / h as usize;
                        let (head, w) = (r / hd, r % hd);
                        head * hd + (w % 2) * (hd / 2) + w / 2
                    }
                    RowMap::VTiled {
                        start,
                        nk,
                        r: per,
                        hd,
                    } => {
                        let (start, nk, per, hd) =
                            (start as usize, nk as usize, per as usize, hd as usize);
                        match r.checked_sub(start) {
                            None => r,
                            Some(i) => start + v_tiled_src(i, nk, per, hd),
                        }
                    }
                    RowMap::Qkvz { nk, hk, vr, z } => {
                        let (nk, hk, vr) = (nk as usize, hk as usize, vr as usize);
                        let blk = 2 * hk + 2 * vr;
                        match z {
                            true => (r / vr) * blk + 2 * hk + vr + r % vr,
                            false if r < 2 * nk * hk => {
                                let (part, i) = (r / (nk * hk), r % (nk * hk));
                                (i / hk) * blk + part * hk + i % hk
                            }
                            false => {
                                let i = r - 2 * nk * hk;
                                (i / vr) * blk + 2 * hk + i % vr
                            }
                        }
                    }
                    RowMap::Half { f, up } => {
                        let f = f as usize;
                        (r / f) * 2 * f + usize::from(up) * f + r % f
                    }
                }
            };
            let esz = match view.dtype() {
                Dtype::F32 => 4,
                _ => 2,
            };
            let src = view.data();
            if src.len() as u64 != e.src_rows * row as u64 * esz as u64 {
                return Err(LoadError::Format {
                    file: label(dir, &names[*si]),
                    msg: format!("tensor '{name}': {} bytes for its shape", src.len()),
                });
            }
            let mut tmp = vec![0u8; row * dsz];
            for r in 0..rows {
                let s = &src[src_row(r) * row * esz..][..row * esz];
                let d = &mut dst[r * row * dsz..][..row * dsz];
                match e.xf.cols {
                    None => convert(view.dtype(), s, e.dtype, d),
                    Some((nk, per, hd)) => {
                        convert(view.dtype(), s, e.dtype, &mut tmp);
                        let (nk, per, hd) = (nk as usize, per as usize, hd as usize);
                        for c in 0..row {
                            let from = v_tiled_src(c, nk, per, hd);
                            d[c * dsz..][..dsz].copy_from_slice(&tmp[from * dsz..][..dsz]);
                        }
                    }
                }
                if e.xf.value != ValueOp::Same {
                    // F32 here (see above).
                    for x in d.chunks_exact_mut(4) {
                        let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                        let v = match e.xf.value {
                            ValueOp::Add(c) => v + c,
                            ValueOp::NegExp => -v.exp(),
                            ValueOp::Same => v,
                        };
                        x.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
    }
    Ok((infos, data))
}

/// Tiled value head order: element `i` of the GGUF (value head `j * nk + g`, offset `d`) is
/// element `(g * per + j) * hd + d` of the checkpoint (value head `j` of key head `g`).
fn v_tiled_src(i: usize, nk: usize, per: usize, hd: usize) -> usize {
    let (head, d) = (i / hd, i % hd);
    let (j, g) = (head / nk, head % nk);
    (g * per + j) * hd + d
}

/// Every layer has its mixer's tensors: a checkpoint without one is refused naming it
/// (the graph would name only the GGUF tensor).
pub fn qwen35_complete(dir: &Path, cfg: &Config, infos: &[TensorInfo]) -> Result<(), LoadError> {
    for (il, &attn) in cfg.attention_layers.iter().enumerate() {
        let need: &[(&str, &str)] = match (attn, cfg.arch) {
            (true, _) => &[
                ("attn_q.weight", "self_attn.q_proj.weight"),
                ("attn_k.weight", "self_attn.k_proj.weight"),
                ("attn_v.weight", "self_attn.v_proj.weight"),
                ("attn_output.weight", "self_attn.o_proj.weight"),
            ],
            (false, "qwen3next") => &[
                ("attn_qkv.weight", "linear_attn.in_proj_qkvz.weight"),
                ("ssm_ba.weight", "linear_attn.in_proj_ba.weight"),
                ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
                ("ssm_a", "linear_attn.A_log"),
                ("ssm_dt.bias", "linear_attn.dt_bias"),
                ("ssm_norm.weight", "linear_attn.norm.weight"),
                ("ssm_out.weight", "linear_attn.out_proj.weight"),
            ],
            (false, _) => &[
                ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
                ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
                ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
                ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
                ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
                ("ssm_a", "linear_attn.A_log"),
                ("ssm_dt.bias", "linear_attn.dt_bias"),
                ("ssm_norm.weight", "linear_attn.norm.weight"),
                ("ssm_out.weight", "linear_attn.out_proj.weight"),
            ],
        };
        for (g, hf) in need {
            let want = format!("blk.{il}.{g}");
            if !infos.iter().any(|t| t.name == want) {
                return Err(LoadError::Format {
                    file: dir.display().to_string(),
                    msg: format!(
                        "tensor 'model.layers.{il}.{hf}' is missing (layer {il} is {})",
                        if attn {
                            "full attention"
                        } else {
                            "linear attention"
                        }
                    ),
                });
            }
        }
    }
    Ok(())
}

/// One row from the checkpoint's element type to the GGUF one (exact in every case taken).
fn convert(from: Dtype, src: &[u8], to: DType, dst: &mut [u8]) {
    match (from, to) {
        (Dtype::F32, _) | (Dtype::F16, DType::F16) => dst.copy_from_slice(src),
        (Dtype::F16, _) => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(2)) {
                let v = half::f16::from_le_bytes([s[0], s[1]]).to_f32();
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            // BF16 is the top half of an f32.
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(2)) {
                d.copy_from_slice(&[0, 0, s[0], s[1]]);
            }
        }
    }
}
