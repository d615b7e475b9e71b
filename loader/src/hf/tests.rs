//! Hugging Face directories built in a scratch folder: what loads (names, shapes, exact dtype
//! conversion, llama's q/k permutation, stacked experts, tokenizer keys) and what is refused with
//! an error naming the file and the problem.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;

use crate::LoadError;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mollm-hf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// (name, dtype, HF shape, f32 values) → safetensors bytes (BF16/F16 from the values).
fn st<S: AsRef<str>>(tensors: &[(S, Dtype, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, dt, _, v)| match dt {
            Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dtype::F16 => v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
            Dtype::BF16 => v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
            _ => unreachable!(),
        })
        .collect();
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, dt, s, _), b)| {
            (
                n.as_ref().to_string(),
                TensorView::new(*dt, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

fn tokenizer_json() -> serde_json::Value {
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 5, "content": "<|end|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4}, "merges": ["a b", "Ġ ab"]}
    })
}

fn ramp(n: usize, k: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - n as f32 / 2.0) * k).collect()
}

/// A tiny llama directory: vocab 8, hidden 4, 2 heads of 2, 1 layer, FFN 6, tied embeddings.
fn llama_dir(name: &str) -> PathBuf {
    let d = scratch(name);
    let cfg = json!({"model_type": "llama", "vocab_size": 8, "hidden_size": 4,
        "intermediate_size": 6, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
        "max_position_embeddings": 64, "rope_theta": 10000.0});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(d.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    std::fs::write(
        d.join("tokenizer_config.json"),
        json!({"eos_token": "<|end|>", "chat_template": "{{ messages[0]['content'] }}"})
            .to_string(),
    )
    .unwrap();
    let p = "model.layers.0.";
    let t = vec![
        (
            "model.embed_tokens.weight".to_string(),
            Dtype::BF16,
            vec![8, 4],
            ramp(32, 0.25),
        ),
        (
            "model.norm.weight".to_string(),
            Dtype::F16,
            vec![4],
            ramp(4, 0.5),
        ),
        (
            format!("{p}input_layernorm.weight"),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        (
            format!("{p}self_attn.q_proj.weight"),
            Dtype::F32,
            vec![4, 4],
            ramp(16, 1.0),
        ),
        (
            format!("{p}self_attn.k_proj.weight"),
            Dtype::F32,
            vec![4, 4],
            ramp(16, 2.0),
        ),
        (
            format!("{p}self_attn.v_proj.weight"),
            Dtype::F16,
            vec![4, 4],
            ramp(16, 0.5),
        ),
        (
            format!("{p}self_attn.o_proj.weight"),
            Dtype::F16,
            vec![4, 4],
            ramp(16, 0.5),
        ),
        (
            format!("{p}post_attention_layernorm.weight"),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        (
            format!("{p}mlp.gate_proj.weight"),
            Dtype::BF16,
            vec![6, 4],
            ramp(24, 0.5),
        ),
        (
            format!("{p}mlp.up_proj.weight"),
            Dtype::BF16,
            vec![6, 4],
            ramp(24, 0.5),
        ),
        (
            format!("{p}mlp.down_proj.weight"),
            Dtype::BF16,
            vec![4, 6],
            ramp(24, 0.5),
        ),
        (
            format!("{p}self_attn.rotary_emb.inv_freq"),
            Dtype::F32,
            vec![1],
            vec![1.0],
        ),
    ];
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    d
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn a_llama_directory_loads_like_its_gguf_conversion() {
    let d = llama_dir("llama");
    let g = super::open_dir(&d).unwrap();
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get_u32("llama.block_count").unwrap(), Some(1));
    assert_eq!(g.get_u32("llama.attention.key_length").unwrap(), Some(2));
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), Some("gpt-2"));
    assert_eq!(g.get_u32("tokenizer.ggml.eos_token_id").unwrap(), Some(5));
    assert!(g.get_str("tokenizer.chat_template").unwrap().is_some());
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 8, "padded to config.json's vocab_size");
    assert_eq!(tokens.get(7), Some("[PAD7]"));
    assert_eq!(g.tensor("output.weight"), None, "tied: no output matrix");
    // BF16 widened exactly, shape reversed.
    let e = g.tensor("token_embd.weight").unwrap();
    assert_eq!((e.dtype, e.shape.clone()), (abi::DType::F32, vec![4, 8]));
    assert_eq!(f32s(g.tensor_data(e)), ramp(32, 0.25));
    // 1-D F16 norms become F32; F16 matrices stay F16.
    assert_eq!(
        g.tensor("output_norm.weight").unwrap().dtype,
        abi::DType::F32
    );
    assert_eq!(
        g.tensor("blk.0.attn_v.weight").unwrap().dtype,
        abi::DType::F16
    );
    // q rows: GGUF row h·hd + 2j + s = HF row h·hd + s·hd/2 + j (hd = 2: rows stay; k too).
    let q = f32s(g.tensor_data(g.tensor("blk.0.attn_q.weight").unwrap()));
    assert_eq!(q, ramp(16, 1.0));
    assert!(g.tensor("blk.0.ffn_down.weight").is_some());
    // The tokenizer reads tokenizer.json through the tokenizers crate.
    let tk = crate::Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tk.encode(" ab<|end|>", false, true).unwrap(), vec![4, 5]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn llama_q_rows_are_permuted_for_rope() {
    let d = llama_dir("perm");
    // 1 head of 4: HF rows [0 1 2 3] become GGUF rows [0 2 1 3].
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    cfg["num_attention_heads"] = json!(1);
    cfg["num_key_value_heads"] = json!(1);
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    let g = super::open_dir(&d).unwrap();
    let q = f32s(g.tensor_data(g.tensor("blk.0.attn_q.weight").unwrap()));
    let hf = ramp(16, 1.0);
    let want: Vec<f32> = [0, 2, 1, 3]
        .iter()
        .flat_map(|&r| hf[4 * r..4 * r + 4].to_vec())
        .collect();
    assert_eq!(q, want);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn experts_are_stacked_across_shards() {
    let d = scratch("moe");
    let cfg = json!({"model_type": "qwen3_moe", "vocab_size": 6, "hidden_size": 4,
        "intermediate_size": 8, "moe_intermediate_size": 2, "num_experts": 2,
        "num_experts_per_tok": 1, "norm_topk_prob": true, "num_hidden_layers": 1,
        "num_attention_heads": 2, "head_dim": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": true});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(d.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    let x = |e: usize, w: &str| format!("model.layers.0.mlp.experts.{e}.{w}_proj.weight");
    let a = vec![
        ((x(1, "gate")), Dtype::BF16, vec![2, 4], ramp(8, 2.0)),
        ((x(0, "gate")), Dtype::BF16, vec![2, 4], ramp(8, 1.0)),
    ];
    let b = vec![((x(0, "up")), Dtype::BF16, vec![2, 4], ramp(8, 1.0))];
    std::fs::write(d.join("a.safetensors"), st(&a)).unwrap();
    std::fs::write(d.join("b.safetensors"), st(&b)).unwrap();
    let index = |files: &[(&str, &str)]| {
        let m: HashMap<_, _> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        json!({"weight_map": m}).to_string()
    };
    std::fs::write(
        d.join("model.safetensors.index.json"),
        index(&[
            (&x(0, "gate"), "a.safetensors"),
            (&x(0, "up"), "b.safetensors"),
        ]),
    )
    .unwrap();
    // Expert 1 of up_proj is missing: refused, naming it.
    let e = super::open_dir(&d).unwrap_err().to_string();
    assert!(
        e.contains("ffn_up_exps") && e.contains("expert 1 is missing"),
        "{e}"
    );
    let tensors = super::tensors::load(&d, &super::config::Config::load(&d).unwrap());
    assert!(tensors.is_err());
    // Stacking order follows the expert index, not the file order.
    let b = vec![
        ((x(0, "up")), Dtype::BF16, vec![2, 4], ramp(8, 1.0)),
        ((x(1, "up")), Dtype::BF16, vec![2, 4], ramp(8, 3.0)),
    ];
    std::fs::write(d.join("b.safetensors"), st(&b)).unwrap();
    let (infos, data) =
        super::tensors::load(&d, &super::config::Config::load(&d).unwrap()).unwrap();
    let gate = infos
        .iter()
        .find(|t| t.name == "blk.0.ffn_gate_exps.weight")
        .unwrap();
    assert_eq!(gate.shape, vec![4, 2, 2]);
    let v = f32s(&data[gate.offset as usize..][..gate.size as usize]);
    assert_eq!(v, [ramp(8, 1.0), ramp(8, 2.0)].concat());
    std::fs::remove_dir_all(&d).unwrap();
}

fn refused(d: &Path, needles: &[&str]) {
    let e: LoadError = super::open_dir(d).unwrap_err();
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} does not mention {n:?}");
    }
}

#[test]
fn bad_directories_are_refused_with_the_file_and_the_problem() {
    let d = llama_dir("bad");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    let set_cfg = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = cfg.clone();
        f(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    };
    set_cfg(&|c| c["model_type"] = json!("mamba"));
    refused(
        &d,
        &[
            "config.json",
            "model_type",
            "'mamba' is not supported",
            "qwen3",
        ],
    );
    set_cfg(&|c| c["num_hidden_layers"] = json!("two"));
    refused(
        &d,
        &["config.json", "num_hidden_layers", "expected an integer"],
    );
    set_cfg(&|c| c["num_key_value_heads"] = json!(3));
    refused(&d, &["num_key_value_heads", "does not divide"]);
    set_cfg(&|c| c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0}));
    refused(&d, &["rope_scaling", "not supported"]);
    set_cfg(&|c| c["tie_word_embeddings"] = json!(false));
    refused(&d, &["lm_head.weight is missing"]);
    set_cfg(&|_| {});
    std::fs::write(d.join("config.json"), b"{not json").unwrap();
    refused(&d, &["config.json", "not valid JSON"]);
    set_cfg(&|_| {});

    // Truncated weights.
    let full = std::fs::read(d.join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &full[..full.len() - 10]).unwrap();
    refused(&d, &["model.safetensors", "not a valid safetensors file"]);
    std::fs::write(d.join("model.safetensors"), &full[..6]).unwrap();
    refused(&d, &["model.safetensors", "not a valid safetensors file"]);
    std::fs::write(d.join("model.safetensors"), &full).unwrap();

    // A shard outside the directory.
    std::fs::write(
        d.join("model.safetensors.index.json"),
        json!({"weight_map": {"model.norm.weight": "../model.safetensors"}}).to_string(),
    )
    .unwrap();
    refused(
        &d,
        &[
            "model.safetensors.index.json",
            "weight_map.model.norm.weight",
            "inside the model directory",
        ],
    );
    std::fs::remove_file(d.join("model.safetensors.index.json")).unwrap();

    // A tensor no graph has a place for.
    let extra = st(&[(
        "model.layers.0.mlp.mystery.weight",
        Dtype::F32,
        vec![2],
        vec![1.0, 2.0],
    )]);
    std::fs::write(d.join("model.safetensors"), extra).unwrap();
    refused(
        &d,
        &[
            "model.layers.0.mlp.mystery.weight",
            "has no place in a llama model",
        ],
    );
    std::fs::write(d.join("model.safetensors"), &full).unwrap();

    // Tokenizer problems.
    std::fs::remove_file(d.join("tokenizer.json")).unwrap();
    refused(&d, &["tokenizer.json"]);
    let mut tj = tokenizer_json();
    tj["model"]["type"] = json!("Unigram");
    std::fs::write(d.join("tokenizer.json"), tj.to_string()).unwrap();
    refused(&d, &["tokenizer.json"]);
    std::fs::write(d.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    super::open_dir(&d).unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}

/// A SentencePiece-style BPE tokenizer.json as Hugging Face writes Gemma's: spaces become
/// U+2581, byte fallback, no pre-tokenizer.
fn spm_tokenizer_json() -> serde_json::Value {
    let mut vocab = serde_json::Map::new();
    for (i, t) in [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "a",
        "b",
        "ab",
        "\u{2581}",
        "\u{2581}ab",
    ]
    .iter()
    .enumerate()
    {
        vocab.insert(t.to_string(), json!(i));
    }
    for b in 0..256 {
        vocab.insert(format!("<0x{b:02X}>"), json!(9 + b));
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": 1, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "<bos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                  "vocab": vocab, "merges": [["a", "b"], ["\u{2581}", "ab"]]}
    })
}

/// A one-layer Gemma 3 directory (vocab 265, hidden 4, 2 heads of 2): only what the loader
/// itself checks and converts.
fn gemma3_dir(name: &str) -> PathBuf {
    let d = scratch(name);
    let cfg = json!({"model_type": "gemma3_text", "vocab_size": 265, "hidden_size": 4,
        "intermediate_size": 6, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 2, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 64, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 16, "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": null});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(d.join("tokenizer.json"), spm_tokenizer_json().to_string()).unwrap();
    std::fs::write(
        d.join("tokenizer_config.json"),
        json!({"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
               "pad_token": "<pad>", "add_bos_token": true})
        .to_string(),
    )
    .unwrap();
    let p = "model.layers.0.";
    let t = vec![
        (
            "model.embed_tokens.weight".to_string(),
            Dtype::F16,
            vec![265, 4],
            ramp(1060, 0.01),
        ),
        (
            "model.norm.weight".to_string(),
            Dtype::BF16,
            vec![4],
            ramp(4, 0.5),
        ),
        (
            format!("{p}post_attention_layernorm.weight"),
            Dtype::F32,
            vec![4],
            ramp(4, 0.25),
        ),
        (
            format!("{p}pre_feedforward_layernorm.weight"),
            Dtype::F32,
            vec![4],
            ramp(4, 0.125),
        ),
        (
            format!("{p}post_feedforward_layernorm.weight"),
            Dtype::F32,
            vec![4],
            ramp(4, 2.0),
        ),
        (
            format!("{p}self_attn.q_norm.weight"),
            Dtype::F32,
            vec![2],
            vec![-1.0, 0.5],
        ),
        (
            format!("{p}self_attn.q_proj.weight"),
            Dtype::F32,
            vec![4, 4],
            ramp(16, 1.0),
        ),
    ];
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    d
}

#[test]
fn a_gemma3_directory_gets_shifted_norms_and_its_attention_keys() {
    let d = gemma3_dir("gemma3");
    let g = super::open_dir(&d).unwrap();
    assert_eq!(g.architecture().unwrap(), "gemma3");
    // Norms hold 1 + weight (BF16 widened first); the sandwich norms get Gemma's names.
    let norm = |n: &str| f32s(g.tensor_data(g.tensor(n).unwrap()));
    let plus1 = |v: Vec<f32>| v.into_iter().map(|x| x + 1.0).collect::<Vec<_>>();
    assert_eq!(norm("output_norm.weight"), plus1(ramp(4, 0.5)));
    assert_eq!(
        norm("blk.0.post_attention_norm.weight"),
        plus1(ramp(4, 0.25))
    );
    assert_eq!(norm("blk.0.ffn_norm.weight"), plus1(ramp(4, 0.125)));
    assert_eq!(norm("blk.0.post_ffw_norm.weight"), plus1(ramp(4, 2.0)));
    assert_eq!(norm("blk.0.attn_q_norm.weight"), vec![0.0, 1.5]);
    // Matrices are not shifted, and not permuted (Gemma uses NEOX rope).
    assert_eq!(norm("blk.0.attn_q.weight"), ramp(16, 1.0));
    assert_eq!(g.tensor("output.weight"), None, "tied by default");
    // Attention keys.
    assert_eq!(
        g.get_u32("gemma3.attention.sliding_window").unwrap(),
        Some(4)
    );
    assert_eq!(
        g.get_bool_array("gemma3.attention.sliding_window_pattern")
            .unwrap(),
        Some(&[true, false][..])
    );
    assert_eq!(g.get_f32("gemma3.attention.scale").unwrap(), Some(0.25));
    assert_eq!(
        g.get_f32("gemma3.rope.freq_base_swa").unwrap(),
        Some(10000.0)
    );
    // The SentencePiece-style vocabulary: llama.cpp's `llama` model with byte tokens.
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), Some("llama"));
    assert_eq!(
        g.get_bool("tokenizer.ggml.add_space_prefix").unwrap(),
        Some(false)
    );
    let types = g
        .get_i32_array("tokenizer.ggml.token_type")
        .unwrap()
        .unwrap();
    assert_eq!(
        (types[2], types[3], types[6], types[9 + 0x41]),
        (3, 2, 1, 6)
    );
    let tk = crate::Tokenizer::from_gguf(&g).unwrap();
    // "ab ab": BPE merges, the space as U+2581, BOS added; "é" falls back to its two bytes.
    let ids = tk.encode("ab abé", true, true).unwrap();
    assert_eq!(ids, vec![2, 6, 8, 9 + 0xC3, 9 + 0xA9]);
    assert_eq!(tk.decode(&ids[1..]), "ab abé");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn gemma3_configs_mollm_cannot_run_are_refused() {
    let d = gemma3_dir("gemma3-bad");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    let set_cfg = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = cfg.clone();
        f(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    };
    set_cfg(&|c| c["final_logit_softcapping"] = json!(30.0));
    refused(
        &d,
        &["config.json", "final_logit_softcapping", "not supported"],
    );
    set_cfg(&|c| c["hidden_activation"] = json!("relu"));
    refused(&d, &["hidden_activation", "'relu' is not supported"]);
    set_cfg(&|c| c["layer_types"] = json!(["sliding_attention"]));
    refused(&d, &["layer_types", "expected a list of 2 layer types"]);
    set_cfg(&|c| c["layer_types"] = json!(["sliding_attention", "chunked"]));
    refused(&d, &["layer_types", "\"chunked\""]);
    set_cfg(&|c| {
        c.as_object_mut().unwrap().remove("sliding_window");
    });
    refused(&d, &["sliding_window", "missing"]);
    // Without layer_types: the period (every sliding_window_pattern-th layer is global).
    set_cfg(&|c| {
        c.as_object_mut().unwrap().remove("layer_types");
        c["sliding_window_pattern"] = json!(2);
    });
    let g = super::open_dir(&d).unwrap();
    assert_eq!(
        g.get_bool_array("gemma3.attention.sliding_window_pattern")
            .unwrap(),
        Some(&[true, false][..])
    );
    std::fs::remove_dir_all(&d).unwrap();
}

fn lfm2_dir(name: &str) -> PathBuf {
    let d = scratch(name);
    let cfg = json!({"model_type": "lfm2", "vocab_size": 265, "hidden_size": 4,
        "block_ff_dim": 12, "block_auto_adjust_ff_dim": true, "block_ffn_dim_multiplier": 1.5,
        "block_multiple_of": 8, "intermediate_size": 99, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 1, "norm_eps": 1e-5,
        "max_position_embeddings": 64, "rope_theta": 1000000.0, "conv_L_cache": 3,
        "conv_bias": false, "layer_types": ["conv", "full_attention", "conv"]});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(d.join("tokenizer.json"), spm_tokenizer_json().to_string()).unwrap();
    let t = vec![
        (
            "model.embed_tokens.weight".to_string(),
            Dtype::F32,
            vec![265, 4],
            ramp(1060, 0.01),
        ),
        (
            "model.embedding_norm.weight".to_string(),
            Dtype::F32,
            vec![4],
            ramp(4, 0.5),
        ),
        (
            "model.layers.0.conv.conv.weight".to_string(),
            Dtype::BF16,
            vec![4, 1, 3],
            ramp(12, 0.25),
        ),
        (
            "model.layers.0.operator_norm.weight".to_string(),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        (
            "model.layers.1.self_attn.q_layernorm.weight".to_string(),
            Dtype::F32,
            vec![2],
            vec![-1.0, 0.5],
        ),
    ];
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    d
}

#[test]
fn an_lfm2_directory_gets_its_layer_kinds_ffn_width_and_conv_weights() {
    let d = lfm2_dir("lfm2");
    let g = super::open_dir(&d).unwrap();
    assert_eq!(g.architecture().unwrap(), "lfm2");
    // 12 * 2/3 = 8, * 1.5 = 12, up to a multiple of 8: 16 (llama.cpp's converter).
    assert_eq!(g.get_u64("lfm2.feed_forward_length").unwrap(), Some(16));
    assert_eq!(
        g.get("lfm2.attention.head_count_kv"),
        Some(&crate::Value::Array(crate::Array::U32(vec![0, 1, 0])))
    );
    assert_eq!(g.get_u64("lfm2.shortconv.l_cache").unwrap(), Some(3));
    assert_eq!(
        g.get_f32("lfm2.attention.layer_norm_rms_epsilon").unwrap(),
        Some(1e-5)
    );
    // [4, 1, 3] squeezed: ggml [3, 4], the same values in order.
    let conv = g.tensor("blk.0.shortconv.conv.weight").unwrap();
    assert_eq!(conv.shape, vec![3, 4]);
    assert_eq!(f32s(g.tensor_data(conv)), ramp(12, 0.25));
    assert!(g.tensor("token_embd_norm.weight").is_some());
    assert!(g.tensor("blk.1.attn_q_norm.weight").is_some());
    assert!(g.tensor("blk.0.attn_norm.weight").is_some());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn lfm2_configs_mollm_cannot_run_are_refused() {
    let d = lfm2_dir("lfm2-bad");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    let set_cfg = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = cfg.clone();
        f(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    };
    set_cfg(&|c| c["conv_bias"] = json!(true));
    refused(&d, &["config.json", "conv_bias", "not supported"]);
    set_cfg(&|c| c["layer_types"] = json!(["conv", "mamba", "conv"]));
    refused(&d, &["layer_types", "\"mamba\""]);
    set_cfg(&|c| {
        c.as_object_mut().unwrap().remove("layer_types");
    });
    refused(&d, &["layer_types", "missing (and no full_attn_idxs)"]);
    set_cfg(&|c| {
        c.as_object_mut().unwrap().remove("layer_types");
        c["full_attn_idxs"] = json!([1, 7]);
    });
    refused(&d, &["full_attn_idxs", "below 3"]);
    set_cfg(&|c| c["conv_L_cache"] = json!(1));
    refused(&d, &["conv_L_cache", "2..=64"]);
    std::fs::remove_dir_all(&d).unwrap();
}
