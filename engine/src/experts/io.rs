//! The expert cache's I/O workers: a pool of threads reading into cache slots, with demand
//! reads ahead of prefetches.
//!
//! A request is one `preadv` (a run of adjacent experts of one part, scattered into their
//! slots). Each slot counts its requests still outstanding; a slot is ready when its count is
//! zero, so a layer waits for exactly the experts it needs, one at a time, in the order it
//! computes them. Workers take the demand queue first; prefetches (next-layer predictions)
//! run only when no demand is waiting, and on at most half the workers (so that a demand read
//! arriving finds one free), can be promoted to demand when a layer needs them
//! before they ran, and cancelled while still queued.
//!
//! Reads go through a second descriptor opened with `O_DIRECT` where the file system allows
//! it: straight from the device into the slot, no page-cache copy (on this project's
//! machines about twice the throughput of buffered reads dropped with `POSIX_FADV_DONTNEED`).
//! A direct read covers the expert's bytes rounded out to [`ALIGN`]; the slot has room for
//! that. Where `O_DIRECT` is refused (e.g. tmpfs), reads are buffered, and dropped from the
//! page cache after.

use crate::error::{EngineError, Result};
use std::collections::VecDeque;
use std::fs::File;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Offsets, lengths and addresses of direct reads are multiples of this.
pub const ALIGN: u64 = 4096;

/// One read: a file offset and the slot memory it fills, in order (addresses as integers so
/// that a request can cross to a worker).
pub type Job = (u64, Vec<(usize, usize)>);

pub(crate) struct Req {
    pub job: Job,
    /// Of `job`'s bytes, how many must arrive (a direct read's rounded-up tail may lie past
    /// the end of the file).
    pub need: usize,
    /// `job` is aligned for the direct descriptor.
    pub direct: bool,
    /// The expert bytes it brings (the counters' bytes).
    pub bytes: usize,
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
    /// Prefetches running now, and the most that may (the other workers stay free for
    /// demand reads, which otherwise queue behind prefetches already running).
    prefetching: usize,
    max_prefetching: usize,
    stop: bool,
}

struct Shared {
    file: Arc<File>,
    /// The same file opened with O_DIRECT, while the file system takes direct reads.
    direct: Option<File>,
    direct_ok: std::sync::atomic::AtomicBool,
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
    /// `direct`: read with O_DIRECT where the file system allows it.
    pub fn new(
        file: Arc<File>,
        path: String,
        n_slots: usize,
        workers: usize,
        direct: bool,
    ) -> IoPool {
        let direct = direct.then(|| open_direct(&path)).flatten();
        let shared = Arc::new(Shared {
            file,
            direct_ok: std::sync::atomic::AtomicBool::new(direct.is_some()),
            direct,
            path,
            st: Mutex::new(State {
                demand: VecDeque::new(),
                prefetch: VecDeque::new(),
                pending: vec![0; n_slots],
                error: vec![None; n_slots],
                counters: Default::default(),
                prefetching: 0,
                max_prefetching: (workers / 2).max(1),
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

    /// Whether reads go through O_DIRECT (until the file system refuses one).
    pub fn direct(&self) -> bool {
        self.shared
            .direct_ok
            .load(std::sync::atomic::Ordering::Relaxed)
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
                if let Some(r) = st.demand.pop_front() {
                    break r;
                }
                if st.prefetching < st.max_prefetching {
                    if let Some(r) = st.prefetch.pop_front() {
                        st.prefetching += 1;
                        break r;
                    }
                }
                st = sh.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (offset, bufs) = &req.job;
        let bytes = req.bytes as u64;
        let t0 = std::time::Instant::now();
        let ptrs: Vec<(*mut u8, usize)> = bufs.iter().map(|&(a, n)| (a as *mut u8, n)).collect();
        let r = read_req(sh, &req, &ptrs);
        if matches!(r, Ok(false)) {
            drop_cached(&sh.file, *offset, req.need as u64);
        }
        let r = r.map(|_| ());
        let ns = t0.elapsed().as_nanos() as u64;
        let span = crate::trace::ReadSpan {
            what: req.what,
            prefetch: req.prefetch,
            experts: req.slots.len(),
            offset: *offset,
            flow: req.flow,
        };
        crate::trace::read(index, span, t0, bytes);
        let mut st = sh.lock();
        if req.prefetch {
            st.prefetching -= 1;
        }
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
        // A prefetch slot came free.
        sh.work.notify_one();
    }
}

fn open_direct(path: &str) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Reads `req` into `bufs`, direct where it can; `Ok(true)` when it went direct (nothing in
/// the page cache to drop).
fn read_req(sh: &Shared, req: &Req, bufs: &[(*mut u8, usize)]) -> Result<bool> {
    use std::sync::atomic::Ordering;
    let (offset, _) = req.job;
    if req.direct && sh.direct_ok.load(Ordering::Relaxed) {
        if let Some(d) = &sh.direct {
            match read_into(d, &sh.path, offset, bufs, req.need, true) {
                Ok(0) => return Ok(true),
                // A short direct read (the end of the file, unaligned): the rest buffered.
                Ok(_) => {
                    return read_into(&sh.file, &sh.path, offset, bufs, req.need, false)
                        .map(|_| false)
                        .map_err(Into::into)
                }
                Err(ReadErr::Refused) => sh.direct_ok.store(false, Ordering::Relaxed),
                Err(ReadErr::Failed(e)) => return Err(e),
            }
        }
    }
    match read_into(&sh.file, &sh.path, offset, bufs, req.need, false) {
        Ok(_) => Ok(false),
        Err(ReadErr::Failed(e)) => Err(e),
        Err(ReadErr::Refused) => Err(EngineError::Model {
            file: sh.path.clone(),
            msg: format!("reading experts at offset {offset}: invalid argument"),
        }),
    }
}

pub(crate) enum ReadErr {
    /// O_DIRECT refused the request (EINVAL on the first call): read it buffered.
    Refused,
    Failed(EngineError),
}

impl From<ReadErr> for EngineError {
    fn from(e: ReadErr) -> EngineError {
        match e {
            ReadErr::Failed(e) => e,
            ReadErr::Refused => EngineError::Invalid("direct read refused".into()),
        }
    }
}

/// Fills `bufs` in order from `file` at `offset` (`preadv`, resumed after short reads and
/// interruptions) until `need` bytes arrived; the end of the file before that is an error
/// naming the offset. `direct`: stops at a short read and returns how much arrived (a direct
/// read cannot resume at an unaligned offset); `Ok(0)` means all of it.
pub(crate) fn read_into(
    file: &File,
    path: &str,
    offset: u64,
    bufs: &[(*mut u8, usize)],
    need: usize,
    direct: bool,
) -> std::result::Result<usize, ReadErr> {
    let total: usize = bufs.iter().map(|b| b.1).sum();
    let mut done = 0usize;
    let mut retried = false;
    while done < need {
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
            if direct && done == 0 && e.raw_os_error() == Some(libc::EINVAL) {
                return Err(ReadErr::Refused);
            }
            // One retry of a failed read (a transient device error), then the error.
            if !retried {
                retried = true;
                continue;
            }
            return Err(ReadErr::Failed(EngineError::Model {
                file: path.to_string(),
                msg: format!("reading {} expert bytes at offset {at}: {e}", need - done),
            }));
        }
        if r == 0 {
            return Err(ReadErr::Failed(EngineError::Model {
                file: path.to_string(),
                msg: format!(
                    "the file ends before offset {} (reading experts at {at}: truncated?)",
                    offset + need as u64
                ),
            }));
        }
        done += r as usize;
        if direct && done < need && done < total {
            return Ok(done);
        }
    }
    Ok(0)
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
