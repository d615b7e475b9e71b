//! The CUDA driver API, opened at run time (never linked), as the shared GPU host code uses a
//! device ([`mollm_gpu_common::Device`]): device memory, the kernels loaded from PTX (NVRTC's,
//! or prebuilt files in `MOLLM_CUDA_PTX`), launches of 64-thread blocks and copies in the
//! context's stream order, and a wait only where the host reads. The primary context of device 0 is made current on each call's thread.

use crate::kernels;
use mollm_gpu_common::{Device, Error, Launch};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

/// A directory of prebuilt PTX (`scripts/build-cuda-ptx.sh`), for machines without NVRTC.
pub const PTX_ENV: &str = abi::settings::CUDA_PTX.name;

const DRIVER_LIBS: &[&str] = &["libcuda.so.1", "libcuda.so"];
const NO_DEVICE: c_int = 100;
const OUT_OF_MEMORY: c_int = 2;
const CC_MAJOR: c_int = 75;
const CC_MINOR: c_int = 76;
/// Blocks per grid row; more spread over y (`block_index` in common.cuh).
const MAX_GRID_X: u32 = 32768;

type CuCtx = *mut c_void;
type CuModule = *mut c_void;
type CuFunction = *mut c_void;
type Ptr = u64;

struct Api {
    init: unsafe extern "C" fn(c_uint) -> c_int,
    device_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> c_int,
    device_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    device_attr: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int,
    retain: unsafe extern "C" fn(*mut CuCtx, c_int) -> c_int,
    set_current: unsafe extern "C" fn(CuCtx) -> c_int,
    module_load: unsafe extern "C" fn(*mut CuModule, *const c_void) -> c_int,
    get_function: unsafe extern "C" fn(*mut CuFunction, CuModule, *const c_char) -> c_int,
    alloc: unsafe extern "C" fn(*mut Ptr, usize) -> c_int,
    free: unsafe extern "C" fn(Ptr) -> c_int,
    htod: unsafe extern "C" fn(Ptr, *const c_void, usize) -> c_int,
    dtoh: unsafe extern "C" fn(*mut c_void, Ptr, usize) -> c_int,
    dtod: unsafe extern "C" fn(Ptr, Ptr, usize) -> c_int,
    launch: unsafe extern "C" fn(
        CuFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> c_int,
    synchronize: unsafe extern "C" fn() -> c_int,
    mem_info: unsafe extern "C" fn(*mut usize, *mut usize) -> c_int,
    error_string: unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int,
}

/// Device 0 with its context and kernels.
pub struct Cuda {
    api: Api,
    ctx: CuCtx,
    functions: HashMap<&'static str, CuFunction>,
    pub name: String,
    /// Allocations dropped since the last wait: freed after it, as queued work may still
    /// use them (and cuMemFree would wait for the device on every op's scratch).
    retired: std::sync::Mutex<Vec<Ptr>>,
}

// SAFETY: the driver API is thread-safe; the context is made current on each calling thread,
// and the handles are immutable after opening.
unsafe impl Send for Cuda {}
unsafe impl Sync for Cuda {}

/// A device allocation, freed after the next wait once dropped.
pub struct Buf {
    ptr: Ptr,
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Ok(c) = cuda() {
            c.retired
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.ptr);
        }
    }
}

fn load_api() -> Result<Api, String> {
    // SAFETY: loading the driver runs its initialisers, which is what opening it means.
    let lib = DRIVER_LIBS
        .iter()
        .find_map(|n| unsafe { libloading::Library::new(n) }.ok())
        .ok_or("no CUDA driver (libcuda.so.1 not found)")?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the driver API's documented C signatures, as declared in `Api`.
            *unsafe { lib.get($name) }.map_err(|_| {
                format!(
                    "the CUDA driver has no {}",
                    String::from_utf8_lossy(&$name[..$name.len() - 1])
                )
            })?
        };
    }
    let api = Api {
        init: sym!(b"cuInit\0"),
        device_count: sym!(b"cuDeviceGetCount\0"),
        device_get: sym!(b"cuDeviceGet\0"),
        device_name: sym!(b"cuDeviceGetName\0"),
        device_attr: sym!(b"cuDeviceGetAttribute\0"),
        retain: sym!(b"cuDevicePrimaryCtxRetain\0"),
        set_current: sym!(b"cuCtxSetCurrent\0"),
        module_load: sym!(b"cuModuleLoadData\0"),
        get_function: sym!(b"cuModuleGetFunction\0"),
        alloc: sym!(b"cuMemAlloc_v2\0"),
        free: sym!(b"cuMemFree_v2\0"),
        htod: sym!(b"cuMemcpyHtoD_v2\0"),
        dtoh: sym!(b"cuMemcpyDtoH_v2\0"),
        dtod: sym!(b"cuMemcpyDtoD_v2\0"),
        launch: sym!(b"cuLaunchKernel\0"),
        synchronize: sym!(b"cuCtxSynchronize\0"),
        mem_info: sym!(b"cuMemGetInfo_v2\0"),
        error_string: sym!(b"cuGetErrorString\0"),
    };
    // Unloading a CUDA driver after cuInit is not supported: keep it for the process.
    std::mem::forget(lib);
    Ok(api)
}

impl Api {
    fn error(&self, rc: c_int) -> String {
        let mut s: *const c_char = core::ptr::null();
        // SAFETY: an out-parameter; the driver returns a static string or leaves it null.
        unsafe { (self.error_string)(rc, &mut s) };
        if s.is_null() {
            format!("CUresult {rc}")
        } else {
            // SAFETY: a static NUL-terminated string.
            format!(
                "{} (CUresult {rc})",
                unsafe { CStr::from_ptr(s) }.to_string_lossy()
            )
        }
    }

    fn ok(&self, what: &str, rc: c_int) -> Result<(), String> {
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("{what}: {}", self.error(rc)))
        }
    }
}

/// The PTX of kernel file `file` for `arch`: NVRTC's, or a prebuilt file from [`PTX_ENV`].
fn ptx(file: &str, arch: &str) -> Result<String, String> {
    let src = kernels::source(file).expect("listed");
    match crate::nvrtc::ptx(file, &src, arch) {
        Ok(p) => Ok(p),
        Err(nvrtc) => match abi::settings::CUDA_PTX.get_os() {
            Some(dir) => {
                let p = std::path::Path::new(&dir)
                    .join(format!("{}-{arch}.ptx", file.trim_end_matches(".cu")));
                std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
            }
            None => Err(format!("{nvrtc}, and no prebuilt PTX ({PTX_ENV})")),
        },
    }
}

fn open() -> Result<Cuda, String> {
    let api = load_api()?;
    let mut n = 0;
    // SAFETY: the driver API with valid out-parameters, in its documented order.
    unsafe {
        match (api.init)(0) {
            0 => {}
            NO_DEVICE => return Err("no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)".into()),
            rc => {
                return Err(format!(
                    "the CUDA driver failed to initialise (cuInit: {})",
                    api.error(rc)
                ))
            }
        }
        api.ok("cuDeviceGetCount", (api.device_count)(&mut n))?;
        if n <= 0 {
            return Err("no CUDA device".into());
        }
        let mut dev = 0;
        api.ok("cuDeviceGet", (api.device_get)(&mut dev, 0))?;
        let mut name = [0 as c_char; 256];
        api.ok(
            "cuDeviceGetName",
            (api.device_name)(name.as_mut_ptr(), 256, dev),
        )?;
        let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        let (mut major, mut minor) = (0, 0);
        api.ok(
            "cuDeviceGetAttribute",
            (api.device_attr)(&mut major, CC_MAJOR, dev),
        )?;
        api.ok(
            "cuDeviceGetAttribute",
            (api.device_attr)(&mut minor, CC_MINOR, dev),
        )?;
        let arch = match major {
            9.. => "compute_90",
            8 => "compute_80",
            7 => "compute_70",
            _ => {
                return Err(format!(
                    "{name}: compute capability {major}.{minor} (7.0 or later needed)"
                ))
            }
        };
        let mut ctx: CuCtx = core::ptr::null_mut();
        api.ok("cuDevicePrimaryCtxRetain", (api.retain)(&mut ctx, dev))?;
        api.ok("cuCtxSetCurrent", (api.set_current)(ctx))?;
        let mut functions = HashMap::new();
        for (file, _, entries) in kernels::FILES {
            let text = CString::new(ptx(file, arch)?).map_err(|_| format!("{file}: NUL in PTX"))?;
            let mut module: CuModule = core::ptr::null_mut();
            api.ok(
                &format!("{file}: cuModuleLoadData"),
                (api.module_load)(&mut module, text.as_ptr() as *const c_void),
            )?;
            for e in *entries {
                let cname = CString::new(*e).unwrap();
                let mut f: CuFunction = core::ptr::null_mut();
                api.ok(
                    &format!("{e}: cuModuleGetFunction"),
                    (api.get_function)(&mut f, module, cname.as_ptr()),
                )?;
                functions.insert(*e, f);
            }
        }
        Ok(Cuda {
            api,
            ctx,
            functions,
            name: format!("{name} (compute {major}.{minor}, {arch} PTX)"),
            retired: std::sync::Mutex::new(Vec::new()),
        })
    }
}

/// The process's CUDA device with its kernels loaded, or why there is none.
pub fn cuda() -> Result<&'static Cuda, &'static str> {
    static CUDA: OnceLock<Result<Cuda, String>> = OnceLock::new();
    CUDA.get_or_init(|| match std::panic::catch_unwind(open) {
        Ok(r) => r,
        Err(_) => Err("opening CUDA panicked".into()),
    })
    .as_ref()
    .map_err(|e| e.as_str())
}

impl Cuda {
    fn current(&self) -> Result<(), Error> {
        // SAFETY: this process's context.
        let rc = unsafe { (self.api.set_current)(self.ctx) };
        self.api.ok("cuCtxSetCurrent", rc).map_err(Error::Device)
    }

    fn allocate(&self, what: &str, size: u64) -> Result<Buf, Error> {
        self.current()?;
        let mut ptr: Ptr = 0;
        // SAFETY: an out-parameter; at least one byte so that every buffer is a real one.
        let mut rc = unsafe { (self.api.alloc)(&mut ptr, size.max(4) as usize) };
        let waiting = !self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if rc == OUT_OF_MEMORY && waiting {
            // What queued work still holds comes back after a wait.
            self.sync()?;
            // SAFETY: as above.
            rc = unsafe { (self.api.alloc)(&mut ptr, size.max(4) as usize) };
        }
        if rc == OUT_OF_MEMORY {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: two out-parameters.
            unsafe { (self.api.mem_info)(&mut free, &mut total) };
            return Err(Error::OutOfMemory(format!(
                "{}: out of memory: {what} asked for {size} bytes, {free} of {total} free",
                self.name
            )));
        }
        self.api
            .ok(&format!("{what}: cuMemAlloc"), rc)
            .map_err(Error::Device)?;
        Ok(Buf { ptr })
    }
}

impl Device for Cuda {
    type Buf = Buf;

    fn max_binding(&self) -> u64 {
        // Kernels index elements with 32-bit row and word counts: keep chunks below 2 GiB.
        1 << 31
    }

    fn matmul_rows_per_group(&self) -> u32 {
        2
    }

    fn upload(&self, what: &str, bytes: &[u8]) -> Result<Buf, Error> {
        let b = self.allocate(what, bytes.len() as u64)?;
        if !bytes.is_empty() {
            // SAFETY: `bytes` is readable for its length, the allocation at least as large.
            let rc =
                unsafe { (self.api.htod)(b.ptr, bytes.as_ptr() as *const c_void, bytes.len()) };
            self.api
                .ok(&format!("{what}: cuMemcpyHtoD"), rc)
                .map_err(Error::Device)?;
        }
        Ok(b)
    }

    fn empty(&self, what: &str, size: u64) -> Result<Buf, Error> {
        self.allocate(what, size)
    }

    fn max_buffer(&self) -> u64 {
        self.max_binding()
    }

    fn alloc(&self, what: &str, size: u64) -> Result<Buf, Error> {
        self.allocate(what, size)
    }

    fn copy(
        &self,
        src: &Buf,
        src_off: u64,
        dst: &Buf,
        dst_off: u64,
        size: u64,
    ) -> Result<(), Error> {
        if size == 0 {
            return Ok(());
        }
        self.current()?;
        // SAFETY: both ranges inside allocations of this context (the callers check); the
        // copy is ordered after the launches before it.
        let rc = unsafe { (self.api.dtod)(dst.ptr + dst_off, src.ptr + src_off, size as usize) };
        self.api.ok("cuMemcpyDtoD", rc).map_err(Error::Device)
    }

    fn write(&self, dst: &Buf, off: u64, bytes: &[u8]) -> Result<(), Error> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.current()?;
        // SAFETY: `bytes` readable for its length; the range inside `dst` (the callers check).
        let rc =
            unsafe { (self.api.htod)(dst.ptr + off, bytes.as_ptr() as *const c_void, bytes.len()) };
        self.api.ok("cuMemcpyHtoD", rc).map_err(Error::Device)
    }

    fn read(&self, src: &Buf, off: u64, size: u64) -> Result<Vec<u8>, Error> {
        self.current()?;
        let mut host = vec![0u8; size as usize];
        // SAFETY: `host` holds `size` bytes; the copy waits for the launches before it.
        let rc = unsafe {
            (self.api.dtoh)(
                host.as_mut_ptr() as *mut c_void,
                src.ptr + off,
                size as usize,
            )
        };
        self.api.ok("cuMemcpyDtoH", rc).map_err(Error::Device)?;
        self.sync()?;
        Ok(host)
    }

    fn sync(&self) -> Result<(), Error> {
        self.current()?;
        // SAFETY: no arguments.
        let rc = unsafe { (self.api.synchronize)() };
        self.api.ok("cuCtxSynchronize", rc).map_err(Error::Device)?;
        let retired = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|p| p.into_inner()));
        for p in retired {
            // SAFETY: allocations of this context, dropped, and no queued work is left.
            unsafe { (self.api.free)(p) };
        }
        Ok(())
    }

    /// Each launch: its meta words by value (zero-padded to the largest kernel parameter
    /// struct) then its buffers' device pointers, on the context's stream.
    fn enqueue(&self, launches: &[Launch<'_, Buf>]) -> Result<(), Error> {
        self.current()?;
        for l in launches {
            if l.groups == 0 {
                continue;
            }
            let f = *self
                .functions
                .get(l.kernel)
                .ok_or_else(|| Error::Device(format!("no kernel named {}", l.kernel)))?;
            let mut meta = [0u32; 16];
            meta[..l.meta.len()].copy_from_slice(&l.meta);
            let mut ptrs: Vec<Ptr> = l.bufs.iter().map(|b| b.ptr).collect();
            let mut params: Vec<*mut c_void> = vec![meta.as_mut_ptr() as *mut c_void];
            params.extend(ptrs.iter_mut().map(|p| p as *mut Ptr as *mut c_void));
            let x = l.groups.min(MAX_GRID_X);
            // SAFETY: a kernel of this context, its parameters in its declared order, each
            // pointer valid for the call.
            let rc = unsafe {
                (self.api.launch)(
                    f,
                    x,
                    l.groups.div_ceil(x),
                    1,
                    64,
                    1,
                    1,
                    0,
                    core::ptr::null_mut(),
                    params.as_mut_ptr(),
                    core::ptr::null_mut(),
                )
            };
            self.api
                .ok(&format!("{}: cuLaunchKernel", l.kernel), rc)
                .map_err(Error::Device)?;
        }
        Ok(())
    }
}
