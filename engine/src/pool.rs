//! The one compute thread pool of the process, lent to every backend through
//! [`abi::HostApi::parallel_for`], so several loaded backends never oversubscribe the cores.

use abi::{HostApi, TaskFn};
use core::ffi::c_void;
use rayon::prelude::*;
use std::sync::Arc;

pub struct Pool {
    pool: Arc<rayon::ThreadPool>,
    n_threads: usize,
}

#[derive(Clone, Copy)]
struct SendPtr(*mut c_void);
// SAFETY: the task contract (abi::TaskFn) says tasks may run concurrently on any thread.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

extern "C" fn parallel_for(host_ctx: *mut c_void, n_tasks: u32, task: TaskFn, user: *mut c_void) {
    // SAFETY: host_ctx is the `rayon::ThreadPool` inside a live `Pool` (see `Pool::host_api`).
    let pool = unsafe { &*(host_ctx as *const rayon::ThreadPool) };
    if n_tasks <= 1 || pool.current_num_threads() <= 1 {
        (0..n_tasks).for_each(|i| task(user, i));
        return;
    }
    let user = SendPtr(user);
    pool.install(|| {
        (0..n_tasks).into_par_iter().for_each(|i| {
            let u = user;
            task(u.0, i)
        })
    });
}

impl Pool {
    /// `n_threads == 0` means one per available core.
    pub fn new(n_threads: usize) -> Pool {
        let n = if n_threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            n_threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("mollm-compute-{i}"))
            .build()
            .expect("cannot start compute threads");
        Pool {
            pool: Arc::new(pool),
            n_threads: n,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// The host services for a backend. Valid while this pool lives; the engine keeps the pool
    /// alive for as long as any backend instance made with it.
    pub fn host_api(&self) -> HostApi {
        HostApi {
            struct_size: core::mem::size_of::<HostApi>() as u32,
            n_threads: self.n_threads as u32,
            host_ctx: Arc::as_ptr(&self.pool) as *mut c_void,
            parallel_for,
        }
    }
}
