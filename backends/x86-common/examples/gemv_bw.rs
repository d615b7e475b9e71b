//! Decode GEMV bandwidth: `cargo run --release -p mollm-x86-common --example gemv_bw --
//! [threads] [reps] [format] [place]`. Streams a Q4_K matrix repacked into 16-row groups and
//! a Q6_K row matrix, larger than the L3 and (the compute roof) small enough for L2, the way
//! a decode step does (rows split into one contiguous chunk per thread), beside a plain read
//! of the same bytes, and prints GB/s: the 10th percentile of `reps` timings (on shared VMs
//! noise only slows a run down, so the fast end is the kernel's own speed).

use abi::DType;
use mollm_x86_common::{dot_rows, q4k16, Isa};
use std::time::Instant;

fn bytes(seed: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 32) as u8
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 10]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse().unwrap_or_else(|_| {
                eprintln!(
                    "gemv_bw: `{a}` is not a count (usage: [threads] [reps] [format] [place])"
                );
                std::process::exit(2)
            })
        })
        .collect();
    let threads = args.first().copied().unwrap_or(1);
    let reps = args.get(1).copied().unwrap_or(15);
    // Third argument: only the cases of this format (0 all, 4 Q4_K, 6 Q6_K, 8 Q8_0, 5 Q5_0, 1 Q4_1); fourth: only
    // the in-cache case (1) or only the out-of-cache ones (2).
    let only = args.get(2).copied().unwrap_or(0);
    let place = args.get(3).copied().unwrap_or(0);
    let skip = |fmt: usize, n: usize| {
        (only != 0 && only != fmt) || (place == 1 && n > 128) || (place == 2 && n <= 128)
    };
    let isa = if Isa::Avx512.detected() {
        Isa::Avx512
    } else {
        Isa::Avx2
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    // Q4_K, repacked: the 1.5B's gate/up shape (k = 1536) and its ffn_down (k = 8960).
    for (k, n) in [(1536usize, 65536usize), (8960, 8192), (1536, 128)] {
        if skip(4, n) {
            continue;
        }
        let nb = k / 256;
        let mut lines = vec![q4k16::Line([0; 64]); q4k16::repacked_bytes(k, n) / 64];
        for (i, l) in lines.iter_mut().enumerate() {
            l.0 = [(i * 37) as u8; 64];
        }
        let w = lines.as_ptr() as *const u8;
        let wb = lines.len() * 64;
        let act = bytes(&mut seed, nb * 292);
        let mut out = vec![0f32; n];
        let ng = n / 16;
        let inner = (50_000_000 / wb).max(1);
        let mut t = Vec::new();
        for _ in 0..reps {
            let t0 = Instant::now();
            let per = ng.div_ceil(threads);
            std::thread::scope(|s| {
                for (ti, o) in out.chunks_mut(per * 16).enumerate() {
                    let (w, a) = (w as usize, act.as_ptr() as usize);
                    s.spawn(move || {
                        let g0 = ti * per;
                        let g = o.len() / 16;
                        // SAFETY: the weight is repacked and aligned; `a` is one Q8_K row.
                        for _ in 0..inner {
                            unsafe {
                                let wg = (w as *const u8).add(g0 * nb * q4k16::GROUP_BLOCK);
                                if isa == Isa::Avx512 {
                                    q4k16::columns_avx512::<1>(
                                        false,
                                        wg,
                                        g,
                                        nb,
                                        a as _,
                                        0,
                                        o.as_mut_ptr(),
                                        0,
                                    )
                                } else {
                                    q4k16::columns_avx2::<1>(
                                        false,
                                        wg,
                                        g,
                                        nb,
                                        a as _,
                                        0,
                                        o.as_mut_ptr(),
                                        0,
                                    )
                                }
                            }
                        }
                    });
                }
            });
            t.push(t0.elapsed().as_secs_f64());
        }
        println!(
            "q4k16 {k}x{n} {:.1} MB: {:.2} GB/s",
            wb as f64 / 1e6,
            (wb * inner) as f64 / median(t) / 1e9
        );
    }
    // Row formats (the row kernels): Q6_K (the 1.5B's output and ffn_down), Q8_0 (Gemma 3's
    // 262144-row output), Q5_0 (Qwen2.5-0.5B and Gemma FFNs), Q4_1 (SmolLM2).
    let row_cases: &[(DType, usize, usize, usize)] = &[
        (DType::Q6_K, 6, 1536, 65536),
        (DType::Q6_K, 6, 8960, 8192),
        (DType::Q6_K, 6, 1536, 128),
        (DType::Q8_0, 8, 640, 262144),
        (DType::Q8_0, 8, 640, 128),
        (DType::Q5_0, 5, 640, 65536),
        (DType::Q5_0, 5, 640, 128),
        (DType::Q4_1, 1, 576, 65536),
        (DType::Q4_1, 1, 576, 128),
    ];
    for &(dt, fmt, k, n) in row_cases {
        if skip(fmt, n) {
            continue;
        }
        let rb = quant::row_bytes(dt, k).unwrap();
        let inner = (50_000_000 / (rb * n)).max(1);
        let mut w = bytes(&mut seed, rb * n);
        // Scales of 1.0 (f16 0x3c00; random bits would give infinities and subnormals).
        let (bb, scales): (usize, &[usize]) = match dt {
            DType::Q6_K => (210, &[208]),
            DType::Q8_0 => (34, &[0]),
            DType::Q5_0 => (22, &[0]),
            _ => (20, &[0, 2]),
        };
        for blk in w.chunks_exact_mut(bb) {
            for &o in scales {
                blk[o] = 0;
                blk[o + 1] = 0x3c;
            }
        }
        let vt = quant::vec_dot_type(dt);
        let mut act = bytes(&mut seed, quant::row_bytes(vt, k).unwrap());
        match vt {
            DType::Q8_K => {
                for blk in act.chunks_exact_mut(292) {
                    blk[..4].copy_from_slice(&1f32.to_le_bytes());
                }
            }
            _ => {
                let ab = if vt == DType::Q8_0 { 34 } else { 36 };
                for blk in act.chunks_exact_mut(ab) {
                    blk[..2].copy_from_slice(&[0, 0x3c]);
                    if ab == 36 {
                        blk[2..4].copy_from_slice(&[0, 0x3c]);
                    }
                }
            }
        }
        let mut out = vec![0f32; n];
        if dt == DType::Q6_K && k == 1536 && n > 128 && only == 0 {
            // The plain read roof: 32-byte loads summed, same split.
            let mut t = Vec::new();
            for _ in 0..reps {
                let t0 = Instant::now();
                let per = w.len().div_ceil(threads);
                std::thread::scope(|s| {
                    for c in w.chunks(per) {
                        s.spawn(move || {
                            let mut acc = [0u64; 4];
                            for q in c.chunks_exact(32) {
                                for j in 0..4 {
                                    acc[j] ^=
                                        u64::from_le_bytes(q[8 * j..8 * j + 8].try_into().unwrap());
                                }
                            }
                            std::hint::black_box(acc);
                        });
                    }
                });
                t.push(t0.elapsed().as_secs_f64());
            }
            println!(
                "read {:.1} MB: {:.2} GB/s",
                w.len() as f64 / 1e6,
                w.len() as f64 / median(t) / 1e9
            );
        }
        let mut t = Vec::new();
        for _ in 0..reps {
            let t0 = Instant::now();
            let per = n.div_ceil(threads);
            std::thread::scope(|s| {
                for (ti, o) in out.chunks_mut(per).enumerate() {
                    let w = &w[ti * per * rb..(ti * per + o.len()) * rb];
                    let act = &act;
                    s.spawn(move || {
                        for _ in 0..inner {
                            dot_rows(isa, quant::Kernel::VecDot, dt, k, w, act, o)
                        }
                    });
                }
            });
            t.push(t0.elapsed().as_secs_f64());
        }
        let wb = w.len();
        println!(
            "{dt} {k}x{n} {:.1} MB: {:.2} GB/s",
            wb as f64 / 1e6,
            (wb * inner) as f64 / median(t) / 1e9
        );
    }
}
