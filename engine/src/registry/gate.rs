//! The conformance gate: every native library is checked against the reference before it
//! runs anything, in a child process, so that a kernel that crashes takes down only the child.
//!
//! **The child's contract.** The host starts [`GateRunner::program`] with
//! [`GateRunner::args`] and the environment variable [`GATE_LIB_ENV`] set to the library's
//! path, stdin closed. The child calls [`gate_child`] and prints the line it returns on
//! stdout: [`GATE_LINE`] and the verdict as JSON (`{"failed": [[op, why], ...]}` or
//! `{"refused": why}`). Anything else it prints is ignored; a child that crashes, prints no
//! such line or runs past `MOLLM_GATE_TIMEOUT` seconds gets its library refused (and that
//! verdict is not cached).
//!
//! **Which program is the child.** [`GateRunner::self_exec`] starts the running executable
//! with the one argument [`GATE_ARG`]; a program that embeds the engine and uses it calls
//! [`serve_gate_child`] first thing in `main` (the `mollm` binary does), which answers as the
//! child and exits when started that way and returns at once otherwise. A program may instead
//! point [`GateRunner`] at any binary of its own that prints [`gate_child`]'s line.

use super::*;
use std::io::Write;

/// The gate child reads the library to check from here.
pub const GATE_LIB_ENV: &str = abi::settings::GATE_LIB.name;
/// Seeded cases per op in the gate (default [`DEFAULT_GATE_CASES`]).
pub const GATE_CASES_ENV: &str = abi::settings::GATE_CASES.name;
/// Seconds the gate child may run (default 300).
pub const GATE_TIMEOUT_ENV: &str = abi::settings::GATE_TIMEOUT.name;
/// The gate child prints its verdict on one line starting with this.
pub const GATE_LINE: &str = "MOLLM_GATE_VERDICT ";
pub const DEFAULT_GATE_CASES: u64 = abi::WEIGHT_DTYPES.len() as u64;
/// The argument [`GateRunner::self_exec`] starts the gate child with, and
/// [`serve_gate_child`] answers to.
pub const GATE_ARG: &str = "--mollm-gate-child";

/// The gate's result for one library.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The gate ran; these ops failed and are refused on this backend (the rest passed, or the
    /// backend does not declare them).
    Ran { failed: Vec<(Op, String)> },
    /// The whole backend is refused (crashed, timed out, could not start).
    Refused(String),
}

/// How the gate child is started: `program args...` with [`GATE_LIB_ENV`] set to the library.
#[derive(Clone, Debug)]
pub struct GateRunner {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl GateRunner {
    /// The running executable with the one argument [`GATE_ARG`]: its `main` must call
    /// [`serve_gate_child`] first.
    pub fn self_exec() -> Result<GateRunner> {
        let program = std::env::current_exe().map_err(|e| {
            EngineError::Invalid(format!("cannot find the running executable: {e}"))
        })?;
        Ok(GateRunner {
            program,
            args: vec![GATE_ARG.into()],
        })
    }

    /// Runs the gate child for `lib`. Returns the verdict and whether it may be cached (only a
    /// verdict the child reported itself is).
    pub fn run(&self, lib: &Path) -> (Verdict, bool) {
        let timeout = abi::settings::GATE_TIMEOUT.int_or(300);
        let mut child = match Command::new(&self.program)
            .args(&self.args)
            .env(GATE_LIB_ENV, lib)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                return (
                    Verdict::Refused(format!(
                        "cannot start the conformance gate ({}): {e}",
                        self.program.display()
                    )),
                    false,
                )
            }
        };
        let mut so = child.stdout.take().expect("piped");
        let mut se = child.stderr.take().expect("piped");
        let out_t = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = so.read_to_string(&mut s);
            s
        });
        let err_t = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = se.read_to_string(&mut s);
            s
        });
        let t0 = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if t0.elapsed() > Duration::from_secs(timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => break None,
            }
        };
        let stdout = out_t.join().unwrap_or_default();
        let stderr = err_t.join().unwrap_or_default();
        let Some(status) = status else {
            return (
                Verdict::Refused(format!(
                    "timed out during conformance gate (over {timeout} s)"
                )),
                false,
            );
        };
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(sig) = status.signal() {
                return (
                    Verdict::Refused(format!("crashed during conformance gate (signal {sig})")),
                    false,
                );
            }
        }
        match stdout.lines().find_map(|l| l.strip_prefix(GATE_LINE)) {
            Some(json) => match parse_verdict(json) {
                Some(v) => (v, status.success()),
                None => (
                    Verdict::Refused(format!(
                        "conformance gate printed an unreadable verdict: {json}"
                    )),
                    false,
                ),
            },
            None => {
                let tail = stderr
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                (
                    Verdict::Refused(format!(
                        "conformance gate exited with {status} without a verdict{}{}",
                        if tail.is_empty() { "" } else { ": " },
                        tail.trim()
                    )),
                    false,
                )
            }
        }
    }
}

fn verdict_json(v: &Verdict) -> serde_json::Value {
    match v {
        Verdict::Ran { failed } => serde_json::json!({
            "ok": true,
            "failed": failed
                .iter()
                .map(|(op, e)| serde_json::json!({"op": op.name(), "error": e}))
                .collect::<Vec<_>>(),
        }),
        Verdict::Refused(e) => serde_json::json!({"ok": false, "error": e}),
    }
}

fn parse_verdict(s: &str) -> Option<Verdict> {
    let v: serde_json::Value = serde_json::from_str(s.trim()).ok()?;
    if v["ok"].as_bool()? {
        let mut failed = Vec::new();
        for f in v["failed"].as_array()? {
            failed.push((
                Op::from_name(f["op"].as_str()?)?,
                f["error"].as_str()?.to_string(),
            ));
        }
        Some(Verdict::Ran { failed })
    } else {
        Some(Verdict::Refused(v["error"].as_str()?.to_string()))
    }
}

/// Seeded cases per op the gate runs, besides the fixed cases ([`GATE_CASES_ENV`]).
pub fn gate_cases() -> u64 {
    abi::settings::GATE_CASES.int_or(DEFAULT_GATE_CASES)
}

/// The gate child's work: loads the library named by [`GATE_LIB_ENV`] (or `lib`), runs the
/// conformance check and returns the line to print on stdout (`MOLLM_GATE_VERDICT {json}`).
/// The gate child's side, for a program that [`GateRunner::self_exec`] may start: call it
/// first thing in `main`. A process started as the gate child (its only argument
/// [`GATE_ARG`]) checks the library [`GATE_LIB_ENV`] names, prints the verdict line and exits
/// with status 0; any other process returns at once.
pub fn serve_gate_child() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(GATE_ARG)) || args.next().is_some() {
        return;
    }
    let line = gate_child(None);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    std::process::exit(0);
}

pub fn gate_child(lib: Option<&Path>) -> String {
    let path = lib
        .map(Path::to_path_buf)
        .or_else(|| abi::settings::GATE_LIB.get_os().map(PathBuf::from));
    let v = match path {
        None => Verdict::Refused(format!("no library given ({GATE_LIB_ENV} unset)")),
        Some(path) => match load(&path) {
            Err(e) => Verdict::Refused(e.to_string()),
            Ok(p) => match Pool::new(0) {
                Err(e) => Verdict::Refused(format!("conformance gate: {e}")),
                Ok(pool) => {
                    let host = pool.host_api();
                    match conformance::check_backend(p.table(), &host, gate_cases()) {
                        Ok(failed) => Verdict::Ran { failed },
                        Err(e) => Verdict::Refused(format!("conformance gate: {e}")),
                    }
                }
            },
        },
    };
    format!("{GATE_LINE}{}", verdict_json(&v))
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// `${XDG_CACHE_HOME:-~/.cache}/mollm/gate`.
pub fn gate_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("mollm").join("gate"))
}

/// Environment variables whose values are part of a verdict's key: the metal backend's adapter
/// (a verdict on lavapipe is not one on a Mac's GPU) and its deliberately broken kernel.
pub const GATE_ENV_KEYS: &[&abi::settings::Setting] =
    &[&abi::settings::METAL_ADAPTER, &abi::settings::GPU_BROKEN];

/// The cache file for `lib`'s verdict: keyed by the library's bytes, this host's ABI version,
/// the case set (version, counts), [`GATE_ENV_KEYS`] and the CPU signature.
pub fn gate_cache_path(lib: &Path) -> Option<PathBuf> {
    let bytes = std::fs::read(lib).ok()?;
    let mut h = fnv1a(&bytes, 0xcbf2_9ce4_8422_2325);
    // The case set too: a verdict on older cases is not a verdict on these.
    let fixed: Vec<u64> = abi::Op::ALL
        .iter()
        .map(|&op| conformance::cases::fixed_count(op))
        .collect();
    let host = format!(
        "mollm {} abi {}.{} cases {} v{} {fixed:?}",
        env!("CARGO_PKG_VERSION"),
        abi::ABI_MAJOR,
        abi::ABI_MINOR,
        gate_cases(),
        conformance::cases::CASES_VERSION
    );
    h = fnv1a(host.as_bytes(), h);
    // Settings that change what a library computes: which device it opens, a test variant.
    for key in GATE_ENV_KEYS {
        let v = key.get().unwrap_or_default();
        h = fnv1a(format!("{}={v}", key.name).as_bytes(), h);
    }
    Some(gate_cache_dir()?.join(format!("{h:016x}-{}.json", cpu_signature())))
}

/// The gate verdict for the library at `path`: from the cache, or by running `runner`.
pub fn gate(path: &Path, runner: &GateRunner) -> Verdict {
    let cache = gate_cache_path(path);
    if let Some(c) = &cache {
        if let Some(v) = std::fs::read_to_string(c)
            .ok()
            .and_then(|s| parse_verdict(&s))
        {
            return v;
        }
    }
    let (v, cacheable) = runner.run(path);
    if let (Some(c), true) = (&cache, cacheable) {
        if let Some(dir) = c.parent() {
            let _ = std::fs::create_dir_all(dir);
            let tmp = c.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, verdict_json(&v).to_string()).is_ok() {
                let _ = std::fs::rename(&tmp, c);
            }
        }
    }
    v
}
