//! The everyday commands: `chat` (turns reuse the KV cache, commands, Ctrl-C), `bench` (rows
//! shaped like llama-bench's), `ppl` (bad input; the llama.cpp comparison is in ppl.rs),
//! interrupted `run`, help and shell completions.

mod common;

use common::{assert_clean_error, mollm, mollm_stdin, stderr, stdout, tmp, SMOLLM2};
use serde_json::Value;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The cached model's path as a string (the tests pass it as an argument).
fn model(name: &str) -> Option<String> {
    common::model(name).map(|p| p.to_string_lossy().into_owned())
}

/// (processed, reused, generated) from each `--verbose` turn line.
fn turn_stats(err: &str) -> Vec<(usize, usize, usize)> {
    err.lines()
        .filter(|l| l.starts_with("[turn "))
        .map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            // [turn T: P prompt tokens processed, R reused from the cache, G generated; ...
            (nums[1], nums[2], nums[3])
        })
        .collect()
}

#[test]
fn chat_turns_reuse_the_cache() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm_stdin(
        &["chat", "-m", &m, "-v", "-n", "12", "--quiet"],
        "Hi there!\nWhat is the capital of France?\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let turns = turn_stats(&stderr(&o));
    assert_eq!(turns.len(), 2, "{}", stderr(&o));
    let (p1, r1, g1) = turns[0];
    let (p2, r2, _) = turns[1];
    assert_eq!(r1, 0, "nothing cached before the first turn");
    assert!(g1 > 0);
    // The second turn keeps the first prompt and the reply in the cache and processes only
    // the closing of the reply and the new message.
    assert!(r2 >= p1, "turn 2 reused {r2} < turn 1 prompt {p1}");
    assert!(p2 < p1 + g1, "turn 2 reprocessed too much: {p2}");
    assert!(p2 < r2, "turn 2 processed {p2}, reused {r2}");
    let out = stdout(&o);
    assert!(
        out.lines().filter(|l| !l.trim().is_empty()).count() >= 2,
        "{out}"
    );
}

#[test]
fn chat_reset_starts_over_and_answers_alike() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm_stdin(
        &["chat", "-m", &m, "-v", "-n", "10", "--quiet"],
        "Say hello.\n/reset\nSay hello.\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("[conversation cleared]"), "{err}");
    let turns = turn_stats(&err);
    assert_eq!(turns.len(), 2, "{err}");
    assert_eq!(turns[1].1, 0, "/reset empties the cache");
    assert_eq!(
        turns[0].0 + turns[0].1,
        turns[1].0 + turns[1].1,
        "same prompt both times"
    );
    let out = stdout(&o);
    let replies: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert_eq!(
        replies[0], replies[1],
        "greedy: the same conversation, the same reply"
    );
}

#[test]
fn chat_banner_and_commands() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm_stdin(
        &["chat", "-m", &m],
        "/help\n/bogus\n\n/quit\nThis line is never read as a turn.\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for needle in [
        SMOLLM2,
        "architecture llama",
        "quant Q4_1",
        "context 4096",
        "threads",
        "backend",
        "/reset",
        "unknown command /bogus",
    ] {
        assert!(err.contains(needle), "missing {needle:?} in: {err}");
    }
    assert!(
        stdout(&o).trim().is_empty(),
        "no turn was run: {}",
        stdout(&o)
    );
}

#[test]
fn chat_ctrl_c_stops_the_reply_not_the_chat() {
    let Some(m) = model(SMOLLM2) else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(["chat", "-m", &m, "--quiet", "-v", "--ctx", "2048"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"Write a very long story about a dragon, in many chapters.\n")
        .unwrap();
    stdin.flush().unwrap();
    // Wait for the reply to start, then press Ctrl-C.
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    out.read_exact(&mut first).unwrap();
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    std::thread::sleep(Duration::from_millis(300));
    stdin.write_all(b"/quit\n").unwrap();
    drop(stdin);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "chat did not stop the reply on Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    assert!(err.contains("[stopped]"), "{err}");
    let turns = turn_stats(&err);
    assert_eq!(turns.len(), 1, "{err}");
    assert!(turns[0].2 < 1900, "the reply ran on: {:?}", turns[0]);
}

#[test]
fn chat_turn_too_long_for_the_context_is_refused_and_the_chat_goes_on() {
    let Some(m) = model(SMOLLM2) else { return };
    let long = "many words ".repeat(100);
    let o = mollm_stdin(
        &["chat", "-m", &m, "--ctx", "96", "-n", "4", "-v", "--quiet"],
        &format!("{long}\nHi\n"),
    );
    let err = stderr(&o);
    assert!(err.contains("raise --ctx"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        turn_stats(&err).len(),
        1,
        "the short turn still runs: {err}"
    );
    assert!(
        !o.status.success(),
        "a failed piped turn shows in the exit status"
    );
    assert!(err.contains("1 turn(s) failed"), "{err}");
}

#[test]
fn run_ctrl_c_exits_130_keeping_the_text() {
    let Some(m) = model(SMOLLM2) else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args([
            "run",
            "-m",
            &m,
            "-p",
            "Once upon a time",
            "-n",
            "2000",
            "--ignore-eos",
            "--ctx",
            "2048",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 8];
    out.read_exact(&mut first).unwrap();
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let mut rest = Vec::new();
    out.read_to_end(&mut rest).unwrap();
    assert!(
        rest.ends_with(b"\n"),
        "the text so far is kept and the line ended"
    );
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("interrupted after"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn run_empty_prompt_is_refused() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm(&["run", "-m", &m, "-p", ""]);
    assert_clean_error(&o, "empty");
}

#[test]
fn ctx_beyond_the_model_is_refused() {
    let Some(m) = model(SMOLLM2) else { return };
    let text = tmp("ctx.txt", b"Some text.\n");
    for cmd in ["run", "chat", "ppl"] {
        let mut args = vec![cmd, "-m", &m, "--ctx", "1000000"];
        match cmd {
            "run" => args.extend(["-p", "hi"]),
            "ppl" => args.extend(["-f", text.to_str().unwrap()]),
            _ => {}
        }
        let o = mollm(&args);
        assert_clean_error(&o, "training context of 8192");
    }
}

#[test]
fn bench_json_rows_read_like_llama_bench() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm(&[
        "bench",
        "-m",
        &m,
        "--prompt-tokens",
        "16,32",
        "--gen-tokens",
        "4",
        "--warmup",
        "1",
        "--reps",
        "2",
        "--threads",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<Value> = serde_json::from_slice(&o.stdout).unwrap();
    let shape: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shape, vec![(16, 0), (32, 0), (0, 4)]);
    for r in &rows {
        assert_eq!(r["n_threads"], 1);
        for k in ["avg_ts", "stddev_ts", "median_ts", "ttft_ms", "tpot_ms"] {
            assert!(r[k].as_f64().is_some_and(|x| x >= 0.0), "{k}: {r}");
        }
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert!(r["peak_rss_bytes"].as_u64().unwrap() > 10 << 20, "{r}");
        assert!(!r["backend"].as_str().unwrap().is_empty());
        assert_eq!(r["model_type"], "llama 135M Q4_1");
    }
}

#[test]
fn bench_table_and_bad_flags() {
    let Some(m) = model(SMOLLM2) else { return };
    let o = mollm(&[
        "bench", "-m", &m, "-p", "8", "-n", "2", "--warmup", "0", "--reps", "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(t.starts_with("| model"), "{t}");
    assert!(t.contains("| pp8 |") && t.contains("| tg2 |"), "{t}");
    // --depth alone times one sequence that deep (it was ignored without --sequences).
    let o = mollm(&[
        "bench", "-m", &m, "-p", "0", "-n", "2", "--depth", "8", "--warmup", "0", "--reps", "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(t.contains("| tg2 x1 @ d8 |"), "{t}");
    assert_clean_error(
        &mollm(&["bench", "-m", &m, "-p", "0", "-n", "0"]),
        "nothing to measure",
    );
    assert_clean_error(&mollm(&["bench", "-m", &m, "-p", "100000"]), "--ctx");
    assert_clean_error(&mollm(&["bench", "-m", &m, "--reps", "0"]), "--reps");
}

#[test]
fn ppl_refuses_bad_files() {
    let Some(m) = model(SMOLLM2) else { return };
    let bin = tmp("latin1.txt", b"caf\xe9 au lait, s'il vous pla\xeet\n");
    assert_clean_error(
        &mollm(&["ppl", "-m", &m, "-f", bin.to_str().unwrap()]),
        "not UTF-8",
    );
    let short = tmp("short.txt", b"Only a few words here.\n");
    assert_clean_error(
        &mollm(&["ppl", "-m", &m, "-f", short.to_str().unwrap()]),
        "needs at least 1024",
    );
    assert_clean_error(
        &mollm(&["ppl", "-m", &m, "-f", "/nonexistent/text.txt"]),
        "/nonexistent/text.txt",
    );
}

#[test]
fn help_covers_every_command_and_completions_work() {
    let o = mollm(&["--help"]);
    let h = stdout(&o);
    for cmd in [
        "run",
        "chat",
        "bench",
        "ppl",
        "architectures",
        "devices",
        "backends",
        "ops",
        "completions",
    ] {
        assert!(h.contains(&format!("  {cmd} ")), "--help lacks {cmd}: {h}");
        let sub = mollm(&[cmd, "--help"]);
        assert!(sub.status.success(), "{cmd} --help failed");
        assert!(stdout(&sub).contains("Usage: mollm"), "{cmd}");
    }
    assert!(
        !h.contains("__gate"),
        "the internal gate command stays hidden"
    );
    for shell in ["bash", "zsh", "fish"] {
        let o = mollm(&["completions", shell]);
        assert!(o.status.success());
        let s = stdout(&o);
        assert!(
            s.contains("mollm") && s.contains("ppl") && s.contains("prompt-tokens"),
            "{shell}"
        );
    }
    assert_clean_error(&mollm(&["completions", "cmd.exe"]), "cmd.exe");
}

#[test]
fn ops_answers_op_families_per_format_and_says_why_a_gpu_is_missing() {
    // gemm_w4: one answer per 4-bit weight format, each with a winner on this CPU.
    let o = mollm(&["ops", "--op", "gemm_w4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for f in ["w4g32", "w4g128", "q4_0", "q4_1", "q4_K"] {
        assert!(out.contains(&format!("({f})\n")), "{f}: {out}");
    }
    assert_eq!(out.matches("winner: ").count(), 5, "{out}");
    assert!(!out.contains("winner: none"), "{out}");
    // --dtype narrows a family; a format outside it is refused, naming what it covers.
    let o = mollm(&["ops", "--op", "gemm_w8", "--dtype", "q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).matches("winner: ").count(), 1);
    assert_clean_error(
        &mollm(&["ops", "--op", "gemm_w4", "--dtype", "q8_0"]),
        "it covers: w4g32 w4g128 q4_0 q4_1 q4_K",
    );
    // A GPU backend that is not here is said plainly, and that is an answer, not an error.
    for d in ["cuda", "metal"] {
        let o = mollm(&["ops", "--op", "gemm_w4", "--device", d]);
        assert!(o.status.success(), "{d}: {}", stderr(&o));
        let out = stdout(&o);
        assert!(out.starts_with(&format!("{d}: unavailable: ")), "{out}");
    }
    // --device gpu leaves out every CPU backend and the reference.
    let o = mollm(&["ops", "--op", "gemm_f32", "--device", "gpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("winner: none") && !out.contains("reference"),
        "{out}"
    );
    assert_clean_error(
        &mollm(&["ops", "--op", "gemm", "--device", "tpu"]),
        "cpu, gpu, cuda, metal",
    );
    assert_clean_error(&mollm(&["ops", "--op", "gemm_w3"]), "families: gemm");
}

/// `mollm devices --probe` measures the read bandwidth and keeps it; `mollm bench` then gives
/// each decode row's weight bandwidth and its share of the probe (and says how to get the
/// share before a probe ran).
#[test]
fn probe_keeps_the_read_bandwidth_and_bench_states_its_share() {
    let Some(m) = model(SMOLLM2) else { return };
    let cache = tmp("probe-anchor", b"").with_file_name("probe-cache");
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mollm"))
            .args(args)
            .env("XDG_CACHE_HOME", &cache)
            .output()
            .expect("run mollm")
    };
    let bench = [
        "bench", "-m", &m, "-p", "0", "-n", "4", "--warmup", "0", "--reps", "1",
    ];
    let o = run(&bench);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("mollm devices --probe"),
        "{}",
        stdout(&o)
    );

    let o = run(&["devices", "--probe", "--probe-mb", "64"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let gbps: Vec<f64> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(out.starts_with("memory read bandwidth: "), "{out}");
    assert!(gbps.len() >= 2 && gbps.iter().all(|&g| g > 0.1), "{out}");
    let kept: Value =
        serde_json::from_str(&std::fs::read_to_string(cache.join("mollm/probe.json")).unwrap())
            .unwrap();
    assert!(kept["read_gbps"].as_f64() > Some(0.1), "{kept}");
    // The way that read fastest: the loads alone (0) or a prefetch 4 or 16 KiB ahead.
    let pf = kept["read_prefetch_bytes"].as_u64();
    assert!([Some(0), Some(4096), Some(16384)].contains(&pf), "{kept}");

    let o = run(&[&bench[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &rows[0];
    let (bytes, gbps) = (
        r["weight_bytes_per_step"].as_u64(),
        r["weight_read_gbps"].as_f64(),
    );
    // SmolLM2 ties its output to the embeddings: every tensor is read each step.
    assert!(bytes > Some(80 << 20) && gbps > Some(0.0), "{r}");
    let share = r["read_share"].as_f64().unwrap_or(0.0);
    let want = gbps.unwrap() / kept["read_gbps"].as_f64().unwrap();
    assert!((share - want).abs() < 1e-9 * want.max(1.0), "{r}");
    let o = run(&bench);
    assert!(stdout(&o).contains("%) |"), "{}", stdout(&o));

    // --probe-between: a slice of the probe after every step, its GB/s per run, and the
    // steps' weight GB/s over it (the steps timed without the slices).
    let between = [
        "bench",
        "-m",
        &m,
        "-p",
        "0",
        "-n",
        "4",
        "--warmup",
        "0",
        "--reps",
        "2",
        "--probe-between",
        "--probe-mb",
        "64",
        "--probe-slice-mb",
        "8",
    ];
    let o = run(&[&between[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &rows[0];
    let (probe, shares) = (
        r["probe_between_gbps"].as_array().unwrap(),
        r["read_shares_between"].as_array().unwrap(),
    );
    assert!(probe.len() == 2 && shares.len() == 2, "{r}");
    for ((p, sh), ts) in probe
        .iter()
        .zip(shares)
        .zip(r["samples_ts"].as_array().unwrap())
    {
        let (p, sh, ts) = (
            p.as_f64().unwrap(),
            sh.as_f64().unwrap(),
            ts.as_f64().unwrap(),
        );
        assert!(p > 0.1, "{r}");
        let want = bytes.unwrap() as f64 * ts / 1e9 / p;
        assert!((sh - want).abs() < 1e-9 * want.max(1.0), "{r}");
    }
    assert!(r["read_share_between"].as_f64() > Some(0.0), "{r}");
    let o = run(&between);
    assert!(
        stdout(&o).contains("of the probe read between the steps"),
        "{}",
        stdout(&o)
    );
    // Prompt rows take no slices; a flag of the probe alone is refused.
    let o = run(&[
        "bench",
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "0",
        "--warmup",
        "0",
        "--reps",
        "1",
        "--probe-between",
        "--json",
    ]);
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(rows[0]["read_share_between"].is_null(), "{}", rows[0]);
    assert_clean_error(
        &mollm(&["bench", "--probe-slice-mb", "8"]),
        "--probe-between",
    );

    assert_clean_error(&mollm(&["devices", "--probe-mb", "8"]), "--probe");
}
