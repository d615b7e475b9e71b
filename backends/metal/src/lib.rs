//! mollm's Metal backend (cdylib `mollm_metal`): WGSL kernels through wgpu, which drives Metal
//! on Apple machines. Elsewhere it has no device and says so (`unavailable_reason`), unless
//! `MOLLM_METAL_ADAPTER=vulkan` asks for a Vulkan adapter: then the same kernels run there, so
//! that CI checks every one of them on Mesa's software Vulkan device (lavapipe).
//!
//! What it computes: every op of the ABI, for the weight formats in [`weights::layout`]
//! (Q2_K and Q3_K are declined, with the reason). Weights given to `prepare_weight` are
//! decoded and uploaded once at load and stay on the device; everything else is host memory
//! that each call uploads, computes on and reads back (one submission and one wait per op).
//! Keeping activations and the KV cache on the device between ops is the next step
//! (`README.md`, issue 16). GPU float order differs from the reference's, so the conformance
//! gate holds it to per-op tolerances, not to bits.

mod attention;
mod gpu;
mod host;
mod ops;
mod shaders;
mod weights;

use abi::{BackendHeader, BackendTable, DeviceKind, HostApi, Op, OpCall, OpParams, Status, TensorDesc};
use core::ffi::c_void;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use weights::DevWeight;

pub use gpu::ADAPTER_ENV;

/// Why a call does not run.
#[derive(Debug)]
pub enum Error {
    Invalid(String),
    Unsupported(String),
    /// The device failed (validation, out of memory, lost).
    Device(String),
}

impl Error {
    fn status(&self) -> Status {
        match self {
            Error::Invalid(_) => Status::InvalidArgument,
            Error::Unsupported(_) => Status::Unsupported,
            Error::Device(_) => Status::Internal,
        }
    }

    fn message(&self) -> &str {
        match self {
            Error::Invalid(m) | Error::Unsupported(m) | Error::Device(m) => m,
        }
    }
}

impl From<reference::Error> for Error {
    fn from(e: reference::Error) -> Error {
        match e {
            reference::Error::Invalid(m) => Error::Invalid(m),
            reference::Error::Unsupported(m) => Error::Unsupported(m),
        }
    }
}

/// One backend instance: the process's device, the weights it prepared, the last error.
pub struct Ctx {
    gpu: &'static gpu::Gpu,
    weights: Mutex<HashMap<u64, Arc<DevWeight>>>,
    next: AtomicU64,
    error: Mutex<String>,
}

impl Ctx {
    fn weight(&self, handle: u64) -> Result<Arc<DevWeight>, Error> {
        self.weights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&handle)
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("buffer {handle} is not a weight of this backend")))
    }

    fn set_error(&self, msg: &str) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = msg.to_string();
    }

    /// Runs `f` with panics caught; its error goes into `last_error`.
    fn guard(&self, f: impl FnOnce() -> Result<(), Error>) -> i32 {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => Status::Ok as i32,
            Ok(Err(e)) => {
                self.set_error(e.message());
                e.status() as i32
            }
            Err(p) => {
                self.set_error(&format!("panic: {}", reference::par::panic_message(&*p)));
                Status::Panic as i32
            }
        }
    }
}

/// Why this backend cannot run here (`None`: it can).
pub fn reason() -> Option<&'static str> {
    gpu::gpu().err()
}

extern "C" fn score() -> u32 {
    // A GPU outranks the CPU backends (their scores are 10-30) wherever it opens.
    match catch_unwind(gpu::gpu) {
        Ok(Ok(_)) => 40,
        _ => 0,
    }
}

fn put(s: &str, buf: *mut u8, cap: usize) -> usize {
    if !buf.is_null() {
        let n = s.len().min(cap);
        // SAFETY: the caller lends `cap` writable bytes at `buf`.
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), buf, n) };
    }
    s.len()
}

extern "C" fn unavailable_reason(buf: *mut u8, cap: usize) -> usize {
    match catch_unwind(reason) {
        Ok(Some(why)) => put(why, buf, cap),
        Ok(None) => 0,
        Err(_) => put("the GPU probe panicked", buf, cap),
    }
}

extern "C" fn init(host: *const HostApi, out: *mut *mut c_void) -> i32 {
    let Ok(Ok(gpu)) = catch_unwind(gpu::gpu) else {
        return Status::Unsupported as i32;
    };
    // SAFETY: the ABI's contract for `init`.
    unsafe {
        reference::glue::init(host, out, |_| Ctx {
            gpu,
            weights: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            error: Mutex::new(String::new()),
        })
    }
}

extern "C" fn shutdown(ctx: *mut c_void) {
    // SAFETY: `ctx` came from `init`.
    unsafe { reference::glue::drop_boxed::<Ctx>(ctx) }
}

/// # Safety
/// `ctx` is null or from `init`.
unsafe fn ctx<'a>(ctx: *mut c_void) -> Option<&'a Ctx> {
    (ctx as *const Ctx).as_ref()
}

/// Whether this backend takes the call; `Err` says why not (or why it is malformed).
///
/// # Safety
/// A call whose descriptors are valid to read (data may be null).
unsafe fn check(c: &Ctx, op: Op, ins: &[TensorDesc], outs: &[TensorDesc], p: &OpParams) -> Result<(), Error> {
    abi::validate(op, ins, outs, p).map_err(Error::Invalid)?;
    for (i, t) in ins.iter().chain(outs).enumerate() {
        if t.buffer != 0 {
            if op != Op::MatMul || i != 0 {
                return Err(Error::Unsupported(format!(
                    "{}: device buffers are taken as mat_mul weights only",
                    op.name()
                )));
            }
            c.weight(t.buffer)?;
            continue;
        }
        reference::tensor::check_layout(t, op.name())?;
        let big = matches!((op, i), (Op::MatMul, 0) | (Op::Attention, 1) | (Op::Attention, 2));
        let packed = t.numel().unwrap_or(0) as u64 * 4;
        if !big && packed > c.gpu.max_binding {
            return Err(Error::Unsupported(format!(
                "{}: operand {i} ({packed} bytes as f32) exceeds the device's {} MiB storage binding",
                op.name(),
                c.gpu.max_binding >> 20
            )));
        }
    }
    if matches!(op, Op::MatMul | Op::GetRows) && ins[0].buffer == 0 {
        let dt = ins[0].dtype().expect("validated");
        if weights::layout(dt).is_none() {
            return Err(Error::Unsupported(format!("{dt} weights are not taken by metal yet")));
        }
        let bytes = quant::row_bytes(dt, ins[0].ne[0] as usize).unwrap_or(0) as u64
            * ins[0].nrows() as u64;
        if op == Op::GetRows && bytes > ops::GET_ROWS_MAX_BYTES {
            return Err(Error::Unsupported(format!(
                "get_rows: a {bytes}-byte table would be uploaded on every call (tables above {} \
                 MiB stay on the CPU until they are prepared at load like mat_mul weights)",
                ops::GET_ROWS_MAX_BYTES >> 20
            )));
        }
    }
    Ok(())
}

extern "C" fn compute(ctx_p: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: the ABI's contract: `ctx` from `init`, `call` valid for the call.
    let Some(c) = (unsafe { ctx(ctx_p) }) else {
        return Status::InvalidArgument as i32;
    };
    c.guard(|| unsafe {
        let (op, ins, outs, p) = reference::glue::decode(call)?;
        check(c, op, ins, outs, &p)?;
        ops::run(c, op, ins, outs, &p)
    })
}

extern "C" fn supports(ctx_p: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: as `compute`.
    let Some(c) = (unsafe { ctx(ctx_p) }) else {
        return Status::Unsupported as i32;
    };
    match c.guard(|| unsafe {
        let (op, ins, outs, p) = reference::glue::decode(call)?;
        check(c, op, ins, outs, &p)
    }) {
        0 => Status::Ok as i32,
        _ => Status::Unsupported as i32,
    }
}

extern "C" fn last_error(ctx_p: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    // SAFETY: as `compute`.
    match unsafe { ctx(ctx_p) } {
        Some(c) => put(&c.error.lock().unwrap_or_else(|p| p.into_inner()), buf, cap),
        None => put("no metal context", buf, cap),
    }
}

/// `prepare_weight`: decodes and uploads a weight once; the descriptor it returns names it by
/// handle (`buffer`), its shape unchanged.
extern "C" fn prepare_weight(ctx_p: *mut c_void, w: *const TensorDesc, out: *mut TensorDesc) -> i32 {
    // SAFETY: as `compute`; `w` and `out` valid for the call.
    let Some(c) = (unsafe { ctx(ctx_p) }) else {
        return Status::InvalidArgument as i32;
    };
    c.guard(|| unsafe {
        let w = w.as_ref().ok_or_else(|| Error::Invalid("null weight".into()))?;
        let out = out.as_mut().ok_or_else(|| Error::Invalid("null output".into()))?;
        if w.buffer != 0 || w.ndim > 2 || w.ne[2] * w.ne[3] != 1 {
            return Err(Error::Unsupported("only 2-D host weights are prepared".into()));
        }
        reference::tensor::check_layout(w, "weight")?;
        let dt = w.dtype().ok_or_else(|| Error::Invalid("unknown weight format".into()))?;
        let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
        let dev = DevWeight::upload(c.gpu, dt, k, n, |r| host::row(w, r))?;
        let h = c.next.fetch_add(1, Ordering::Relaxed);
        c.weights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(h, Arc::new(dev));
        *out = *w;
        out.buffer = h;
        Ok(())
    })
}

extern "C" fn buffer_free(ctx_p: *mut c_void, buffer: u64) {
    // SAFETY: as `compute`.
    if let Some(c) = unsafe { ctx(ctx_p) } {
        c.weights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&buffer);
    }
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
    buffer_free: Some(buffer_free),
    buffer_copy: None,
    prepare_weight: Some(prepare_weight),
    buffer_host_ptr: None,
    unavailable_reason: Some(unavailable_reason),
};

static HEADER: BackendHeader =
    BackendHeader::layout(c"metal".as_ptr(), DeviceKind::Gpu, 0, &TABLE);

/// The backend entry symbol (`abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const BackendHeader {
    &HEADER
}

#[cfg(test)]
mod tests;
