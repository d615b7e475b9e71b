//! safetensors weights → GGUF tensors: llama.cpp's names, ggml shape order (a Hugging Face
//! `[out, in]` matrix is ggml `[in, out]`, the same bytes), routed experts stacked into one
//! `[in, out, n_expert]` tensor per projection, BF16 widened to F32 (exact), 1-D tensors in F32
//! (as llama.cpp's converter writes norms), and llama's q/k rows permuted for its rope layout
//! (`LlamaModel.permute` in convert_hf_to_gguf.py). Gemma 3's RMS norms scale by `1 + weight`;
//! the GGUF holds `1 + weight` (computed in f32, as Hugging Face's `Gemma3RMSNorm` does), as
//! llama.cpp's converter writes it. LFM2's convolution weights `[channels, 1, L]` lose their
//! middle dimension (the converter's squeeze).

use std::collections::BTreeMap;
use std::path::Path;

use abi::DType;
use safetensors::{Dtype, SafeTensors};

use super::config::Config;
use super::{label, read_json};
use crate::gguf::{tensor_bytes, TensorInfo, DEFAULT_ALIGNMENT};
use crate::LoadError;

/// Where a checkpoint tensor goes.
enum Target {
    Plain(String),
    /// Expert `e` of a stacked tensor.
    Expert(String, usize),
    /// Not a weight (rotary caches some checkpoints carry).
    Skip,
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
    /// llama's q/k: rows are permuted with this many heads.
    permute_heads: Option<u64>,
    /// Added to every element (Gemma's `1 + weight` norms).
    shift: f32,
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
    for (si, st) in shards.iter().enumerate() {
        for (name, view) in st.iter() {
            let bad = |msg: String| LoadError::Format {
                file: label(dir, &names[si]),
                msg: format!("tensor '{name}': {msg}"),
            };
            let Some(t) = target(cfg.arch, name) else {
                return Err(bad(format!("has no place in a {} model", cfg.arch)));
            };
            let mut hf: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            // LFM2's depthwise convolution `[channels, 1, L]`: the converter squeezes it.
            if cfg.arch == "lfm2"
                && name.ends_with("conv.conv.weight")
                && hf.len() == 3
                && hf[1] == 1
            {
                hf.remove(1);
            }
            if hf.is_empty() || hf.len() > 2 {
                return Err(bad(format!("shape {hf:?}: expected 1 or 2 dimensions")));
            }
            let dtype = match (view.dtype(), hf.len()) {
                (Dtype::F32 | Dtype::BF16, _) | (Dtype::F16, 1) => DType::F32,
                (Dtype::F16, _) => DType::F16,
                (d, _) => return Err(bad(format!("dtype {d:?} (supported: F32, F16, BF16)"))),
            };
            let shape: Vec<u64> = hf.iter().rev().copied().collect();
            match t {
                Target::Skip => {}
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
                        permute_heads,
                        shift,
                    };
                    if entries.insert(g.clone(), e).is_some() {
                        return Err(bad(format!("a second tensor for '{g}'")));
                    }
                }
                Target::Expert(g, xi) => {
                    if xi as u64 >= cfg.n_expert {
                        return Err(bad(format!("expert {xi} of {}", cfg.n_expert)));
                    }
                    let e = entries.entry(g.clone()).or_insert_with(|| Entry {
                        dtype,
                        shape: [shape.clone(), vec![cfg.n_expert]].concat(),
                        parts: vec![(usize::MAX, String::new()); cfg.n_expert as usize],
                        permute_heads: None,
                        shift: 0.0,
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

    if !cfg.tie_embeddings && !entries.contains_key("output.weight") {
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
            let rows = part_bytes / (row * e.dtype.info().block_bytes as usize);
            let src_row = |r: usize| -> usize {
                // llama: GGUF row h·hd + 2j + s is checkpoint row h·hd + s·hd/2 + j.
                match e.permute_heads {
                    Some(h) => {
                        let hd = rows / h as usize;
                        let (head, w) = (r / hd, r % hd);
                        head * hd + (w % 2) * (hd / 2) + w / 2
                    }
                    None => r,
                }
            };
            let esz = match view.dtype() {
                Dtype::F32 => 4,
                _ => 2,
            };
            let src = view.data();
            if src.len() != rows * row * esz {
                return Err(LoadError::Format {
                    file: label(dir, &names[*si]),
                    msg: format!("tensor '{name}': {} bytes for its shape", src.len()),
                });
            }
            let dsz = e.dtype.info().block_bytes as usize;
            for r in 0..rows {
                let s = &src[src_row(r) * row * esz..][..row * esz];
                let d = &mut dst[r * row * dsz..][..row * dsz];
                convert(view.dtype(), s, e.dtype, d);
                if e.shift != 0.0 {
                    // Norms are F32 here (1-D tensors always are).
                    for x in d.chunks_exact_mut(4) {
                        let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]) + e.shift;
                        x.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
    }
    Ok((infos, data))
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
