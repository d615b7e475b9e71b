//! Greedy parity with llama.cpp: `mollm run --json` must produce exactly the token ids that
//! llama.cpp produced for the same prompt (fixtures/golden/*.json, made by
//! scripts/golden/make_golden.py; its configuration is recorded in each file).
//!
//! Models come from the model cache (scripts/fetch-models.sh). A missing model skips its test
//! with a note, unless MOLLM_REQUIRE_MODELS=1 (CI sets it), where it fails.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn models_dir() -> PathBuf {
    match std::env::var_os("MOLLM_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/mollm/models"),
    }
}

fn backend() -> String {
    std::env::var("MOLLM_TEST_BACKEND").unwrap_or_else(|_| "reference".into())
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn check_model(key: &str) {
    let golden_path = repo().join(format!("fixtures/golden/{key}.json"));
    let golden: Value =
        serde_json::from_slice(&std::fs::read(&golden_path).expect("golden file")).unwrap();
    let model = models_dir().join(golden["model_file"].as_str().unwrap());
    if !model.exists() {
        if std::env::var("MOLLM_REQUIRE_MODELS").as_deref() == Ok("1") {
            panic!(
                "{} is missing (run scripts/fetch-models.sh)",
                model.display()
            );
        }
        eprintln!(
            "SKIP {key}: {} not found (run scripts/fetch-models.sh)",
            model.display()
        );
        return;
    }
    let mut failures = Vec::new();
    let cases = golden["cases"].as_array().unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let want = ids(&case["tokens"]);
        let out = Command::new(env!("CARGO_BIN_EXE_mollm"))
            .args([
                "run",
                "--json",
                "--temperature",
                "0",
                "--threads",
                "2",
                "--ctx",
                "2048",
            ])
            .arg("--backend")
            .arg(backend())
            .arg("--model")
            .arg(&model)
            .arg("--max-tokens")
            .arg(want.len().to_string())
            .arg("--prompt")
            .arg(case["prompt"].as_str().unwrap())
            .output()
            .expect("run mollm");
        assert!(
            out.status.success(),
            "{key}/{name}: mollm failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Value = serde_json::from_slice(&out.stdout).expect("json output");
        let got_prompt = ids(&got["prompt_tokens"]);
        let want_prompt = ids(&case["prompt_tokens"]);
        if got_prompt != want_prompt {
            failures.push(format!(
                "{name}: prompt tokens differ\n  mollm: {got_prompt:?}\n  llama: {want_prompt:?}"
            ));
            continue;
        }
        let got_tokens = ids(&got["tokens"]);
        if got_tokens != want {
            let at = got_tokens
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got_tokens.len().min(want.len()));
            failures.push(format!(
                "{name}: generated tokens differ at {at}\n  mollm: {got_tokens:?}\n  llama: {want:?}\n  mollm text: {:?}",
                got["text"]
            ));
        } else {
            eprintln!(
                "{key}/{name}: {} tokens equal ({:.1} tok/s decode)",
                want.len(),
                got["timings"]["decode_tokens_per_s"]
                    .as_f64()
                    .unwrap_or(0.0)
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{key}: {} of {} cases differ from llama.cpp:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn golden_smollm2() {
    check_model("smollm2");
}

#[test]
fn golden_qwen05() {
    check_model("qwen05");
}

#[test]
fn golden_gemma3() {
    check_model("gemma3");
}

#[test]
fn golden_qwen15() {
    check_model("qwen15");
}
