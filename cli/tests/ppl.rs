//! `mollm ppl` against llama-perplexity: the same file, model, window (512) and batch, F32 K/V
//! cache on both sides. fixtures/ppl/lee-news-100.json holds llama-perplexity's running
//! estimate after every window (scripts/golden/make_ppl_fixture.py made it); mollm's estimate
//! after the same number of windows must be within 1% of it. SmolLM2 is scored over the whole
//! text (24,061 tokens); Qwen2.5-Coder-0.5B, whose 151,936-token output layer makes each window
//! cost far more, over its first windows (the full-text numbers of both are in the fixture and
//! docs/src/usage/chat-bench-ppl.md).

mod common;

use common::{model, repo as root, required};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn text() -> Option<PathBuf> {
    let o = Command::new(root().join("scripts/fetch-ppl-text.sh"))
        .output()
        .expect("run scripts/fetch-ppl-text.sh");
    if o.status.success() {
        return Some(PathBuf::from(String::from_utf8(o.stdout).unwrap().trim()));
    }
    let why = String::from_utf8_lossy(&o.stderr);
    assert!(!required(), "the ppl text could not be fetched: {why}");
    eprintln!("SKIP: the ppl text could not be fetched: {why}");
    None
}

fn check(key: &str, chunks: Option<usize>) {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/ppl/lee-news-100.json")).unwrap(),
    )
    .unwrap();
    let rec = &fx["models"][key];
    let Some(m) = model(rec["model_file"].as_str().unwrap()) else {
        return;
    };
    let Some(t) = text() else { return };
    let cfg = &fx["llama_cpp"]["config"];
    let (ctx, batch) = (cfg["n_ctx"].to_string(), cfg["n_batch"].to_string());
    let mut args = vec![
        "ppl".to_string(),
        "-m".into(),
        m.to_string_lossy().into(),
        "-f".into(),
        t.to_string_lossy().into(),
        "--ctx".into(),
        ctx,
        "--batch".into(),
        batch,
        "--json".into(),
    ];
    if let Some(n) = chunks {
        args.extend(["--chunks".into(), n.to_string()]);
    }
    let o = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(&args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let running = rec["llama"]["running"].as_array().unwrap();
    let n = v["chunks"].as_u64().unwrap() as usize;
    assert_eq!(
        n,
        chunks.unwrap_or(running.len()),
        "window count differs from llama-perplexity's"
    );
    let ours = v["ppl"].as_f64().unwrap();
    let theirs = running[n - 1].as_f64().unwrap();
    let rel = (ours - theirs).abs() / theirs;
    eprintln!("{key}: {n} windows, mollm {ours:.4}, llama-perplexity {theirs:.4}, relative difference {rel:.2e}");
    assert!(
        rel < 0.01,
        "{key}: mollm {ours} vs llama-perplexity {theirs} ({rel:.4} relative)"
    );
    // The per-window estimates track each other too, not only the last one.
    for (i, (a, b)) in v["running"]
        .as_array()
        .unwrap()
        .iter()
        .zip(running)
        .enumerate()
    {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!(
            (a - b).abs() / b < 0.01,
            "{key}: window {}: {a} vs {b}",
            i + 1
        );
    }
}

#[test]
fn smollm2_whole_text_within_one_percent_of_llama_perplexity() {
    check("smollm2", None);
}

#[test]
fn qwen05_first_windows_within_one_percent_of_llama_perplexity() {
    check("qwen05", Some(4));
}
