//! The reference as an ABI backend (`name = "reference"`, CPU, score 1).

use abi::{BackendHeader, BackendTable, DeviceKind, HostApi, OpCall, Status};
use backend_kit::glue::{self, ErrorSlot};
use core::ffi::{c_char, c_void};

pub use backend_kit::par::{scoped_threads_host, serial_host};

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
    last_error: ErrorSlot,
}

extern "C" fn init(host: *const HostApi, out: *mut *mut c_void) -> i32 {
    // SAFETY: the host passes a valid HostApi and `out` (or nulls, refused).
    unsafe {
        glue::init(host, out, |host| Context {
            host,
            last_error: ErrorSlot::default(),
        })
    }
}

extern "C" fn shutdown(ctx: *mut c_void) {
    // SAFETY: ctx came from init.
    unsafe { glue::drop_boxed::<Context>(ctx) }
}

extern "C" fn compute(ctx: *mut c_void, call: *const OpCall) -> i32 {
    if ctx.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: ctx came from init.
    let cx = unsafe { &*(ctx as *const Context) };
    cx.last_error.guard(|| unsafe {
        if PANIC_NEXT.with(|f| f.replace(false)) {
            panic!("deliberate test panic");
        }
        let (op, i, o, p) = glue::decode(call)?;
        crate::ops::compute(&cx.host, op, i, o, &p)
    })
}

extern "C" fn last_error(ctx: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    if ctx.is_null() {
        return 0;
    }
    // SAFETY: ctx came from init; the caller provides `cap` writable bytes at `buf`.
    unsafe { (*(ctx as *const Context)).last_error.copy_to(buf, cap) }
}

extern "C" fn score() -> u32 {
    1
}

extern "C" fn supports(ctx: *mut c_void, call: *const OpCall) -> i32 {
    // SAFETY: ctx is null or came from init.
    let slot = unsafe { (ctx as *const Context).as_ref() }.map(|c| &c.last_error);
    glue::guard_supports(slot, || unsafe {
        let (op, i, o, p) = glue::decode(call)?;
        crate::ops::check(op, i, o, &p)
    })
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
    prepare_weight_into: None,
    prepare_weight_ex: None,
};

/// The header `mollm_backend_entry` returns.
pub static HEADER: BackendHeader = BackendHeader::layout(
    b"reference\0".as_ptr() as *const c_char,
    DeviceKind::Cpu,
    0,
    &TABLE,
);

/// The backend entry symbol, for building the reference as a plugin of its own (feature
/// `entry`; off by default so that the native backends, which link this crate for its
/// numerics, export only their own).
#[cfg(feature = "entry")]
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const BackendHeader {
    &HEADER
}

pub use backend_kit::glue::last_error_string;
