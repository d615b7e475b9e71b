//! Helpers shared by the `mollm` integration tests: run the binary, read its output, make
//! scratch files, find the cached models (missing ones skip with a note, or fail under
//! MOLLM_REQUIRE_MODELS=1 as in CI), and check that bad input fails cleanly.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn mollm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(args)
        .output()
        .expect("run mollm")
}

/// `mollm args` with `input` on its standard input (a pipe, as from a script).
pub fn mollm_stdin(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mollm");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// This test process's scratch folder, `$TMPDIR/mollm-tests/<pid>`, removed when the process
/// exits. On first use it also removes the folders of earlier test processes that are no
/// longer alive (runs that were killed), so scratch does not pile up on a machine that runs
/// the suite again and again: model copies and packages are hundreds of MB each, and leftovers
/// of many runs once filled a CI machine's disk.
pub fn scratch() -> PathBuf {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let root = std::env::temp_dir().join("mollm-tests");
    let dir = root.join(std::process::id().to_string());
    ONCE.call_once(|| {
        sweep_dead(&root);
        std::fs::create_dir_all(&dir).unwrap();
        extern "C" fn remove_own() {
            let own = std::env::temp_dir()
                .join("mollm-tests")
                .join(std::process::id().to_string());
            let _ = std::fs::remove_dir_all(own);
        }
        // SAFETY: atexit(3) with a handler that only removes files; libtest leaves through
        // exit(3) whether the tests passed or failed, which runs it.
        unsafe { libc::atexit(remove_own) };
    });
    dir
}

/// Removes the scratch folders under `root` whose process is gone (Linux: no `/proc/<pid>`).
fn sweep_dead(root: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A fresh, empty subfolder `tag` of this process's scratch folder.
pub fn scratch_sub(tag: &str) -> PathBuf {
    let d = scratch().join(tag);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A scratch file of this test process.
pub fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

pub fn models_dir() -> PathBuf {
    abi::settings::models_dir()
}

pub fn required() -> bool {
    abi::settings::REQUIRE_MODELS.on(false)
}

/// The cached model `name`, or `None` (with a note) when it is missing and not required.
/// A model under `derived/` is made by scripts/make-moe-models.sh when missing (once per
/// test binary).
pub fn model(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(name);
    if name.starts_with("derived/") && !p.exists() {
        make_derived();
    }
    if p.exists() {
        Some(p)
    } else {
        assert!(
            !required(),
            "{} is missing (run scripts/fetch-models.sh)",
            p.display()
        );
        eprintln!("SKIP: {} not found", p.display());
        None
    }
}

/// Runs scripts/make-moe-models.sh (once per test binary); its errors go to stderr.
fn make_derived() {
    static MADE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if *made {
        return;
    }
    *made = true;
    let script = repo().join("scripts/make-moe-models.sh");
    match Command::new(&script).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!(
            "{} failed (it needs python3 with numpy and gguf==0.19.0 from PyPI):\n{}",
            script.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => eprintln!("{}: {e}", script.display()),
    }
}

/// Failed with a non-zero exit, no panic, and an error naming `needle`.
pub fn assert_clean_error(o: &Output, needle: &str) {
    let e = stderr(o);
    assert!(!o.status.success(), "expected failure; stderr: {e}");
    assert!(!e.contains("panicked"), "panic instead of an error: {e}");
    assert!(e.contains(needle), "error does not mention {needle:?}: {e}");
}

/// As [`assert_clean_error`], and the error is one line.
pub fn assert_one_line_error(o: &Output, needle: &str) {
    assert_clean_error(o, needle);
    let e = stderr(o);
    assert_eq!(
        e.trim_end().lines().count(),
        1,
        "expected one line, got: {e}"
    );
}

/// Backends the parity tests run on: the reference, then each native backend built next to
/// `mollm` that can run on this CPU (MOLLM_TEST_BACKENDS=a,b overrides the list; `auto` is
/// `--backend auto`).
pub fn test_backends() -> Vec<String> {
    let wanted = abi::settings::TEST_BACKENDS
        .get()
        .unwrap_or_else(|| abi::settings::TEST_BACKENDS.default.into());
    let devices = std::process::Command::new(env!("CARGO_BIN_EXE_mollm"))
        .arg("devices")
        .output()
        .expect("mollm devices");
    let devices = String::from_utf8_lossy(&devices.stdout).into_owned();
    let mut out = Vec::new();
    for name in wanted.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if name == "auto" {
            // whatever `--backend auto` picks on this CPU
            out.push(name.to_string());
            continue;
        }
        let line = devices
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name));
        match line {
            Some(l) if l.contains("available") && !l.contains("unavailable") => {
                out.push(name.to_string())
            }
            // Built, but this CPU lacks what it needs: nothing to test here.
            Some(l) if l.contains("CPU lacks") => eprintln!("SKIP backend {name}: {l}"),
            Some(l) => panic!("backend {name} is not usable: {l}"),
            None => panic!("backend {name} was not found by `mollm devices`:\n{devices}"),
        }
    }
    out
}

/// A copy of `model` whose `tokenizer.chat_template` is `template`, written in place of the
/// original string (padded with spaces to its length, so no offset moves). For hostile
/// templates: the test fails if the original is shorter than `template`.
pub fn with_template(model: &Path, name: &str, template: &str) -> PathBuf {
    let mut b = std::fs::read(model).unwrap();
    let key = b"tokenizer.chat_template";
    let mut pat = (key.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(key);
    let at = b
        .windows(pat.len())
        .position(|w| w == pat.as_slice())
        .expect("the model has a chat template")
        + pat.len();
    assert_eq!(
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap()),
        8,
        "a string"
    );
    let n = u64::from_le_bytes(b[at + 4..at + 12].try_into().unwrap()) as usize;
    assert!(
        template.len() <= n,
        "the model's template has only {n} bytes"
    );
    let text = &mut b[at + 12..at + 12 + n];
    text.fill(b' ');
    text[..template.len()].copy_from_slice(template.as_bytes());
    let p = scratch().join(name);
    std::fs::write(&p, b).unwrap();
    p
}

/// Nested loops that write nothing: minijinja's own range limit does not catch them.
pub const QUIET_BOMB: &str =
    "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}";
/// Few instructions, 10^9 bytes of output.
pub const LOUD_BOMB: &str = "{% for i in range(10000) %}{{ 'x' * 100000 }}{% endfor %}";

/// `mollm args`, killed after `secs` (then the test fails): for inputs that used to hang.
pub fn mollm_within(args: &[&str], secs: u64) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mollm"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mollm");
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed().as_secs() >= secs {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "mollm {args:?} still running after {secs} s: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
