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

mod caps;
mod gate;
mod select;

pub use caps::*;
pub use gate::*;
pub use select::*;

/// Directories searched for plugins, `:`-separated (the platform's path-list separator).
pub const DIR_ENV: &str = abi::settings::BACKEND_DIR.name;
/// `scalar|avx2|avx512|auto`: which x86 backends may be selected.
pub const ISA_ENV: &str = abi::settings::X86_ISA.name;

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
    pub plugin: std::result::Result<Plugin, PluginError>,
}

/// Why a library cannot be used as a backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    #[error("no such file")]
    NoFile,
    /// The dynamic loader's message, on one line.
    #[error("cannot load: {0}")]
    Open(String),
    #[error("not a mollm backend: no mollm_backend_entry symbol")]
    NoEntry,
    #[error("mollm_backend_entry returned null")]
    NullHeader,
    /// The header's magic, version or sizes (the ABI's own message).
    #[error("{0}")]
    Layout(String),
    #[error("duplicate: backend '{name}' already found at {}", .first.display())]
    Duplicate { name: String, first: PathBuf },
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
                plugin = Err(PluginError::Duplicate {
                    name: p.name.clone(),
                    first: first.clone(),
                });
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
pub fn load(path: &Path) -> std::result::Result<Plugin, PluginError> {
    if !path.exists() {
        return Err(PluginError::NoFile);
    }
    // SAFETY: loading runs the library's initialisers; that is the trust a plugin asks for.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| PluginError::Open(one_line(&e.to_string())))?;
    let entry: extern "C" fn() -> *const BackendHeader = unsafe {
        *lib.get::<extern "C" fn() -> *const BackendHeader>(abi::ENTRY_SYMBOL)
            .map_err(|_| PluginError::NoEntry)?
    };
    let hp = entry();
    if hp.is_null() {
        return Err(PluginError::NullHeader);
    }
    // SAFETY: the entry returns a static header; magic and sizes are checked before any other
    // field is trusted.
    let header: &BackendHeader = unsafe { &*hp };
    header.check_layout().map_err(PluginError::Layout)?;
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
