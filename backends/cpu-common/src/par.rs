//! `HostApi::parallel_for` for Rust closures (the backend never starts threads of its own).

use abi::HostApi;
use core::ffi::c_void;
use std::sync::Mutex;

/// A raw pointer that tasks may share; each task writes disjoint elements.
#[derive(Clone, Copy)]
pub struct SyncPtr(pub *mut u8);
// SAFETY: used only for reads of shared inputs and disjoint writes from parallel tasks.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

/// The text of a panic payload.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Runs `f(i)` for every `i` in `0..n` on the host's pool. A panic inside a task is caught
/// in the task (unwinding through the `extern "C"` trampoline would abort) and re-raised here
/// once every task has returned.
///
/// # Safety
/// `f` may run on several threads at once: everything it shares must be read-only or written
/// at disjoint addresses by different tasks.
pub unsafe fn parallel_for<F: Fn(u32)>(host: &HostApi, n: u32, f: F) {
    if n == 0 {
        return;
    }
    if n == 1 {
        f(0);
        return;
    }
    struct Job<'a, F> {
        f: &'a F,
        panic: Mutex<Option<String>>,
    }
    extern "C" fn trampoline<F: Fn(u32)>(user: *mut c_void, task: u32) {
        // SAFETY: `user` is the `Job` below, alive until parallel_for returns.
        let job = unsafe { &*(user as *const Job<F>) };
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (job.f)(task))) {
            let msg = panic_message(&*p);
            let mut slot = job.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(msg);
        }
    }
    let job = Job {
        f: &f,
        panic: Mutex::new(None),
    };
    (host.parallel_for)(
        host.host_ctx,
        n,
        trampoline::<F>,
        &job as *const Job<F> as *mut c_void,
    );
    if let Some(msg) = job.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        panic!("{msg}");
    }
}
