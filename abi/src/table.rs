//! The function table a backend exports, and what the host lends it.
//!
//! Rules every backend follows (the loader checks what it can, conformance tests the rest):
//! - No panic or C++ exception unwinds across any function here: catch it, return
//!   [`Status::Panic`], and keep the message for `last_error`.
//! - A backend never spawns compute threads of its own. It splits work through
//!   [`HostApi::parallel_for`], so one process-wide pool serves every loaded backend and the
//!   machine is never oversubscribed.
//! - Tables are append-only. A host reads only the fields that `table_size` says exist; an
//!   absent optional function is `None`.
//! - Pointers handed to a backend are valid for the duration of the call only.

use crate::{Op, OpParams, TensorDesc};
use core::ffi::{c_char, c_void};

pub const ABI_MAGIC: u64 = u64::from_le_bytes(*b"MOLLMABI");
/// Bumped on any change an older host or backend cannot read.
pub const ABI_MAJOR: u16 = 1;
/// Bumped when fields or ops are appended.
pub const ABI_MINOR: u16 = 11;
// Minor 1: mat_mul's `chain_cols` attribute (a backend of minor 0 ignores it).
// Minor 2: attention's optional `block_table` operand and `page_rows` attribute (paged KV
// caches; a host passes them only to backends of minor 2 or later), and the table's
// `buffer_host_ptr` (host-memory buffers from `buffer_alloc`).
// Minor 3: the table's `unavailable_reason` (why `score` is 0, for device backends).
// Minor 4: attention's optional `seqs` operand (several sequences in one call, each its
// own queries, n_kv and block-table column; a backend of minor < 4 is not sent such calls).
// Minor 5: the table's `prepare_weight_into` (a repack into the caller's memory: the expert
// cache's slots).
// Minor 6: the table's `prepare_weight_ex` (`prepare_weight` with flags: a source the backend
// may drop from memory as it reads it, `PREPARE_SOURCE_MAPPED`).
// Minor 7: operands in device memory (a `buffer_alloc` buffer without `buffer_host_ptr`:
// `data` is the byte offset in it); `compute` queues work on them, and the host waits only in
// `buffer_copy` into host memory and in `synchronize`.
// Minor 8: op 12, `ssm_conv` (a backend of minor < 8 is not sent it: its `compute` would
// answer InvalidArgument to the unknown id).
// Minor 9: op 13, `gated_delta_net` (the same: not sent to a backend of minor < 9).
// Minor 10: op 14, `rwkv_wkv7` (the same: not sent to a backend of minor < 10).
// Minor 11: ops 15 `norm`, 16 `l2_norm`, 17 `token_shift` (the same: minor < 11).
/// Name of the one symbol a backend library exports: `extern "C" fn() -> *const BackendHeader`.
pub const ENTRY_SYMBOL: &[u8] = b"mollm_backend_entry\0";

#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    /// The call is malformed (schema check failed); `last_error` says how.
    InvalidArgument = 1,
    /// Well-formed, but this backend does not implement this op/format/shape combination.
    Unsupported = 2,
    OutOfMemory = 3,
    /// A panic was caught inside the backend.
    Panic = 4,
    Internal = 5,
}

impl Status {
    pub fn from_raw(v: i32) -> Status {
        match v {
            0 => Status::Ok,
            1 => Status::InvalidArgument,
            2 => Status::Unsupported,
            3 => Status::OutOfMemory,
            4 => Status::Panic,
            _ => Status::Internal,
        }
    }
}

/// One op invocation. `inputs`/`outputs` point to arrays of the lengths given, in the order of
/// the op's schema.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OpCall {
    pub op: u32,
    pub n_inputs: u32,
    pub n_outputs: u32,
    pub inputs: *const TensorDesc,
    pub outputs: *const TensorDesc,
    pub params: OpParams,
}

impl OpCall {
    pub fn new(op: Op, inputs: &[TensorDesc], outputs: &[TensorDesc], params: OpParams) -> OpCall {
        OpCall {
            op: op as u32,
            n_inputs: inputs.len() as u32,
            n_outputs: outputs.len() as u32,
            inputs: inputs.as_ptr(),
            outputs: outputs.as_ptr(),
            params,
        }
    }

    /// # Safety
    /// `inputs`/`outputs` must point to arrays of the stated lengths, alive for `'a`.
    pub unsafe fn parts<'a>(&self) -> (Option<Op>, &'a [TensorDesc], &'a [TensorDesc]) {
        let slice = |p: *const TensorDesc, n: u32| {
            if n == 0 || p.is_null() {
                &[][..]
            } else {
                core::slice::from_raw_parts(p, n as usize)
            }
        };
        (
            Op::from_id(self.op),
            slice(self.inputs, self.n_inputs),
            slice(self.outputs, self.n_outputs),
        )
    }
}

/// A task body for [`HostApi::parallel_for`]: called once for each index in `0..n_tasks`,
/// possibly concurrently from different threads.
pub type TaskFn = extern "C" fn(user: *mut c_void, task: u32);

/// Services the host lends a backend for its lifetime.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HostApi {
    pub struct_size: u32,
    /// Threads the host's pool runs; a backend may size its task split by it.
    pub n_threads: u32,
    pub host_ctx: *mut c_void,
    /// Runs `task(user, i)` for every `i` in `0..n_tasks` on the host's pool and returns when
    /// all have finished. Tasks must not call `parallel_for` themselves.
    pub parallel_for:
        extern "C" fn(host_ctx: *mut c_void, n_tasks: u32, task: TaskFn, user: *mut c_void),
}

/// What kind of memory a backend computes on.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu = 0,
    Gpu = 1,
}

/// The backend's operations. Required entries are plain function pointers; optional ones are
/// `Option` (null when absent).
#[repr(C)]
pub struct BackendTable {
    /// Creates a backend instance. `*out` receives an opaque context passed to every other call.
    pub init: extern "C" fn(host: *const HostApi, out: *mut *mut c_void) -> i32,
    pub shutdown: extern "C" fn(ctx: *mut c_void),
    /// Runs one op (see [`OpCall`]); returns a [`Status`] as `i32`.
    pub compute: extern "C" fn(ctx: *mut c_void, call: *const OpCall) -> i32,
    /// Copies the message of the last failure on this context into `buf` (UTF-8, not
    /// terminated, truncated to `cap`); returns the full length.
    pub last_error: extern "C" fn(ctx: *mut c_void, buf: *mut u8, cap: usize) -> usize,
    /// Fit to this CPU: 0 = cannot run here, higher = better. Must not execute any instruction
    /// the CPU lacks.
    pub score: Option<extern "C" fn() -> u32>,
    /// Returns [`Status::Ok`] when `compute` would accept this exact call (op, formats,
    /// shapes), [`Status::Unsupported`] otherwise. Data pointers may be null.
    pub supports: Option<extern "C" fn(ctx: *mut c_void, call: *const OpCall) -> i32>,
    /// Blocks until queued work is done (asynchronous devices); reports a device failure of
    /// the queued work.
    pub synchronize: Option<extern "C" fn(ctx: *mut c_void) -> i32>,
    /// Device memory: allocate `size` bytes, returning a handle in `*out` (never 0).
    pub buffer_alloc: Option<extern "C" fn(ctx: *mut c_void, size: usize, out: *mut u64) -> i32>,
    pub buffer_free: Option<extern "C" fn(ctx: *mut c_void, buffer: u64)>,
    /// Copies between host memory (`buffer == 0`) and backend buffers, in the order of the
    /// queued work; a copy into host memory waits for it.
    pub buffer_copy: Option<
        extern "C" fn(ctx: *mut c_void, dst: *const TensorDesc, src: *const TensorDesc) -> i32,
    >,
    /// Repacks a weight into the backend's private layout at load time: writes a descriptor of
    /// the prepared tensor to `*out`; later calls pass that descriptor as the weight.
    pub prepare_weight: Option<
        extern "C" fn(ctx: *mut c_void, weight: *const TensorDesc, out: *mut TensorDesc) -> i32,
    >,
    /// ABI 1.2. The address of a `buffer_alloc` buffer when it is host memory (CPU backends):
    /// the host then passes tensors inside it by address, with `buffer` 0. Null for device
    /// memory, which the host reaches only through `buffer_copy`. Absent: no host buffers.
    pub buffer_host_ptr: Option<extern "C" fn(ctx: *mut c_void, buffer: u64) -> *mut u8>,
    /// ABI 1.3. Why `score` is 0, in words ("no CUDA driver", "no Metal device"): copies the
    /// reason into `buf` (UTF-8, not terminated, truncated to `cap`) and returns its full
    /// length (0: no reason given). Absent: the host names the CPU features the library lacks.
    pub unavailable_reason: Option<extern "C" fn(buf: *mut u8, cap: usize) -> usize>,
    /// ABI 1.5. As `prepare_weight`, into the caller's `cap` bytes at `dst` (64-byte aligned;
    /// they may hold the weight itself, which the backend reads whole before it writes any).
    /// `out.buffer` is a handle the caller passes to `buffer_free` before it reuses the memory
    /// (which frees nothing at `dst`). Unsupported: no layout for this weight, or one larger
    /// than `cap` (and then `dst` is untouched).
    pub prepare_weight_into: Option<
        extern "C" fn(
            ctx: *mut c_void,
            weight: *const TensorDesc,
            dst: *mut u8,
            cap: usize,
            out: *mut TensorDesc,
        ) -> i32,
    >,
    /// ABI 1.6. As `prepare_weight`, with `flags` (`PREPARE_*`; unknown bits are ignored).
    pub prepare_weight_ex: Option<
        extern "C" fn(
            ctx: *mut c_void,
            weight: *const TensorDesc,
            flags: u32,
            out: *mut TensorDesc,
        ) -> i32,
    >,
}

/// `prepare_weight_ex` flag: the weight lies in a read-only private file mapping, which the
/// host reads again only through page faults. The backend may drop its pages
/// (`MADV_DONTNEED`) once it has read them, so that repacking a large weight never holds the
/// whole source in memory beside its copy.
pub const PREPARE_SOURCE_MAPPED: u32 = 1;

impl BackendTable {
    /// What `unavailable_reason` (ABI 1.3) says, as one line, if the table has it and it gives
    /// a reason. A table from an older library must have been padded to this layout first.
    pub fn unavailable_why(&self) -> Option<String> {
        let f = self.unavailable_reason?;
        let mut buf = [0u8; 512];
        let n = f(buf.as_mut_ptr(), buf.len()).min(buf.len());
        let why = String::from_utf8_lossy(&buf[..n]);
        let why = why.split_whitespace().collect::<Vec<_>>().join(" ");
        (!why.is_empty()).then_some(why)
    }
}

/// What the entry symbol returns. The host checks `magic`, `abi_major`, and every size below
/// before touching anything else, so a library built against another layout is refused rather
/// than misread.
#[repr(C)]
pub struct BackendHeader {
    pub magic: u64,
    pub abi_major: u16,
    pub abi_minor: u16,
    pub header_size: u32,
    pub table_size: u32,
    pub tensor_desc_size: u32,
    pub op_call_size: u32,
    pub host_api_size: u32,
    /// NUL-terminated UTF-8, static.
    pub name: *const c_char,
    pub device_kind: u32,
    /// Bit set of CPU features the library was compiled to use (defined with the native
    /// backends; 0 for portable code).
    pub cpu_features: u64,
    pub table: *const BackendTable,
}

// SAFETY: headers and tables are immutable statics holding only function pointers and
// pointers to static strings.
unsafe impl Sync for BackendHeader {}
unsafe impl Sync for BackendTable {}

impl BackendHeader {
    /// A header describing this build's layout; backends fill in the rest.
    pub const fn layout(
        name: *const c_char,
        device_kind: DeviceKind,
        cpu_features: u64,
        table: *const BackendTable,
    ) -> BackendHeader {
        BackendHeader {
            magic: ABI_MAGIC,
            abi_major: ABI_MAJOR,
            abi_minor: ABI_MINOR,
            header_size: core::mem::size_of::<BackendHeader>() as u32,
            table_size: core::mem::size_of::<BackendTable>() as u32,
            tensor_desc_size: core::mem::size_of::<TensorDesc>() as u32,
            op_call_size: core::mem::size_of::<OpCall>() as u32,
            host_api_size: core::mem::size_of::<HostApi>() as u32,
            name,
            device_kind: device_kind as u32,
            cpu_features,
            table,
        }
    }

    /// Why a header from a loaded library cannot be used by this host, if it cannot.
    pub fn check_layout(&self) -> Result<(), String> {
        if self.magic != ABI_MAGIC {
            return Err("not a mollm backend (bad magic)".into());
        }
        if self.abi_major != ABI_MAJOR {
            return Err(format!(
                "ABI major version {} (this mollm speaks {})",
                self.abi_major, ABI_MAJOR
            ));
        }
        let sizes = [
            (
                "TensorDesc",
                self.tensor_desc_size,
                core::mem::size_of::<TensorDesc>(),
            ),
            ("OpCall", self.op_call_size, core::mem::size_of::<OpCall>()),
            (
                "HostApi",
                self.host_api_size,
                core::mem::size_of::<HostApi>(),
            ),
        ];
        for (what, theirs, ours) in sizes {
            if theirs as usize != ours {
                return Err(format!(
                    "{what} is {theirs} bytes in the library, {ours} here"
                ));
            }
        }
        if (self.table_size as usize) < core::mem::offset_of!(BackendTable, score) {
            return Err(format!(
                "function table too small ({} bytes)",
                self.table_size
            ));
        }
        if self.table.is_null() || self.name.is_null() {
            return Err("null table or name".into());
        }
        Ok(())
    }
}
