//! Hostile and careless input to the commands (issue 51): chat-template bombs, absurd flags,
//! degenerate sampling values, a FIFO as the model, a file that is not a plugin, a batch line
//! that is not UTF-8. Each must end quickly with a clear error (or the right answer), never a
//! panic, an abort or a hang. The server's side is in serve.rs.

mod common;

use common::{
    assert_clean_error, assert_one_line_error, model, mollm, mollm_within, stderr, stdout,
    with_template, LOUD_BOMB, QUIET_BOMB, SMOLLM2,
};

fn smollm2() -> Option<String> {
    model(SMOLLM2).map(|p| p.to_str().unwrap().to_string())
}

#[test]
fn chat_template_bombs_end_quickly_with_an_error() {
    let Some(m) = model(SMOLLM2) else { return };
    let quiet = with_template(&m, "quiet-bomb.gguf", QUIET_BOMB);
    let o = mollm_within(
        &[
            "run",
            "--chat",
            "-m",
            quiet.to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "2",
        ],
        30,
    );
    assert_one_line_error(&o, "instructions");
    let loud = with_template(&m, "loud-bomb.gguf", LOUD_BOMB);
    let o = mollm_within(
        &[
            "run",
            "--chat",
            "-m",
            loud.to_str().unwrap(),
            "-p",
            "hi",
            "-n",
            "2",
        ],
        30,
    );
    assert_one_line_error(&o, "the prompt the chat template renders has more than");
    // A prompt whose bytes alone cannot fit is refused before it is tokenized (100 kB: an
    // argument may have at most 128 KiB).
    let m = m.to_str().unwrap();
    let long = "word ".repeat(20_000);
    let o = mollm_within(&["run", "-m", m, "--ctx", "64", "-p", &long, "-n", "2"], 30);
    assert_one_line_error(&o, "bytes, more than 63 tokens can hold");
}

#[test]
fn absurd_numbers_are_one_line_errors() {
    let Some(m) = smollm2() else { return };
    let m = m.as_str();
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "-m", m, "-p", "hi", "-n", "2"];
        a.extend_from_slice(extra);
        mollm_within(&a, 60)
    };
    assert_one_line_error(&run(&["--threads", "100000"]), "--threads 100000");
    assert_one_line_error(&run(&["--threads", "2147483647"]), "at most");
    assert_one_line_error(&run(&["--batch", "2147483647"]), "--batch 2147483647");
    // The KV pool is checked against the memory there is before it is allocated.
    let o = mollm_within(
        &["batch", "-m", m, "-i", "/dev/null", "--ctx", "4000000000"],
        60,
    );
    assert_one_line_error(&o, "--ctx 4000000000: the KV cache would take");
    let o = mollm_within(
        &["serve", "-m", m, "--port", "0", "--ctx", "4000000000"],
        60,
    );
    assert_clean_error(&o, "--ctx 4000000000: the KV cache would take");
    let o = mollm(&["serve", "--parallel", "100000"]);
    assert_one_line_error(&o, "--parallel 100000");
    let o = mollm(&["serve", "--header-timeout", "0"]);
    assert_clean_error(&o, "--header-timeout");
}

#[test]
fn degenerate_sampling_values_are_refused_alike_or_greedy() {
    // Checked before the model loads: no model needed for the refusals.
    for (flag, v) in [
        ("--temperature", "NaN"),
        ("--temperature", "inf"),
        ("--temperature", "-1"),
        ("--top-p", "0"),
        ("--top-p", "1.5"),
        ("--min-p", "NaN"),
        ("--repeat-penalty", "5e-324"),
        ("--presence-penalty", "inf"),
        ("--frequency-penalty", "1e30"),
    ] {
        let arg = format!("{flag}={v}");
        let o = mollm(&["run", "-m", "/nonexistent.gguf", "-p", "hi", &arg]);
        assert_one_line_error(&o, flag);
        let o = mollm(&["batch", "-m", "/nonexistent.gguf", "-i", "/dev/null", &arg]);
        assert_one_line_error(&o, flag);
    }
    let Some(m) = smollm2() else { return };
    // A temperature so small that dividing by it overflows is the greedy limit.
    let text = |extra: &[&str]| {
        let mut a = vec![
            "run",
            "-m",
            &m,
            "-p",
            "The capital of France is",
            "-n",
            "6",
            "-q",
            "--seed",
            "1",
        ];
        a.extend_from_slice(extra);
        let o = mollm(&a);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let greedy = text(&[]);
    for t in ["1e-45", "1e-40", "1e-38"] {
        assert_eq!(text(&["--temperature", t]), greedy, "temperature {t}");
    }
    // batch: a line's value is checked by the same rule, and only that line fails.
    let input = common::tmp(
        "sampling.jsonl",
        br#"{"id": 1, "prompt": "Hi", "max_tokens": 2, "repeat_penalty": 5e-324}
{"id": 2, "prompt": "Hi", "max_tokens": 2, "temperature": 1e-40}
"#,
    );
    let o = mollm(&["batch", "-m", &m, "-i", input.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines[0]["error"]
            .as_str()
            .unwrap()
            .contains("repeat_penalty"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1]["error"].is_null() && lines[1]["text"].is_string(),
        "{}",
        lines[1]
    );
}

#[test]
fn a_batch_line_that_is_not_utf8_is_one_error_result() {
    let Some(m) = smollm2() else { return };
    let mut input = br#"{"id": "a", "prompt": "Hi", "max_tokens": 2}"#.to_vec();
    input.extend_from_slice(b"\n{\"id\": \"b\", \"prompt\": \"\xff\xfe\"}\n");
    input.extend_from_slice(br#"{"id": "c", "prompt": "Hello", "max_tokens": 2}"#);
    let input = common::tmp("not-utf8.jsonl", &input);
    let o = mollm(&["batch", "-m", &m, "-i", input.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{}", stdout(&o));
    assert_eq!(lines[0]["id"], "a");
    assert_eq!(lines[1]["line"], 2);
    assert!(
        lines[1]["error"]
            .as_str()
            .unwrap()
            .contains("line 2: not valid UTF-8"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2]["id"], "c");
    assert!(lines[2]["text"].is_string(), "{}", lines[2]);
}

#[test]
fn a_fifo_model_and_a_non_library_plugin_are_refused() {
    let dir = common::scratch_sub("fifo");
    let fifo = dir.join("model.gguf");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a path this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = mollm_within(&["run", "-m", fifo.to_str().unwrap(), "-p", "hi"], 30);
    assert_one_line_error(&o, "not a regular file or a directory");
    let _ = std::fs::remove_dir_all(&dir);

    let Some(m) = smollm2() else { return };
    let not_lib = common::tmp("libnot-a-backend.so", b"just text\n");
    let o = mollm(&[
        "run",
        "-m",
        &m,
        "-p",
        "hi",
        "-n",
        "2",
        "--backend-lib",
        not_lib.to_str().unwrap(),
    ]);
    assert_one_line_error(&o, "--backend-lib");
    assert!(stderr(&o).contains("libnot-a-backend.so"), "{}", stderr(&o));
}

#[test]
fn help_never_shows_the_api_key() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(["serve", "--help"])
        .env("MOLLM_API_KEY", "sk-do-not-print")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(stdout(&o).contains("MOLLM_API_KEY"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("sk-do-not-print"), "{}", stdout(&o));
}
