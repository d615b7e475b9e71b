//! Hybrid and recurrent architectures against llama.cpp: on the random-weight LFM2 and LFM2-MoE
//! models of scripts/make_random_lfm2.py and the Qwen3.5/Qwen3-Next ones of
//! scripts/make_random_qwen35.py (short-convolution layers beside attention, llama.cpp's
//! test vocabulary; the MoE one also through the expert cache; one LFM2 also as a Hugging Face
//! directory) and the Hugging Face Qwen3.5 / Qwen3.5-MoE / Qwen3-Next directories of
//! scripts/make_random_qwen35_hf.py with their GGUF conversions, `mollm batch` from token ids generates exactly the 16 greedy ids llama.cpp did
//! (fixtures/golden/random-lfm2.json, scripts/golden/make_recurrent_golden.py) for a one-token
//! prompt, a 37-token one and a 230-token one run in 64-token chunks (close to the 256-token
//! context), on every CPU backend, alone (`--parallel 1`) and batched (`--parallel 4`: each
//! sequence's recurrent state its own). The same for the RWKV-7 models of
//! scripts/make_random_rwkv7.py (no attention: LayerNorms, token shift, the wkv7 recurrence).

mod common;

use common::{mollm, test_backends, tmp};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

#[path = "../../engine/tests/common/random.rs"]
mod random_support;

fn golden(family: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../fixtures/golden/random-{family}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn sha256(p: &Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// id -> generated ids of `mollm batch` on `input`.
fn batch(
    model: &Path,
    input: &Path,
    backend: &str,
    parallel: usize,
    extra: &[&str],
) -> BTreeMap<String, Value> {
    let parallel = parallel.to_string();
    let mut args = vec![
        "batch",
        "-m",
        model.to_str().unwrap(),
        "-i",
        input.to_str().unwrap(),
        "--parallel",
        &parallel,
        "--batch",
        "64",
        "--backend",
        backend,
        "-t",
        "2",
    ];
    args.extend_from_slice(extra);
    let o = mollm(&args);
    assert!(o.status.success(), "{}", common::stderr(&o));
    common::stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .map(|v| (v["id"].as_str().unwrap().to_string(), v))
        .collect()
}

fn check(family: &str) {
    let g = golden(family);
    let backends = test_backends();
    for (key, m) in g["models"].as_object().unwrap() {
        let path = random_support::random_checkpoint(m["gguf"].as_str().unwrap());
        assert_eq!(
            sha256(&path),
            m["gguf_sha256"].as_str().unwrap(),
            "{} differs from the file the golden data was made from (numpy or gguf version?)",
            path.display()
        );
        let mut lines = String::new();
        let mut want = BTreeMap::new();
        for case in m["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            lines.push_str(&format!(
                "{{\"id\": \"{name}\", \"prompt_ids\": {}, \"max_tokens\": 16, \"temperature\": 0, \"ignore_eos\": true}}\n",
                case["tokens"]
            ));
            want.insert(name.to_string(), case["generated"].clone());
        }
        let input = tmp(&format!("{key}.jsonl"), lines.as_bytes());
        // A model with a Hugging Face twin (the same weights as a directory) runs from it too.
        let dir = path.with_extension("");
        let files: Vec<&Path> = match dir.is_dir() {
            true => vec![&path, &dir],
            false => vec![&path],
        };
        // MoE models also through the expert cache (experts read from the file into slots).
        let runs: &[&[&str]] = match key.contains("moe") || key.contains("next") {
            true => &[&[], &["--expert-cache", "1"]],
            false => &[&[]],
        };
        for (fi, file) in files.iter().enumerate() {
            for b in &backends {
                for parallel in [1, 4] {
                    // A directory twin holds its GGUF's tensors bit for bit (cli/tests/hf.rs),
                    // so it runs batched and with its experts in memory only: the rest is the
                    // GGUF's run again (and minutes under emulation).
                    if fi > 0 && parallel == 1 {
                        continue;
                    }
                    for extra in &runs[..if fi > 0 { 1 } else { runs.len() }] {
                        let got = batch(file, &input, b, parallel, extra);
                        for (name, ids) in &want {
                            assert_eq!(
                                &got[name]["tokens"],
                                ids,
                                "{} {name} on {b}, --parallel {parallel} {extra:?}: {}",
                                file.display(),
                                got[name]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn lfm2_and_lfm2moe_generate_llama_cpps_tokens_on_every_backend_alone_and_batched() {
    check("lfm2");
}

/// Qwen3.5, Qwen3.5-MoE and Qwen3-Next (scripts/make_random_qwen35.py: gated delta-net layers
/// with per-sequence convolution windows and recurrent matrices beside gated attention; tiled
/// and grouped value heads; merged and separate expert stacks, also through the expert cache).
#[test]
fn qwen35_and_qwen3next_generate_llama_cpps_tokens_on_every_backend_alone_and_batched() {
    check("qwen35");
}

/// The Hugging Face directories of Qwen3.5, Qwen3.5-MoE and Qwen3-Next
/// (scripts/make_random_qwen35_hf.py: the converter's transforms, value heads reordered, fused
/// projections split, an MTP block) and their GGUF conversions.
#[test]
fn qwen35_and_qwen3next_hugging_face_directories_generate_llama_cpps_tokens() {
    check("qwen35hf");
}

/// RWKV-7 (scripts/make_random_rwkv7.py: two heads over four layers, and four heads over two
/// with distinct LoRA ranks): every generated id equal to llama.cpp's, alone and batched.
#[test]
fn rwkv7_generates_llama_cpps_tokens_on_every_backend_alone_and_batched() {
    check("rwkv7");
}

/// A `.mollm` package of each model (`--quant keep`: the same weights; Qwen3.5-MoE's merged
/// expert stacks written as separate ones) carries its graph, and generates llama.cpp's tokens.
#[test]
fn packages_of_recurrent_models_generate_llama_cpps_tokens() {
    for family in ["lfm2", "qwen35", "qwen35hf", "rwkv7"] {
        let g = golden(family);
        for (key, m) in g["models"].as_object().unwrap() {
            let path = random_support::random_checkpoint(m["gguf"].as_str().unwrap());
            let pkg = tmp(&format!("{key}.mollm"), b"");
            let o = mollm(&[
                "convert",
                "-q",
                "--quant",
                "keep",
                path.to_str().unwrap(),
                pkg.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{key}: {}", common::stderr(&o));
            let mut lines = String::new();
            for case in m["cases"].as_array().unwrap() {
                lines.push_str(&format!(
                    "{{\"id\": \"{}\", \"prompt_ids\": {}, \"max_tokens\": 16, \"temperature\": 0, \"ignore_eos\": true}}\n",
                    case["name"].as_str().unwrap(),
                    case["tokens"]
                ));
            }
            let input = tmp(&format!("{key}-pkg.jsonl"), lines.as_bytes());
            let got = batch(&pkg, &input, "auto", 4, &[]);
            for case in m["cases"].as_array().unwrap() {
                let name = case["name"].as_str().unwrap();
                assert_eq!(got[name]["tokens"], case["generated"], "{key}.mollm {name}");
            }
        }
    }
}

/// llama.cpp's test vocabulary turns text into ids (5-byte chunks), so `mollm run` takes a text
/// prompt on these models too; the prompt here is the ids 1, 2, 3.
#[test]
fn lfm2_runs_from_text_through_the_test_vocabulary() {
    let path = random_support::random_checkpoint("lfm2-random.gguf");
    let o = mollm(&[
        "run",
        "-m",
        path.to_str().unwrap(),
        "--json",
        "-n",
        "8",
        "-p",
        "aaaddaaadeaaadf",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 8, "{v}");
}

/// The copy of `bytes` with the first `from` replaced by `to` (the same length).
fn patched(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the bytes to patch");
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    out
}

/// Bad recurrent models fail at load with one line naming the tensor or key.
#[test]
fn a_missing_recurrent_tensor_or_a_bad_window_is_named() {
    let path = random_support::random_checkpoint("lfm2-random.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let run = |name: &str, b: Vec<u8>| {
        let p = tmp(name, &b);
        mollm(&["run", "-m", p.to_str().unwrap(), "-n", "1", "-p", "hi"])
    };
    let o = run(
        "lfm2-no-conv.gguf",
        patched(
            &bytes,
            b"blk.0.shortconv.conv.weight",
            b"blk.0.shortconv.cXnv.weight",
        ),
    );
    common::assert_one_line_error(&o, "'blk.0.shortconv.conv.weight' is not in the model");
    // The window length, a u32 after its key and type.
    let key = b"lfm2.shortconv.l_cache";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    let mut bad = bytes.clone();
    bad[at + 4..at + 8].copy_from_slice(&1u32.to_le_bytes());
    let o = run("lfm2-window.gguf", bad);
    common::assert_one_line_error(&o, "'lfm2.shortconv.l_cache' in 2..=64, got 1");
}

/// Bad Qwen3.5 models fail at load with one line naming the tensor or key: a missing
/// delta-net tensor, a state size that does not divide the inner size, a layer pattern of
/// the wrong length.
#[test]
fn a_missing_delta_net_tensor_or_sizes_that_do_not_fit_are_named() {
    let path = random_support::random_checkpoint("qwen35-random.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let run = |name: &str, b: Vec<u8>| {
        let p = tmp(name, &b);
        mollm(&["run", "-m", p.to_str().unwrap(), "-n", "1", "-p", "hi"])
    };
    let o = run(
        "qwen35-no-a.gguf",
        patched(&bytes, b"blk.0.ssm_a", b"blk.0.ssm_X"),
    );
    common::assert_one_line_error(&o, "weight 'blk.0.ssm_a' is not in the model");
    let u32_after = |key: &[u8], v: u32| {
        let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
        let mut bad = bytes.clone();
        bad[at + 4..at + 8].copy_from_slice(&v.to_le_bytes());
        bad
    };
    let o = run(
        "qwen35-inner.gguf",
        u32_after(b"qwen35.ssm.inner_size", 250),
    );
    common::assert_one_line_error(
        &o,
        "'qwen35.ssm.inner_size' 250 must be 'qwen35.ssm.time_step_rank' 4 value heads of 'qwen35.ssm.state_size' 64 each",
    );
    let o = run("qwen35-heads.gguf", u32_after(b"qwen35.ssm.group_count", 3));
    common::assert_one_line_error(&o, "the heads a multiple of 'qwen35.ssm.group_count' 3");
    let o = run("qwen35-conv.gguf", u32_after(b"qwen35.ssm.conv_kernel", 0));
    common::assert_one_line_error(&o, "'qwen35.ssm.conv_kernel' is 0, expected 2..=64");
    let o = run(
        "qwen35-interval.gguf",
        u32_after(b"qwen35.full_attention_interval", 0),
    );
    common::assert_one_line_error(&o, "'qwen35.full_attention_interval' is 0");
    // Rope sections [3, 3, 2, 0] over 8 pairs rotate every pair; [3, 3, 1, 1] leaves pair 5 to
    // the fourth section, which text does not rotate: refused rather than run differently.
    let key = b"qwen35.rope.dimension_sections";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // The array's type (u32), element type (u32) and length (u64), then four i32 values.
    let mut bad = bytes.clone();
    bad[at + 16 + 8..at + 16 + 16].copy_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]);
    let o = run("qwen35-sections.gguf", bad);
    common::assert_one_line_error(
        &o,
        "rope sections [3, 3, 1, 1] leave dimension pair 5 of 8 unrotated on text",
    );
    // qwen35moe-random names its layers by flags; without them the default pattern (every
    // fourth layer attention) does not fit its tensors, and the first that is missing is named.
    let path = random_support::random_checkpoint("qwen35moe-random.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let o = run(
        "qwen35moe-flags.gguf",
        patched(
            &bytes,
            b"qwen35moe.attention.recurrent_layers",
            b"qwen35moe.attention.recurrent_layerX",
        ),
    );
    common::assert_one_line_error(&o, "weight 'blk.2.attn_qkv.weight' is not in the model");
}

/// Bad RWKV-7 models fail at load with one line naming the key or tensor: a head size that
/// does not divide the width, a token shift other than 2, a missing time-mix tensor.
#[test]
fn rwkv7_sizes_that_do_not_fit_and_missing_tensors_are_named() {
    let path = random_support::random_checkpoint("rwkv7-h4-random.gguf");
    let bytes = std::fs::read(&path).unwrap();
    let run = |name: &str, b: Vec<u8>| {
        let p = tmp(name, &b);
        mollm(&["run", "-m", p.to_str().unwrap(), "-n", "1", "-p", "hi"])
    };
    let u32_after = |key: &[u8], v: u32| {
        let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
        let mut bad = bytes.clone();
        bad[at + 4..at + 8].copy_from_slice(&v.to_le_bytes());
        bad
    };
    let o = run("rwkv7-head.gguf", u32_after(b"rwkv7.wkv.head_size", 48));
    common::assert_one_line_error(
        &o,
        "'rwkv7.wkv.head_size' 48 must divide 'rwkv7.embedding_length' 256",
    );
    let o = run("rwkv7-shift.gguf", u32_after(b"rwkv7.token_shift_count", 3));
    common::assert_one_line_error(&o, "'rwkv7.token_shift_count' is 3; RWKV-7 shifts by 2");
    let o = run(
        "rwkv7-no-kk.gguf",
        patched(
            &bytes,
            b"blk.1.time_mix_k_k.weight",
            b"blk.1.time_mix_k_X.weight",
        ),
    );
    common::assert_one_line_error(&o, "'blk.1.time_mix_k_k.weight' is not in the model");
}

/// Quantized packages of recurrent models load and run: a mode requantizes only the matrices
/// the graph multiplies, so the convolution windows, decay vectors and lerp factors that host
/// code and f32-only ops read keep their format (they were requantized before, and the
/// package was refused at load).
#[test]
fn quantized_packages_of_recurrent_models_run() {
    let input = tmp(
        "quantized-recurrent.jsonl",
        b"{\"id\": \"a\", \"prompt_ids\": [1, 2, 3], \"max_tokens\": 16, \"temperature\": 0, \"ignore_eos\": true}\n",
    );
    for file in [
        "lfm2-random.gguf",
        "qwen35-random.gguf",
        "qwen35moe-random.gguf",
        "rwkv7-random.gguf",
    ] {
        let path = random_support::random_checkpoint(file);
        for quant in ["w8pc", "w4g128"] {
            let pkg = tmp(&format!("{file}-{quant}.mollm"), b"");
            let o = mollm(&[
                "convert",
                "-q",
                "--quant",
                quant,
                path.to_str().unwrap(),
                pkg.to_str().unwrap(),
            ]);
            assert!(o.status.success(), "{file} {quant}: {}", common::stderr(&o));
            let got = batch(&pkg, &input, "auto", 1, &[]);
            let n = got["a"]["tokens"].as_array().map_or(0, |t| t.len());
            assert_eq!(n, 16, "{file} {quant}: {}", got["a"]);
        }
    }
}
