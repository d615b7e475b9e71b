//! GEMV / small-GEMM throughput of the x86 kernels vs quant's scalar twins and the reference
//! backend. `cargo run --release -p mollm-x86-common --example bench [-- --quick]`

use abi::{BackendTable, DType, HostApi, Op, OpCall, OpParams, TensorDesc};
use mollm_x86_common::{dot_rows, Isa, HEADER_AVX2, HEADER_AVX512};
use std::time::{Duration, Instant};

fn rand_f32(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

/// Median seconds per call of `f`, run for about `budget`.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut v = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < budget || v.len() < 3 {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64());
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn run_table(table: &BackendTable, host: &HostApi, call: &OpCall) {
    let mut ctx = core::ptr::null_mut();
    assert_eq!((table.init)(host, &mut ctx), 0);
    assert_eq!((table.compute)(ctx, call), 0);
    (table.shutdown)(ctx);
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = Duration::from_millis(if quick { 150 } else { 600 });
    let mut seed = 0x1234_5678_9abc_def1u64;
    let cases: &[(DType, usize, usize, &str)] = &[
        (DType::Q4_1, 576, 1536, "SmolLM2 ffn_up"),
        (DType::Q8_0, 576, 1536, ""),
        (DType::Q5_0, 896, 4864, "qwen-0.5b ffn"),
        (DType::Q6_K, 4864, 896, "qwen-0.5b ffn_down"),
        (DType::Q4_K, 1536, 8960, "qwen-1.5b ffn_up (repack GEMV)"),
        (DType::Q4_K, 1536, 8964, "rows % 8 != 0: vec_dot"),
    ];
    let isas: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.detected())
        .collect();
    println!("single thread, 1 column (GEMV); GB/s = weight bytes / time");
    for &(dt, k, n, note) in cases {
        let x = rand_f32(&mut seed, k * n);
        let rb = quant::row_bytes(dt, k).unwrap();
        let mut w = vec![0u8; rb * n];
        quant::quantize_row(dt, &x, &mut w).unwrap();
        let kernel = quant::matmul_kernel(dt, k, n, 1, 0);
        let a = rand_f32(&mut seed, k);
        let mut act = vec![0u8; quant::row_bytes(quant::vec_dot_type(dt), k).unwrap()];
        quant::quantize_activations_for(kernel, dt, &a, &mut act).unwrap();
        let mut out = vec![0f32; n];
        let ts = time(budget, || {
            for (o, row) in out.iter_mut().zip(w.chunks_exact(rb)) {
                *o = quant::dot_with(kernel, dt, k, row, &act);
            }
        });
        let want = out.clone();
        let gb = w.len() as f64 / 1e9;
        print!(
            "{dt:>5} {k:>5}x{n:<5} {kernel:<10?} scalar {:8.1} us {:6.2} GB/s",
            ts * 1e6,
            gb / ts
        );
        for &isa in &isas {
            let t = time(budget, || dot_rows(isa, kernel, dt, k, &w, &act, &mut out));
            assert!(out
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            print!(
                " | {isa:?} {:8.1} us {:6.2} GB/s x{:.1}",
                t * 1e6,
                gb / t,
                ts / t
            );
        }
        println!("  {note}");
    }

    println!("\nwhole mat_mul through the table (activation conversion included)");
    for threads in [1u32, 2] {
        let host = reference::scoped_threads_host(threads);
        for &(dt, k, n, cols) in &[
            (DType::Q4_1, 576, 1536, 1),
            (DType::Q4_K, 1536, 8960, 1),
            (DType::Q6_K, 4864, 896, 1),
            (DType::Q4_1, 576, 1536, 32),
            (DType::Q4_K, 1536, 8960, 32),
        ] {
            let x = rand_f32(&mut seed, k * n);
            let mut w = vec![0u8; quant::row_bytes(dt, k).unwrap() * n];
            quant::quantize_row(dt, &x, &mut w).unwrap();
            let mut a = rand_f32(&mut seed, k * cols);
            let mut o = vec![0f32; n * cols];
            let ins = [
                TensorDesc::contiguous(w.as_mut_ptr(), dt, &[k as i64, n as i64]),
                TensorDesc::contiguous(
                    a.as_mut_ptr() as *mut u8,
                    DType::F32,
                    &[k as i64, cols as i64],
                ),
            ];
            let outs = [TensorDesc::contiguous(
                o.as_mut_ptr() as *mut u8,
                DType::F32,
                &[n as i64, cols as i64],
            )];
            let call = OpCall::new(Op::MatMul, &ins, &outs, OpParams::default());
            let tr = time(budget, || run_table(&reference::TABLE, &host, &call));
            print!(
                "{threads} thr {dt:>5} {k:>5}x{n:<5} cols {cols:>2}: reference {:9.1} us",
                tr * 1e6
            );
            for (isa, h) in [(Isa::Avx2, &HEADER_AVX2), (Isa::Avx512, &HEADER_AVX512)] {
                if isa.detected() {
                    let t = time(budget, || run_table(unsafe { &*h.table }, &host, &call));
                    print!(" | {isa:?} {:9.1} us x{:.1}", t * 1e6, tr / t);
                }
            }
            println!();
        }
    }
}
