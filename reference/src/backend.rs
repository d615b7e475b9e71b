//! The reference as an ABI backend (`name = "reference"`, CPU, score 1).

use crate::par::panic_message;
use crate::tensor::Error;
use abi::{BackendHeader, BackendTable, DeviceKind, HostApi, Op, OpCall, Status};
use core::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

pub use crate::par::{scoped_threads_host, serial_host};

thread_local! {
    static PANIC_NEXT: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Test hook: the next `compute` on this thread panics inside the backend (to prove that the
/// panic is caught and reported as [`Status::Panic`]).
#[doc(hidden)]
pub fn panic_on_next_compute() {
    PANIC_NEXT.with(|f| f.set(true));
}

/// One backend instance: the host's services and the last failure message.
pub struct Context {
    pub host: HostApi,
    last_error: Mutex<String>,
}

impl Context {
    fn set_error(&self, msg: String) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = msg;
    }
}

extern "C" fn init(host: *const HostApi, out: *mut *mut c_void) -> i32 {
    if host.is_null() || out.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: the host passes a valid HostApi; we only read struct_size before trusting it.
    let size = unsafe { core::ptr::addr_of!((*host).struct_size).read() } as usize;
    if size < core::mem::size_of::<HostApi>() {
        return Status::InvalidArgument as i32;
    }
    let host = unsafe { *host };
    let ctx = Box::new(Context {
        host,
        last_error: Mutex::new(String::new()),
    });
    unsafe { *out = Box::into_raw(ctx) as *mut c_void };
    Status::Ok as i32
}

extern "C" fn shutdown(ctx: *mut c_void) {
    if !ctx.is_null() {
        // SAFETY: ctx came from init.
        drop(unsafe { Box::from_raw(ctx as *mut Context) });
    }
}

fn status_of(e: &Error) -> Status {
    match e {
        Error::Invalid(_) => Status::InvalidArgument,
        Error::Unsupported(_) => Status::Unsupported,
    }
}

/// Decodes a call; `None` op means an unknown id.
unsafe fn decode(
    call: *const OpCall,
) -> Result<
    (
        Op,
        &'static [abi::TensorDesc],
        &'static [abi::TensorDesc],
        abi::OpParams,
    ),
    Error,
> {
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

extern "C" fn compute(ctx: *mut c_void, call: *const OpCall) -> i32 {
    if ctx.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: ctx came from init.
    let cx = unsafe { &*(ctx as *const Context) };
    let r = catch_unwind(AssertUnwindSafe(|| unsafe {
        if PANIC_NEXT.with(|f| f.replace(false)) {
            panic!("deliberate test panic");
        }
        let (op, i, o, p) = decode(call)?;
        crate::ops::compute(&cx.host, op, i, o, &p)
    }));
    match r {
        Ok(Ok(())) => Status::Ok as i32,
        Ok(Err(e)) => {
            let s = status_of(&e);
            cx.set_error(e.to_string());
            s as i32
        }
        Err(p) => {
            cx.set_error(format!("panic: {}", panic_message(&*p)));
            Status::Panic as i32
        }
    }
}

extern "C" fn last_error(ctx: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    if ctx.is_null() {
        return 0;
    }
    let cx = unsafe { &*(ctx as *const Context) };
    let msg = cx
        .last_error
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if !buf.is_null() {
        let n = msg.len().min(cap);
        // SAFETY: the caller provides `cap` writable bytes.
        unsafe { core::ptr::copy_nonoverlapping(msg.as_ptr(), buf, n) };
    }
    msg.len()
}

extern "C" fn score() -> u32 {
    1
}

extern "C" fn supports(ctx: *mut c_void, call: *const OpCall) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| unsafe {
        let (op, i, o, p) = decode(call)?;
        crate::ops::check(op, i, o, &p)
    }));
    match r {
        Ok(Ok(())) => Status::Ok as i32,
        Ok(Err(e)) => {
            if !ctx.is_null() {
                unsafe { &*(ctx as *const Context) }.set_error(e.to_string());
            }
            Status::Unsupported as i32
        }
        Err(_) => Status::Unsupported as i32,
    }
}

extern "C" fn synchronize(_ctx: *mut c_void) -> i32 {
    Status::Ok as i32
}

/// The function table.
pub static TABLE: BackendTable = BackendTable {
    init,
    shutdown,
    compute,
    last_error,
    score: Some(score),
    supports: Some(supports),
    synchronize: Some(synchronize),
    buffer_alloc: None,
    buffer_free: None,
    buffer_copy: None,
    prepare_weight: None,
    buffer_host_ptr: None,
    unavailable_reason: None,
};

/// The header `mollm_backend_entry` returns.
pub static HEADER: BackendHeader = BackendHeader::layout(
    b"reference\0".as_ptr() as *const c_char,
    DeviceKind::Cpu,
    0,
    &TABLE,
);

/// The backend entry symbol.
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const BackendHeader {
    &HEADER
}

/// Reads the last error of a context (safe helper for hosts and tests).
pub fn last_error_string(table: &BackendTable, ctx: *mut c_void) -> String {
    let n = (table.last_error)(ctx, core::ptr::null_mut(), 0);
    let mut buf = vec![0u8; n];
    (table.last_error)(ctx, buf.as_mut_ptr(), n);
    String::from_utf8_lossy(&buf).into_owned()
}
