//! The machine's memory read bandwidth (`mollm devices --probe`), measured once and kept, so
//! that `mollm bench` can state each decode row's weight bandwidth as a share of it (how far
//! a run is from the memory limit).

use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Instant;

/// Read bandwidth over a buffer larger than the caches.
pub struct Probe {
    /// GB/s (1e9 bytes) read by one thread, and by `threads` threads together.
    pub gbps_one: f64,
    pub gbps_all: f64,
    pub threads: usize,
    pub mib: usize,
    /// The prefetch distance of the best all-threads pass (0: the loads alone).
    pub prefetch: usize,
}

/// Passes per measurement and way of reading; the best one counts (the others met page
/// faults or noise).
pub const PASSES: usize = 4;

/// The ways the probe reads, as software prefetch distances in bytes (0: the loads alone, at
/// the hardware prefetchers' pace). The decode kernels prefetch into L2 ahead of their loads,
/// which on a Sapphire Rapids VM read 15-16.5 GB/s a core where the loads alone read
/// 12.6-14.6: a probe of loads alone would understate the machine, and every share of it
/// overstate how close a run comes. The best way counts.
pub const PREFETCH: [usize; 3] = [0, 4096, 16384];

/// Sums `v` with the widest vectors this CPU has (the loads, not the adds, must bound it),
/// prefetching `pf` bytes ahead into L2 (x86-64; elsewhere the loads alone).
fn read(v: &[u64], pf: usize) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F detected.
        return unsafe { read_avx512(v, pf) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected.
        return unsafe { read_avx2(v, pf) };
    }
    let _ = pf;
    read_any(v)
}

/// Prefetches the four lines of the 256-byte chunk `pf` bytes past `c` into L2 (`pf` 0:
/// nothing). The address may lie past the buffer: a prefetch never faults.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_ahead(c: &[u64], pf: usize) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    if pf > 0 {
        let p = (c.as_ptr() as *const i8).wrapping_add(pf);
        for l in 0..4 {
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * l));
        }
    }
}

// Explicit loads: left to itself, the compiler vectorized `read_any` across chunks with
// gathers, which read 2.8 GB/s on a Zen 4 core that streams 28 GB/s with these.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(v: &[u64], pf: usize) -> u64 {
    use core::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let chunks = v.chunks_exact(32);
    let tail = read_any(chunks.remainder());
    for c in chunks {
        prefetch_ahead(c, pf);
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_epi64(*a, _mm512_loadu_si512(c.as_ptr().add(8 * j) as *const _));
        }
    }
    let mut out = [0u64; 8];
    let sum = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    _mm512_storeu_si512(out.as_mut_ptr() as *mut _, sum);
    out.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_avx2(v: &[u64], pf: usize) -> u64 {
    use core::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 8];
    let chunks = v.chunks_exact(32);
    let tail = read_any(chunks.remainder());
    for c in chunks {
        prefetch_ahead(c, pf);
        for (j, a) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_si256(c.as_ptr().add(4 * j) as *const __m256i);
            *a = _mm256_add_epi64(*a, x);
        }
    }
    let mut out = [0u64; 4];
    let mut sum = acc[0];
    for a in &acc[1..] {
        sum = _mm256_add_epi64(sum, *a);
    }
    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, sum);
    out.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

/// Eight independent lanes, unrolled so the compiler keeps several vector loads in flight.
#[inline(always)]
fn read_any(v: &[u64]) -> u64 {
    let mut acc = [0u64; 32];
    let chunks = v.chunks_exact(32);
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    for c in chunks {
        for i in 0..32 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

/// GB/s of one pass of `threads` threads each reading its share of `buf` (prefetching `pf`
/// bytes ahead).
fn pass_gbps(buf: &[u64], threads: usize, pf: usize) -> f64 {
    let per = buf
        .len()
        .div_ceil(threads.max(1))
        .next_multiple_of(32)
        .max(32);
    let t0 = Instant::now();
    let sum = std::thread::scope(|s| {
        let hs: Vec<_> = buf
            .chunks(per)
            .map(|c| s.spawn(move || read(c, pf)))
            .collect();
        hs.into_iter()
            .fold(0u64, |a, h| a.wrapping_add(h.join().unwrap_or(0)))
    });
    std::hint::black_box(sum);
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    (buf.len() * 8) as f64 / secs / 1e9
}

/// Best GB/s of [`PASSES`] passes of each way of reading, and the prefetch distance that
/// read it.
fn best_gbps(buf: &[u64], threads: usize) -> (f64, usize) {
    let mut best = (0f64, 0);
    for _ in 0..PASSES {
        for pf in PREFETCH {
            let g = pass_gbps(buf, threads, pf);
            if g > best.0 {
                best = (g, pf);
            }
        }
    }
    best
}

/// `mib` MiB written once (every page resident), or an error naming the size.
fn buffer(mib: usize) -> Result<Vec<u64>, String> {
    let n = mib.checked_mul(1 << 17).ok_or("--probe-mb is too large")?;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(n)
        .map_err(|_| format!("cannot allocate {mib} MiB for the bandwidth probe"))?;
    // On 2 MiB pages where the kernel has them, as the backends keep their weights: the
    // probe then reads with no more TLB misses than a decode step does (measured here: within
    // 1% of 4 KiB pages, 24-25 GB/s either way).
    #[cfg(target_os = "linux")]
    {
        let (p, len) = (buf.as_mut_ptr() as usize, n * 8);
        let start = p.next_multiple_of(2 << 20);
        let end = (p + len) & !((2 << 20) - 1);
        if end > start {
            // SAFETY: advice on pages of our own reservation; failure changes nothing.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    buf.extend((0..n as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    Ok(buf)
}

/// Measures over `mib` MiB (written first, so every page is resident).
pub fn measure(mib: usize, threads: usize) -> Result<Probe, String> {
    let buf = buffer(mib)?;
    let threads = threads.max(1);
    let (gbps_one, _) = best_gbps(&buf, 1);
    let (gbps_all, prefetch) = best_gbps(&buf, threads);
    Ok(Probe {
        gbps_one,
        gbps_all,
        threads,
        mib,
        prefetch,
    })
}

/// The probe's buffer, read a slice at a time between the steps of a measured run (`bench
/// --probe-between`), on the run's own compute threads: on a machine whose bandwidth drifts
/// by tens of percent within a minute, the reads then see the machine the steps saw, over the
/// same seconds. Consecutive slices walk the buffer, so each is read from memory (the steps
/// between them stream the weights through the caches).
pub struct Slices {
    buf: Vec<u64>,
    /// Words per slice.
    per: usize,
    next: std::cell::Cell<usize>,
    /// The way of reading ([`PREFETCH`]) that read fastest when the buffer was made.
    pf: usize,
}

struct SliceJob {
    words: *const u64,
    len: usize,
    pf: usize,
    per_task: usize,
    /// The tasks' sums (kept so that no load is optimised away).
    sum: std::sync::atomic::AtomicU64,
}

extern "C" fn slice_task(user: *mut core::ffi::c_void, i: u32) {
    // SAFETY: `user` is the SliceJob `Slices::read` lends for the length of parallel_for.
    let job = unsafe { &*(user as *const SliceJob) };
    let lo = (i as usize * job.per_task).min(job.len);
    let hi = (lo + job.per_task).min(job.len);
    // SAFETY: words lo..hi of the slice, which outlives parallel_for.
    let v = unsafe { core::slice::from_raw_parts(job.words.add(lo), hi - lo) };
    job.sum
        .fetch_add(read(v, job.pf), std::sync::atomic::Ordering::Relaxed);
}

impl Slices {
    /// A `mib` MiB buffer read `slice_mib` MiB at a time by `threads` threads, in the way
    /// that reads it fastest here ([`best_gbps`] over the whole buffer, once).
    pub fn new(mib: usize, slice_mib: usize, threads: usize) -> Result<Slices, String> {
        let buf = buffer(mib.max(1))?;
        let per = (slice_mib.clamp(1, mib.max(1)) << 17).next_multiple_of(32);
        let (_, pf) = best_gbps(&buf, threads.max(1));
        Ok(Slices {
            buf,
            per,
            next: std::cell::Cell::new(0),
            pf,
        })
    }

    /// Reads the next slice on `host`'s threads: (bytes, seconds).
    pub fn read(&self, host: &abi::HostApi) -> (u64, f64) {
        let start = self.next.get();
        let end = (start + self.per).min(self.buf.len());
        self.next.set(if end >= self.buf.len() { 0 } else { end });
        let n = end - start;
        let tasks = host.n_threads.max(1) as usize;
        let job = SliceJob {
            words: self.buf[start..].as_ptr(),
            len: n,
            pf: self.pf,
            per_task: n.div_ceil(tasks).next_multiple_of(32),
            sum: Default::default(),
        };
        let t0 = Instant::now();
        (host.parallel_for)(
            host.host_ctx,
            tasks as u32,
            slice_task,
            &job as *const SliceJob as *mut core::ffi::c_void,
        );
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(&job.sum);
        ((n * 8) as u64, secs)
    }
}

fn path() -> Option<PathBuf> {
    let gate = engine::registry::gate_cache_dir()?;
    Some(gate.parent()?.join("probe.json"))
}

/// Keeps the result for `bench` (per CPU signature); returns where.
pub fn save(p: &Probe) -> Result<PathBuf, String> {
    let f = path().ok_or("no cache directory (HOME and XDG_CACHE_HOME are unset)")?;
    let v = json!({
        "cpu": engine::registry::cpu_signature(),
        "read_gbps_1_thread": p.gbps_one,
        "read_gbps": p.gbps_all,
        "read_prefetch_bytes": p.prefetch,
        "threads": p.threads,
        "mib": p.mib,
    });
    if let Some(d) = f.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::write(&f, v.to_string()).map_err(|e| format!("{}: {e}", f.display()))?;
    Ok(f)
}

/// The kept all-threads read bandwidth of this CPU, in GB/s, if a probe ran here.
pub fn load_gbps() -> Option<f64> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path()?).ok()?).ok()?;
    if v["cpu"].as_str()? != engine::registry::cpu_signature() {
        return None;
    }
    v["read_gbps"]
        .as_f64()
        .filter(|g| g.is_finite() && *g > 0.0)
}

#[cfg(test)]
mod tests {
    /// The SIMD reads sum what the plain one sums, whole chunks and a tail alike (the sum keeps
    /// the compiler from dropping the loads, so it must be over every word).
    #[test]
    fn every_read_sums_every_word() {
        for n in [0usize, 5, 32, 1000, 4099] {
            let v: Vec<u64> = (0..n as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let want = v.iter().fold(0u64, |a, &x| a.wrapping_add(x));
            for pf in super::PREFETCH {
                assert_eq!(super::read(&v, pf), want, "{n} words, prefetch {pf}");
            }
            assert_eq!(super::read_any(&v), want, "{n} words");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 detected.
                for pf in super::PREFETCH {
                    assert_eq!(unsafe { super::read_avx2(&v, pf) }, want, "{n} words, AVX2");
                }
            }
        }
    }
}
