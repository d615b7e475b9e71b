//! The expert cache's I/O workers: a pool of threads reading into cache slots, with demand
//! reads ahead of prefetches.
//!
//! A request is one `preadv` (a run of adjacent experts of one part, scattered into their
//! slots). Each slot counts its requests still outstanding; a slot is ready when its count is
//! zero, so a layer waits for exactly the experts it needs, one at a time, in the order it
//! computes them. Workers take the demand queue first; prefetches (next-layer predictions)
//! run only when no demand is waiting, can be promoted to demand when a layer needs them
//! before they ran, and cancelled while still queued.

use crate::error::{EngineError, Result};
use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One read: a file offset and the slot memory it fills, in order (addresses as integers so
/// that a request can cross to a worker).
pub type Job = (u64, Vec<(usize, usize)>);

pub(crate) struct Req {
    pub job: Job,
    /// The slots `job` writes into (one per buffer).
    pub slots: Vec<usize>,
    /// Which expert read this is, for the trace: (layer, first expert, part).
    pub what: (usize, usize, usize),
    /// Counted in the decode phase (else prefill).
    pub decode: bool,
    pub prefetch: bool,
    /// A trace flow from the prediction that queued it.
    pub flow: Option<u64>,
}

/// Per phase, what the workers did.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct IoCounters {
    pub reads: u64,
    pub bytes: u64,
    pub prefetch_bytes: u64,
    pub read_ns: u64,
}

struct State {
    demand: VecDeque<Req>,
    prefetch: VecDeque<Req>,
    /// Per slot: requests queued or running.
    pending: Vec<u32>,
    /// Per slot: the error of a failed read, until a waiter takes it.
    error: Vec<Option<String>>,
    /// [prefill, decode].
    counters: [IoCounters; 2],
    stop: bool,
}

struct Shared {
    file: Arc<File>,
    path: String,
    st: Mutex<State>,
    /// Work was queued (or stop).
    work: Condvar,
    /// A request finished.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl IoPool {
    pub fn new(file: Arc<File>, path: String, n_slots: usize, workers: usize) -> IoPool {
        let shared = Arc::new(Shared {
            file,
            path,
            st: Mutex::new(State {
                demand: VecDeque::new(),
                prefetch: VecDeque::new(),
                pending: vec![0; n_slots],
                error: vec![None; n_slots],
                counters: Default::default(),
                stop: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
        });
        let threads = (0..workers.max(1))
            .map(|i| {
                let sh = shared.clone();
                std::thread::Builder::new()
                    .name(format!("mollm-io-{i}"))
                    .spawn(move || worker(&sh, i))
                    .expect("spawning an I/O worker")
            })
            .collect();
        IoPool { shared, threads }
    }

    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// Queues `reqs` (demand reads in their order, behind earlier demand; prefetches behind
    /// everything).
    pub fn submit(&self, reqs: Vec<Req>) {
        if reqs.is_empty() {
            return;
        }
        let mut st = self.shared.lock();
        for r in reqs {
            for &s in &r.slots {
                st.pending[s] += 1;
            }
            if r.prefetch {
                st.prefetch.push_back(r);
            } else {
                st.demand.push_back(r);
            }
        }
        drop(st);
        self.shared.work.notify_all();
    }

    /// Moves the queued prefetches that write into `slot` to the demand queue.
    pub fn promote(&self, slot: usize) {
        let mut st = self.shared.lock();
        let mut i = 0;
        while i < st.prefetch.len() {
            if st.prefetch[i].slots.contains(&slot) {
                let mut r = st.prefetch.remove(i).expect("index checked");
                r.prefetch = false;
                st.demand.push_back(r);
            } else {
                i += 1;
            }
        }
    }

    /// Drops the queued prefetches for which `drop` says so; returns the slots they would
    /// have written (their data is incomplete: the caller frees them once not pending).
    pub fn cancel(&self, drop: impl Fn(&Req) -> bool) -> Vec<usize> {
        let mut st = self.shared.lock();
        let mut out = Vec::new();
        let queued = std::mem::take(&mut st.prefetch);
        for r in queued {
            if drop(&r) {
                for &s in &r.slots {
                    st.pending[s] -= 1;
                    out.push(s);
                }
            } else {
                st.prefetch.push_back(r);
            }
        }
        out
    }

    /// Whether a read into `slot` is queued or running.
    pub fn busy(&self, slot: usize) -> bool {
        self.shared.lock().pending[slot] > 0
    }

    /// Per slot: whether a read into it is queued or running.
    pub fn busy_slots(&self) -> Vec<bool> {
        self.shared.lock().pending.iter().map(|&p| p > 0).collect()
    }

    /// Waits until no read into `slot` is outstanding; the error of one that failed.
    pub fn wait(&self, slot: usize) -> Result<()> {
        let mut st = self.shared.lock();
        while st.pending[slot] > 0 {
            st = self.shared.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        match st.error[slot].take() {
            Some(msg) => Err(EngineError::Model {
                file: self.shared.path.clone(),
                msg,
            }),
            None => Ok(()),
        }
    }

    /// Clears a failed read's error (the slot is being reused).
    pub fn clear_error(&self, slot: usize) {
        self.shared.lock().error[slot] = None;
    }

    pub fn counters(&self) -> [IoCounters; 2] {
        self.shared.lock().counters
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker(sh: &Shared, index: usize) {
    loop {
        let req = {
            let mut st = sh.lock();
            loop {
                if st.stop {
                    return;
                }
                if let Some(r) = st.demand.pop_front().or_else(|| st.prefetch.pop_front()) {
                    break r;
                }
                st = sh.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (offset, bufs) = &req.job;
        let bytes: u64 = bufs.iter().map(|b| b.1 as u64).sum();
        let t0 = std::time::Instant::now();
        let ptrs: Vec<(*mut u8, usize)> = bufs.iter().map(|&(a, n)| (a as *mut u8, n)).collect();
        let r = read_into(&sh.file, &sh.path, *offset, &ptrs);
        if r.is_ok() {
            drop_cached(&sh.file, *offset, bytes);
        }
        let ns = t0.elapsed().as_nanos() as u64;
        crate::trace::read(index, &req, t0, bytes);
        let mut st = sh.lock();
        let c = &mut st.counters[req.decode as usize];
        c.reads += 1;
        c.bytes += bytes;
        c.read_ns += ns;
        if req.prefetch {
            c.prefetch_bytes += bytes;
        }
        for &s in &req.slots {
            st.pending[s] -= 1;
            if let Err(e) = &r {
                st.error[s] = Some(match e {
                    EngineError::Model { msg, .. } => msg.clone(),
                    other => other.to_string(),
                });
            }
        }
        drop(st);
        sh.done.notify_all();
    }
}

/// Fills `bufs` in order from `file` at `offset` (`preadv`, resumed after short reads and
/// interruptions); the end of the file before the last byte is an error naming the offset.
pub(crate) fn read_into(
    file: &File,
    path: &str,
    offset: u64,
    bufs: &[(*mut u8, usize)],
) -> Result<()> {
    let total: usize = bufs.iter().map(|b| b.1).sum();
    let mut done = 0usize;
    let mut retried = false;
    while done < total {
        // The iovecs of what is still missing.
        let mut iov = Vec::with_capacity(bufs.len());
        let mut skip = done;
        for &(p, n) in bufs {
            if skip >= n {
                skip -= n;
                continue;
            }
            iov.push(libc::iovec {
                // SAFETY: inside the buffer.
                iov_base: unsafe { p.add(skip) } as *mut libc::c_void,
                iov_len: n - skip,
            });
            skip = 0;
        }
        let at = offset + done as u64;
        // SAFETY: every iovec covers memory of a slot reserved for this read; the fd is open.
        let r = unsafe {
            libc::preadv(
                std::os::fd::AsRawFd::as_raw_fd(file),
                iov.as_ptr(),
                iov.len().min(1024) as libc::c_int,
                at as libc::off_t,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // One retry of a failed read (a transient device error), then the error.
            if !retried {
                retried = true;
                continue;
            }
            return Err(EngineError::Model {
                file: path.to_string(),
                msg: format!("reading {} expert bytes at offset {at}: {e}", total - done),
            });
        }
        if r == 0 {
            return Err(EngineError::Model {
                file: path.to_string(),
                msg: format!(
                    "the file ends before offset {} (reading experts at {at}: truncated?)",
                    offset + total as u64
                ),
            });
        }
        done += r as usize;
    }
    Ok(())
}

/// Tells the kernel the page cache need not keep what was just read.
fn drop_cached(file: &File, offset: u64, len: u64) {
    // SAFETY: advice only; errors are harmless.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(file),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}
