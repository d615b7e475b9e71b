//! `mollm run --model DIR` on a Hugging Face directory: the random-weight Qwen3 / Qwen3-MoE /
//! Gemma 3 checkpoints (scripts/make_random_qwen3.py, scripts/make_random_gemma3.py) generate
//! exactly what their GGUF twins generate,
//! and a broken directory fails with one clear line.

mod common;

use common::{assert_clean_error, mollm, stdout, tmp};

fn random(name: &str) -> Option<std::path::PathBuf> {
    Some(random_checkpoint(name))
}

#[path = "../../engine/tests/common/random.rs"]
mod random_support;
use random_support::random_checkpoint;

#[test]
fn a_hf_directory_runs_like_its_gguf() {
    for key in ["qwen3-random", "qwen3moe-random", "gemma3-random"] {
        let (Some(dir), Some(gguf)) = (random(key), random(&format!("{key}.gguf"))) else {
            continue;
        };
        let run = |m: &std::path::Path| {
            let o = mollm(&[
                "run",
                "-m",
                m.to_str().unwrap(),
                "-p",
                "def add(a, b):",
                "-n",
                "12",
                "--backend",
                "reference",
            ]);
            assert!(o.status.success(), "{}", common::stderr(&o));
            stdout(&o)
        };
        let (a, b) = (run(&dir), run(&gguf));
        assert!(!a.trim().is_empty());
        assert_eq!(a, b, "{key}: directory and GGUF generate different text");
    }
}

/// Qwen3.5, Qwen3.5-MoE and Qwen3-Next directories (scripts/make_random_qwen35_hf.py) load
/// as their GGUF conversions (the converter's transforms done in numpy, `-exp` with glibc's
/// expf): every tensor bit for bit, every architecture key the conversion has.
#[test]
fn qwen35_directories_hold_their_gguf_conversions_bit_for_bit() {
    for key in [
        "qwen35-hf-random",
        "qwen35moe-hf-random",
        "qwen3next-hf-random",
    ] {
        let dir = loader::open_model(random_checkpoint(key)).unwrap();
        let gguf = loader::open_model(random_checkpoint(&format!("{key}.gguf"))).unwrap();
        let arch = gguf.architecture().unwrap().to_string();
        assert_eq!(dir.architecture().unwrap(), arch);
        assert_eq!(dir.tensors.len(), gguf.tensors.len(), "{key}: tensor count");
        for t in &gguf.tensors {
            let d = dir
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{key}: no {}", t.name));
            assert_eq!(
                (d.dtype, &d.shape),
                (t.dtype, &t.shape),
                "{key}: {}",
                t.name
            );
            assert!(
                dir.tensor_data(d) == gguf.tensor_data(t),
                "{key}: {} differs",
                t.name
            );
        }
        for (k, v) in &gguf.metadata {
            if k.starts_with(&format!("{arch}.")) {
                assert_eq!(dir.get(k), Some(v), "{key}: {k}");
            }
        }
    }
}

#[test]
fn a_broken_directory_is_refused_clearly() {
    let base = tmp("hf-marker", b"");
    let dir = base.parent().unwrap().join("hf-broken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        br#"{"model_type": "qwen3", "num_hidden_layers": 2}"#,
    )
    .unwrap();
    let o = mollm(&["run", "-m", dir.to_str().unwrap(), "-p", "hi", "-n", "1"]);
    assert_clean_error(&o, "config.json");
    let empty = base.parent().unwrap().join("hf-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = mollm(&["run", "-m", empty.to_str().unwrap(), "-p", "hi", "-n", "1"]);
    assert_clean_error(&o, "without config.json");
}
