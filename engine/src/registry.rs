//! Native backend plugins: discovery, loading, the conformance gate, selection.
//!
//! - **Discovery** ([`discover`]): libraries named `libmollm_*.so` (platform prefix/suffix) in
//!   the running executable's directory and in each directory of `MOLLM_BACKEND_DIR` (a path
//!   list), plus explicit paths (`--backend-lib`). Explicit paths come first, then the
//!   environment's directories, then the executable's; a second library with a backend name
//!   already found is listed as a duplicate and not used.
//! - **Loading** ([`load`]): `dlopen`, look up [`abi::ENTRY_SYMBOL`], call it,
//!   [`abi::BackendHeader::check_layout`]; then name, device kind, CPU features and `score()`
//!   (0 = cannot run on this CPU). The `Library` stays loaded while any [`Backend`] made from it
//!   lives.
//! - **Gate** ([`gate`]): `conformance::check_backend` runs in a child process (the host
//!   re-executes itself, see [`GateRunner`]), so a kernel that crashes takes down only the
//!   child; the backend is then refused as a whole. Ops that fail are refused one by one and
//!   dispatch passes them to the next backend. Verdicts are cached under
//!   `${XDG_CACHE_HOME:-~/.cache}/mollm/gate/<hash of library bytes and host>-<cpu>.json`.
//! - **Selection** ([`select`]): `auto` = every conforming native backend by score, highest
//!   first, then the reference as fallback; `reference`; or one backend by name (+ reference
//!   fallback unless `require_native`). `MOLLM_X86_ISA=scalar|avx2|avx512|auto` caps which x86
//!   backends (name containing `x86` or `avx`) may be used, `MOLLM_ARM_ISA=scalar|neon|i8mm|auto`
//!   which ARM backends (name starting with `arm-`).

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::pool::Pool;
use abi::{BackendHeader, BackendTable, DeviceKind, Op};
use std::collections::HashSet;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Directories searched for plugins, `:`-separated (the platform's path-list separator).
pub const DIR_ENV: &str = abi::settings::BACKEND_DIR.name;
/// `scalar|avx2|avx512|auto`: which x86 backends may be selected.
pub const ISA_ENV: &str = abi::settings::X86_ISA.name;
/// The gate child reads the library to check from here.
pub const GATE_LIB_ENV: &str = abi::settings::GATE_LIB.name;
/// Seeded cases per op in the gate (default [`DEFAULT_GATE_CASES`]).
pub const GATE_CASES_ENV: &str = abi::settings::GATE_CASES.name;
/// Seconds the gate child may run (default 300).
pub const GATE_TIMEOUT_ENV: &str = abi::settings::GATE_TIMEOUT.name;
/// The gate child prints its verdict on one line starting with this.
pub const GATE_LINE: &str = "MOLLM_GATE_VERDICT ";
pub const DEFAULT_GATE_CASES: u64 = abi::WEIGHT_DTYPES.len() as u64;
/// The hidden CLI subcommand that runs the gate child.
pub const GATE_SUBCOMMAND: &str = "__gate";

/// Where a candidate library was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--backend-lib`.
    Explicit,
    /// A directory of `MOLLM_BACKEND_DIR`.
    EnvDir,
    /// Next to the running executable.
    ExeDir,
}

impl Origin {
    pub fn label(self) -> &'static str {
        match self {
            Origin::Explicit => "--backend-lib",
            Origin::EnvDir => DIR_ENV,
            Origin::ExeDir => "executable dir",
        }
    }
}

/// A library that opened and whose header this host can read.
pub struct Plugin {
    lib: Arc<libloading::Library>,
    table: &'static BackendTable,
    pub name: String,
    pub device_kind: u32,
    pub cpu_features: u64,
    pub abi_minor: u16,
    /// `score()`; a table without `score` counts as 1.
    pub score: u32,
}

// SAFETY: the table is immutable static data of the library, which `lib` keeps loaded.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

impl Plugin {
    pub fn table(&self) -> &BackendTable {
        self.table
    }

    pub fn device(&self) -> &'static str {
        device_name(self.device_kind)
    }

    /// A backend instance; the library stays loaded while it lives.
    pub fn open_backend(&self, host: abi::HostApi) -> Result<Backend> {
        // SAFETY: `table` lives in `lib` (or is a leaked padded copy), which the backend keeps.
        unsafe {
            Backend::open_plugin(
                self.name.clone(),
                self.table,
                self.abi_minor,
                host,
                self.lib.clone(),
            )
        }
    }
}

pub fn device_name(kind: u32) -> &'static str {
    match kind {
        k if k == DeviceKind::Cpu as u32 => "cpu",
        k if k == DeviceKind::Gpu as u32 => "gpu",
        _ => "unknown",
    }
}

/// One library found by discovery.
pub struct Candidate {
    pub path: PathBuf,
    pub origin: Origin,
    /// `Err`: why it cannot be used at all (cannot open, not a backend, wrong ABI, duplicate).
    pub plugin: std::result::Result<Plugin, String>,
}

impl Candidate {
    /// The backend's name, or the file name when it did not open.
    pub fn name(&self) -> String {
        match &self.plugin {
            Ok(p) => p.name.clone(),
            Err(_) => self
                .path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

/// Is `file` a plugin file name (`libmollm_*.so` on Linux)?
pub fn is_plugin_file_name(file: &str) -> bool {
    let pre = format!("{}mollm_", std::env::consts::DLL_PREFIX);
    file.starts_with(&pre)
        && file.ends_with(std::env::consts::DLL_SUFFIX)
        && file.len() > pre.len() + std::env::consts::DLL_SUFFIX.len()
}

/// The directories searched, in order: `MOLLM_BACKEND_DIR`'s, then the executable's.
pub fn search_dirs() -> Vec<(PathBuf, Origin)> {
    let mut dirs = Vec::new();
    if let Some(v) = abi::settings::BACKEND_DIR.get_os() {
        for d in std::env::split_paths(&v) {
            if !d.as_os_str().is_empty() {
                dirs.push((d, Origin::EnvDir));
            }
        }
    }
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push((d, Origin::ExeDir));
    }
    dirs
}

/// Finds and loads every candidate library: `explicit` paths, then the search directories.
pub fn discover(explicit: &[PathBuf]) -> Vec<Candidate> {
    let mut paths: Vec<(PathBuf, Origin)> = explicit
        .iter()
        .map(|p| (p.clone(), Origin::Explicit))
        .collect();
    for (dir, origin) in search_dirs() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut found: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| is_plugin_file_name(&e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect();
        found.sort();
        paths.extend(found.into_iter().map(|p| (p, origin)));
    }
    let mut seen_paths = HashSet::new();
    let mut seen_names: Vec<(String, PathBuf)> = Vec::new();
    let mut out = Vec::new();
    for (path, origin) in paths {
        let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if !seen_paths.insert(key) {
            continue;
        }
        let mut plugin = load(&path);
        if let Ok(p) = &plugin {
            if let Some((_, first)) = seen_names.iter().find(|(n, _)| *n == p.name) {
                plugin = Err(format!(
                    "duplicate: backend '{}' already found at {}",
                    p.name,
                    first.display()
                ));
            } else {
                seen_names.push((p.name.clone(), path.clone()));
            }
        }
        out.push(Candidate {
            path,
            origin,
            plugin,
        });
    }
    out
}

/// Opens one library and reads its header.
pub fn load(path: &Path) -> std::result::Result<Plugin, String> {
    if !path.exists() {
        return Err("no such file".into());
    }
    // SAFETY: loading runs the library's initialisers; that is the trust a plugin asks for.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| format!("cannot load: {}", one_line(&e.to_string())))?;
    let entry: extern "C" fn() -> *const BackendHeader = unsafe {
        *lib.get::<extern "C" fn() -> *const BackendHeader>(abi::ENTRY_SYMBOL)
            .map_err(|_| "not a mollm backend: no mollm_backend_entry symbol".to_string())?
    };
    let hp = entry();
    if hp.is_null() {
        return Err("mollm_backend_entry returned null".into());
    }
    // SAFETY: the entry returns a static header; magic and sizes are checked before any other
    // field is trusted.
    let header: &BackendHeader = unsafe { &*hp };
    header.check_layout()?;
    let name = unsafe { std::ffi::CStr::from_ptr(header.name) }
        .to_string_lossy()
        .into_owned();
    let table = unsafe { padded_table(header) };
    let score = table.score.map(|f| f()).unwrap_or(1);
    Ok(Plugin {
        lib: Arc::new(lib),
        table,
        name,
        device_kind: header.device_kind,
        cpu_features: header.cpu_features,
        abi_minor: header.abi_minor,
        score,
    })
}

/// The library's table when it has every field this host knows; otherwise a copy of the
/// fields it has, the rest `None` (tables are append-only; absent optional functions are null).
///
/// # Safety
/// `header` passed `check_layout`.
unsafe fn padded_table(header: &BackendHeader) -> &'static BackendTable {
    let full = core::mem::size_of::<BackendTable>();
    let have = header.table_size as usize;
    if have >= full {
        return &*header.table;
    }
    let mut copy = core::mem::MaybeUninit::<BackendTable>::zeroed();
    core::ptr::copy_nonoverlapping(
        header.table as *const u8,
        copy.as_mut_ptr() as *mut u8,
        have,
    );
    // Zeroed optional function pointers are `None`; the required ones precede `score` and
    // check_layout guarantees they were copied. Leaked: one small copy per short library.
    Box::leak(Box::new(copy.assume_init()))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// CPU signature and the ISA cap.

/// CPU features that matter to the native backends, as `(name, detected)`; the names are
/// those of `abi::cpu::FEATURES` (plus a few shown for information).
pub fn cpu_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
            (
                "avx512vnni",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
            (
                "avx512bf16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        vec![
            ("neon", std::arch::is_aarch64_feature_detected!("neon")),
            (
                "dotprod",
                std::arch::is_aarch64_feature_detected!("dotprod"),
            ),
            ("fp16", std::arch::is_aarch64_feature_detected!("fp16")),
            ("i8mm", std::arch::is_aarch64_feature_detected!("i8mm")),
            ("sve", std::arch::is_aarch64_feature_detected!("sve")),
            ("sve2", std::arch::is_aarch64_feature_detected!("sve2")),
        ]
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Vec::new()
    }
}

/// The features a library declares (`cpu_features` bits) that this CPU does not report.
pub fn missing_features(bits: u64) -> Vec<String> {
    let have = cpu_features();
    abi::cpu::feature_names(bits)
        .filter(|n| match n {
            abi::cpu::FeatureName::Known(name) => !have.iter().any(|(h, on)| h == name && *on),
            abi::cpu::FeatureName::Unknown(_) => true,
        })
        .map(|n| n.to_string())
        .collect()
}

/// A short stable name for this CPU's feature set, e.g. `x86_64-03fe`.
pub fn cpu_signature() -> String {
    let bits = cpu_features()
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, (_, on))| acc | ((*on as u64) << i));
    format!("{}-{bits:04x}", std::env::consts::ARCH)
}

/// The ISA caps from `MOLLM_X86_ISA` and `MOLLM_ARM_ISA`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub x86: IsaCap,
    pub arm: ArmIsaCap,
}

impl Caps {
    pub fn from_env() -> Result<Caps> {
        Ok(Caps {
            x86: IsaCap::from_env()?,
            arm: ArmIsaCap::from_env()?,
        })
    }

    /// Why the backend `name` is excluded by a cap, if it is.
    pub fn excludes(self, name: &str) -> Option<String> {
        self.x86.excludes(name).or_else(|| self.arm.excludes(name))
    }
}

/// `neon|i8mm|scalar|auto`: which ARM backends may be selected.
pub const ARM_ISA_ENV: &str = abi::settings::ARM_ISA.name;

/// The `MOLLM_ARM_ISA` cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmIsaCap {
    Scalar,
    Neon,
    I8mm,
    Auto,
}

impl ArmIsaCap {
    pub fn from_env() -> Result<ArmIsaCap> {
        match abi::settings::ARM_ISA.get().as_deref() {
            None | Some("") | Some("auto") => Ok(ArmIsaCap::Auto),
            Some("scalar") => Ok(ArmIsaCap::Scalar),
            Some("neon") => Ok(ArmIsaCap::Neon),
            Some("i8mm") => Ok(ArmIsaCap::I8mm),
            Some(v) => Err(EngineError::Invalid(format!(
                "{ARM_ISA_ENV}={v}: expected scalar, neon, i8mm or auto"
            ))),
        }
    }

    /// Why the backend `name` is excluded by this cap, if it is. Only ARM backends (names
    /// starting with `arm-`) are capped.
    pub fn excludes(self, name: &str) -> Option<String> {
        let n = name.to_ascii_lowercase();
        if !n.starts_with("arm-") {
            return None;
        }
        let (allowed, v) = match self {
            ArmIsaCap::Auto => (true, "auto"),
            ArmIsaCap::Scalar => (false, "scalar"),
            ArmIsaCap::Neon => (n == "arm-neon", "neon"),
            ArmIsaCap::I8mm => (true, "i8mm"),
        };
        (!allowed).then(|| format!("excluded by {ARM_ISA_ENV}={v}"))
    }
}

/// The `MOLLM_X86_ISA` cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsaCap {
    Scalar,
    Avx2,
    Avx512,
    Auto,
}

impl IsaCap {
    pub fn from_env() -> Result<IsaCap> {
        match abi::settings::X86_ISA.get().as_deref() {
            None | Some("") | Some("auto") => Ok(IsaCap::Auto),
            Some("scalar") => Ok(IsaCap::Scalar),
            Some("avx2") => Ok(IsaCap::Avx2),
            Some("avx512") => Ok(IsaCap::Avx512),
            Some(v) => Err(EngineError::Invalid(format!(
                "{ISA_ENV}={v}: expected scalar, avx2, avx512 or auto"
            ))),
        }
    }

    /// Why the backend `name` is excluded by this cap, if it is. Only x86 backends (names
    /// containing `x86` or `avx`) are capped.
    pub fn excludes(self, name: &str) -> Option<String> {
        let n = name.to_ascii_lowercase();
        if !(n.contains("x86") || n.contains("avx")) {
            return None;
        }
        let allowed = match self {
            IsaCap::Auto => true,
            IsaCap::Scalar => false,
            IsaCap::Avx2 => n.contains("avx2"),
            IsaCap::Avx512 => n.contains("avx2") || n.contains("avx512"),
        };
        let v = match self {
            IsaCap::Scalar => "scalar",
            IsaCap::Avx2 => "avx2",
            IsaCap::Avx512 => "avx512",
            IsaCap::Auto => "auto",
        };
        (!allowed).then(|| format!("excluded by {ISA_ENV}={v}"))
    }
}

// ---------------------------------------------------------------------------------------------
// The conformance gate.

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
    /// The running executable with the hidden `__gate` subcommand (the `mollm` CLI).
    pub fn self_exec() -> Result<GateRunner> {
        let program = std::env::current_exe().map_err(|e| {
            EngineError::Invalid(format!("cannot find the running executable: {e}"))
        })?;
        Ok(GateRunner {
            program,
            args: vec![GATE_SUBCOMMAND.into()],
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
pub fn gate_child(lib: Option<&Path>) -> String {
    let path = lib
        .map(Path::to_path_buf)
        .or_else(|| abi::settings::GATE_LIB.get_os().map(PathBuf::from));
    let v = match path {
        None => Verdict::Refused(format!("no library given ({GATE_LIB_ENV} unset)")),
        Some(path) => match load(&path) {
            Err(e) => Verdict::Refused(e),
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

// ---------------------------------------------------------------------------------------------
// Assessment and selection.

/// Everything known about one candidate: can it be used, and which ops are refused.
pub struct Assessed {
    pub candidate: Candidate,
    /// `Ok(failed ops)` when usable; `Err(why not)` otherwise.
    pub status: std::result::Result<Vec<(Op, String)>, String>,
}

impl Assessed {
    pub fn plugin(&self) -> Option<&Plugin> {
        self.candidate.plugin.as_ref().ok()
    }
    pub fn score(&self) -> u32 {
        self.plugin().map(|p| p.score).unwrap_or(0)
    }
    pub fn usable(&self) -> bool {
        self.status.is_ok()
    }
    /// The gate's message for `op` when it refused it.
    pub fn refused(&self, op: Op) -> Option<&str> {
        self.status
            .as_ref()
            .ok()?
            .iter()
            .find(|(o, _)| *o == op)
            .map(|(_, e)| e.as_str())
    }
}

/// Why a plugin cannot be used before any gate runs (score 0 or the ISA cap), if so.
pub fn precheck(p: &Plugin, cap: Caps) -> Option<String> {
    if p.score == 0 {
        if let Some(why) = p.table().unavailable_why() {
            return Some(why);
        }
        let missing = missing_features(p.cpu_features);
        if !missing.is_empty() {
            return Some(format!("CPU lacks {}", missing.join(" ")));
        }
        return Some(format!(
            "CPU lacks the features this backend was built for (library cpu_features {:#x}; this CPU: {})",
            p.cpu_features,
            {
                let on: Vec<&str> = cpu_features().iter().filter(|f| f.1).map(|f| f.0).collect();
                if on.is_empty() { "none detected".to_string() } else { on.join(" ") }
            }
        ));
    }
    cap.excludes(&p.name)
}

/// Assesses every candidate: opened, fit for this CPU, within the ISA cap, through the gate.
/// `gate_names`: gate only these backends (`None` = all); others that would otherwise be usable
/// are reported as "not selected".
pub fn assess(
    candidates: Vec<Candidate>,
    runner: &GateRunner,
    cap: Caps,
    gate_names: Option<&[String]>,
) -> Vec<Assessed> {
    candidates
        .into_iter()
        .map(|c| {
            let status = match &c.plugin {
                Err(e) => Err(e.clone()),
                Ok(p) => match precheck(p, cap) {
                    Some(why) => Err(why),
                    None if gate_names.is_some_and(|n| !n.contains(&p.name)) => {
                        Err("not selected".into())
                    }
                    None => match gate(&c.path, runner) {
                        Verdict::Ran { failed } => Ok(failed),
                        Verdict::Refused(e) => Err(e),
                    },
                },
            };
            Assessed {
                candidate: c,
                status,
            }
        })
        .collect()
}

/// Usable native backends in dispatch order: highest score first (stable: discovery order on
/// ties).
pub fn ranked(assessed: &[Assessed]) -> Vec<&Assessed> {
    let mut v: Vec<&Assessed> = assessed.iter().filter(|a| a.usable()).collect();
    v.sort_by(|a, b| b.score().cmp(&a.score()));
    v
}

/// What the host asks of the plugin machinery.
#[derive(Clone, Debug)]
pub struct PluginOptions {
    /// `--backend-lib` paths.
    pub libs: Vec<PathBuf>,
    pub gate: GateRunner,
    /// No reference fallback: a call no native backend takes is an error.
    pub require_native: bool,
}

/// The backends for a session, in dispatch order, and whether the last one is a fallback.
pub fn select(
    choice: &crate::BackendChoice,
    opts: &PluginOptions,
    pool: &Pool,
) -> Result<(Vec<Backend>, bool)> {
    use crate::BackendChoice;
    let cap = Caps::from_env()?;
    let reference = || Backend::open(&reference::HEADER, pool.host_api());
    if matches!(choice, BackendChoice::Named(n) if n == "reference") {
        if opts.require_native {
            return Err(EngineError::Invalid(
                "--require-native with --backend reference: nothing native to run on".into(),
            ));
        }
        return Ok((vec![reference()?], true));
    }
    let only: Option<Vec<String>> = match choice {
        BackendChoice::Named(n) => Some(vec![n.clone()]),
        BackendChoice::Auto => None,
    };
    let found = discover(&opts.libs);
    // A library the user named that cannot be loaded is an error, not a silent fallback
    // (`mollm devices` lists it with the same reason).
    if let Some(c) = found
        .iter()
        .find(|c| c.origin == Origin::Explicit && c.plugin.is_err())
    {
        let why = c.plugin.as_ref().err().map(String::as_str).unwrap_or("?");
        return Err(EngineError::Invalid(format!(
            "--backend-lib {}: {why}",
            c.path.display()
        )));
    }
    let assessed = assess(found, &opts.gate, cap, only.as_deref());
    if let BackendChoice::Named(n) = choice {
        match assessed
            .iter()
            .find(|a| a.plugin().is_some_and(|p| &p.name == n))
        {
            None => {
                let found: Vec<String> = assessed
                    .iter()
                    .filter_map(|a| a.plugin().map(|p| p.name.clone()))
                    .chain(std::iter::once("reference".to_string()))
                    .collect();
                return Err(EngineError::Invalid(format!(
                    "backend '{n}' not found (found: {}; see `mollm devices`)",
                    found.join(", ")
                )));
            }
            Some(a) => {
                if let Err(e) = &a.status {
                    return Err(EngineError::Invalid(format!("backend '{n}': {e}")));
                }
            }
        }
    }
    let mut backends = Vec::new();
    for a in ranked(&assessed) {
        let p = a.plugin().expect("usable means loaded");
        let mut b = p.open_backend(pool.host_api())?;
        for (op, _) in a.status.as_ref().expect("usable") {
            b.refuse(*op);
        }
        backends.push(b);
    }
    if opts.require_native {
        if backends.is_empty() {
            let why: Vec<String> = assessed
                .iter()
                .map(|a| {
                    format!(
                        "{}: {}",
                        a.candidate.name(),
                        a.status.as_ref().err().map(String::as_str).unwrap_or("?")
                    )
                })
                .collect();
            return Err(EngineError::Invalid(format!(
                "--require-native: no usable native backend{}{}",
                if why.is_empty() { " found" } else { ": " },
                why.join("; ")
            )));
        }
        return Ok((backends, false));
    }
    backends.push(reference()?);
    Ok((backends, true))
}
