//! `prepare_weight_ex` with `PREPARE_SOURCE_MAPPED` (ABI 1.6): a weight in a read-only file
//! mapping is repacked (or copied) while its pages are dropped as the repack reads them, so the process's
//! peak memory grows by about the copy, not by the source and the copy. Its own test binary:
//! the peak is the process's.

#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use abi::{DType, Status, TensorDesc, PREPARE_SOURCE_MAPPED};
use mollm_x86_common::{Isa, HEADER_AVX2, HEADER_AVX512};
use std::io::Write;

/// `VmRSS` / `VmHWM` of this process, in bytes.
fn status_kb(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        * 1024
}

/// Bytes of the mapping that starts at `addr` resident in this process (`/proc/self/smaps`;
/// `mincore` would count the page cache's pages, which dropping them from here keeps).
fn mapped_rss(addr: usize) -> usize {
    let s = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{addr:x}-");
    let mut lines = s.lines().skip_while(|l| !l.starts_with(&head));
    lines.next().expect("the mapping is listed");
    let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
    rss.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<usize>()
        .unwrap()
        * 1024
}

#[test]
fn a_mapped_source_is_dropped_as_it_is_repacked() {
    let (isa, h) = if Isa::Avx512.detected() {
        (Isa::Avx512, &HEADER_AVX512)
    } else {
        (Isa::Avx2, &HEADER_AVX2)
    };
    if !isa.detected() {
        eprintln!("SKIPPED: no AVX2");
        return;
    }
    let table = unsafe { &*h.table };
    // Q4_1 is in 16-row groups on both ISAs: 131072 x 512 is 42 MB, either way.
    check(table, DType::Q4_1, 512, 131072, "mollm-mapped-q41");
    // AVX-512 copies Q6_K as it is (into 2 MiB pages): 16384 x 1536, 42 MB.
    if isa == Isa::Avx512 {
        check(table, DType::Q6_K, 1536, 16384, "mollm-mapped-q6k");
    }
}

/// Prepares an `n x k` weight of `dt` (random codes, small positive block scales) from a
/// file mapping: the source's pages are dropped, the layout is the one made from heap memory,
/// the peak grows by the copy and not by both.
fn check(table: &abi::BackendTable, dt: DType, k: usize, n: usize, name: &str) {
    let rb = quant::row_bytes(dt, k).unwrap();
    let bytes = rb * n;
    let info = dt.info();
    let bb = info.block_bytes as usize;
    // Where each block keeps its f16 scale `d` (and Q4_1 its min).
    let d_at = if dt == DType::Q6_K { bb - 2 } else { 0 };
    let mut data = vec![0u8; bytes];
    let mut x = 0x9e3779b97f4a7c15u64;
    for (r, row) in data.chunks_exact_mut(rb).enumerate() {
        for blk in row.chunks_exact_mut(bb) {
            for b in blk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let d = quant::f32_to_fp16(0.01 + r as f32 * 1e-6).to_le_bytes();
            blk[d_at..d_at + 2].copy_from_slice(&d);
            if dt == DType::Q4_1 {
                blk[2..4].copy_from_slice(&quant::f32_to_fp16(-0.5).to_le_bytes());
            }
        }
    }
    let path = std::env::temp_dir().join(format!("{name}-{}.bin", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    // SAFETY: a read-only private mapping of a file this test wrote and nobody changes.
    let map = unsafe {
        use std::os::fd::AsRawFd;
        libc::mmap(
            core::ptr::null_mut(),
            bytes,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let src = map as *mut u8;
    let wd = TensorDesc::contiguous(src, dt, &[k as i64, n as i64]);

    let host = reference::serial_host();
    let mut ctx = core::ptr::null_mut();
    assert_eq!((table.init)(&host, &mut ctx), 0);
    // The layout from heap memory, to compare with.
    let heap = TensorDesc::contiguous(data.as_mut_ptr(), dt, &[k as i64, n as i64]);
    let mut want = heap;
    assert_eq!(
        Status::from_raw((table.prepare_weight.unwrap())(ctx, &heap, &mut want)),
        Status::Ok
    );
    let want_bytes = unsafe { std::slice::from_raw_parts(want.data, bytes) }.to_vec();
    (table.buffer_free.unwrap())(ctx, want.buffer);
    drop(data);

    // Peak from here: the source mapped in and the copy made.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_kb("VmRSS:");
    let mut got = wd;
    let f = table
        .prepare_weight_ex
        .expect("ABI 1.6 CPU backends offer prepare_weight_ex");
    assert_eq!(
        Status::from_raw(f(ctx, &wd, PREPARE_SOURCE_MAPPED, &mut got)),
        Status::Ok
    );
    let peak = status_kb("VmHWM:").saturating_sub(before);
    assert_eq!(
        mapped_rss(src as usize),
        0,
        "{dt}: the source's pages are dropped once read"
    );
    let got_bytes = unsafe { std::slice::from_raw_parts(got.data, bytes) };
    assert!(
        got_bytes == &want_bytes[..],
        "{dt}: the same layout as from heap memory"
    );
    // The result (42 MB) plus a few MiB of source in flight, not both whole (84 MB).
    assert!(
        peak < bytes + bytes / 4,
        "{dt}: peak grew by {} MB preparing {} MB",
        peak >> 20,
        bytes >> 20
    );
    // The source reads back intact from the file after its pages were dropped.
    let back = unsafe { std::slice::from_raw_parts(src, bytes) };
    assert_eq!(&back[..64], &std::fs::read(&path).unwrap()[..64]);
    (table.buffer_free.unwrap())(ctx, got.buffer);
    (table.shutdown)(ctx);
    unsafe { libc::munmap(map, bytes) };
    let _ = std::fs::remove_file(&path);
}
