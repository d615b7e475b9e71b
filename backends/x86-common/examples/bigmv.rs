//! Scratch: GEMV throughput on matrices bigger than the caches, 1 and 2 threads.
use abi::DType;
use mollm_x86_common::{dot_rows, Isa};
use quant::Kernel;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dt = if args.get(1).map(|s| s.as_str()) == Some("q6") {
        DType::Q6_K
    } else {
        DType::Q4_K
    };
    let kernel = if dt == DType::Q4_K {
        Kernel::RepackGemv
    } else {
        Kernel::VecDot
    };
    let (k, n) = (1536usize, 65536usize);
    let rb = quant::row_bytes(dt, k).unwrap();
    let mut w = vec![0u8; rb * n];
    let mut seed = 1u64;
    let src: Vec<f32> = (0..k)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((seed >> 40) as f32 / 16777216.0) - 0.5
        })
        .collect();
    for row in w.chunks_exact_mut(rb) {
        quant::quantize_row(dt, &src, row).unwrap();
    }
    let ab = quant::row_bytes(quant::vec_dot_type(dt), k).unwrap();
    let mut act = vec![0u8; ab];
    quant::quantize_activations_for(kernel, dt, &src, &mut act).unwrap();
    for threads in [1usize, 2] {
        let mut best = f64::MAX;
        for _ in 0..10 {
            let t = Instant::now();
            std::thread::scope(|s| {
                let per = n / threads;
                for ti in 0..threads {
                    let (w, act) = (&w, &act);
                    s.spawn(move || {
                        let mut out = vec![0f32; 256];
                        let mut r = ti * per;
                        while r < (ti + 1) * per {
                            dot_rows(
                                Isa::Avx512,
                                kernel,
                                dt,
                                k,
                                &w[r * rb..(r + 256) * rb],
                                act,
                                &mut out,
                            );
                            r += 256;
                        }
                    });
                }
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{dt} threads {threads}: {:.1} GB/s ({:.2} ms for {} MB)",
            w.len() as f64 / best / 1e9,
            best * 1e3,
            w.len() / 1000000
        );
    }
}
