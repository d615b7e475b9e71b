//! What every native CPU backend shares: [`ops`], the non-matmul ops in portable Rust
//! (bit-identical to the reference), [`fmatmul`] and [`wmatmul`]; with the `x86` feature their
//! AVX2/AVX-512 kernels, kept apart in `src/x86/` (one file per op file); with the `neon`
//! feature the AArch64 NEON kernels of the recurrent ops (ssm_conv, gated_delta_net,
//! rwkv_wkv7), in `src/arm/`; and the `abi::BackendTable` built from
//! a [`CpuBackend`] implementation, with every entry point catching panics (none may cross the
//! C boundary) and turning errors into statuses plus a `last_error` text; and [`par`], the
//! host's thread pool for Rust closures. A backend crate implements [`CpuBackend`] and exports
//! `mollm_backend_entry` returning a `static` [`abi::BackendHeader`] built with [`header`].

use abi::{
    BackendHeader, BackendTable, DeviceKind, HostApi, Op, OpCall, OpParams, Status, TensorDesc,
};
use backend_kit::glue::{self, ErrorSlot};
use core::ffi::{c_char, c_void};
use std::panic::catch_unwind;
use std::sync::Mutex;

#[cfg(neon)]
mod arm;
pub mod fmatmul;
pub mod ops;
pub mod par;
#[cfg(target_os = "linux")]
mod slab;
pub mod wmatmul;
#[cfg(x86)]
mod x86;

/// Why a call was not computed: `Invalid` (the call breaks the op's schema or the ABI,
/// `Status::InvalidArgument`) or `Unsupported` (a valid call this backend does not compute:
/// the host sends it to the next backend). The reference's type: one error everywhere.
pub use backend_kit::Error;

/// A native CPU backend: the contract behind the table [`table`] builds.
pub trait CpuBackend: 'static {
    /// `score()`: 0 when this CPU cannot run the backend (it must not execute instructions
    /// the CPU lacks to find out), higher = better fit.
    fn score() -> u32;

    /// Whether [`CpuBackend::compute`] would compute this call (`supports`). Implementations
    /// call [`abi::validate`] first.
    ///
    /// # Safety
    /// Descriptors as in an `OpCall`; data pointers may be null and must not be read.
    unsafe fn check(
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error>;

    /// Computes one call; everything [`CpuBackend::check`] accepts.
    ///
    /// # Safety
    /// A call on valid host memory, as `BackendTable::compute` receives it.
    unsafe fn compute(
        host: &HostApi,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error>;

    /// `prepare_weight`: the weight `w` (host memory) repacked into one of this backend's
    /// private layouts, or why not (`Unsupported`: the host keeps using `w` as it is). A
    /// repack that reads `w` front to back tells `src` how far it has read (large ones must:
    /// see [`SourcePages`]).
    ///
    /// # Safety
    /// `w` describes valid host memory.
    unsafe fn prepare(
        host: &HostApi,
        w: &TensorDesc,
        src: &SourcePages,
    ) -> Result<Prepared, Error> {
        let _ = (host, w, src);
        Err(Error::Unsupported("no prepared weight layouts".into()))
    }

    /// As [`CpuBackend::check`] for a call whose first input is a weight this backend
    /// prepared in layout `kind`; `inputs[0]` keeps the weight's shape and strides, its
    /// `data` points at the prepared bytes.
    ///
    /// # Safety
    /// As [`CpuBackend::check`].
    unsafe fn check_prepared(
        kind: u32,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        let _ = (kind, inputs, outputs, params);
        Err(Error::Unsupported(format!(
            "{}: no prepared-weight kernels",
            op.schema().name
        )))
    }

    /// Computes what [`CpuBackend::check_prepared`] accepts.
    ///
    /// # Safety
    /// As [`CpuBackend::compute`]; `inputs[0].data` is the prepared weight of `kind`.
    unsafe fn compute_prepared(
        host: &HostApi,
        kind: u32,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        let _ = host;
        Self::check_prepared(kind, op, inputs, outputs, params)
    }
}

/// The weight a repack reads ([`CpuBackend::prepare`]). When the host says it lies in a
/// read-only file mapping (`prepare_weight_ex` with `abi::PREPARE_SOURCE_MAPPED`), the pages
/// the repack has read are dropped as it goes (the host faults back in any it reads later),
/// so repacking a 200 MB embedding table holds a few MiB of it beside the copy, not all of it.
pub struct SourcePages {
    /// The end of the last page that lies wholly inside the weight.
    end: usize,
    /// Where the repack started: offsets passed to [`SourcePages::read_upto`] count from here.
    base: usize,
    /// Pages below this are dropped (at first: the first page wholly inside the weight).
    dropped: core::cell::Cell<usize>,
    drop_pages: bool,
}

/// Bytes of read source dropped at a time (one `madvise` per this much).
const DROP_STEP: usize = 4 << 20;

impl SourcePages {
    /// A source whose pages stay (heap memory, or a host that did not say).
    pub fn keep() -> SourcePages {
        SourcePages {
            end: 0,
            base: 0,
            dropped: core::cell::Cell::new(0),
            drop_pages: false,
        }
    }

    /// The `bytes` at `data`, a read-only file mapping whose pages may be dropped.
    fn mapped(data: *const u8, bytes: usize) -> SourcePages {
        const PAGE: usize = 4096;
        let (a, b) = (data as usize, data as usize + bytes);
        let start = a.next_multiple_of(PAGE);
        SourcePages {
            end: b / PAGE * PAGE,
            base: a,
            dropped: core::cell::Cell::new(start),
            drop_pages: cfg!(unix),
        }
    }

    /// The repack has read the weight's first `offset` bytes and reads none of them again.
    pub fn read_upto(&self, offset: usize) {
        self.drop_below(self.base.saturating_add(offset), DROP_STEP);
    }

    /// Drops every page read (the repack is done).
    fn finish(&self) {
        self.drop_below(self.end, 0);
    }

    fn drop_below(&self, addr: usize, step: usize) {
        if !self.drop_pages {
            return;
        }
        let (from, to) = (self.dropped.get(), (addr / 4096 * 4096).min(self.end));
        if to <= from || to - from < step.max(1) {
            return;
        }
        #[cfg(unix)]
        // SAFETY: whole pages inside the weight's read-only file mapping (the host's word,
        // `PREPARE_SOURCE_MAPPED`): MADV_DONTNEED only drops them, and a later read faults
        // the same bytes back in from the file.
        unsafe {
            libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED);
        }
        self.dropped.set(to);
    }
}

/// A weight in a backend's private layout (see [`CpuBackend::prepare`]).
pub struct Prepared {
    /// Which layout (the backend's own numbering, non-zero).
    pub kind: u32,
    buf: AlignedBytes,
}

impl Prepared {
    /// `bytes` zeroed bytes of layout `kind`, 64-byte aligned (2 MiB aligned, with
    /// transparent huge pages requested, for large ones on Linux).
    pub fn zeroed(kind: u32, bytes: usize) -> Prepared {
        Prepared {
            kind,
            buf: AlignedBytes::zeroed(bytes),
        }
    }

    /// [`Prepared::zeroed`], or `None` when the memory is not there.
    pub fn try_zeroed(kind: u32, bytes: usize) -> Option<Prepared> {
        Some(Prepared {
            kind,
            buf: AlignedBytes::try_zeroed(bytes)?,
        })
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.buf.ptr
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` zeroed-then-owned bytes at `ptr`, borrowed mutably with self.
        unsafe { core::slice::from_raw_parts_mut(self.buf.ptr, self.buf.len) }
    }
}

/// Zeroed bytes, 64-byte aligned; on Linux, large ones are their own anonymous mapping with
/// transparent huge pages requested and middling ones share such mappings ([`slab`]). Or the
/// caller's memory (`prepare_weight_into`), which is never freed here.
struct AlignedBytes {
    ptr: *mut u8,
    len: usize,
    /// How the bytes were obtained (for `Drop`).
    origin: Origin,
}

enum Origin {
    Heap(std::alloc::Layout),
    Borrowed,
    #[cfg(target_os = "linux")]
    Map {
        base: *mut libc::c_void,
        size: usize,
    },
    /// A piece of the slab mapped at `base`.
    #[cfg(target_os = "linux")]
    Slab {
        base: usize,
    },
}

// SAFETY: plain owned memory.
unsafe impl Send for AlignedBytes {}
unsafe impl Sync for AlignedBytes {}

impl AlignedBytes {
    fn zeroed(len: usize) -> AlignedBytes {
        Self::try_zeroed(len).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(len.max(1), 64).expect("weight size"),
            )
        })
    }

    /// [`AlignedBytes::zeroed`], or `None` when the memory is not there.
    fn try_zeroed(len: usize) -> Option<AlignedBytes> {
        #[cfg(target_os = "linux")]
        {
            if (slab::MIN..slab::MAX).contains(&len) {
                if let Some((ptr, base)) = slab::SLABS.alloc(len) {
                    return Some(AlignedBytes {
                        ptr,
                        len,
                        origin: Origin::Slab { base },
                    });
                }
            }
            if len >= slab::MAX {
                if let Some((base, size, start)) = slab::map_huge(len) {
                    return Some(AlignedBytes {
                        ptr: start as *mut u8,
                        len,
                        origin: Origin::Map { base, size },
                    });
                }
            }
        }
        let layout =
            std::alloc::Layout::from_size_align(len.max(1).next_multiple_of(64), 64).ok()?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        Some(AlignedBytes {
            ptr,
            len,
            origin: Origin::Heap(layout),
        })
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        match self.origin {
            // SAFETY: allocated in `zeroed` with this layout.
            Origin::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr, layout) },
            Origin::Borrowed => {}
            #[cfg(target_os = "linux")]
            // SAFETY: the mapping made in `zeroed`.
            Origin::Map { base, size } => unsafe {
                libc::munmap(base, size);
            },
            #[cfg(target_os = "linux")]
            Origin::Slab { base } => slab::SLABS.free(base),
        }
    }
}

/// One backend instance.
struct Context {
    host: HostApi,
    last_error: ErrorSlot,
    /// Prepared weights by handle (the `buffer` of their descriptors); freed by
    /// `buffer_free` or at shutdown.
    prepared: Mutex<std::collections::HashMap<u64, Prepared>>,
    next_handle: std::sync::atomic::AtomicU64,
}

impl Context {
    /// Keeps `p` under a new handle (never 0) until `buffer_free` or shutdown.
    fn keep(&self, p: Prepared) -> u64 {
        let handle = self
            .next_handle
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(handle, p);
        handle
    }

    /// The layout of a prepared weight descriptor, and the descriptor as host memory; an
    /// error for a handle this instance did not hand out or a moved data pointer.
    fn resolve(&self, w: &TensorDesc) -> Result<(u32, TensorDesc), Error> {
        let map = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        let p = map
            .get(&w.buffer)
            .filter(|p| p.kind != KIND_HOST)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "buffer handle {} is not a prepared weight (host buffers are passed by address, buffer 0)",
                    w.buffer
                ))
            })?;
        if w.data as *const u8 != p.as_ptr() {
            return Err(Error::Invalid(
                "prepared weight: data does not point at the prepared bytes".into(),
            ));
        }
        let mut host = *w;
        host.buffer = 0;
        Ok((p.kind, host))
    }
}

/// The call's inputs with a prepared first input resolved (see [`Context::resolve`]).
type Resolved = (Option<u32>, [TensorDesc; 4], usize);

fn resolve_inputs(cx: &Context, inputs: &[TensorDesc]) -> Result<Option<Resolved>, Error> {
    match inputs.first() {
        Some(w) if w.buffer != 0 => {
            if inputs.len() > 4 {
                return Err(Error::Unsupported(
                    "prepared weight with over 4 inputs".into(),
                ));
            }
            let (kind, host) = cx.resolve(w)?;
            let mut arr = [host; 4];
            arr[..inputs.len()].copy_from_slice(inputs);
            arr[0] = host;
            Ok(Some((Some(kind), arr, inputs.len())))
        }
        _ => Ok(None),
    }
}

extern "C" fn init(host: *const HostApi, out: *mut *mut c_void) -> i32 {
    // SAFETY: the host passes a valid HostApi and `out` (or nulls, refused).
    unsafe {
        glue::init(host, out, |host| Context {
            host,
            last_error: ErrorSlot::default(),
            prepared: Mutex::new(Default::default()),
            next_handle: std::sync::atomic::AtomicU64::new(1),
        })
    }
}

extern "C" fn shutdown(ctx: *mut c_void) {
    // SAFETY: ctx came from init.
    unsafe { glue::drop_boxed::<Context>(ctx) }
}

extern "C" fn compute<B: CpuBackend>(ctx: *mut c_void, call: *const OpCall) -> i32 {
    if ctx.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: ctx came from init.
    let cx = unsafe { &*(ctx as *const Context) };
    cx.last_error.guard(|| unsafe {
        let (op, i, o, p) = glue::decode(call)?;
        if let Some((Some(kind), arr, n)) = resolve_inputs(cx, i)? {
            B::check_prepared(kind, op, &arr[..n], o, &p)?;
            return B::compute_prepared(&cx.host, kind, op, &arr[..n], o, &p);
        }
        B::check(op, i, o, &p)?;
        B::compute(&cx.host, op, i, o, &p)
    })
}

extern "C" fn last_error(ctx: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    if ctx.is_null() {
        return 0;
    }
    // SAFETY: ctx came from init; the caller provides `cap` writable bytes at `buf`.
    unsafe { (*(ctx as *const Context)).last_error.copy_to(buf, cap) }
}

extern "C" fn score<B: CpuBackend>() -> u32 {
    catch_unwind(B::score).unwrap_or(0)
}

extern "C" fn supports<B: CpuBackend>(ctx: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: ctx is null or came from init.
    let cx = unsafe { (ctx as *const Context).as_ref() };
    glue::guard_supports(cx.map(|c| &c.last_error), || unsafe {
        let (op, i, o, p) = glue::decode(call)?;
        if let Some(cx) = cx {
            if let Some((Some(kind), arr, n)) = resolve_inputs(cx, i)? {
                return B::check_prepared(kind, op, &arr[..n], o, &p);
            }
        }
        B::check(op, i, o, &p)
    })
}

extern "C" fn prepare_weight<B: CpuBackend>(
    ctx: *mut c_void,
    weight: *const TensorDesc,
    out: *mut TensorDesc,
) -> i32 {
    prepare_weight_ex::<B>(ctx, weight, 0, out)
}

/// `prepare_weight_ex` (ABI 1.6): `prepare_weight`, dropping a mapped source's pages as the
/// repack reads them (`PREPARE_SOURCE_MAPPED`).
extern "C" fn prepare_weight_ex<B: CpuBackend>(
    ctx: *mut c_void,
    weight: *const TensorDesc,
    flags: u32,
    out: *mut TensorDesc,
) -> i32 {
    if ctx.is_null() || weight.is_null() || out.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: ctx came from init; the pointers are non-null and valid per the contract.
    let cx = unsafe { &*(ctx as *const Context) };
    let w = unsafe { *weight };
    if w.buffer != 0 {
        cx.last_error
            .set("prepare_weight: the weight is not in host memory".into());
        return Status::Unsupported as i32;
    }
    let src = match (flags & abi::PREPARE_SOURCE_MAPPED != 0, span_bytes(&w)) {
        (true, Some(bytes)) => SourcePages::mapped(w.data, bytes),
        _ => SourcePages::keep(),
    };
    cx.last_error.guard(|| unsafe {
        let p = B::prepare(&cx.host, &w, &src)?;
        src.finish();
        let mut desc = w;
        desc.data = p.as_ptr() as *mut u8;
        desc.buffer = cx.keep(p);
        // SAFETY: `out` is valid for a write.
        *out = desc;
        Ok(())
    })
}

/// Bytes from a host tensor's first byte past its last (non-negative strides), if its
/// format is known.
fn span_bytes(w: &TensorDesc) -> Option<usize> {
    let info = w.dtype()?.info();
    let row = (w.ne[0] as usize / info.block_len as usize) * info.block_bytes as usize;
    let mut last = 0usize;
    for d in 1..abi::MAX_DIMS {
        if w.ne[d] > 1 {
            let (n, nb) = (
                usize::try_from(w.ne[d]).ok()?,
                usize::try_from(w.nb[d]).ok()?,
            );
            last = last.checked_add((n - 1).checked_mul(nb)?)?;
        }
    }
    last.checked_add(row)
}

/// `prepare_weight_into`: the backend's own repack (into memory of its own), copied to the
/// caller's memory and registered there; the copy runs after the repack has read the weight,
/// so `dst` may be the weight's own bytes.
extern "C" fn prepare_weight_into<B: CpuBackend>(
    ctx: *mut c_void,
    weight: *const TensorDesc,
    dst: *mut u8,
    cap: usize,
    out: *mut TensorDesc,
) -> i32 {
    if ctx.is_null() || weight.is_null() || out.is_null() || dst.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: ctx came from init; the pointers are non-null and valid per the contract.
    let cx = unsafe { &*(ctx as *const Context) };
    let w = unsafe { *weight };
    if w.buffer != 0 || dst as usize % 64 != 0 {
        cx.last_error.set(
            "prepare_weight_into: the weight is not in host memory, or dst is not 64-byte aligned"
                .into(),
        );
        return Status::InvalidArgument as i32;
    }
    cx.last_error.guard(|| unsafe {
        let p = B::prepare(&cx.host, &w, &SourcePages::keep())?;
        if p.buf.len > cap {
            return Err(Error::Unsupported(format!(
                "prepare_weight_into: the layout takes {} bytes, {cap} given",
                p.buf.len
            )));
        }
        // SAFETY: `cap` writable bytes at `dst` (the contract); `p` is memory of its own.
        core::ptr::copy_nonoverlapping(p.as_ptr(), dst, p.buf.len);
        let kept = Prepared {
            kind: p.kind,
            buf: AlignedBytes {
                ptr: dst,
                len: p.buf.len,
                origin: Origin::Borrowed,
            },
        };
        let mut desc = w;
        desc.data = dst;
        desc.buffer = cx.keep(kept);
        // SAFETY: `out` is valid for a write.
        *out = desc;
        Ok(())
    })
}

extern "C" fn buffer_free(ctx: *mut c_void, buffer: u64) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: ctx came from init.
    let cx = unsafe { &*(ctx as *const Context) };
    let removed = cx
        .prepared
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&buffer);
    drop(removed);
}

/// [`Prepared::kind`] of host memory from `buffer_alloc` (not a weight layout).
const KIND_HOST: u32 = u32::MAX;

extern "C" fn buffer_alloc(ctx: *mut c_void, size: usize, out: *mut u64) -> i32 {
    if ctx.is_null() || out.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: ctx came from init.
    let cx = unsafe { &*(ctx as *const Context) };
    if size == 0 || size > isize::MAX as usize / 2 {
        cx.last_error.set(format!("buffer_alloc: {size} bytes"));
        return Status::InvalidArgument as i32;
    }
    match Prepared::try_zeroed(KIND_HOST, size) {
        Some(p) => {
            // SAFETY: `out` is valid for a write.
            unsafe { *out = cx.keep(p) };
            Status::Ok as i32
        }
        None => {
            cx.last_error
                .set(format!("buffer_alloc: {size} bytes could not be allocated"));
            Status::OutOfMemory as i32
        }
    }
}

extern "C" fn buffer_host_ptr(ctx: *mut c_void, buffer: u64) -> *mut u8 {
    if ctx.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: ctx came from init.
    let cx = unsafe { &*(ctx as *const Context) };
    let map = cx.prepared.lock().unwrap_or_else(|e| e.into_inner());
    match map.get(&buffer) {
        Some(p) if p.kind == KIND_HOST => p.as_ptr() as *mut u8,
        _ => core::ptr::null_mut(),
    }
}

extern "C" fn synchronize(_ctx: *mut c_void) -> i32 {
    // CPU work is finished when `compute` returns.
    Status::Ok as i32
}

/// The function table of backend `B`. CPU backends compute on host memory; their buffers are
/// weights they prepared (`prepare_weight`) and host memory the host asks for (`buffer_alloc`,
/// e.g. the activation arena: 64-byte aligned, huge pages when large), both freed with
/// `buffer_free`.
pub const fn table<B: CpuBackend>() -> BackendTable {
    BackendTable {
        init,
        shutdown,
        compute: compute::<B>,
        last_error,
        score: Some(score::<B>),
        supports: Some(supports::<B>),
        synchronize: Some(synchronize),
        buffer_alloc: Some(buffer_alloc),
        buffer_free: Some(buffer_free),
        buffer_copy: None,
        prepare_weight: Some(prepare_weight::<B>),
        buffer_host_ptr: Some(buffer_host_ptr),
        unavailable_reason: None,
        prepare_weight_into: Some(prepare_weight_into::<B>),
        prepare_weight_ex: Some(prepare_weight_ex::<B>),
    }
}

/// The header of a CPU backend named `name` whose kernels use the `abi::cpu` feature bits
/// `cpu_features`.
pub const fn header(
    name: *const c_char,
    cpu_features: u64,
    table: *const BackendTable,
) -> BackendHeader {
    BackendHeader::layout(name, DeviceKind::Cpu, cpu_features, table)
}

pub use backend_kit::glue::last_error_string;

pub use backend_kit::tensor::split_row;

/// The checks every CPU `mat_mul` makes before its kernel-specific ones: weights in one of
/// `formats` (`who` names the backend family in the refusal), host memory, packed weight
/// rows. Returns the weight format and `(k, n_rows, n_cols)`.
pub fn mat_mul_host_layout(
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    formats: &[abi::DType],
    who: &str,
) -> Result<(abi::DType, usize, usize, usize), Error> {
    let (w, x, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let dt = w
        .dtype()
        .ok_or_else(|| Error::Invalid(format!("mat_mul: unknown dtype id {}", w.dtype)))?;
    if !formats.contains(&dt) {
        return Err(Error::Unsupported(format!(
            "mat_mul: no {who} kernels for {dt} weights"
        )));
    }
    if w.buffer != 0 || x.buffer != 0 || out.buffer != 0 {
        return Err(Error::Unsupported("mat_mul: device buffers".into()));
    }
    if w.nb[0] != dt.info().block_bytes as i64 || w.nb[1] < 0 {
        return Err(Error::Unsupported(format!(
            "mat_mul: weight rows of {dt} must be packed"
        )));
    }
    Ok((
        dt,
        w.ne[0] as usize,
        w.ne[1] as usize,
        x.nrows().max(0) as usize,
    ))
}
