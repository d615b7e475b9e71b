//! Greedy parity with llama.cpp: `mollm run --json` must produce exactly the token ids that
//! llama.cpp produced for the same prompt (fixtures/golden/*.json, made by
//! scripts/golden/make_golden.py; its configuration is recorded in each file).
//!
//! Models come from the model cache (scripts/fetch-models.sh). A missing model skips its test
//! with a note, unless MOLLM_REQUIRE_MODELS=1 (CI sets it), where it fails.
//!
//! Every backend runs every case, except that the reference backend (scalar, about 2 tokens/s
//! on the 1.5B with 2 cores) skips the prompts longer than [`REFERENCE_MAX_PROMPT`] tokens on
//! the two Qwen models: those two cases cost it about five minutes of CI. It still runs them on
//! SmolLM2 and Gemma 3 (Gemma's past its sliding window), and the native backends, which the
//! conformance gate holds bit-identical to it op by op, run them on all four.

mod common;

use common::{repo, test_backends as backends};
use serde_json::Value;
use std::process::Command;

/// The longest prompt the reference backend runs on the Qwen models (see the module comment).
const REFERENCE_MAX_PROMPT: usize = 64;
const REFERENCE_SHORT_ONLY: &[&str] = &["qwen05", "qwen15"];

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
    let Some(model) = common::model(golden["model_file"].as_str().unwrap()) else {
        return;
    };
    let cases = golden["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    let mut runs = 0;
    for backend in backends() {
        for case in cases {
            if backend == "reference"
                && REFERENCE_SHORT_ONLY.contains(&key)
                && ids(&case["prompt_tokens"]).len() > REFERENCE_MAX_PROMPT
            {
                eprintln!(
                    "{key}/{} on reference: skipped (prompt over {REFERENCE_MAX_PROMPT} tokens)",
                    case["name"].as_str().unwrap()
                );
                continue;
            }
            runs += 1;
            if let Err(e) = check_case(key, &model, &backend, case) {
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{key}: {} of {runs} runs differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn check_case(
    key: &str,
    model: &std::path::Path,
    backend: &str,
    case: &Value,
) -> Result<(), String> {
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
        .args(["--backend", backend])
        .arg("--model")
        .arg(model)
        .args(["--max-tokens", &want.len().to_string()])
        .args(["--prompt", case["prompt"].as_str().unwrap()])
        .output()
        .expect("run mollm");
    if !out.status.success() {
        return Err(format!(
            "{name} on {backend}: mollm failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let got: Value = serde_json::from_slice(&out.stdout).expect("json output");
    let got_prompt = ids(&got["prompt_tokens"]);
    let want_prompt = ids(&case["prompt_tokens"]);
    if got_prompt != want_prompt {
        return Err(format!(
            "{name}: prompt tokens differ\n  mollm: {got_prompt:?}\n  llama: {want_prompt:?}"
        ));
    }
    let got_tokens = ids(&got["tokens"]);
    if got_tokens != want {
        let at = got_tokens
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got_tokens.len().min(want.len()));
        return Err(format!(
            "{name} on {backend}: generated tokens differ at {at}\n  mollm: {got_tokens:?}\n  llama: {want:?}\n  mollm text: {:?}",
            got["text"]
        ));
    }
    eprintln!(
        "{key}/{name} on {backend}: {} tokens equal ({:.1} tok/s decode)",
        want.len(),
        got["timings"]["decode_tokens_per_s"]
            .as_f64()
            .unwrap_or(0.0)
    );
    Ok(())
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
