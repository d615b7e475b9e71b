//! Single-thread vec_dot throughput: `cargo run --release -p mollm-quant --example vec_dot_speed`.
use abi::DType;
use std::time::Instant;

fn main() {
    let n = 4096usize;
    let rows = 256usize;
    let mut seed = 0x1234_5678u64;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
    for dt in [
        DType::Q4_K,
        DType::Q4_1,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q6_K,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q5_K,
        DType::F16,
        DType::F32,
    ] {
        let rb = quant::row_bytes(dt, n).unwrap();
        let w: Vec<f32> = (0..n * rows).map(|_| rnd()).collect();
        let mut wq = vec![0u8; rb * rows];
        for (src, dst) in w.chunks(n).zip(wq.chunks_mut(rb)) {
            quant::quantize_row(dt, src, dst).unwrap();
        }
        let vt = quant::vec_dot_type(dt);
        let mut a = vec![0u8; quant::row_bytes(vt, n).unwrap()];
        quant::quantize_activations(dt, &x, &mut a).unwrap();
        let mut sink = 0f32;
        let reps = 20;
        let t = Instant::now();
        for _ in 0..reps {
            for r in wq.chunks(rb) {
                sink += quant::vec_dot(dt, n, r, &a);
            }
        }
        let s = t.elapsed().as_secs_f64();
        let elems = (n * rows * reps) as f64;
        println!("{dt:>5}: {:7.2} G elements/s  ({sink:.1})", elems / s / 1e9);
    }
}
