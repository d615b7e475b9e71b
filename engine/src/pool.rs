//! The one compute thread pool of the process, lent to every backend through
//! [`abi::HostApi::parallel_for`], so several loaded backends never oversubscribe the cores.
//!
//! A pool of `n` threads is the calling thread plus `n - 1` workers. A decode step is a few
//! hundred short `parallel_for` calls (tens of microseconds each), so a call must cost far
//! less than a thread wake-up: workers spin on an epoch counter for a while after each job
//! (then yield, then sleep on a condition variable), the caller publishes the job with one
//! atomic store and takes tasks itself, and tasks are handed out by an atomic counter.

use abi::{HostApi, TaskFn};
use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Workers spin (then yield) this long after a job before they sleep.
const SPIN: Duration = Duration::from_millis(2);
/// Of which the first part is a pure spin, without yielding the core.
const PURE_SPIN: Duration = Duration::from_micros(100);

/// One `parallel_for` call, on the caller's stack while it runs.
struct Job {
    task: TaskFn,
    user: *mut c_void,
    n_tasks: u32,
    /// Next task index to hand out.
    next: AtomicU32,
    /// Tasks finished.
    done: AtomicU32,
}

impl Job {
    /// Runs tasks until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Relaxed);
            if i >= self.n_tasks {
                return;
            }
            (self.task)(self.user, i);
            self.done.fetch_add(1, Release);
        }
    }
}

struct Shared {
    /// Worker threads (the caller of `parallel_for` is one more).
    n_workers: usize,
    /// Serializes callers: one job at a time.
    submit: Mutex<()>,
    /// Bumped for every job and at shutdown; workers wait for it to change.
    epoch: AtomicU64,
    /// The running job, or null.
    job: AtomicPtr<Job>,
    /// Workers between "about to read `job`" and "done with that job": the caller frees the
    /// job (returns) only once this is 0 after clearing `job`.
    refs: AtomicU32,
    shutdown: AtomicBool,
    /// Workers asleep (or going to sleep) on `wake`.
    sleepers: AtomicU32,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    /// Memory the next job will read ([`Warmer`]): an idle worker brings it into its cache.
    warm: WarmHint,
}

/// A range posted by [`Warmer::warm`]; `seq` changes with every post. A cache line of its own:
/// the workers poll it beside the epoch.
#[derive(Default)]
#[repr(align(64))]
struct WarmHint {
    seq: AtomicU64,
    addr: AtomicUsize,
    len: AtomicUsize,
}

// SAFETY: the raw pointers in `Job` are used under the protocol described on `Shared`.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    fn worker(&self, index: usize) {
        // The epoch starts at 0: a job or a shutdown published before this thread first runs
        // is seen (loading the epoch here could miss it, and a missed shutdown never ends).
        let mut seen = 0u64;
        // The warm hint being worked on, how far this worker got through its share, and the
        // last one finished (a job interrupts warming; it resumes after the job).
        let (mut warm_cur, mut warm_pos, mut warm_done) = (0u64, 0usize, 0u64);
        loop {
            // Wait for a new epoch: spin, then spin-yield, then sleep.
            let t0 = Instant::now();
            let mut spins = 0u32;
            loop {
                if self.epoch.load(Acquire) != seen {
                    break;
                }
                let w = self.warm.seq.load(Acquire);
                if w != warm_done {
                    if w != warm_cur {
                        (warm_cur, warm_pos) = (w, 0);
                    }
                    if self.warm_share(index, seen, &mut warm_pos) {
                        warm_done = w;
                    }
                    continue;
                }
                spins = spins.wrapping_add(1);
                if spins % 64 == 0 {
                    let el = t0.elapsed();
                    if el > SPIN {
                        let g = self.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
                        self.sleepers.fetch_add(1, SeqCst);
                        let mut g = g;
                        while self.epoch.load(SeqCst) == seen && !self.shutdown.load(SeqCst) {
                            g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                        }
                        self.sleepers.fetch_sub(1, SeqCst);
                        drop(g);
                        break;
                    } else if el > PURE_SPIN {
                        std::thread::yield_now();
                    }
                }
                core::hint::spin_loop();
            }
            seen = self.epoch.load(Acquire);
            if self.shutdown.load(Acquire) {
                return;
            }
            self.refs.fetch_add(1, SeqCst);
            let p = self.job.load(SeqCst);
            if !p.is_null() {
                // SAFETY: non-null and `refs` counts us, so the caller has not returned yet.
                unsafe { &*p }.work();
            }
            self.refs.fetch_sub(1, SeqCst);
        }
    }

    /// Worker `index`'s share of the posted range, line by line into its caches, from `pos`
    /// bytes into the share; stops when a job is published (`pos` says where, and the worker
    /// goes on after the job). Whether the share is done.
    fn warm_share(&self, index: usize, seen: u64, pos: &mut usize) -> bool {
        let (addr, len) = (self.warm.addr.load(Acquire), self.warm.len.load(Acquire));
        let per = len.div_ceil(self.n_workers.max(1)).next_multiple_of(64);
        let a = addr.saturating_add(index * per);
        let b = addr.saturating_add(len).min(a.saturating_add(per));
        while a.saturating_add(*pos) < b {
            if self.epoch.load(Relaxed) != seen {
                return false;
            }
            let p = a + *pos;
            let end = p.saturating_add(WARM_CHUNK).min(b);
            (p..end).step_by(64).for_each(prefetch);
            *pos += end - p;
        }
        true
    }

    fn run(&self, n_tasks: u32, task: TaskFn, user: *mut c_void) {
        let _g = self.submit.lock().unwrap_or_else(|e| e.into_inner());
        let job = Job {
            task,
            user,
            n_tasks,
            next: AtomicU32::new(0),
            done: AtomicU32::new(0),
        };
        self.job.store(&job as *const Job as *mut Job, SeqCst);
        self.epoch.fetch_add(1, SeqCst);
        if self.sleepers.load(SeqCst) > 0 {
            let _l = self.sleep_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.wake.notify_all();
        }
        job.work();
        let mut spins = 0u32;
        while job.done.load(Acquire) < n_tasks {
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                std::thread::yield_now();
            }
            core::hint::spin_loop();
        }
        self.job.store(core::ptr::null_mut(), SeqCst);
        while self.refs.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

/// Lines warmed between checks for a new job.
const WARM_CHUNK: usize = 4096;

/// A hint that the line at `p` is read soon (never faults, whatever `p` is).
#[inline(always)]
fn prefetch(p: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above (PRFM never faults).
    unsafe {
        core::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// Posts memory a coming `parallel_for` job will read, so that the pool's idle workers bring
/// it into their caches while the bus would otherwise idle: while the caller does serial work
/// (the gaps between a decode step's matrix products: norms, rope, attention) and while a
/// worker waits for the others to finish a job. A published job interrupts warming; a worker
/// goes on with it after the job, until another range is posted.
#[derive(Clone)]
pub struct Warmer(Arc<Shared>);

impl Warmer {
    pub fn warm(&self, addr: *const u8, len: usize) {
        let s = &self.0;
        if s.n_workers == 0 || len == 0 {
            return;
        }
        s.warm.addr.store(addr as usize, Relaxed);
        s.warm.len.store(len, Relaxed);
        s.warm.seq.fetch_add(1, Release);
    }
}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

extern "C" fn parallel_for(host_ctx: *mut c_void, n_tasks: u32, task: TaskFn, user: *mut c_void) {
    // SAFETY: host_ctx is the `Shared` inside a live `Pool` (see `Pool::host_api`).
    let shared = unsafe { &*(host_ctx as *const Shared) };
    if n_tasks <= 1 || shared.n_workers == 0 {
        (0..n_tasks).for_each(|i| task(user, i));
        return;
    }
    shared.run(n_tasks, task, user);
}

impl Pool {
    /// `n_threads == 0` means one per available core. The calling thread counts as one. An
    /// error when the system refuses a thread (the ones already started are stopped).
    pub fn new(n_threads: usize) -> std::io::Result<Pool> {
        let n = if n_threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            n_threads
        };
        let shared = Arc::new(Shared {
            n_workers: n - 1,
            submit: Mutex::new(()),
            epoch: AtomicU64::new(0), // see `worker`
            job: AtomicPtr::new(core::ptr::null_mut()),
            refs: AtomicU32::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicU32::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            warm: WarmHint::default(),
        });
        let mut pool = Pool {
            shared,
            workers: Vec::with_capacity(n - 1),
            n_threads: n,
        };
        for i in 1..n {
            let s = Arc::clone(&pool.shared);
            let w = std::thread::Builder::new()
                .name(format!("mollm-compute-{i}"))
                .spawn(move || s.worker(i - 1))
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot start compute thread {i} of {n}: {e}"),
                    )
                })?; // `pool` drops here: the started workers are stopped and joined
            pool.workers.push(w);
        }
        Ok(pool)
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// A handle that posts memory for the idle workers to warm ([`Warmer`]).
    pub fn warmer(&self) -> Warmer {
        Warmer(Arc::clone(&self.shared))
    }

    /// The host services for a backend. Valid while this pool lives; the engine keeps the pool
    /// alive for as long as any backend instance made with it.
    pub fn host_api(&self) -> HostApi {
        HostApi {
            struct_size: core::mem::size_of::<HostApi>() as u32,
            n_threads: self.n_threads as u32,
            host_ctx: Arc::as_ptr(&self.shared) as *mut c_void,
            parallel_for,
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        self.shared.epoch.fetch_add(1, SeqCst);
        {
            let _l = self
                .shared
                .sleep_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    extern "C" fn count(user: *mut c_void, task: u32) {
        let v = unsafe { &*(user as *const Vec<AtomicUsize>) };
        v[task as usize].fetch_add(1, Relaxed);
    }

    /// A worker's share of a posted range is warmed to its end, or up to where a job
    /// interrupts it (and resumes from there); addresses that map nothing do not fault.
    #[test]
    fn warming_covers_a_share_stops_for_jobs_and_never_faults() {
        let pool = Pool::new(3).unwrap();
        let buf = vec![1u8; 200_000];
        let sh = &pool.shared;
        pool.warmer().warm(buf.as_ptr(), buf.len());
        let seen = sh.epoch.load(SeqCst);
        let per = buf.len().div_ceil(2).next_multiple_of(64);
        let mut pos = 0;
        assert!(sh.warm_share(0, seen, &mut pos));
        assert_eq!(pos, per);
        pos = 0;
        assert!(sh.warm_share(1, seen, &mut pos));
        assert_eq!(pos, buf.len() - per);
        // A job published since `seen`: nothing done, resumable.
        let mut pos = 4096;
        assert!(!sh.warm_share(0, seen.wrapping_sub(1), &mut pos));
        assert_eq!(pos, 4096);
        assert!(sh.warm_share(0, seen, &mut pos));
        assert_eq!(pos, per);
        // Unmapped memory (the first page, the top of the address space): hints only.
        for addr in [0usize, usize::MAX - (1 << 20)] {
            pool.warmer().warm(addr as *const u8, 1 << 20);
            let mut pos = 0;
            assert!(sh.warm_share(0, seen, &mut pos));
        }
        // Jobs still run every task once while the workers warm.
        let host = pool.host_api();
        for _ in 0..200 {
            pool.warmer().warm(buf.as_ptr(), buf.len());
            let v: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
            (host.parallel_for)(host.host_ctx, 64, count, &v as *const _ as *mut c_void);
            assert!(v.iter().all(|c| c.load(Relaxed) == 1));
        }
    }

    #[test]
    fn every_task_runs_once() {
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads).unwrap();
            let host = pool.host_api();
            for n in [0u32, 1, 2, 5, 100, 1000] {
                for _ in 0..50 {
                    let v: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    (host.parallel_for)(host.host_ctx, n, count, &v as *const _ as *mut c_void);
                    assert!(
                        v.iter().all(|c| c.load(Relaxed) == 1),
                        "{threads} threads, {n} tasks"
                    );
                }
            }
            // after the workers went to sleep
            std::thread::sleep(SPIN * 3);
            let v: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
            (host.parallel_for)(host.host_ctx, 64, count, &v as *const _ as *mut c_void);
            assert!(v.iter().all(|c| c.load(Relaxed) == 1));
        }
    }

    /// A pool dropped (or given a job) before its workers first run still shuts down.
    #[test]
    fn drop_before_workers_start() {
        for _ in 0..2000 {
            let pool = Pool::new(3).unwrap();
            drop(pool);
        }
        for _ in 0..500 {
            let pool = Pool::new(2).unwrap();
            let host = pool.host_api();
            let v: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
            (host.parallel_for)(host.host_ctx, 4, count, &v as *const _ as *mut c_void);
            assert!(v.iter().all(|c| c.load(Relaxed) == 1));
        }
    }

    #[test]
    fn callers_on_several_threads() {
        let pool = Pool::new(2).unwrap();
        let host = pool.host_api();
        let (pf, ctx) = (host.parallel_for, host.host_ctx as usize);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(move || {
                    for _ in 0..200 {
                        let v: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
                        pf(ctx as *mut c_void, 37, count, &v as *const _ as *mut c_void);
                        assert!(v.iter().all(|c| c.load(Relaxed) == 1));
                    }
                });
            }
        });
    }
}
