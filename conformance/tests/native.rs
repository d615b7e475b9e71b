//! The conformance gate on every native backend of this workspace (x86 and ARM).
//!
//! The test builds the backends itself: the workspace's backend libraries (`backends/*` members
//! that are `cdylib`s named `mollm_*`) for this target's architecture, with the cargo that runs
//! the test, in the test's own profile, target and target directory (`cargo build -p ...
//! [--release] [--target T] --target-dir D`), then loads them from that profile's directory.
//! So `cargo test [--release] -p mollm-conformance` works on a fresh clone, and under
//! `scripts/arm-test.sh` (a cross build run under qemu) it builds the ARM libraries for
//! aarch64. `MOLLM_CONFORMANCE_LIB_DIR=DIR` checks the libraries already in DIR instead and
//! builds nothing.
//!
//! Both tiers are checked whatever MOLLM_X86_ISA says. What is not checked is reported as a
//! skip, never as a pass: a backend for another architecture, a backend this CPU cannot run
//! (score 0), and, per op and format, what a backend does not declare.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

/// Checks the libraries in this directory as they are (no build).
const LIB_DIR_ENV: &str = abi::settings::CONFORMANCE_LIB_DIR.name;
/// Seeded cases per op (on top of the fixed ones).
const CASES: u64 = 16;

/// Written past libtest's capture, so that skips show in a passing run too.
fn say(s: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{s}");
}

/// A backend library crate of the workspace.
#[derive(Clone, Debug)]
struct BackendCrate {
    /// The package (`-p`), e.g. `mollm-x86-avx2`.
    package: String,
    /// The library name, e.g. `mollm_x86_avx2`.
    lib: String,
}

impl BackendCrate {
    /// The architecture its kernels are for, when it is for one.
    fn arch(&self) -> Option<&'static str> {
        if self.lib.starts_with("mollm_x86_") {
            Some("x86_64")
        } else if self.lib.starts_with("mollm_arm_") {
            Some("aarch64")
        } else {
            None
        }
    }

    /// Built and checked on this target.
    fn for_this_target(&self) -> bool {
        !matches!(self.arch(), Some(a) if a != std::env::consts::ARCH)
    }

    fn file_name(&self) -> String {
        format!(
            "{}{}{}",
            std::env::consts::DLL_PREFIX,
            self.lib,
            std::env::consts::DLL_SUFFIX
        )
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The quoted strings of a one-line TOML array value `key = ["a", "b"]` in `text`.
fn toml_list(text: &str, key: &str) -> Vec<String> {
    let Some(l) = text.lines().find(|l| {
        l.trim_start()
            .strip_prefix(key)
            .is_some_and(|r| r.trim_start().starts_with('='))
    }) else {
        return Vec::new();
    };
    l.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// `key = "value"` inside section `[section]` of `text`.
fn toml_str(text: &str, section: &str, key: &str) -> Option<String> {
    let mut inside = false;
    for l in text.lines() {
        let t = l.trim();
        if t.starts_with('[') {
            inside = t == format!("[{section}]");
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(r) = t.strip_prefix(key) {
            if let Some(v) = r.trim_start().strip_prefix('=') {
                return v.trim().split('"').nth(1).map(str::to_string);
            }
        }
    }
    None
}

/// The backend libraries of the workspace: members under `backends/` whose library is a
/// `cdylib` named `mollm_*` (what mollm discovers at run time; the test plugin is not one).
fn workspace_backends() -> Vec<BackendCrate> {
    let root = workspace_root();
    let ws = std::fs::read_to_string(root.join("Cargo.toml")).expect("workspace Cargo.toml");
    let mut out = Vec::new();
    for m in toml_list(&ws, "members") {
        if !m.starts_with("backends/") {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&m).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{m}/Cargo.toml: {e}"));
        let cdylib = text
            .lines()
            .any(|l| l.trim_start().starts_with("crate-type") && l.contains("\"cdylib\""));
        let package = toml_str(&text, "package", "name").expect("package name");
        let lib = toml_str(&text, "lib", "name").unwrap_or_else(|| package.replace('-', "_"));
        if cdylib && lib.starts_with("mollm_") {
            out.push(BackendCrate { package, lib });
        }
    }
    out.sort_by(|a, b| a.lib.cmp(&b.lib));
    out
}

/// Where this test binary lives: `<target dir>/[<triple>/]<profile dir>/deps/<test>`.
struct Layout {
    target_dir: PathBuf,
    /// `--target` when the test was built with one.
    triple: Option<String>,
    /// Where cargo puts the libraries: `<target dir>/[<triple>/]<profile dir>`.
    profile_dir: PathBuf,
}

fn layout() -> Layout {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let above = profile_dir.parent().unwrap();
    let target = env!("CONFORMANCE_TARGET");
    let triple = (!target.is_empty() && above.file_name().and_then(|n| n.to_str()) == Some(target))
        .then(|| target.to_string());
    let target_dir = match triple {
        Some(_) => above.parent().unwrap().to_path_buf(),
        None => above.to_path_buf(),
    };
    Layout {
        target_dir,
        triple,
        profile_dir,
    }
}

/// The cargo profile whose output directory is `dir` (`debug` is dev, `release` release).
fn profile_args(dir: &Path) -> Vec<String> {
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => vec![],
        Some("release") => vec!["--release".into()],
        Some(p) => vec!["--profile".into(), p.into()],
        None => panic!("no profile directory in {}", dir.display()),
    }
}

/// Builds the backends for this target once (one cargo run for all of them); returns the
/// directory to load them from.
fn built(backends: &[BackendCrate]) -> &'static Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(|| {
        if let Some(d) = abi::settings::CONFORMANCE_LIB_DIR.get_os() {
            say(&format!(
                "conformance: checking the libraries in {} as they are ({LIB_DIR_ENV})",
                Path::new(&d).display()
            ));
            return Ok(PathBuf::from(d));
        }
        let l = layout();
        let mut c = Command::new(env!("CARGO"));
        c.current_dir(workspace_root()).arg("build");
        for b in backends.iter().filter(|b| b.for_this_target()) {
            c.args(["-p", &b.package]);
        }
        c.args(profile_args(&l.profile_dir));
        if let Some(t) = &l.triple {
            c.args(["--target", t]);
        }
        c.arg("--target-dir").arg(&l.target_dir);
        say(&format!("conformance: building the backends: {c:?}"));
        let t0 = Instant::now();
        let st = c
            .status()
            .map_err(|e| format!("cannot run {}: {e}", env!("CARGO")))?;
        if !st.success() {
            return Err(format!("{c:?} failed: {st}"));
        }
        say(&format!(
            "conformance: backends built in {:.1} s",
            t0.elapsed().as_secs_f64()
        ));
        Ok(l.profile_dir)
    })
}

/// What happened to one library.
enum Outcome {
    Checked(conformance::Report),
    Skipped(String),
}

fn check(b: &BackendCrate, dir: &Path) -> Outcome {
    if !b.for_this_target() {
        return Outcome::Skipped(format!(
            "not built: its kernels are for {}, this is {}",
            b.arch().unwrap(),
            std::env::consts::ARCH
        ));
    }
    let path = dir.join(b.file_name());
    assert!(path.exists(), "{} was not built", path.display());
    // SAFETY: a library of this workspace, built from this source tree.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let entry: libloading::Symbol<extern "C" fn() -> *const abi::BackendHeader> =
        unsafe { lib.get(abi::ENTRY_SYMBOL) }.unwrap();
    // SAFETY: the entry returns a pointer to a static header.
    let header = unsafe { &*entry() };
    header.check_layout().unwrap();
    let table = unsafe { &*header.table };
    if table.score.map(|s| s()).unwrap_or(0) == 0 {
        // A device backend says why (ABI 1.3); a CPU backend's reason is this CPU.
        return Outcome::Skipped(match table.unavailable_why() {
            Some(w) => format!("cannot run here (score 0): {w}"),
            None => "this CPU cannot run it (score 0)".into(),
        });
    }
    let host = reference::scoped_threads_host(2);
    let t0 = Instant::now();
    let report = conformance::check_backend_report(table, &host, CASES).unwrap();
    say(&format!(
        "conformance: {} checked in {:.2} s: {}",
        b.lib,
        t0.elapsed().as_secs_f64(),
        report.summary()
    ));
    Outcome::Checked(report)
}

#[test]
fn workspace_backends_are_found() {
    let libs: Vec<String> = workspace_backends().into_iter().map(|b| b.lib).collect();
    for want in [
        "mollm_x86_avx2",
        "mollm_x86_avx512",
        "mollm_arm_neon",
        "mollm_arm_i8mm",
    ] {
        assert!(libs.iter().any(|l| l == want), "{want} not in {libs:?}");
    }
    assert!(!libs.iter().any(|l| l.contains("broken")), "{libs:?}");
}

#[test]
fn native_backends_conform() {
    let backends = workspace_backends();
    let dir = match built(&backends) {
        Ok(d) => d,
        Err(e) => panic!("could not build the backends: {e}"),
    };
    let mut failed = Vec::new();
    let (mut passed, mut skipped) = (Vec::new(), Vec::new());
    for b in &backends {
        match check(b, dir) {
            Outcome::Skipped(why) => skipped.push(format!("{}: {why}", b.lib)),
            Outcome::Checked(r) => {
                if !r.ok() {
                    failed.push(format!("{} fails the gate:\n{}", b.lib, r.summary()));
                } else if r.passed.is_empty() {
                    // It must declare something, or the gate proves nothing.
                    failed.push(format!("{} declares no op:\n{}", b.lib, r.summary()));
                } else {
                    passed.push(b.lib.clone());
                }
            }
        }
    }
    let mut s = format!(
        "conformance: native backends: {} passed, {} skipped, {} failed",
        passed.len(),
        skipped.len(),
        failed.len()
    );
    for p in &passed {
        s += &format!("\n  passed   {p}");
    }
    for k in &skipped {
        s += &format!("\n  SKIPPED  {k} (not checked, not a pass)");
    }
    say(&s);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
