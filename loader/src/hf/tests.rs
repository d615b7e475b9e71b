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
            Dtype::I64 => v.iter().flat_map(|x| (*x as i64).to_le_bytes()).collect(),
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

/// A tiny Qwen3.5 directory in the `*ForConditionalGeneration` form (fields under
/// `text_config`, tensors under `model.language_model.`): hidden 4, layers [linear, full],
/// delta-net 2 key heads / 4 value heads of 2, conv 3, attention 1 head of 8, one MTP block.
fn qwen35_dir(name: &str) -> PathBuf {
    let d = scratch(name);
    let cfg = json!({"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "tie_word_embeddings": true,
        "text_config": {"model_type": "qwen3_5_text", "vocab_size": 6, "hidden_size": 4,
            "intermediate_size": 6, "num_hidden_layers": 2, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": 8, "rms_norm_eps": 1e-6,
            "layer_types": ["linear_attention", "full_attention"], "linear_conv_kernel_dim": 3,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 2,
            "linear_value_head_dim": 2, "attn_output_gate": true, "tie_word_embeddings": true,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0,
                "partial_rotary_factor": 0.25, "mrope_section": [1, 0, 0]}},
        "vision_config": {"depth": 1}});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(d.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    let p = "model.language_model.layers.0.linear_attn.";
    let q = "model.language_model.layers.1.";
    let t: Vec<(String, Dtype, Vec<usize>, Vec<f32>)> = vec![
        (
            "model.language_model.embed_tokens.weight".into(),
            Dtype::BF16,
            vec![6, 4],
            ramp(24, 0.25),
        ),
        (
            "model.language_model.norm.weight".into(),
            Dtype::BF16,
            vec![4],
            ramp(4, 0.5),
        ),
        (
            "model.language_model.layers.0.input_layernorm.weight".into(),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        (
            format!("{p}in_proj_qkv.weight"),
            Dtype::F32,
            vec![16, 4],
            ramp(64, 1.0),
        ),
        (
            format!("{p}in_proj_z.weight"),
            Dtype::F32,
            vec![8, 4],
            ramp(32, 1.0),
        ),
        (
            format!("{p}in_proj_b.weight"),
            Dtype::F32,
            vec![4, 4],
            ramp(16, 1.0),
        ),
        (
            format!("{p}in_proj_a.weight"),
            Dtype::F32,
            vec![4, 4],
            ramp(16, 2.0),
        ),
        (
            format!("{p}conv1d.weight"),
            Dtype::BF16,
            vec![16, 1, 3],
            ramp(48, 1.0),
        ),
        (
            format!("{p}dt_bias"),
            Dtype::F32,
            vec![4],
            vec![0.5, 1.5, 2.5, 3.5],
        ),
        (
            format!("{p}A_log"),
            Dtype::F32,
            vec![4],
            vec![-0.75, 0.0, 0.25, 1.0],
        ),
        (
            format!("{p}norm.weight"),
            Dtype::F32,
            vec![2],
            vec![0.5, 2.0],
        ),
        (
            format!("{p}out_proj.weight"),
            Dtype::F32,
            vec![4, 8],
            ramp(32, 1.0),
        ),
        (
            "model.language_model.layers.0.post_attention_layernorm.weight".into(),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        (
            format!("{q}self_attn.q_proj.weight"),
            Dtype::F32,
            vec![16, 4],
            ramp(64, 1.0),
        ),
        (
            format!("{q}self_attn.k_proj.weight"),
            Dtype::F32,
            vec![8, 4],
            ramp(32, 1.0),
        ),
        (
            format!("{q}self_attn.v_proj.weight"),
            Dtype::F32,
            vec![8, 4],
            ramp(32, 1.0),
        ),
        (
            format!("{q}self_attn.o_proj.weight"),
            Dtype::F32,
            vec![4, 8],
            ramp(32, 1.0),
        ),
        (
            format!("{q}self_attn.q_norm.weight"),
            Dtype::F32,
            vec![8],
            ramp(8, 0.5),
        ),
        (
            "mtp.fc.weight".into(),
            Dtype::F32,
            vec![4, 8],
            ramp(32, 1.0),
        ),
        (
            "mtp.pre_fc_norm_embedding.weight".into(),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        ("mtp.norm.weight".into(), Dtype::F32, vec![4], ramp(4, 1.0)),
        (
            "mtp.layers.0.input_layernorm.weight".into(),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        (
            "model.visual.blocks.0.attn.qkv.weight".into(),
            Dtype::F32,
            vec![2, 2],
            ramp(4, 1.0),
        ),
    ];
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    d
}

/// Rows (or elements) of `x` in blocks of `n`, in the given block order.
fn blocks(x: &[f32], n: usize, order: &[usize]) -> Vec<f32> {
    order
        .iter()
        .flat_map(|&b| x[b * n..(b + 1) * n].to_vec())
        .collect()
}

#[test]
fn a_qwen35_directory_is_converted_as_llama_cpps_converter_does() {
    let d = qwen35_dir("qwen35");
    let g = super::open_dir(&d).unwrap();
    assert_eq!(g.architecture().unwrap(), "qwen35");
    // One MTP block after the 2 layers.
    assert_eq!(g.get_u32("qwen35.block_count").unwrap(), Some(3));
    assert_eq!(g.get_u32("qwen35.nextn_predict_layers").unwrap(), Some(1));
    assert_eq!(g.get_u32("qwen35.rope.dimension_count").unwrap(), Some(2));
    assert_eq!(g.get_f32("qwen35.rope.freq_base").unwrap(), Some(5000.0));
    assert_eq!(
        g.get("qwen35.rope.dimension_sections"),
        Some(&crate::Value::Array(crate::Array::I32(vec![1, 0, 0, 0])))
    );
    assert_eq!(
        g.get_bool_array("qwen35.attention.recurrent_layers")
            .unwrap(),
        Some(&[true, false, false][..])
    );
    for (k, v) in [
        ("ssm.conv_kernel", 3),
        ("ssm.state_size", 2),
        ("ssm.group_count", 2),
        ("ssm.time_step_rank", 4),
        ("ssm.inner_size", 8),
    ] {
        assert_eq!(g.get_u32(&format!("qwen35.{k}")).unwrap(), Some(v), "{k}");
    }
    let data = |n: &str| f32s(g.tensor_data(g.tensor(n).unwrap_or_else(|| panic!("{n}"))));
    // Value heads (2 rows each) grouped by key head [k0v0, k0v1, k1v0, k1v1] become tiled
    // [k0v0, k1v0, k0v1, k1v1]: checkpoint heads [0, 2, 1, 3].
    let tiled = [0, 2, 1, 3];
    let qkv = ramp(64, 1.0);
    let want = [qkv[..32].to_vec(), blocks(&qkv[32..], 8, &tiled)].concat();
    assert_eq!(
        data("blk.0.attn_qkv.weight"),
        want,
        "q and k rows stay, v rows tiled"
    );
    assert_eq!(
        data("blk.0.attn_gate.weight"),
        blocks(&ramp(32, 1.0), 8, &tiled)
    );
    assert_eq!(
        data("blk.0.ssm_beta.weight"),
        blocks(&ramp(16, 1.0), 4, &tiled)
    );
    assert_eq!(
        data("blk.0.ssm_alpha.weight"),
        blocks(&ramp(16, 2.0), 4, &tiled)
    );
    assert_eq!(data("blk.0.ssm_dt.bias"), vec![0.5, 2.5, 1.5, 3.5]);
    let a: Vec<f32> = [-0.75f32, 0.25, 0.0, 1.0]
        .iter()
        .map(|x| -x.exp())
        .collect();
    assert_eq!(data("blk.0.ssm_a"), a, "-exp(A_log), tiled");
    // The convolution [16, 1, 3] squeezed to ggml [3, 16]; its v channels (8..16) tiled.
    let conv = g.tensor("blk.0.ssm_conv1d.weight").unwrap();
    assert_eq!(conv.shape, vec![3, 16]);
    let c = ramp(48, 1.0);
    assert_eq!(
        data("blk.0.ssm_conv1d.weight"),
        [c[..24].to_vec(), blocks(&c[24..], 6, &tiled)].concat()
    );
    // out_proj's columns: each row's 8 inputs tiled.
    let o = ramp(32, 1.0);
    let want: Vec<f32> = o.chunks(8).flat_map(|r| blocks(r, 2, &tiled)).collect();
    assert_eq!(data("blk.0.ssm_out.weight"), want);
    // Norms scale by 1 + weight, but the delta-net's own.
    let plus1 = |v: Vec<f32>| v.iter().map(|x| x + 1.0).collect::<Vec<f32>>();
    assert_eq!(data("output_norm.weight"), plus1(ramp(4, 0.5)));
    assert_eq!(data("blk.0.attn_norm.weight"), plus1(ramp(4, 1.0)));
    assert_eq!(
        data("blk.0.post_attention_norm.weight"),
        plus1(ramp(4, 1.0))
    );
    assert_eq!(data("blk.1.attn_q_norm.weight"), plus1(ramp(8, 0.5)));
    assert_eq!(data("blk.0.ssm_norm.weight"), vec![0.5, 2.0]);
    // MTP: block 2, its norms shifted, `fc` not.
    assert_eq!(data("blk.2.nextn.enorm.weight"), plus1(ramp(4, 1.0)));
    assert_eq!(
        data("blk.2.nextn.shared_head_norm.weight"),
        plus1(ramp(4, 1.0))
    );
    assert_eq!(data("blk.2.attn_norm.weight"), plus1(ramp(4, 1.0)));
    assert_eq!(data("blk.2.nextn.eh_proj.weight"), ramp(32, 1.0));
    // Attention as it is; the vision tower left out.
    assert_eq!(data("blk.1.attn_q.weight"), ramp(64, 1.0));
    assert!(g.tensors.iter().all(|t| !t.name.contains("visual")));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn qwen3_next_splits_its_fused_projections_and_keeps_value_heads_grouped() {
    let d = scratch("qwen3next");
    let cfg = json!({"model_type": "qwen3_next", "vocab_size": 6, "hidden_size": 2,
        "intermediate_size": 6, "num_hidden_layers": 1, "num_attention_heads": 1,
        "num_key_value_heads": 1, "head_dim": 8, "rms_norm_eps": 1e-6,
        "full_attention_interval": 4, "linear_conv_kernel_dim": 2, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 1, "linear_value_head_dim": 1,
        "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 2,
        "shared_expert_intermediate_size": 2, "rope_theta": 1000.0, "partial_rotary_factor": 0.5,
        "tie_word_embeddings": true});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(d.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    let p = "model.layers.0.linear_attn.";
    // Per key head [q (1), k (1), v (2), z (2)]: 6 rows each, 12 in all, 2 columns.
    let t = vec![
        (
            format!("{p}in_proj_qkvz.weight"),
            Dtype::F32,
            vec![12, 2],
            ramp(24, 1.0),
        ),
        (
            format!("{p}A_log"),
            Dtype::F32,
            vec![4],
            vec![0.0, 1.0, 2.0, 3.0],
        ),
        (
            format!("{p}dt_bias"),
            Dtype::F32,
            vec![4],
            vec![0.0, 1.0, 2.0, 3.0],
        ),
        (
            "model.layers.0.mlp.shared_expert_gate.weight".into(),
            Dtype::F32,
            vec![1, 2],
            vec![1.0, 2.0],
        ),
    ];
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    let g = super::open_dir(&d);
    // Layer 0 is linear attention and lacks most of its tensors: named.
    let msg = g.err().unwrap().to_string();
    assert!(
        msg.contains("'model.layers.0.linear_attn.in_proj_ba.weight' is missing"),
        "{msg}"
    );
    let conf = super::config::Config::load(&d).unwrap();
    let (infos, data) = super::tensors::load(&d, &conf).unwrap();
    let get = |n: &str| {
        let i = infos.iter().find(|t| t.name == n).unwrap();
        (
            i.shape.clone(),
            f32s(&data[i.offset as usize..][..i.size as usize]),
        )
    };
    let x = ramp(24, 1.0);
    let row = |r: usize| x[2 * r..2 * r + 2].to_vec();
    let rows = |rs: &[usize]| rs.iter().flat_map(|&r| row(r)).collect::<Vec<f32>>();
    // q: rows 0, 6; k: 1, 7; v: 2, 3, 8, 9 (grouped); z: 4, 5, 10, 11.
    assert_eq!(
        get("blk.0.attn_qkv.weight"),
        (vec![2, 8], rows(&[0, 6, 1, 7, 2, 3, 8, 9]))
    );
    assert_eq!(
        get("blk.0.attn_gate.weight"),
        (vec![2, 4], rows(&[4, 5, 10, 11]))
    );
    let a: Vec<f32> = [0.0f32, 1.0, 2.0, 3.0].iter().map(|x| -x.exp()).collect();
    assert_eq!(get("blk.0.ssm_a").1, a, "not reordered");
    assert_eq!(get("blk.0.ssm_dt.bias").1, vec![0.0, 1.0, 2.0, 3.0]);
    assert_eq!(
        get("blk.0.ffn_gate_inp_shexp.weight"),
        (vec![2, 1], vec![1.0, 2.0])
    );
    let mut meta = Vec::new();
    conf.metadata(&mut meta).unwrap();
    let m: HashMap<_, _> = meta.into_iter().collect();
    assert_eq!(m["qwen3next.rope.dimension_count"], crate::Value::U32(4));
    assert_eq!(m["qwen3next.rope.freq_base"], crate::Value::F32(1000.0));
    assert!(!m.contains_key("qwen3next.rope.dimension_sections"));
    assert_eq!(
        m["qwen3next.attention.recurrent_layers"],
        crate::Value::Array(crate::Array::Bool(vec![true]))
    );
    assert_eq!(
        m["qwen3next.expert_shared_feed_forward_length"],
        crate::Value::U32(2)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn qwen35_experts_fused_in_3d_tensors_are_split() {
    let d = scratch("qwen35moe");
    let cfg = json!({"model_type": "qwen3_5_moe_text", "vocab_size": 6, "hidden_size": 2,
        "num_hidden_layers": 1, "num_attention_heads": 1, "head_dim": 8, "rms_norm_eps": 1e-6,
        "layer_types": ["full_attention"], "linear_conv_kernel_dim": 2, "linear_num_key_heads": 1,
        "linear_num_value_heads": 1, "linear_key_head_dim": 1, "linear_value_head_dim": 1,
        "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 3,
        "shared_expert_intermediate_size": 2, "tie_word_embeddings": true});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(d.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    // [E 2, 2f 6, n 2] and [E 2, n 2, f 3].
    let t = vec![
        (
            "model.layers.0.mlp.experts.gate_up_proj",
            Dtype::BF16,
            vec![2, 6, 2],
            ramp(24, 1.0),
        ),
        (
            "model.layers.0.mlp.experts.down_proj",
            Dtype::BF16,
            vec![2, 2, 3],
            ramp(12, 1.0),
        ),
    ];
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    let conf = super::config::Config::load(&d).unwrap();
    let (infos, data) = super::tensors::load(&d, &conf).unwrap();
    let get = |n: &str| {
        let i = infos.iter().find(|t| t.name == n).unwrap();
        (
            i.shape.clone(),
            f32s(&data[i.offset as usize..][..i.size as usize]),
        )
    };
    let x = ramp(24, 1.0);
    // Rows of 2: expert 0 rows 0..6, expert 1 rows 6..12; gate the first 3 of each.
    let rows = |rs: &[usize]| {
        rs.iter()
            .flat_map(|&r| x[2 * r..2 * r + 2].to_vec())
            .collect::<Vec<f32>>()
    };
    assert_eq!(
        get("blk.0.ffn_gate_exps.weight"),
        (vec![2, 3, 2], rows(&[0, 1, 2, 6, 7, 8]))
    );
    assert_eq!(
        get("blk.0.ffn_up_exps.weight"),
        (vec![2, 3, 2], rows(&[3, 4, 5, 9, 10, 11]))
    );
    assert_eq!(
        get("blk.0.ffn_down_exps.weight"),
        (vec![3, 2, 2], ramp(12, 1.0))
    );
    let mut meta = Vec::new();
    conf.metadata(&mut meta).unwrap();
    let m: HashMap<_, _> = meta.into_iter().collect();
    // Qwen3.5's default sections; no dense FFN width in the config.
    assert_eq!(
        m["qwen35moe.rope.dimension_sections"],
        crate::Value::Array(crate::Array::I32(vec![11, 11, 10, 0]))
    );
    assert_eq!(m["qwen35moe.feed_forward_length"], crate::Value::U32(0));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn qwen35_directories_mollm_cannot_convert_are_refused_naming_the_key_or_tensor() {
    let d = qwen35_dir("qwen35-bad");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    let set_cfg = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = cfg.clone();
        f(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    };
    set_cfg(&|c| c["text_config"]["linear_num_value_heads"] = json!(3));
    refused(
        &d,
        &[
            "config.json",
            "text_config.linear_num_value_heads",
            "3 is not a multiple of linear_num_key_heads 2",
        ],
    );
    set_cfg(&|c| {
        c["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("linear_key_head_dim");
    });
    refused(&d, &["text_config.linear_key_head_dim", "missing"]);
    set_cfg(&|c| c["text_config"]["linear_value_head_dim"] = json!(4));
    refused(&d, &["text_config.linear_value_head_dim", "differs"]);
    set_cfg(&|c| c["text_config"]["layer_types"] = json!(["linear_attention", "mamba"]));
    refused(&d, &["text_config.layer_types", "\"mamba\""]);
    set_cfg(&|c| c["text_config"]["attn_output_gate"] = json!(false));
    refused(&d, &["text_config.attn_output_gate", "not supported"]);
    set_cfg(&|c| c["text_config"]["rope_parameters"]["rope_type"] = json!("yarn"));
    refused(&d, &["rope_parameters", "'yarn' is not supported"]);
    set_cfg(&|c| c["text_config"]["rope_parameters"]["mrope_section"] = json!([1, "x"]));
    refused(&d, &["rope_parameters.mrope_section", "expected up to 4"]);
    set_cfg(&|c| {
        c.as_object_mut().unwrap().remove("text_config");
    });
    refused(&d, &["config.json", "text_config", "missing"]);
    set_cfg(&|_| {});
    super::open_dir(&d).unwrap();

    // Weights: a missing delta-net tensor, one no graph has a place for, a wrong shape.
    let full = std::fs::read(d.join("model.safetensors")).unwrap();
    let write = |skip: &str, extra: Vec<(String, Dtype, Vec<usize>, Vec<f32>)>| {
        let t = safetensors::SafeTensors::deserialize(&full).unwrap();
        let mut v: Vec<(String, Dtype, Vec<usize>, Vec<f32>)> = t
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != skip)
            .map(|(n, view)| {
                let vals: Vec<f32> = match view.dtype() {
                    Dtype::F32 => f32s(view.data()),
                    _ => view
                        .data()
                        .chunks_exact(2)
                        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                        .collect(),
                };
                (n, view.dtype(), view.shape().to_vec(), vals)
            })
            .collect();
        v.extend(extra);
        std::fs::write(d.join("model.safetensors"), st(&v)).unwrap();
    };
    let la = "model.language_model.layers.0.linear_attn.";
    write(&format!("{la}A_log"), vec![]);
    refused(
        &d,
        &[
            "'model.layers.0.linear_attn.A_log' is missing",
            "linear attention",
        ],
    );
    write(
        "",
        vec![(
            format!("{la}mystery.weight"),
            Dtype::F32,
            vec![2],
            vec![1.0, 2.0],
        )],
    );
    refused(
        &d,
        &[
            "model.safetensors",
            "linear_attn.mystery.weight",
            "has no place in a qwen35 model",
        ],
    );
    write(
        &format!("{la}in_proj_z.weight"),
        vec![(
            format!("{la}in_proj_z.weight"),
            Dtype::F32,
            vec![6, 4],
            ramp(24, 1.0),
        )],
    );
    refused(&d, &["in_proj_z.weight", "6 rows, expected 8"]);
    write(
        &format!("{la}out_proj.weight"),
        vec![(
            format!("{la}out_proj.weight"),
            Dtype::F32,
            vec![4, 6],
            ramp(24, 1.0),
        )],
    );
    refused(&d, &["out_proj.weight", "expected 8 columns"]);
    std::fs::remove_dir_all(&d).unwrap();
}

// ---- BERT (sentence-transformers layout) ----

/// A WordPiece tokenizer.json as BERT's: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4 (added,
/// special), then words, continuations and punctuation; lowercasing BertNormalizer,
/// "[CLS] $A [SEP]" template.
fn wordpiece_tokenizer_json() -> serde_json::Value {
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let tok = |id: &str, type_id: u32| json!({"SpecialToken": {"id": id, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    json!({
        "version": "1.0", "truncation": {"max_length": 128, "strategy": "LongestFirst", "stride": 0},
        "padding": {"strategy": {"Fixed": 128}, "direction": "Right", "pad_to_multiple_of": null,
                    "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
        "added_tokens": [special(0, "[PAD]"), special(1, "[UNK]"), special(2, "[CLS]"),
                         special(3, "[SEP]"), special(4, "[MASK]")],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [tok("[CLS]", 0), seq("A", 0), tok("[SEP]", 0)],
            "pair": [tok("[CLS]", 0), seq("A", 0), tok("[SEP]", 0), seq("B", 1), tok("[SEP]", 1)],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100,
                  "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4,
                            "hello": 5, "world": 6, "##s": 7, ",": 8, "!": 9, "un": 10,
                            "##known": 11}}
    })
}

/// A tiny BERT directory as sentence-transformers saves one: vocab 12, hidden 4, 2 heads of
/// 2, 1 layer, FFN 6, 8 positions, 2 token types, CLS pooling (modules.json →
/// 1_Pooling/config.json); `bert.`-prefixed tensor names, I64 position ids and a pooler, which
/// the converter skips.
fn bert_dir(name: &str) -> PathBuf {
    let d = scratch(name);
    let cfg = json!({"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 12,
        "hidden_size": 4, "intermediate_size": 6, "num_hidden_layers": 1,
        "num_attention_heads": 2, "max_position_embeddings": 8, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute",
        "pad_token_id": 0});
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::write(
        d.join("tokenizer.json"),
        wordpiece_tokenizer_json().to_string(),
    )
    .unwrap();
    std::fs::write(
        d.join("tokenizer_config.json"),
        json!({"do_lower_case": true, "unk_token": "[UNK]", "sep_token": "[SEP]",
               "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
               "tokenizer_class": "BertTokenizer"})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        d.join("modules.json"),
        json!([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
        .to_string(),
    )
    .unwrap();
    std::fs::create_dir_all(d.join("1_Pooling")).unwrap();
    std::fs::write(
        d.join("1_Pooling/config.json"),
        json!({"word_embedding_dimension": 4, "pooling_mode_cls_token": true,
               "pooling_mode_mean_tokens": false, "pooling_mode_max_tokens": false})
        .to_string(),
    )
    .unwrap();
    std::fs::write(d.join("model.safetensors"), st(&bert_tensors())).unwrap();
    d
}

fn bert_tensors() -> Vec<(String, Dtype, Vec<usize>, Vec<f32>)> {
    let mut t = vec![
        (
            "bert.embeddings.word_embeddings.weight".to_string(),
            Dtype::F32,
            vec![12, 4],
            ramp(48, 0.25),
        ),
        (
            "bert.embeddings.position_embeddings.weight".into(),
            Dtype::F32,
            vec![8, 4],
            ramp(32, 0.5),
        ),
        (
            "bert.embeddings.token_type_embeddings.weight".into(),
            Dtype::F32,
            vec![2, 4],
            ramp(8, 1.0),
        ),
        (
            "bert.embeddings.LayerNorm.weight".into(),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
        (
            "bert.embeddings.LayerNorm.bias".into(),
            Dtype::F32,
            vec![4],
            ramp(4, 0.5),
        ),
        (
            "bert.embeddings.position_ids".into(),
            Dtype::I64,
            vec![1, 8],
            (0..8).map(|i| i as f32).collect(),
        ),
        (
            "bert.pooler.dense.weight".into(),
            Dtype::F32,
            vec![4, 4],
            ramp(16, 1.0),
        ),
        (
            "bert.pooler.dense.bias".into(),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ),
    ];
    let p = "bert.encoder.layer.0.";
    for (stem, rows, cols) in [
        ("attention.self.query", 4, 4),
        ("attention.self.key", 4, 4),
        ("attention.self.value", 4, 4),
        ("attention.output.dense", 4, 4),
        ("intermediate.dense", 6, 4),
        ("output.dense", 4, 6),
    ] {
        t.push((
            format!("{p}{stem}.weight"),
            Dtype::F16,
            vec![rows, cols],
            ramp(rows * cols, 0.5),
        ));
        t.push((
            format!("{p}{stem}.bias"),
            Dtype::F32,
            vec![rows],
            ramp(rows, 0.25),
        ));
    }
    // Old TF-style norm names.
    for stem in ["attention.output.LayerNorm", "output.LayerNorm"] {
        t.push((
            format!("{p}{stem}.gamma"),
            Dtype::F32,
            vec![4],
            ramp(4, 1.0),
        ));
        t.push((format!("{p}{stem}.beta"), Dtype::F32, vec![4], ramp(4, 0.5)));
    }
    t
}

#[test]
fn a_bert_directory_gets_llama_cpps_metadata_tensors_and_wordpiece_vocabulary() {
    let d = bert_dir("bert");
    let g = super::open_dir(&d).unwrap();
    assert_eq!(g.architecture().unwrap(), "bert");
    for (k, v) in [
        ("bert.block_count", 1),
        ("bert.context_length", 8),
        ("bert.embedding_length", 4),
        ("bert.feed_forward_length", 6),
        ("bert.attention.head_count", 2),
        ("bert.pooling_type", 2),
        ("tokenizer.ggml.token_type_count", 2),
        ("tokenizer.ggml.bos_token_id", 2),
        ("tokenizer.ggml.eos_token_id", 3),
        ("tokenizer.ggml.unknown_token_id", 1),
        ("tokenizer.ggml.seperator_token_id", 3),
        ("tokenizer.ggml.padding_token_id", 0),
        ("tokenizer.ggml.mask_token_id", 4),
    ] {
        assert_eq!(g.get_u32(k).unwrap(), Some(v), "{k}");
    }
    // Only what the converter writes: no GQA / head size keys, no cls id, no rope, no
    // tokenizer.json copy (mollm tokenizes WordPiece as llama.cpp does).
    for k in [
        "bert.attention.head_count_kv",
        "bert.attention.key_length",
        "bert.rope.freq_base",
        "tokenizer.ggml.cls_token_id",
        "tokenizer.ggml.normalizer.strip_accents",
        "tokenizer.ggml.merges",
        "tokenizer.huggingface.json",
        "tokenizer.chat_template",
    ] {
        assert!(g.get(k).is_none(), "{k}");
    }
    assert_eq!(
        g.get_f32("bert.attention.layer_norm_epsilon").unwrap(),
        Some(1e-12)
    );
    assert_eq!(g.get_bool("bert.attention.causal").unwrap(), Some(false));
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), Some("bert"));
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), Some("default"));
    for (k, v) in [
        ("tokenizer.ggml.add_bos_token", true),
        ("tokenizer.ggml.add_eos_token", true),
        ("tokenizer.ggml.add_sep_token", false),
        ("tokenizer.ggml.normalizer.lowercase", true),
    ] {
        assert_eq!(g.get_bool(k).unwrap(), Some(v), "{k}");
    }
    // Phantom space: specials as they are, "##s" → "s", "hello" → "▁hello".
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    let texts: Vec<&str> = (0..tokens.len()).map(|i| tokens.get(i).unwrap()).collect();
    assert_eq!(
        texts,
        [
            "[PAD]",
            "[UNK]",
            "[CLS]",
            "[SEP]",
            "[MASK]",
            "\u{2581}hello",
            "\u{2581}world",
            "s",
            "\u{2581},",
            "\u{2581}!",
            "\u{2581}un",
            "known"
        ]
    );
    assert_eq!(
        g.get_i32_array("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap(),
        &[3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1][..]
    );
    // Tensors: llama.cpp's names, ggml shapes; position ids and pooler skipped.
    let mut names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    let mut want = vec![
        "token_embd.weight",
        "position_embd.weight",
        "token_types.weight",
        "token_embd_norm.weight",
        "token_embd_norm.bias",
    ];
    let per_layer = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "attn_output_norm",
        "ffn_up",
        "ffn_down",
        "layer_output_norm",
    ];
    let layer: Vec<String> = per_layer
        .iter()
        .flat_map(|t| [format!("blk.0.{t}.weight"), format!("blk.0.{t}.bias")])
        .collect();
    want.extend(layer.iter().map(String::as_str));
    want.sort();
    assert_eq!(names, want);
    let shape = |n: &str| g.tensor(n).unwrap().shape.clone();
    assert_eq!(shape("token_embd.weight"), [4, 12]);
    assert_eq!(shape("position_embd.weight"), [4, 8]);
    assert_eq!(shape("token_types.weight"), [4, 2]);
    assert_eq!(shape("blk.0.ffn_up.weight"), [4, 6]);
    assert_eq!(shape("blk.0.ffn_down.weight"), [6, 4]);
    assert_eq!(shape("blk.0.ffn_up.bias"), [6]);
    assert_eq!(
        g.tensor("blk.0.attn_q.weight").unwrap().dtype,
        abi::DType::F16
    );
    let norm = g.tensor("blk.0.layer_output_norm.bias").unwrap();
    assert_eq!(f32s(g.tensor_data(norm)), ramp(4, 0.5), "beta → bias");
    let pos = g.tensor("position_embd.weight").unwrap();
    assert_eq!(f32s(g.tensor_data(pos)), ramp(32, 0.5));

    // The vocabulary tokenizes as llama.cpp's WPM: lowercased, split at punctuation, greedy
    // longest match, [CLS] ... [SEP]; a word nothing matches is [UNK].
    let tk = crate::Tokenizer::from_gguf(&g).unwrap();
    let ids = tk.encode("Hello WORLDS, unknown!", true, false).unwrap();
    assert_eq!(ids, [2, 5, 6, 7, 8, 10, 11, 9, 3]);
    assert_eq!(tk.encode("hello xyz", false, false).unwrap(), [5, 1]);
    assert_eq!(tk.decode(&ids[1..ids.len() - 1]), " hello worlds, unknown!");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bert_pooling_follows_sentence_transformers_or_defaults_to_mean() {
    let d = bert_dir("bert-pooling");
    let pooling = |d: &Path| {
        super::open_dir(d)
            .unwrap()
            .get_u32("bert.pooling_type")
            .unwrap()
    };
    let write = |v: serde_json::Value| {
        std::fs::write(d.join("1_Pooling/config.json"), v.to_string()).unwrap()
    };
    write(json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}));
    assert_eq!(pooling(&d), Some(1), "mean is checked first");
    write(json!({"pooling_mode_lasttoken": true}));
    assert_eq!(pooling(&d), Some(3));
    write(json!({"pooling_mode": "cls"}));
    assert_eq!(pooling(&d), Some(2));
    write(json!({"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": false}));
    refused(
        &d,
        &[
            "1_Pooling/config.json",
            "pooling_mode_max_tokens",
            "only mean, CLS and last-token",
        ],
    );
    // Without modules.json: 1_Pooling/config.json still; without it either: mean.
    std::fs::remove_file(d.join("modules.json")).unwrap();
    write(json!({"pooling_mode_cls_token": true}));
    assert_eq!(pooling(&d), Some(2));
    std::fs::remove_dir_all(d.join("1_Pooling")).unwrap();
    assert_eq!(pooling(&d), Some(1));
    // A pooling folder outside the model directory is refused.
    std::fs::write(
        d.join("modules.json"),
        json!([{"path": "../elsewhere", "type": "sentence_transformers.models.Pooling"}])
            .to_string(),
    )
    .unwrap();
    refused(
        &d,
        &["modules.json", "[0].path", "inside the model directory"],
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bert_directories_mollm_cannot_run_are_refused_naming_the_field_or_tensor() {
    let d = bert_dir("bert-bad");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
    let set_cfg = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut c = cfg.clone();
        f(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
    };
    set_cfg(&|c| c["hidden_act"] = json!("relu"));
    refused(
        &d,
        &["config.json", "hidden_act", "'relu' is not supported"],
    );
    set_cfg(&|c| c["position_embedding_type"] = json!("relative_key"));
    refused(
        &d,
        &[
            "config.json",
            "position_embedding_type",
            "'relative_key' is not supported",
        ],
    );
    set_cfg(&|c| c["is_decoder"] = json!(true));
    refused(&d, &["config.json", "is_decoder"]);
    set_cfg(&|c| {
        c.as_object_mut().unwrap().remove("max_position_embeddings");
    });
    refused(&d, &["config.json", "max_position_embeddings", "missing"]);
    // A table of another size than config.json says.
    set_cfg(&|c| c["max_position_embeddings"] = json!(16));
    refused(
        &d,
        &[
            "embeddings.position_embeddings.weight",
            "[8, 4]",
            "expected [16, 4]",
        ],
    );
    set_cfg(&|_| {});
    // A missing weight is named as the checkpoint names it.
    let t: Vec<_> = bert_tensors()
        .into_iter()
        .filter(|t| !t.0.ends_with("intermediate.dense.bias"))
        .collect();
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    refused(&d, &["encoder.layer.0.intermediate.dense.bias", "missing"]);
    // A layer past num_hidden_layers, a classifier head: no place in the model.
    let mut t = bert_tensors();
    t.push((
        "encoder.layer.1.output.dense.bias".into(),
        Dtype::F32,
        vec![4],
        ramp(4, 1.0),
    ));
    std::fs::write(d.join("model.safetensors"), st(&t)).unwrap();
    refused(
        &d,
        &[
            "encoder.layer.1.output.dense.bias",
            "has no place in a bert model",
        ],
    );
    std::fs::write(d.join("model.safetensors"), st(&bert_tensors())).unwrap();
    // A WordPiece vocabulary whose continuations are not "##".
    let mut tj = wordpiece_tokenizer_json();
    tj["model"]["continuing_subword_prefix"] = json!("@@");
    std::fs::write(d.join("tokenizer.json"), tj.to_string()).unwrap();
    refused(
        &d,
        &["tokenizer.json", "continuing_subword_prefix", "\"@@\""],
    );
    std::fs::remove_dir_all(&d).unwrap();
}
