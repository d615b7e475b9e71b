//! End-to-end behaviour of `mollm run`: bad input fails with one clear line, sampling is
//! reproducible by seed, chat mode goes through the template, JSON output has its fields.

mod common;

use common::{assert_one_line_error as assert_clean_error, model, mollm, stderr, tmp, SMOLLM2};
use serde_json::Value;
use std::process::Command;

#[test]
fn missing_file_is_one_line_naming_it() {
    let o = mollm(&[
        "run",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
    ]);
    assert_clean_error(&o, "/nonexistent/model.gguf");
}

#[test]
fn not_a_gguf_is_refused() {
    let p = tmp(
        "notgguf.gguf",
        b"this is plainly not a model file, just some text\n",
    );
    let o = mollm(&["run", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
    assert_clean_error(&o, "notgguf.gguf");
}

#[test]
fn truncated_gguf_is_refused() {
    let Some(m) = model(SMOLLM2) else { return };
    let bytes = std::fs::read(&m).unwrap();
    for cut in [10usize, 4096, bytes.len() / 2] {
        let p = tmp(&format!("trunc{cut}.gguf"), &bytes[..cut]);
        let o = mollm(&["run", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
        assert_clean_error(&o, &format!("trunc{cut}.gguf"));
    }
}

#[test]
fn absurd_counts_fail_fast() {
    // GGUF v3 header claiming 2^62 tensors and 2^62 metadata entries.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 62).to_le_bytes());
    b.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let p = tmp("absurd.gguf", &b);
    let t = std::time::Instant::now();
    let o = mollm(&["run", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
    assert_clean_error(&o, "absurd.gguf");
    assert!(t.elapsed().as_secs() < 5, "took {:?}", t.elapsed());
}

/// A valid GGUF header with one metadata key, `general.architecture = arch`, and no tensors.
fn gguf_with_arch(arch: &str) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    let key = "general.architecture";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&8u32.to_le_bytes()); // string
    b.extend_from_slice(&(arch.len() as u64).to_le_bytes());
    b.extend_from_slice(arch.as_bytes());
    b
}

#[test]
fn unknown_architecture_is_named() {
    let p = tmp("mamba.gguf", &gguf_with_arch("mamba9"));
    let o = mollm(&["run", "--model", p.to_str().unwrap(), "--prompt", "hi"]);
    assert_clean_error(&o, "mamba9");
}

#[test]
fn unknown_backend_is_refused_plainly() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "hi",
        "--backend",
        "x86-avx1024",
    ]);
    assert_clean_error(&o, "x86-avx1024");
}

#[test]
fn json_output_has_every_field() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "One, two, three,",
        "--max-tokens",
        "5",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["architecture"], "llama");
    // auto: native backends found next to mollm first, the reference always last.
    assert!(
        v["backend"].as_str().unwrap().ends_with("reference"),
        "{}",
        v["backend"]
    );
    assert_eq!(v["model"], SMOLLM2);
    assert!(!v["prompt_tokens"].as_array().unwrap().is_empty());
    let n = v["tokens"].as_array().unwrap().len();
    assert!((1..=5).contains(&n));
    for k in [
        "load_ms",
        "prefill_ms",
        "decode_ms",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
    ] {
        assert!(v["timings"][k].as_f64().is_some(), "timings.{k} missing");
    }
    assert!(v["timings"]["prefill_tokens_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn streamed_text_equals_json_text() {
    let Some(m) = model(SMOLLM2) else { return };
    let args = [
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        "The best way to learn",
        "--max-tokens",
        "12",
    ];
    let plain = mollm(&args);
    let mut jargs = args.to_vec();
    jargs.push("--json");
    let json = mollm(&jargs);
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    let text = String::from_utf8(plain.stdout).unwrap();
    assert_eq!(
        text.trim_end_matches('\n'),
        v["text"].as_str().unwrap().trim_end_matches('\n')
    );
}

#[test]
fn same_seed_same_text_other_seed_other_text() {
    let Some(m) = model(SMOLLM2) else { return };
    let run = |seed: &str| {
        let o = mollm(&[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "Once upon a time",
            "--max-tokens",
            "24",
            "--temperature",
            "1.2",
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--min-p",
            "0",
            "--seed",
            seed,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["tokens"].clone()
    };
    assert_eq!(run("42"), run("42"));
    assert_ne!(run("42"), run("43"));
}

#[test]
fn chat_goes_through_the_template() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--chat",
        "--prompt",
        "Hi",
        "--max-tokens",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: Vec<u64> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    // SmolLM2's ChatML: <|im_start|> is id 1; the prompt ends with "<|im_start|>assistant\n".
    assert_eq!(ids.iter().filter(|&&t| t == 1).count(), 3, "{ids:?}");
    assert_eq!(*ids.last().unwrap(), 198, "{ids:?}");
}

#[test]
fn prompt_longer_than_context_is_refused() {
    let Some(m) = model(SMOLLM2) else { return };
    let long = "word ".repeat(200);
    let o = mollm(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        &long,
        "--ctx",
        "64",
    ]);
    assert_clean_error(&o, "--ctx");
}

#[test]
fn a_closed_pipe_ends_quietly() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .arg("devices")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader leaves before mollm writes
    let o = child.wait_with_output().unwrap();
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{e}");
}

/// The activation arena comes from the backend's own buffer functions (`buffer_alloc` +
/// `buffer_host_ptr`) on every native backend; the reference lends none, so the engine's
/// memory serves.
#[test]
fn the_activation_arena_is_a_buffer_of_the_backend() {
    let Some(m) = model(SMOLLM2) else { return };
    for b in common::test_backends() {
        let o = Command::new(env!("CARGO_BIN_EXE_mollm"))
            .args([
                "run",
                "-m",
                m.to_str().unwrap(),
                "-p",
                "Hi",
                "-n",
                "2",
                "-t",
                "2",
            ])
            .args(["--backend", &b])
            .env("MOLLM_PROFILE", "1")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let err = stderr(&o);
        let line = err
            .lines()
            .find(|l| l.starts_with("activation arena:"))
            .unwrap_or_else(|| panic!("no arena line: {err}"));
        if b == "reference" {
            assert!(line.ends_with("of the engine's memory"), "{line}");
        } else {
            assert!(line.ends_with(&format!("a host buffer of {b}")), "{line}");
        }
    }
}
