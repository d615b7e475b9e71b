//! The gate itself must work: the reference passes against itself, and a backend that gets
//! one op subtly wrong is caught on exactly that op.

use abi::{BackendTable, Op, OpCall, Status};
use core::ffi::c_void;

#[test]
fn reference_conforms_to_itself() {
    let host = reference::serial_host();
    let failures = conformance::check_backend(&reference::TABLE, &host, 24).unwrap();
    assert!(failures.is_empty(), "{failures:?}");
}

/// The reference, except that `add` is off by 1e-3 in its first element.
extern "C" fn broken_compute(ctx: *mut c_void, call: *const OpCall) -> i32 {
    let st = (reference::TABLE.compute)(ctx, call);
    // SAFETY: the call's arrays are valid for this call (ABI contract).
    let (op, _, outs) = unsafe { (*call).parts() };
    if st == Status::Ok as i32 && op == Some(Op::Add) {
        unsafe { *(outs[0].data as *mut f32) += 1e-3 };
    }
    st
}

static BROKEN: BackendTable = BackendTable {
    compute: broken_compute,
    ..copy_reference()
};

const fn copy_reference() -> BackendTable {
    BackendTable {
        init: reference::TABLE.init,
        shutdown: reference::TABLE.shutdown,
        compute: reference::TABLE.compute,
        last_error: reference::TABLE.last_error,
        score: reference::TABLE.score,
        supports: reference::TABLE.supports,
        synchronize: reference::TABLE.synchronize,
        buffer_alloc: reference::TABLE.buffer_alloc,
        buffer_free: reference::TABLE.buffer_free,
        buffer_copy: reference::TABLE.buffer_copy,
        prepare_weight: reference::TABLE.prepare_weight,
    }
}

#[test]
fn a_broken_op_is_refused_and_only_that_op() {
    let host = reference::serial_host();
    let failures = conformance::check_backend(&BROKEN, &host, 8).unwrap();
    let ops: Vec<Op> = failures.iter().map(|f| f.0).collect();
    assert_eq!(ops, vec![Op::Add], "{failures:?}");
    assert!(failures[0].1.contains("add seed"), "{}", failures[0].1);
}
