//! Wide greedy parity with llama.cpp: for every model, 67 prompts given as token ids (every
//! length 1..64, and 300, 513 and 1000 tokens; cut from real news text) and their greedy
//! continuations from llama.cpp (12 tokens, 8 after the long prompts; fixtures/golden/
//! wide-<key>.json, made by scripts/golden/make_wide_golden.py, which records its configuration
//! in each file). All cases of a model run in ONE `mollm batch --parallel 8` process per
//! backend, so the prompts are scheduled together (chunked prefill mixed with other sequences'
//! decode steps) and the test stays bounded; every case's tokens must equal llama.cpp's.
//!
//! Backends: the last native backend of the list (the widest ISA this CPU runs, the one `auto`
//! picks) every case of all four models; the other native backends (held bit-identical to the
//! reference op by op by the conformance gate, as that one is) the prompts of 1 to 16 tokens
//! (every remainder of the widest column tile) and of 24, 32, ..., 64 (on the 1.5B with AVX2
//! all cases cost three minutes of CI, these one); the reference for SmolLM2 only, and on the
//! prompts of REFERENCE_LENGTHS tokens only (it computes about 5 tokens/s on 2 cores: all cases
//! would take over 20 minutes). Models come from the model cache
//! (scripts/fetch-models.sh); a missing one skips with a note unless MOLLM_REQUIRE_MODELS=1
//! (CI), where it fails.

mod common;

use common::{model, test_backends, tmp};
use engine::kv::KV_PAGE;
use serde_json::{json, Value};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

const PARALLEL: usize = 8;

/// The prompt lengths the native backends but the widest run.
fn other_natives_run(n: usize) -> bool {
    n <= 16 || (n % 8 == 0 && n <= 64)
}

/// The prompt lengths the reference backend runs (SmolLM2).
const REFERENCE_LENGTHS: &[usize] = &[1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64];

/// One `mollm batch` at a time: each uses both cores (`-t 2`); the tests of this file would
/// otherwise run them side by side.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("token id"))
        .collect()
}

struct Case {
    prompt: Vec<u64>,
    tokens: Vec<u64>,
    margins: Vec<f64>,
}

fn check_model(key: &str, with_reference: bool) {
    let path = common::repo().join(format!("fixtures/golden/wide-{key}.json"));
    let golden: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("wide golden file")).unwrap();
    let Some(m) = model(golden["model_file"].as_str().unwrap()) else {
        return;
    };
    let cases: Vec<Case> = golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            prompt: ids(&c["prompt_ids"]),
            tokens: ids(&c["tokens"]),
            margins: c["top2_margins"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default(),
        })
        .collect();
    assert!(cases.len() >= 64, "{}: too few cases", path.display());

    let backends: Vec<String> = test_backends()
        .into_iter()
        .filter(|b| with_reference || b != "reference")
        .collect();
    let widest = backends.iter().rev().find(|b| *b != "reference").cloned();
    let mut failures = Vec::new();
    for b in &backends {
        // The cases this backend runs (indices into `cases`; the request ids).
        let picked: Vec<usize> = (0..cases.len())
            .filter(|&i| {
                let n = cases[i].prompt.len();
                if b == "reference" {
                    REFERENCE_LENGTHS.contains(&n)
                } else {
                    Some(b) == widest.as_ref() || other_natives_run(n)
                }
            })
            .collect();
        let mut jsonl = String::new();
        for &i in &picked {
            let c = &cases[i];
            let line = json!({"id": i, "prompt_ids": c.prompt, "max_tokens": c.tokens.len()});
            jsonl.push_str(&line.to_string());
            jsonl.push('\n');
        }
        let input = tmp(&format!("wide-{key}-{b}.jsonl"), jsonl.as_bytes());
        // KV budget: room for the PARALLEL longest sequences at once, each in whole pages of
        // KV_PAGE cache rows (as `mollm batch` hands them out).
        let mut lens: Vec<usize> = picked
            .iter()
            .map(|&i| (cases[i].prompt.len() + cases[i].tokens.len()).next_multiple_of(KV_PAGE))
            .collect();
        lens.sort_unstable_by(|a, b| b.cmp(a));
        let kv: usize = lens.iter().take(PARALLEL).sum();

        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        let o = Command::new(env!("CARGO_BIN_EXE_mollm"))
            .args(["batch", "-m"])
            .arg(&m)
            .arg("-i")
            .arg(&input)
            .args([
                "--parallel",
                &PARALLEL.to_string(),
                "--ctx",
                &kv.to_string(),
            ])
            .args([
                "--batch",
                "512",
                "-t",
                "2",
                "--temperature",
                "0",
                "--backend",
                b,
            ])
            .output()
            .expect("run mollm batch");
        let secs = t0.elapsed().as_secs_f64();
        if !o.status.success() {
            failures.push(format!(
                "{key} on {b}: mollm batch failed: {}",
                common::stderr(&o)
            ));
            continue;
        }
        let lines: Vec<Value> = common::stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON result line"))
            .collect();
        if lines.len() != picked.len() {
            failures.push(format!(
                "{key} on {b}: {} result lines for {} requests",
                lines.len(),
                picked.len()
            ));
            continue;
        }
        let mut bad = Vec::new();
        let mut n_bad = 0;
        for (&i, v) in picked.iter().zip(&lines) {
            let issues = check_line(i, &cases[i], v);
            n_bad += !issues.is_empty() as usize;
            bad.extend(issues);
        }
        eprintln!(
            "{key} on {b}: {} of {} cases equal llama.cpp ({secs:.1} s, --ctx {kv})",
            picked.len() - n_bad,
            picked.len()
        );
        if !bad.is_empty() {
            failures.push(format!(
                "{key} on {b}: {n_bad} of {} cases differ from llama.cpp:\n  {}",
                picked.len(),
                bad.join("\n  ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What is wrong with result line `v` for case `i` (nothing: its tokens equal llama.cpp's).
fn check_line(i: usize, c: &Case, v: &Value) -> Vec<String> {
    let n = c.prompt.len();
    if v["id"].as_u64() != Some(i as u64) {
        return vec![format!("case {i}: result line has id {}", v["id"])];
    }
    let Some(got) = v.get("tokens").map(ids) else {
        return vec![format!("case {i} (prompt {n} tokens): {}", v["error"])];
    };
    let mut issues = Vec::new();
    if v["prompt_tokens"].as_u64() != Some(n as u64) {
        issues.push(format!(
            "case {i}: mollm counted {} prompt tokens, the case has {n}",
            v["prompt_tokens"]
        ));
    }
    if got != c.tokens {
        let at = got
            .iter()
            .zip(&c.tokens)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(c.tokens.len()));
        let margin = c.margins.get(at).map_or(String::new(), |m| {
            format!(", llama.cpp top-2 margin there {m}")
        });
        issues.push(format!(
            "case {i} (prompt {n} tokens): first difference at generated position {at}: \
             llama.cpp {:?}, mollm {:?}{margin}\n    llama.cpp: {:?}\n    mollm:     {got:?}",
            c.tokens.get(at),
            got.get(at),
            c.tokens
        ));
    }
    issues
}

#[test]
fn wide_golden_smollm2() {
    check_model("smollm2", true);
}

#[test]
fn wide_golden_qwen05() {
    check_model("qwen05", false);
}

#[test]
fn wide_golden_gemma3() {
    check_model("gemma3", false);
}

#[test]
fn wide_golden_qwen15() {
    check_model("qwen15", false);
}
