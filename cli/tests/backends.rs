//! Native backend plugins through the CLI: discovery, the conformance gate in a child process
//! (a wrong op is refused alone, a crashing backend is refused whole and the caller survives),
//! garbage libraries refused with a clear message, and runs that continue on the reference.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_mollm"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The deliberately broken test plugin (crate `backends/test-broken`), built next to the binary.
fn broken_lib() -> Option<PathBuf> {
    let name = format!(
        "{}broken_backend_for_tests{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    for dir in [bin_dir(), bin_dir().join("deps")] {
        let p = dir.join(&name);
        if p.exists() {
            return Some(p);
        }
    }
    // `cargo test` builds workspace cdylibs; when only this package was built, build it.
    let st = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "test-broken"])
        .status()
        .ok()?;
    let p = bin_dir().join(&name);
    (st.success() && p.exists()).then_some(p)
}

/// A scratch directory of this test's own (cache and plugin dir).
fn scratch(tag: &str) -> PathBuf {
    common::scratch_sub(tag)
}

fn mollm(args: &[&str], envs: &[(&str, &Path)], extra: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mollm"));
    c.args(args)
        .env_remove("MOLLM_BACKEND_DIR")
        // Only the test plugin: the x86 backends built next to mollm stay out of these tests.
        .env("MOLLM_X86_ISA", "scalar")
        .env_remove("MOLLM_TEST_BROKEN_CRASH");
    for (k, v) in envs {
        c.env(k, v);
    }
    for (k, v) in extra {
        c.env(k, v);
    }
    c.output().expect("run mollm")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn line_of<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no line for {name} in:\n{out}"))
}

#[test]
fn gate_refuses_only_the_wrong_op_and_caches_the_verdict() {
    let Some(lib) = broken_lib() else {
        panic!("the test-broken plugin is not built")
    };
    let cache = scratch("cache");
    let o = mollm(
        &["devices", "--backend-lib", lib.to_str().unwrap()],
        &[("XDG_CACHE_HOME", &cache)],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let l = line_of(&out, "test-broken");
    assert!(
        l.contains("available; refused by the conformance gate: add "),
        "{l}"
    );
    assert!(!l.contains("mul"), "{l}");
    // One cached verdict, naming add and nothing else.
    let files: Vec<_> = std::fs::read_dir(cache.join("mollm/gate"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    let failed: Vec<&str> = v["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["op"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["add"]);
    // The second run reads the cache: a crash-triggering environment would otherwise refuse
    // the whole backend.
    let o = mollm(
        &["devices", "--backend-lib", lib.to_str().unwrap()],
        &[("XDG_CACHE_HOME", &cache)],
        &[("MOLLM_TEST_BROKEN_CRASH", "1")],
    );
    let (out, _) = text(&o);
    assert!(
        line_of(&out, "test-broken").contains("refused by the conformance gate: add"),
        "{out}"
    );

    // `ops` explains who wins each op.
    let o = mollm(
        &["ops", "--op", "add", "--backend-lib", lib.to_str().unwrap()],
        &[("XDG_CACHE_HOME", &cache)],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        line_of(&out, "test-broken").contains("failed the conformance gate"),
        "{out}"
    );
    assert!(out.contains("winner: reference"), "{out}");
    let o = mollm(
        &["ops", "--op", "mul", "--backend-lib", lib.to_str().unwrap()],
        &[("XDG_CACHE_HOME", &cache)],
        &[],
    );
    let (out, _) = text(&o);
    assert!(out.contains("winner: test-broken"), "{out}");
    let o = mollm(
        &[
            "ops",
            "--op",
            "mat_mul",
            "--dtype",
            "q4_K",
            "--backend-lib",
            lib.to_str().unwrap(),
        ],
        &[("XDG_CACHE_HOME", &cache)],
        &[],
    );
    let (out, _) = text(&o);
    assert!(
        line_of(&out, "test-broken").contains("unsupported"),
        "{out}"
    );
    assert!(out.contains("winner: reference"), "{out}");

    // `backends` lists what it declares.
    let o = mollm(
        &["backends", "--backend-lib", lib.to_str().unwrap()],
        &[("XDG_CACHE_HOME", &cache)],
        &[],
    );
    let (out, _) = text(&o);
    let add = out
        .lines()
        .find(|l| l.trim_start().starts_with("add "))
        .unwrap();
    assert!(add.contains("f32") && add.contains("refused"), "{add}");
    let mul = out
        .lines()
        .find(|l| l.trim_start().starts_with("mul "))
        .unwrap();
    assert!(mul.contains("passed: f32"), "{mul}");
    // What it does not declare is skipped, not passed: the op rows say so, and the skipped
    // list names op, format and the backend's reason, apart from the op table.
    let softmax = out
        .lines()
        .find(|l| l.trim_start().starts_with("softmax "))
        .unwrap();
    assert!(
        softmax.contains("skipped (nothing declared)") && !softmax.contains("passed"),
        "{softmax}"
    );
    let (ops_table, skipped) = out
        .split_once("skipped by the conformance gate (not declared, so not run: not passed):")
        .unwrap_or_else(|| panic!("no skipped list in:\n{out}"));
    let skipped = skipped.split("\n\n").next().unwrap();
    assert!(ops_table.contains("test-broken"), "{out}");
    let skip_line = |op: &str, format: &str| {
        skipped
            .lines()
            .find(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[0] == op && w[1] == format
            })
            .unwrap_or_else(|| panic!("{op} {format} not listed as skipped in:\n{skipped}"))
            .to_string()
    };
    assert!(
        skip_line("mat_mul", "q4_K").contains("mat_mul is not implemented here"),
        "{skipped}"
    );
    assert!(
        skip_line("attention", "f16").contains("attention is not implemented here"),
        "{skipped}"
    );
    assert!(
        skip_line("softmax", "f32").contains("softmax is not implemented here"),
        "{skipped}"
    );
    // What passed is not in the skipped list.
    assert!(
        !skipped
            .lines()
            .any(|l| l.split_whitespace().next() == Some("mul")),
        "{skipped}"
    );
}

#[test]
fn a_crash_in_the_gate_refuses_the_backend_and_the_caller_survives() {
    let Some(lib) = broken_lib() else {
        panic!("the test-broken plugin is not built")
    };
    let cache = scratch("crash");
    let o = mollm(
        &["devices", "--backend-lib", lib.to_str().unwrap()],
        &[("XDG_CACHE_HOME", &cache)],
        &[("MOLLM_TEST_BROKEN_CRASH", "1")],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "the caller must survive: {err}");
    assert!(
        line_of(&out, "test-broken").contains("crashed during conformance gate (signal 6)"),
        "{out}"
    );
    assert!(line_of(&out, "reference").contains("available"), "{out}");
    // A crash is not cached: it is checked again next time.
    assert!(
        !cache.join("mollm/gate").exists()
            || std::fs::read_dir(cache.join("mollm/gate"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
fn a_library_that_is_not_a_backend_is_refused_clearly() {
    let dir = scratch("fake");
    std::fs::write(
        dir.join(format!(
            "{}mollm_fake{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        )),
        b"this is not a shared library",
    )
    .unwrap();
    let o = mollm(
        &["devices"],
        &[("XDG_CACHE_HOME", &dir), ("MOLLM_BACKEND_DIR", &dir)],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let l = line_of(&out, "libmollm_fake");
    assert!(l.contains("unavailable: cannot load"), "{l}");
    assert!(line_of(&out, "reference").contains("available"), "{out}");
}

fn smollm2() -> Option<PathBuf> {
    let p = abi::settings::models_dir().join("smollm2-135m-instruct-q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        assert!(
            !abi::settings::REQUIRE_MODELS.on(false),
            "{} missing",
            p.display()
        );
        eprintln!("SKIP: {} not found", p.display());
        None
    }
}

#[test]
fn runs_go_on_with_broken_plugins_and_match_the_reference() {
    let Some(model) = smollm2() else { return };
    let Some(lib) = broken_lib() else {
        panic!("the test-broken plugin is not built")
    };
    let dir = scratch("run");
    std::fs::write(dir.join("libmollm_fake.so"), b"garbage").unwrap();
    let m = model.to_str().unwrap();
    let base = [
        "run",
        "--model",
        m,
        "--prompt",
        "One, two, three,",
        "--max-tokens",
        "4",
        "--json",
        "--threads",
        "2",
    ];
    let run = |extra: &[&str], env: &[(&str, &str)], cache: &Path| {
        let mut args: Vec<&str> = base.to_vec();
        args.extend_from_slice(extra);
        let o = mollm(
            &args,
            &[("XDG_CACHE_HOME", cache), ("MOLLM_BACKEND_DIR", &dir)],
            env,
        );
        let (out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v
    };
    let reference = run(&["--backend", "reference"], &[], &dir);
    assert_eq!(reference["backend"], "reference");
    // auto: the broken plugin runs mul (it passed the gate); add goes to the reference.
    let auto = run(&["--backend-lib", lib.to_str().unwrap()], &[], &dir);
    assert_eq!(auto["backend"], "test-broken,reference");
    assert_eq!(
        auto["tokens"], reference["tokens"],
        "a refused op must not reach the plugin"
    );
    // Crashing plugin (fresh cache: the verdict above is cached by library bytes): refused
    // whole, the run goes on with the reference.
    let crash = run(
        &["--backend-lib", lib.to_str().unwrap()],
        &[("MOLLM_TEST_BROKEN_CRASH", "1")],
        &scratch("run-crash"),
    );
    assert_eq!(crash["backend"], "reference");
    assert_eq!(crash["tokens"], reference["tokens"]);
    // --require-native: the model needs ops the plugin does not take.
    let mut args: Vec<&str> = base.to_vec();
    args.extend_from_slice(&[
        "--backend",
        "test-broken",
        "--require-native",
        "--backend-lib",
        lib.to_str().unwrap(),
    ]);
    let o = mollm(&args, &[("XDG_CACHE_HOME", &dir)], &[]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("--require-native"), "{err}");
}

#[test]
fn isa_cap_is_checked() {
    let dir = scratch("isa");
    let o = mollm(
        &["devices"],
        &[("XDG_CACHE_HOME", &dir)],
        &[("MOLLM_X86_ISA", "sse9")],
    );
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("MOLLM_X86_ISA=sse9"), "{err}");
}

/// The cuda plugin is built on every machine and loads without CUDA; where it cannot run it
/// says why in its own words (ABI 1.3 `unavailable_reason`), not as a CPU lacking features.
#[test]
fn the_cuda_plugin_says_why_it_cannot_run() {
    let dir = scratch("cuda");
    let o = mollm(&["devices"], &[("XDG_CACHE_HOME", &dir)], &[]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let l = line_of(&out, "cuda");
    assert!(l.contains("gpu") && l.contains("unavailable: "), "{l}");
    assert!(!l.contains("CPU lacks"), "{l}");
    let o = mollm(
        &["ops", "--op", "gemm_w4", "--device", "cuda"],
        &[("XDG_CACHE_HOME", &dir)],
        &[],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("cuda: unavailable: "), "{out}");
    assert!(
        !out.contains("has no cuda backend"),
        "the plugin was found: {out}"
    );
    if !std::path::Path::new("/proc/driver/nvidia").exists() {
        assert!(out.contains("no CUDA"), "{out}");
    }
}
