//! NVRTC, CUDA's run-time compiler, opened at run time like the driver (never linked): the
//! kernels compile to PTX on any machine that has the library, with or without a GPU. Where
//! it is found: `MOLLM_NVRTC` (the library's path), the loader's search path, or what
//! `scripts/install-nvrtc.sh` unpacked from PyPI's `nvidia-cuda-nvrtc-cu12` wheel into
//! `~/.cache/mollm/nvrtc`. Compiled PTX is cached on disk (`~/.cache/mollm/cuda/`), keyed by
//! the source, the options and NVRTC's version.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

pub const ENV: &str = abi::settings::NVRTC.name;
const NAMES: &[&str] = &["libnvrtc.so.12", "libnvrtc.so", "libnvrtc.so.13"];

type Prog = *mut c_void;

struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Prog) -> c_int,
    error: unsafe extern "C" fn(c_int) -> *const c_char,
    /// (major, minor).
    ver: (i32, i32),
    path: String,
}

fn candidates() -> Vec<String> {
    let mut v = Vec::new();
    if let Some(p) = abi::settings::NVRTC.get() {
        v.push(p);
        return v;
    }
    v.extend(NAMES.iter().map(|s| s.to_string()));
    if let Some(home) = std::env::var_os("HOME") {
        let base = PathBuf::from(home).join(".cache/mollm/nvrtc");
        if let Ok(rd) = std::fs::read_dir(&base) {
            let mut dirs: Vec<_> = rd.flatten().map(|e| e.path()).collect();
            dirs.sort();
            for d in dirs.iter().rev() {
                v.push(
                    d.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    v
}

fn open() -> Result<Api, String> {
    let tried = candidates();
    // SAFETY: opening NVRTC runs its initialisers, which is what opening it means.
    let (lib, path) = tried
        .iter()
        .find_map(|n| {
            unsafe { libloading::Library::new(n) }
                .ok()
                .map(|l| (l, n.clone()))
        })
        .ok_or_else(|| {
            format!(
                "no NVRTC library (tried {}; {ENV} names one)",
                tried.join(", ")
            )
        })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: NVRTC's documented C signatures, as declared in `Api`.
            *unsafe { lib.get($name) }.map_err(|_| {
                format!(
                    "{path}: no {}",
                    String::from_utf8_lossy(&$name[..$name.len() - 1])
                )
            })?
        };
    }
    let mut api = Api {
        version: sym!(b"nvrtcVersion\0"),
        create: sym!(b"nvrtcCreateProgram\0"),
        compile: sym!(b"nvrtcCompileProgram\0"),
        log_size: sym!(b"nvrtcGetProgramLogSize\0"),
        log: sym!(b"nvrtcGetProgramLog\0"),
        ptx_size: sym!(b"nvrtcGetPTXSize\0"),
        ptx: sym!(b"nvrtcGetPTX\0"),
        destroy: sym!(b"nvrtcDestroyProgram\0"),
        error: sym!(b"nvrtcGetErrorString\0"),
        ver: (0, 0),
        path,
    };
    let (mut a, mut b) = (0, 0);
    // SAFETY: two out-parameters.
    unsafe { (api.version)(&mut a, &mut b) };
    api.ver = (a, b);
    // The functions live as long as the library: keep it loaded for the process.
    std::mem::forget(lib);
    Ok(api)
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(open).as_ref().map_err(|e| e.clone())
}

/// NVRTC's version and where it was found, or why it is not there.
pub fn describe() -> Result<String, String> {
    let a = api()?;
    Ok(format!("NVRTC {}.{} ({})", a.ver.0, a.ver.1, a.path))
}

fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("mollm").join("cuda"))
}

/// PTX of `src` (named `name` in messages) for the virtual architecture `arch`
/// (`compute_80`, ...): from the disk cache, or compiled now. A compile error comes back with
/// NVRTC's log.
pub fn ptx(name: &str, src: &str, arch: &str) -> Result<String, String> {
    let a = api()?;
    // `--fmad=false`: no product and sum is fused unless a kernel asks (`fmaf`), so the kernels
    // round where the reference rounds.
    let opts = [
        format!("--gpu-architecture={arch}"),
        "--fmad=false".to_string(),
    ];
    let mut h = fnv1a(src.as_bytes(), 0xcbf2_9ce4_8422_2325);
    h = fnv1a(
        format!("{opts:?} nvrtc {}.{}", a.ver.0, a.ver.1).as_bytes(),
        h,
    );
    let cached = cache_dir().map(|d| d.join(format!("{name}-{arch}-{h:016x}.ptx")));
    if let Some(p) = &cached {
        if let Ok(s) = std::fs::read_to_string(p) {
            return Ok(s);
        }
    }
    let out = compile(a, name, src, &opts)?;
    if let Some(p) = &cached {
        // A cache that cannot be written costs a compile next time, nothing else.
        let _ = std::fs::create_dir_all(p.parent().unwrap());
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &out).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(out)
}

fn compile(a: &Api, name: &str, src: &str, opts: &[String]) -> Result<String, String> {
    let err = |rc: c_int| {
        // SAFETY: NVRTC returns a static string for any code.
        let s = unsafe { (a.error)(rc) };
        if s.is_null() {
            format!("NVRTC error {rc}")
        } else {
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        }
    };
    let csrc = CString::new(src).map_err(|_| format!("{name}: NUL in the source"))?;
    let cname = CString::new(name).map_err(|_| format!("{name}: NUL in the name"))?;
    let copts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()).unwrap())
        .collect();
    let popts: Vec<*const c_char> = copts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Prog = core::ptr::null_mut();
    // SAFETY: NVRTC's API with valid C strings that outlive the calls; the program is
    // destroyed on every path below.
    unsafe {
        let rc = (a.create)(
            &mut prog,
            csrc.as_ptr(),
            cname.as_ptr(),
            0,
            core::ptr::null(),
            core::ptr::null(),
        );
        if rc != 0 {
            return Err(format!("{name}: nvrtcCreateProgram: {}", err(rc)));
        }
        let rc = (a.compile)(prog, popts.len() as c_int, popts.as_ptr());
        let result = if rc != 0 {
            let mut n = 0usize;
            (a.log_size)(prog, &mut n);
            let mut log = vec![0u8; n.max(1)];
            (a.log)(prog, log.as_mut_ptr() as *mut c_char);
            let log = String::from_utf8_lossy(&log[..n.saturating_sub(1)]).into_owned();
            Err(format!("{name}: {}:\n{log}", err(rc)))
        } else {
            let mut n = 0usize;
            (a.ptx_size)(prog, &mut n);
            let mut buf = vec![0u8; n.max(1)];
            match (a.ptx)(prog, buf.as_mut_ptr() as *mut c_char) {
                0 => Ok(String::from_utf8_lossy(&buf[..n.saturating_sub(1)]).into_owned()),
                rc => Err(format!("{name}: nvrtcGetPTX: {}", err(rc))),
            }
        };
        (a.destroy)(&mut prog);
        result
    }
}
