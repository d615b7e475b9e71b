//! Turning Rust closures into `HostApi::parallel_for` tasks, and two small hosts.

use abi::{HostApi, TaskFn};
use core::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Runs `f(i)` for every `i` in `0..n` through `host.parallel_for`. A panic inside a task is
/// caught there (unwinding through the `extern "C"` trampoline would abort) and re-raised on
/// the calling thread once all tasks have returned.
pub fn parallel_for<F: Fn(u32) + Sync>(host: &HostApi, n: u32, f: F) {
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
    extern "C" fn trampoline<F: Fn(u32) + Sync>(user: *mut c_void, task: u32) {
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

extern "C" fn serial_parallel_for(
    _ctx: *mut c_void,
    n_tasks: u32,
    task: TaskFn,
    user: *mut c_void,
) {
    for i in 0..n_tasks {
        task(user, i);
    }
}

/// A host that runs every task inline on the calling thread (tests and tools).
pub fn serial_host() -> HostApi {
    HostApi {
        struct_size: core::mem::size_of::<HostApi>() as u32,
        n_threads: 1,
        host_ctx: core::ptr::null_mut(),
        parallel_for: serial_parallel_for,
    }
}

extern "C" fn scoped_parallel_for(ctx: *mut c_void, n_tasks: u32, task: TaskFn, user: *mut c_void) {
    let n_threads = (ctx as usize).clamp(1, 256) as u32;
    let next = AtomicU32::new(0);
    let user = user as usize;
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            break;
        }
        task(user as *mut c_void, i);
    };
    std::thread::scope(|s| {
        for _ in 1..n_threads.min(n_tasks) {
            s.spawn(work);
        }
        work();
    });
}

/// A host that spreads each `parallel_for` over `n_threads` scoped OS threads (spawned per
/// call: fine for tests and benchmarks, not a production pool).
pub fn scoped_threads_host(n_threads: u32) -> HostApi {
    HostApi {
        struct_size: core::mem::size_of::<HostApi>() as u32,
        n_threads: n_threads.max(1),
        host_ctx: n_threads.max(1) as usize as *mut c_void,
        parallel_for: scoped_parallel_for,
    }
}

/// A raw pointer that tasks may share; each task writes disjoint elements.
#[derive(Clone, Copy)]
pub struct SyncPtr(pub *mut u8);
// SAFETY: used only for disjoint writes from parallel tasks.
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

struct AssertSync<F>(F);
// SAFETY: see `parallel_for_shared`.
unsafe impl<F> Sync for AssertSync<F> {}

impl<F: Fn(u32)> AssertSync<F> {
    fn call(&self, i: u32) {
        (self.0)(i)
    }
}

/// [`parallel_for`] for closures that capture tensor descriptors (raw pointers, so not `Sync`).
///
/// # Safety
/// The closure may run on several threads at once: everything it shares must be read-only or
/// written at disjoint addresses by different tasks.
pub unsafe fn parallel_for_shared<F: Fn(u32)>(host: &HostApi, n: u32, f: F) {
    let g = AssertSync(f);
    parallel_for(host, n, |i| g.call(i));
}
