//! The C function table's plumbing that every backend table written in Rust shares (the
//! reference's and the native CPU backends'): reading the host's `HostApi`, decoding an
//! `OpCall`, the `last_error` slot, and the rule that no panic crosses the boundary (caught,
//! reported as `Status::Panic` with its message).

use crate::par::panic_message;
use crate::tensor::Error;
use abi::{BackendTable, HostApi, Op, OpCall, OpParams, Status, TensorDesc};
use core::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

/// The host's services as `init` receives them: `None` for a null pointer or a `HostApi`
/// older (smaller) than this build's.
///
/// # Safety
/// `host` is null or points at a `HostApi` whose `struct_size` field is readable.
pub unsafe fn read_host(host: *const HostApi) -> Option<HostApi> {
    if host.is_null() {
        return None;
    }
    // Only struct_size is read before the size is trusted.
    let size = core::ptr::addr_of!((*host).struct_size).read() as usize;
    (size >= core::mem::size_of::<HostApi>()).then(|| *host)
}

/// An `OpCall` taken apart: the op, its operands and parameters.
pub type Decoded = (Op, &'static [TensorDesc], &'static [TensorDesc], OpParams);

/// Decodes a call: null pointers and unknown op ids are `Invalid`.
///
/// # Safety
/// `call` is null or a valid `OpCall` whose operand arrays live for the call.
pub unsafe fn decode(call: *const OpCall) -> Result<Decoded, Error> {
    if call.is_null() {
        return Err(Error::Invalid("null call".into()));
    }
    let c = &*call;
    if (c.n_inputs > 0 && c.inputs.is_null()) || (c.n_outputs > 0 && c.outputs.is_null()) {
        return Err(Error::Invalid("null operand array".into()));
    }
    let (op, i, o) = c.parts();
    let op = op.ok_or_else(|| Error::Invalid(format!("unknown op id {}", c.op)))?;
    Ok((op, i, o, c.params))
}

/// The status an error returns.
pub fn status_of(e: &Error) -> Status {
    match e {
        Error::Invalid(_) => Status::InvalidArgument,
        Error::Unsupported(_) => Status::Unsupported,
    }
}

/// A backend instance's last failure message (`last_error`).
#[derive(Default)]
pub struct ErrorSlot(Mutex<String>);

impl ErrorSlot {
    pub fn set(&self, msg: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = msg;
    }

    /// `last_error`: copies up to `cap` bytes of the message to `buf` (when non-null) and
    /// returns the message's full length.
    ///
    /// # Safety
    /// `buf` is null or valid for `cap` bytes of writes.
    pub unsafe fn copy_to(&self, buf: *mut u8, cap: usize) -> usize {
        let msg = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !buf.is_null() {
            let n = msg.len().min(cap);
            core::ptr::copy_nonoverlapping(msg.as_ptr(), buf, n);
        }
        msg.len()
    }

    /// Runs `f` with panics caught: its error or the panic's message goes into the slot, and
    /// the status is returned as the table's `i32`.
    pub fn guard(&self, f: impl FnOnce() -> Result<(), Error>) -> i32 {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => Status::Ok as i32,
            Ok(Err(e)) => {
                self.set(e.to_string());
                status_of(&e) as i32
            }
            Err(p) => {
                self.set(format!("panic: {}", panic_message(&*p)));
                Status::Panic as i32
            }
        }
    }
}

/// `supports`: `Ok` or `Unsupported` (a panic while checking counts as unsupported), the
/// reason kept in `slot` when there is one.
pub fn guard_supports(slot: Option<&ErrorSlot>, f: impl FnOnce() -> Result<(), Error>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::Ok as i32,
        Ok(Err(e)) => {
            if let Some(s) = slot {
                s.set(e.to_string());
            }
            Status::Unsupported as i32
        }
        Err(_) => Status::Unsupported as i32,
    }
}

/// `init`: checks the host's `HostApi` ([`read_host`]) and `out`, then stores the context
/// `make` builds from the host on the heap (`Status::Ok`); `InvalidArgument` otherwise.
///
/// # Safety
/// As [`read_host`]; `out` is null or valid for a write.
pub unsafe fn init<T>(
    host: *const HostApi,
    out: *mut *mut c_void,
    make: impl FnOnce(HostApi) -> T,
) -> i32 {
    match read_host(host) {
        Some(host) if !out.is_null() => {
            *out = Box::into_raw(Box::new(make(host))) as *mut c_void;
            Status::Ok as i32
        }
        _ => Status::InvalidArgument as i32,
    }
}

/// Drops a context made by [`init`] (`shutdown`); null is ignored.
///
/// # Safety
/// `ctx` is null or came from `init` with a `T` and is not used again.
pub unsafe fn drop_boxed<T>(ctx: *mut c_void) {
    if !ctx.is_null() {
        drop(Box::from_raw(ctx as *mut T));
    }
}

/// Reads the last error of a context (hosts, tools and tests).
pub fn last_error_string(table: &BackendTable, ctx: *mut c_void) -> String {
    let n = (table.last_error)(ctx, core::ptr::null_mut(), 0);
    let mut buf = vec![0u8; n];
    (table.last_error)(ctx, buf.as_mut_ptr(), n);
    String::from_utf8_lossy(&buf).into_owned()
}
