//! The ABI table of a GPU backend, from its [`GpuBackend`]: contexts, the checks of a call,
//! `prepare_weight` into device buffers, and the rule that no panic crosses the boundary.

use crate::weights::{self, DevWeight};
use crate::{host, ops, Device, Error};
use abi::{
    BackendHeader, BackendTable, DeviceKind, HostApi, Op, OpCall, OpParams, Status, TensorDesc,
};
use core::ffi::c_void;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A GPU backend: its device and how it presents itself.
pub trait GpuBackend: 'static {
    type Dev: Device;
    /// Its name in messages ("metal").
    const NAME: &'static str;
    /// `score()` where the device opens (the CPU backends score 10-30: a GPU outranks them).
    const SCORE: u32;
    /// The process's device, opened on first use, or why there is none.
    fn device() -> Result<&'static Self::Dev, &'static str>;
}

/// One backend instance: the process's device, the weights it prepared, the last error.
pub struct Ctx<D: Device> {
    pub dev: &'static D,
    name: &'static str,
    weights: Mutex<HashMap<u64, (Arc<DevWeight<D::Buf>>, u64)>>,
    /// The engine's buffers (`buffer_alloc`) and their sizes.
    bufs: Mutex<HashMap<u64, (Arc<D::Buf>, u64)>>,
    next: AtomicU64,
    error: Mutex<String>,
    /// ggml's GELU table (`f16(gelu(x))` by the f16 bits of x), uploaded on first use.
    pub gelu: std::sync::OnceLock<D::Buf>,
    /// Bytes of the weights and buffers this context holds on the device.
    resident: AtomicU64,
    /// Copies into host memory so far (see [`LOSE_ENV`]).
    reads: AtomicU64,
}

/// A test flag: the device memory in bytes (a smaller GPU), counting the weights and buffers
/// a context holds; what does not fit fails as out of memory.
pub const MEMORY_ENV: &str = abi::settings::GPU_MEMORY_LIMIT.name;
/// A test flag: the device is lost after this many copies into host memory (the engine's
/// one a step); every copy out after that fails.
pub const LOSE_ENV: &str = abi::settings::GPU_LOSE_AFTER.name;

impl<D: Device> Ctx<D> {
    pub fn new(dev: &'static D, name: &'static str) -> Ctx<D> {
        Ctx {
            dev,
            name,
            weights: Mutex::new(HashMap::new()),
            bufs: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            error: Mutex::new(String::new()),
            gelu: std::sync::OnceLock::new(),
            resident: AtomicU64::new(0),
            reads: AtomicU64::new(0),
        }
    }

    /// Counts `size` more resident bytes, or says the device is out of memory
    /// ([`MEMORY_ENV`]).
    fn reserve(&self, what: &str, size: u64) -> Result<(), Error> {
        let held = self.resident.fetch_add(size, Ordering::Relaxed);
        match abi::settings::GPU_MEMORY_LIMIT.int().ok().flatten() {
            Some(limit) if held + size > limit => {
                self.resident.fetch_sub(size, Ordering::Relaxed);
                Err(Error::OutOfMemory(format!(
                    "{}: out of device memory: {what} asked for {size} bytes, {} of {limit} free \
                     ({MEMORY_ENV})",
                    self.name,
                    limit.saturating_sub(held)
                )))
            }
            _ => Ok(()),
        }
    }

    /// A copy into host memory: fails once the device is lost ([`LOSE_ENV`]).
    pub(crate) fn read_allowed(&self) -> Result<(), Error> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed);
        match abi::settings::GPU_LOSE_AFTER.int().ok().flatten() {
            Some(after) if n >= after => Err(Error::Device(format!(
                "{}: the device was lost ({LOSE_ENV}={after}, a test flag)",
                self.name
            ))),
            _ => Ok(()),
        }
    }

    pub(crate) fn weight(&self, handle: u64) -> Result<Arc<DevWeight<D::Buf>>, Error> {
        self.weights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&handle)
            .map(|(w, _)| w.clone())
            .ok_or_else(|| {
                Error::Invalid(format!("buffer {handle} is not a weight of this backend"))
            })
    }

    pub(crate) fn is_weight(&self, handle: u64) -> bool {
        self.weights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&handle)
    }

    /// A buffer from `buffer_alloc` and its size.
    pub(crate) fn buffer(&self, handle: u64) -> Result<(Arc<D::Buf>, u64), Error> {
        self.bufs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&handle)
            .cloned()
            .ok_or_else(|| {
                Error::Invalid(format!("buffer {handle} is not a buffer of this backend"))
            })
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
                self.set_error(&format!("panic: {}", backend_kit::par::panic_message(&*p)));
                Status::Panic as i32
            }
        }
    }

    /// Decodes `w` into the device layout and keeps it: its handle.
    ///
    /// # Safety
    /// `w` is a host weight whose memory is readable for its shape.
    pub unsafe fn prepare(&self, w: &TensorDesc) -> Result<u64, Error> {
        if w.buffer != 0 || w.ndim > 2 || w.ne[2] * w.ne[3] != 1 {
            return Err(Error::Unsupported(
                "only 2-D host weights are prepared".into(),
            ));
        }
        backend_kit::tensor::check_layout(w, "weight")?;
        let dt = w
            .dtype()
            .ok_or_else(|| Error::Invalid("unknown weight format".into()))?;
        let (k, n) = (w.ne[0] as usize, w.ne[1] as usize);
        let bytes = quant::row_bytes(dt, k).unwrap_or(0) as u64 * n as u64;
        self.reserve("a weight", bytes)?;
        let dev = match DevWeight::upload(self.dev, dt, k, n, |r| host::row(w, r)) {
            Ok(d) => d,
            Err(e) => {
                self.resident.fetch_sub(bytes, Ordering::Relaxed);
                return Err(e);
            }
        };
        let h = self.next.fetch_add(1, Ordering::Relaxed);
        self.weights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(h, (Arc::new(dev), bytes));
        Ok(h)
    }
}

/// Whether the backend takes the call; `Err` says why not (or why it is malformed).
///
/// # Safety
/// A call whose descriptors are valid to read (data may be null).
pub unsafe fn check<D: Device>(
    c: &Ctx<D>,
    op: Op,
    ins: &[TensorDesc],
    outs: &[TensorDesc],
    p: &OpParams,
) -> Result<(), Error> {
    abi::validate(op, ins, outs, p).map_err(Error::Invalid)?;
    if op == Op::SsmConv {
        return Err(Error::Unsupported(ops::NO_SSM_CONV.into()));
    }
    if op == Op::GatedDeltaNet {
        return Err(Error::Unsupported(ops::NO_GATED_DELTA_NET.into()));
    }
    if op == Op::RwkvWkv7 {
        return Err(Error::Unsupported(ops::NO_RWKV_WKV7.into()));
    }
    if matches!(op, Op::Norm | Op::L2Norm | Op::TokenShift) {
        return Err(Error::Unsupported(ops::NO_RWKV_OPS.into()));
    }
    let max = c.dev.max_binding();
    let exact = op == Op::MatMul && ops::exact(ins, p);
    for (i, t) in ins.iter().chain(outs).enumerate() {
        if t.buffer != 0
            && i == 0
            && matches!(op, Op::MatMul | Op::GetRows)
            && c.is_weight(t.buffer)
        {
            continue;
        }
        if t.buffer != 0 {
            let place = c.place(t)?;
            if !crate::mem::on_device_ok(op, i, ins.len(), exact) {
                return Err(Error::Unsupported(format!(
                    "{}: operand {i} is read on the host: pass it in host memory",
                    op.name()
                )));
            }
            // The caches and set_rows' destination are bound whole.
            let whole = matches!((op, i), (Op::Attention, 1 | 2) | (Op::SetRows, 2 | 3));
            let cap = place.cap;
            if whole && cap > max {
                return Err(Error::Unsupported(format!(
                    "{}: a {cap}-byte device buffer exceeds the device's {} MiB binding",
                    op.name(),
                    max >> 20
                )));
            }
            if !whole && place.size > max {
                return Err(Error::Unsupported(format!(
                    "{}: operand {i} ({} bytes) exceeds the device's {} MiB buffer limit",
                    op.name(),
                    place.size,
                    max >> 20
                )));
            }
            continue;
        }
        backend_kit::tensor::check_layout(t, op.name())?;
        // Weights are split into chunks; the caches are gathered to the rows a call reads.
        let big = matches!(
            (op, i),
            (Op::MatMul, 0) | (Op::Attention, 1) | (Op::Attention, 2)
        );
        let packed = t.numel().unwrap_or(0) as u64 * 4;
        if !big && packed > max {
            return Err(Error::Unsupported(format!(
                "{}: operand {i} ({packed} bytes as f32) exceeds the device's {} MiB buffer limit",
                op.name(),
                max >> 20
            )));
        }
    }
    if matches!(op, Op::MatMul | Op::GetRows) && ins[0].buffer == 0 {
        let dt = ins[0].dtype().expect("validated");
        if weights::layout(dt).is_none() {
            return Err(Error::Unsupported(format!(
                "{dt} weights are not taken by {} yet",
                c.name
            )));
        }
        let bytes =
            quant::row_bytes(dt, ins[0].ne[0] as usize).unwrap_or(0) as u64 * ins[0].nrows() as u64;
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

fn put(s: &str, buf: *mut u8, cap: usize) -> usize {
    if !buf.is_null() {
        let n = s.len().min(cap);
        // SAFETY: the caller lends `cap` writable bytes at `buf`.
        unsafe { core::ptr::copy_nonoverlapping(s.as_ptr(), buf, n) };
    }
    s.len()
}

/// # Safety
/// `ctx` is null or from `init`.
unsafe fn ctx<'a, D: Device>(ctx: *mut c_void) -> Option<&'a Ctx<D>> {
    (ctx as *const Ctx<D>).as_ref()
}

extern "C" fn score<B: GpuBackend>() -> u32 {
    match catch_unwind(B::device) {
        Ok(Ok(_)) => B::SCORE,
        _ => 0,
    }
}

extern "C" fn unavailable_reason<B: GpuBackend>(buf: *mut u8, cap: usize) -> usize {
    match catch_unwind(B::device) {
        Ok(Err(why)) => put(why, buf, cap),
        Ok(Ok(_)) => 0,
        Err(_) => put("the GPU probe panicked", buf, cap),
    }
}

extern "C" fn init<B: GpuBackend>(host: *const HostApi, out: *mut *mut c_void) -> i32 {
    let Ok(Ok(dev)) = catch_unwind(B::device) else {
        return Status::Unsupported as i32;
    };
    // SAFETY: the ABI's contract for `init`.
    unsafe { backend_kit::glue::init(host, out, |_| Ctx::new(dev, B::NAME)) }
}

extern "C" fn shutdown<B: GpuBackend>(ctx: *mut c_void) {
    // SAFETY: `ctx` came from `init`.
    unsafe { backend_kit::glue::drop_boxed::<Ctx<B::Dev>>(ctx) }
}

extern "C" fn compute<B: GpuBackend>(ctx_p: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: the ABI's contract: `ctx` from `init`, `call` valid for the call.
    let Some(c) = (unsafe { ctx::<B::Dev>(ctx_p) }) else {
        return Status::InvalidArgument as i32;
    };
    c.guard(|| unsafe {
        let (op, ins, outs, p) = backend_kit::glue::decode(call)?;
        check(c, op, ins, outs, &p)?;
        ops::run(c, op, ins, outs, &p)
    })
}

extern "C" fn supports<B: GpuBackend>(ctx_p: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: as `compute`.
    let Some(c) = (unsafe { ctx::<B::Dev>(ctx_p) }) else {
        return Status::Unsupported as i32;
    };
    match c.guard(|| unsafe {
        let (op, ins, outs, p) = backend_kit::glue::decode(call)?;
        check(c, op, ins, outs, &p)
    }) {
        0 => Status::Ok as i32,
        _ => Status::Unsupported as i32,
    }
}

extern "C" fn last_error<B: GpuBackend>(ctx_p: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    // SAFETY: as `compute`.
    match unsafe { ctx::<B::Dev>(ctx_p) } {
        Some(c) => put(&c.error.lock().unwrap_or_else(|p| p.into_inner()), buf, cap),
        None => put("no context", buf, cap),
    }
}

/// `prepare_weight`: decodes and uploads a weight once; the descriptor it returns names it by
/// handle (`buffer`), its shape unchanged.
extern "C" fn prepare_weight<B: GpuBackend>(
    ctx_p: *mut c_void,
    w: *const TensorDesc,
    out: *mut TensorDesc,
) -> i32 {
    // SAFETY: as `compute`; `w` and `out` valid for the call.
    let Some(c) = (unsafe { ctx::<B::Dev>(ctx_p) }) else {
        return Status::InvalidArgument as i32;
    };
    c.guard(|| unsafe {
        let w = w
            .as_ref()
            .ok_or_else(|| Error::Invalid("null weight".into()))?;
        let out = out
            .as_mut()
            .ok_or_else(|| Error::Invalid("null output".into()))?;
        let h = c.prepare(w)?;
        *out = *w;
        out.buffer = h;
        Ok(())
    })
}

extern "C" fn buffer_free<B: GpuBackend>(ctx_p: *mut c_void, buffer: u64) {
    // SAFETY: as `compute`.
    if let Some(c) = unsafe { ctx::<B::Dev>(ctx_p) } {
        let w = c
            .weights
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&buffer)
            .map(|(_, n)| n);
        let b = c
            .bufs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&buffer)
            .map(|(_, n)| n);
        let freed = w.or(b).unwrap_or(0);
        c.resident.fetch_sub(freed, Ordering::Relaxed);
    }
}

/// `buffer_alloc`: device memory for the engine (activations, KV cache), zeroed.
extern "C" fn buffer_alloc<B: GpuBackend>(ctx_p: *mut c_void, size: usize, out: *mut u64) -> i32 {
    // SAFETY: as `compute`; `out` valid for the call.
    let Some(c) = (unsafe { ctx::<B::Dev>(ctx_p) }) else {
        return Status::InvalidArgument as i32;
    };
    c.guard(|| unsafe {
        let out = out
            .as_mut()
            .ok_or_else(|| Error::Invalid("null output".into()))?;
        c.reserve("a buffer", size as u64)?;
        let b = c.dev.alloc("buffer_alloc", size as u64).inspect_err(|_| {
            c.resident.fetch_sub(size as u64, Ordering::Relaxed);
        })?;
        let h = c.next.fetch_add(1, Ordering::Relaxed);
        c.bufs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(h, (Arc::new(b), size as u64));
        *out = h;
        Ok(())
    })
}

extern "C" fn buffer_copy<B: GpuBackend>(
    ctx_p: *mut c_void,
    dst: *const TensorDesc,
    src: *const TensorDesc,
) -> i32 {
    // SAFETY: as `compute`; `dst` and `src` valid for the call.
    let Some(c) = (unsafe { ctx::<B::Dev>(ctx_p) }) else {
        return Status::InvalidArgument as i32;
    };
    c.guard(|| unsafe {
        match (dst.as_ref(), src.as_ref()) {
            (Some(d), Some(s)) => c.copy(d, s),
            _ => Err(Error::Invalid("null tensor".into())),
        }
    })
}

extern "C" fn synchronize<B: GpuBackend>(ctx_p: *mut c_void) -> i32 {
    // SAFETY: as `compute`.
    let Some(c) = (unsafe { ctx::<B::Dev>(ctx_p) }) else {
        return Status::InvalidArgument as i32;
    };
    c.guard(|| c.dev.sync())
}

/// The function table of backend `B`.
pub const fn table<B: GpuBackend>() -> BackendTable {
    BackendTable {
        init: init::<B>,
        shutdown: shutdown::<B>,
        compute: compute::<B>,
        last_error: last_error::<B>,
        score: Some(score::<B>),
        supports: Some(supports::<B>),
        synchronize: Some(synchronize::<B>),
        buffer_alloc: Some(buffer_alloc::<B>),
        buffer_free: Some(buffer_free::<B>),
        buffer_copy: Some(buffer_copy::<B>),
        prepare_weight: Some(prepare_weight::<B>),
        buffer_host_ptr: None,
        unavailable_reason: Some(unavailable_reason::<B>),
        prepare_weight_into: None,
        prepare_weight_ex: None,
    }
}

/// The header of a GPU backend named `name` (a static C string) with table `table`.
pub const fn header(name: &'static core::ffi::CStr, table: &'static BackendTable) -> BackendHeader {
    BackendHeader::layout(name.as_ptr(), DeviceKind::Gpu, 0, table)
}
