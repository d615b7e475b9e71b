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
}

/// Passes per measurement; the best one counts (the others met page faults or noise).
pub const PASSES: usize = 4;

/// Sums `v` with the widest vectors this CPU has (the loads, not the adds, must bound it).
fn read(v: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F detected.
        return unsafe { read_avx512(v) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected.
        return unsafe { read_avx2(v) };
    }
    read_any(v)
}

// Explicit loads: left to itself, the compiler vectorized `read_any` across chunks with
// gathers, which read 2.8 GB/s on a Zen 4 core that streams 28 GB/s with these.

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(v: &[u64]) -> u64 {
    use core::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let chunks = v.chunks_exact(32);
    let tail = read_any(chunks.remainder());
    for c in chunks {
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
unsafe fn read_avx2(v: &[u64]) -> u64 {
    use core::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 8];
    let chunks = v.chunks_exact(32);
    let tail = read_any(chunks.remainder());
    for c in chunks {
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

/// Best GB/s of `threads` threads each reading its share of `buf`.
fn best_gbps(buf: &[u64], threads: usize) -> f64 {
    let per = buf.len().div_ceil(threads).next_multiple_of(32);
    let mut best = 0f64;
    for _ in 0..PASSES {
        let t0 = Instant::now();
        let sum = std::thread::scope(|s| {
            let hs: Vec<_> = buf.chunks(per).map(|c| s.spawn(move || read(c))).collect();
            hs.into_iter()
                .fold(0u64, |a, h| a.wrapping_add(h.join().unwrap_or(0)))
        });
        std::hint::black_box(sum);
        let secs = t0.elapsed().as_secs_f64().max(1e-9);
        best = best.max((buf.len() * 8) as f64 / secs / 1e9);
    }
    best
}

/// Measures over `mib` MiB (written first, so every page is resident).
pub fn measure(mib: usize, threads: usize) -> Result<Probe, String> {
    let n = mib.checked_mul(1 << 17).ok_or("--probe-mb is too large")?;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(n)
        .map_err(|_| format!("cannot allocate {mib} MiB for the bandwidth probe"))?;
    buf.extend((0..n as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let threads = threads.max(1);
    Ok(Probe {
        gbps_one: best_gbps(&buf, 1),
        gbps_all: best_gbps(&buf, threads),
        threads,
        mib,
    })
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
            assert_eq!(super::read(&v), want, "{n} words");
            assert_eq!(super::read_any(&v), want, "{n} words");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: AVX2 detected.
                assert_eq!(unsafe { super::read_avx2(&v) }, want, "{n} words, AVX2");
            }
        }
    }
}
