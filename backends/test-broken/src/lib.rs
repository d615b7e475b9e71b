//! A deliberately broken backend plugin, for the host's tests only.
//!
//! It implements only `add` and `mul` on F32 tensors (every other call is `Unsupported`), and:
//! - `add` writes a wrong value (the first output element is off by 1), so the conformance gate
//!   must refuse `add` and only `add`;
//! - with `MOLLM_TEST_BROKEN_CRASH=1`, `mul` aborts the whole process inside `compute`, to prove
//!   that the gate runs in a child process.
//!
//! It does not link the `reference` crate: that crate exports its own `mollm_backend_entry`,
//! which would clash with this library's.

use abi::{
    BackendHeader, BackendTable, DType, DeviceKind, HostApi, Op, OpCall, Status, TensorDesc,
};
use core::ffi::{c_char, c_void};

struct Ctx {
    last_error: String,
}

extern "C" fn init(_host: *const HostApi, out: *mut *mut c_void) -> i32 {
    if out.is_null() {
        return Status::InvalidArgument as i32;
    }
    let ctx = Box::new(Ctx {
        last_error: String::new(),
    });
    // SAFETY: out is a valid pointer from the host.
    unsafe { *out = Box::into_raw(ctx) as *mut c_void };
    Status::Ok as i32
}

extern "C" fn shutdown(ctx: *mut c_void) {
    if !ctx.is_null() {
        // SAFETY: ctx came from init.
        drop(unsafe { Box::from_raw(ctx as *mut Ctx) });
    }
}

/// The binary op of a call if this backend takes it: F32 `a`, F32 `b` broadcast over `a`, F32
/// output shaped like `a`.
unsafe fn accept(call: *const OpCall) -> Result<(Op, TensorDesc, TensorDesc, TensorDesc), String> {
    if call.is_null() {
        return Err("null call".into());
    }
    let (op, ins, outs) = (*call).parts();
    let op = match op {
        Some(op @ (Op::Add | Op::Mul)) => op,
        Some(op) => return Err(format!("{} is not implemented here", op.name())),
        None => return Err("unknown op".into()),
    };
    if ins.len() != 2 || outs.len() != 1 {
        return Err("expected 2 inputs and 1 output".into());
    }
    let (a, b, o) = (ins[0], ins[1], outs[0]);
    for t in [&a, &b, &o] {
        if t.dtype() != Some(DType::F32) || t.nb[0] != 4 {
            return Err("F32 with packed rows only".into());
        }
    }
    for d in 0..4 {
        if b.ne[d] <= 0 || a.ne[d] % b.ne[d] != 0 || o.ne[d] != a.ne[d] {
            return Err("shapes do not broadcast".into());
        }
    }
    Ok((op, a, b, o))
}

unsafe fn at(t: &TensorDesc, i: [i64; 4]) -> *mut f32 {
    let off: i64 = (0..4).map(|d| (i[d] % t.ne[d]) * t.nb[d]).sum();
    t.data.offset(off as isize) as *mut f32
}

extern "C" fn compute(ctx: *mut c_void, call: *const OpCall) -> i32 {
    if ctx.is_null() {
        return Status::InvalidArgument as i32;
    }
    // SAFETY: ctx came from init; the host passes a valid call.
    let cx = unsafe { &mut *(ctx as *mut Ctx) };
    let (op, a, b, o) = match unsafe { accept(call) } {
        Ok(x) => x,
        Err(e) => {
            cx.last_error = e;
            return Status::Unsupported as i32;
        }
    };
    if op == Op::Mul && abi::settings::TEST_BROKEN_CRASH.on(false) {
        std::process::abort();
    }
    let n = a.ne;
    for i3 in 0..n[3] {
        for i2 in 0..n[2] {
            for i1 in 0..n[1] {
                for i0 in 0..n[0] {
                    let i = [i0, i1, i2, i3];
                    // SAFETY: indices within the shapes checked in accept.
                    unsafe {
                        let (x, y) = (at(&a, i).read_unaligned(), at(&b, i).read_unaligned());
                        let v = if op == Op::Add { x + y } else { x * y };
                        at(&o, i).write_unaligned(v);
                    }
                }
            }
        }
    }
    if op == Op::Add && n.iter().all(|&x| x > 0) {
        // The deliberate bug.
        unsafe {
            let p = at(&o, [0; 4]);
            p.write_unaligned(p.read_unaligned() + 1.0);
        }
    }
    Status::Ok as i32
}

extern "C" fn last_error(ctx: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    if ctx.is_null() {
        return 0;
    }
    // SAFETY: ctx came from init; buf has cap bytes.
    let msg = unsafe { &(*(ctx as *const Ctx)).last_error };
    if !buf.is_null() {
        let n = msg.len().min(cap);
        unsafe { core::ptr::copy_nonoverlapping(msg.as_ptr(), buf, n) };
    }
    msg.len()
}

extern "C" fn score() -> u32 {
    5
}

extern "C" fn supports(ctx: *mut c_void, call: *const OpCall) -> i32 {
    match unsafe { accept(call) } {
        Ok(_) => Status::Ok as i32,
        Err(e) => {
            if !ctx.is_null() {
                // SAFETY: ctx came from init.
                unsafe { &mut *(ctx as *mut Ctx) }.last_error = e;
            }
            Status::Unsupported as i32
        }
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
    buffer_free: None,
    buffer_copy: None,
    prepare_weight: None,
    buffer_host_ptr: None,
    unavailable_reason: None,
    prepare_weight_into: None,
    prepare_weight_ex: None,
};

static HEADER: BackendHeader = BackendHeader::layout(
    b"test-broken\0".as_ptr() as *const c_char,
    DeviceKind::Cpu,
    0,
    &TABLE,
);

/// The entry symbol (see `abi::ENTRY_SYMBOL`).
#[no_mangle]
pub extern "C" fn mollm_backend_entry() -> *const BackendHeader {
    &HEADER
}
