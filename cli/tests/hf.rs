//! `mollm run --model DIR` on a Hugging Face directory: the random-weight Qwen3 / Qwen3-MoE /
//! Gemma 3 checkpoints (scripts/make_random_qwen3.py, scripts/make_random_gemma3.py) generate
//! exactly what their GGUF twins generate,
//! and a broken directory fails with one clear line.

mod common;

use common::{assert_clean_error, mollm, stdout, tmp};

fn random(name: &str) -> Option<std::path::PathBuf> {
    Some(random_checkpoint(name))
}

/// The random checkpoint `name` under the model cache's `random/`, made by
/// scripts/make-random-checkpoints.sh when missing (once per test binary); a failure says what
/// is missing and how to get it.
fn random_checkpoint(name: &str) -> std::path::PathBuf {
    static MADE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let models = match std::env::var_os("MOLLM_MODELS_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/mollm/models"),
    };
    let p = models.join("random").join(name);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if !p.exists() && !*made {
        *made = true;
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-random-checkpoints.sh");
        let o = std::process::Command::new(&script).output();
        if let Ok(o) = &o {
            if !o.status.success() {
                eprintln!("{}", String::from_utf8_lossy(&o.stderr));
            }
        }
    }
    assert!(
        p.exists(),
        "{} is missing and {} could not make it (it needs python3 with numpy and gguf==0.19.0 from PyPI, and the models of scripts/fetch-models.sh)",
        p.display(),
        "scripts/make-random-checkpoints.sh"
    );
    p
}


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
