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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(v: &[u64]) -> u64 {
    read_any(v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_avx2(v: &[u64]) -> u64 {
    read_any(v)
}

/// Eight independent lanes, unrolled so the compiler keeps several vector loads in flight.
#[inline(always)]
fn read_any(v: &[u64]) -> u64 {
    let mut acc = [0u64; 32];
    for c in v.chunks_exact(32) {
        for i in 0..32 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().fold(0, |a, &x| a.wrapping_add(x))
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
