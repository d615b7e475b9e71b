//! mollm's CUDA backend (cdylib `mollm_cuda`), as far as it goes today: it finds out whether
//! this machine could run CUDA (the driver library, `cuInit`, a device) and says why not; its
//! kernels (CUDA C in `kernels/`, the metal backend's ops) compile to PTX with NVRTC
//! ([`nvrtc`]), tested wherever the library is (CI takes it from PyPI). Nothing launches them
//! yet (the driver-side host code is the next step), so its score is 0 everywhere and the host
//! never sends it work; `mollm devices` and `mollm ops --device cuda` show its reason (ABI
//! 1.3's `unavailable_reason`). The driver and NVRTC are opened at run time, never linked, so
//! the library builds and loads on machines without CUDA.

pub mod kernels;
pub mod nvrtc;

use abi::{BackendHeader, BackendTable, DeviceKind, HostApi, OpCall, Status};
use core::ffi::c_void;
use std::sync::OnceLock;

/// Names the driver library goes by (the unversioned link comes with development packages
/// only).
const DRIVER_LIBS: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// `CUDA_ERROR_NO_DEVICE`.
const NO_DEVICE: i32 = 100;

/// The number of CUDA devices, or why there is none to use.
fn probe() -> Result<i32, String> {
    // SAFETY: loading the driver runs its initialisers, which is what opening it means.
    let lib = DRIVER_LIBS
        .iter()
        .find_map(|n| unsafe { libloading::Library::new(n) }.ok())
        .ok_or("no CUDA driver (libcuda.so.1 not found)")?;
    type Init = unsafe extern "C" fn(u32) -> i32;
    type Count = unsafe extern "C" fn(*mut i32) -> i32;
    // SAFETY: the driver API's documented signatures; the library stays loaded (forgotten
    // below: unloading a CUDA driver after cuInit is not supported).
    let n = unsafe {
        let init: libloading::Symbol<Init> = lib
            .get(b"cuInit\0")
            .map_err(|_| "the CUDA driver library has no cuInit")?;
        let count: libloading::Symbol<Count> = lib
            .get(b"cuDeviceGetCount\0")
            .map_err(|_| "the CUDA driver library has no cuDeviceGetCount")?;
        match init(0) {
            0 => {}
            NO_DEVICE => return Err("no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)".into()),
            rc => {
                return Err(format!(
                    "the CUDA driver failed to initialise (cuInit: CUresult {rc})"
                ))
            }
        }
        let mut n = 0i32;
        let rc = count(&mut n);
        if rc != 0 {
            return Err(format!("cuDeviceGetCount failed (CUresult {rc})"));
        }
        n
    };
    std::mem::forget(lib);
    if n <= 0 {
        return Err("no CUDA device".into());
    }
    Ok(n)
}

/// Why this backend cannot run here, found once per process.
pub fn reason() -> &'static str {
    static WHY: OnceLock<String> = OnceLock::new();
    WHY.get_or_init(|| match std::panic::catch_unwind(probe) {
        Ok(Err(why)) => why,
        Ok(Ok(n)) => {
            format!(
                "{n} CUDA device(s) found, but this build's cuda backend does not launch its \
                 kernels yet"
            )
        }
        Err(_) => "the CUDA driver probe panicked".into(),
    })
}

/// Copies `s` into `buf` (at most `cap` bytes) and returns its full length.
fn put(s: &str, buf: *mut u8, cap: usize) -> usize {
    if !buf.is_null() {
        let n = s.len().min(cap);
        // SAFETY: the caller lends `cap` writable bytes at `buf`.
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), buf, n) };
    }
    s.len()
}

const NO_KERNELS: &str = "the cuda backend does not launch its kernels yet";

extern "C" fn score() -> u32 {
    // Always 0 until kernels are launched; the probe runs here so that the reason is ready.
    let _ = reason();
    0
}

extern "C" fn unavailable_reason(buf: *mut u8, cap: usize) -> usize {
    put(reason(), buf, cap)
}

extern "C" fn init(_host: *const HostApi, out: *mut *mut c_void) -> i32 {
    if !out.is_null() {
        // SAFETY: the host passes a place for the context.
        unsafe { *out = core::ptr::null_mut() };
    }
    Status::Unsupported as i32
}

extern "C" fn shutdown(_ctx: *mut c_void) {}

extern "C" fn compute(_ctx: *mut c_void, _call: *const OpCall) -> i32 {
    Status::Unsupported as i32
}

extern "C" fn supports(_ctx: *mut c_void, _call: *const OpCall) -> i32 {
    Status::Unsupported as i32
}

extern "C" fn last_error(_ctx: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    put(NO_KERNELS, buf, cap)
}

static TABLE: BackendTable = BackendTable {
    init,
    shutdown,
    compute,
    last_error,
    score: Some(score),
    supports: Some(supports),
    synchronize: None,
    buffer_alloc: None,
    buffer_free: None,
    buffer_copy: None,
    prepare_weight: None,
    buffer_host_ptr: None,
    unavailable_reason: Some(unavailable_reason),
};

static HEADER: BackendHeader = BackendHeader::layout(c"cuda".as_ptr(), DeviceKind::Gpu, 0, &TABLE);

/// The backend entry symbol (`abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const BackendHeader {
    &HEADER
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_well_formed_and_it_says_why_it_cannot_run() {
        // SAFETY: a static header.
        let h = unsafe { &*mollm_backend_entry() };
        h.check_layout().unwrap();
        let name = unsafe { core::ffi::CStr::from_ptr(h.name) };
        assert_eq!(name.to_str().unwrap(), "cuda");
        assert_eq!(h.device_kind, DeviceKind::Gpu as u32);
        let t = unsafe { &*h.table };
        assert_eq!((t.score.unwrap())(), 0, "no kernel launches: never chosen");
        let mut buf = [0u8; 8];
        let n = (t.unavailable_reason.unwrap())(buf.as_mut_ptr(), buf.len());
        assert_eq!(n, reason().len());
        assert_eq!(
            &buf[..],
            &reason().as_bytes()[..8],
            "truncated, not overrun"
        );
        let why = reason();
        assert!(!why.is_empty());
        // A machine without the driver library says so in those words.
        if DRIVER_LIBS
            .iter()
            .all(|n| unsafe { libloading::Library::new(n) }.is_err())
        {
            assert!(why.starts_with("no CUDA driver"), "{why}");
        }
        let mut ctx = core::ptr::null_mut();
        assert_eq!(
            (t.init)(core::ptr::null(), &mut ctx),
            Status::Unsupported as i32
        );
    }
}

#[cfg(test)]
mod kernel_tests {
    use super::*;

    /// Every kernel compiles with NVRTC for every architecture PTX is made for, and the PTX
    /// defines each kernel the host will launch. Skipped (with a note) where NVRTC is missing,
    /// unless MOLLM_REQUIRE_NVRTC=1 (CI, after scripts/install-nvrtc.sh).
    #[test]
    fn every_kernel_compiles_with_nvrtc() {
        match nvrtc::describe() {
            Ok(d) => eprintln!("{d}"),
            Err(why) => {
                assert!(
                    std::env::var("MOLLM_REQUIRE_NVRTC").as_deref() != Ok("1"),
                    "MOLLM_REQUIRE_NVRTC=1 but {why}"
                );
                eprintln!("SKIPPED: {why} (scripts/install-nvrtc.sh fetches it)");
                return;
            }
        }
        for (file, _, entries) in kernels::FILES {
            let src = kernels::source(file).unwrap();
            for arch in kernels::ARCHS {
                let ptx = nvrtc::ptx(file, &src, arch).unwrap_or_else(|e| panic!("{e}"));
                assert!(ptx.contains(&format!(".target sm_{}", &arch[8..])), "{file} {arch}");
                for e in *entries {
                    assert!(ptx.contains(&format!(".entry {e}(")), "{file} {arch}: no {e}");
                }
            }
        }
    }

    /// A kernel that does not compile is an error carrying NVRTC's log, not a panic.
    #[test]
    fn a_compile_error_comes_back_with_the_log() {
        if nvrtc::describe().is_err() {
            return;
        }
        let e = nvrtc::ptx("bad.cu", "extern \"C\" __global__ void f() { undefined_thing(); }", "compute_70")
            .unwrap_err();
        assert!(e.contains("bad.cu") && e.contains("undefined_thing"), "{e}");
    }
}
