//! The W4G32 / W4G128 / W8PC matmul on every frame this CPU runs (the portable twin everywhere,
//! AVX2 and AVX-512 VNNI on x86) against `quant::vec_dot`, the formats' reference, bit for bit.

use abi::{DType, TensorDesc};
use mollm_cpu_common::wmatmul::{run, Frame};

fn frames() -> Vec<Frame> {
    #[allow(unused_mut)]
    let mut v = vec![Frame::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| match f {
            "avx2" => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            _ => {
                is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
        };
        if has("avx2") {
            v.push(Frame::Avx2);
            if has("avx512") {
                v.push(Frame::Avx512);
            }
        }
    }
    v
}

#[test]
fn every_frame_matches_the_reference_bit_for_bit() {
    let host = reference::serial_host();
    let mut s = 5u64;
    let mut rnd = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut checked = 0;
    for &(dt, k, n) in &[
        (DType::W4G32, 576usize, 7usize),
        (DType::W4G128, 1152, 5),
        (DType::W4G128, 384, 3),
        (DType::W8PC, 640, 4),
    ] {
        let rb = quant::row_bytes(dt, k).unwrap();
        let mut w = vec![0u8; rb * n];
        for r in 0..n {
            let row: Vec<f32> = (0..k).map(|_| rnd() * 0.5).collect();
            quant::quantize_row(dt, &row, &mut w[r * rb..(r + 1) * rb]).unwrap();
        }
        if dt == DType::W8PC {
            // Each block carries its scale: kernels must read every block's, not the first.
            for (b, blk) in w.chunks_exact_mut(68).enumerate() {
                let d = f32::from_le_bytes(blk[..4].try_into().unwrap()) * (1 + b % 3) as f32;
                blk[..4].copy_from_slice(&d.to_le_bytes());
            }
        }
        for cols in [1usize, 3, 5, 9] {
            let mut x: Vec<f32> = (0..k * cols).map(|_| rnd() * 2.0).collect();
            let vt = quant::vec_dot_type(dt);
            let mut want = vec![0f32; n * cols];
            for c in 0..cols {
                let mut a = vec![0u8; quant::row_bytes(vt, k).unwrap()];
                quant::quantize_activations(dt, &x[c * k..(c + 1) * k], &mut a).unwrap();
                for r in 0..n {
                    want[c * n + r] = quant::vec_dot(dt, k, &w[r * rb..(r + 1) * rb], &a);
                }
            }
            for frame in frames() {
                let mut got = vec![f32::NAN; n * cols];
                let ins = [
                    TensorDesc::contiguous(w.as_mut_ptr(), dt, &[k as i64, n as i64]),
                    TensorDesc::contiguous(
                        x.as_mut_ptr() as *mut u8,
                        DType::F32,
                        &[k as i64, cols as i64],
                    ),
                ];
                let outs = [TensorDesc::contiguous(
                    got.as_mut_ptr() as *mut u8,
                    DType::F32,
                    &[n as i64, cols as i64],
                )];
                // SAFETY: valid descriptors; the frame was detected.
                unsafe { run(frame, &host, &ins, &outs) }.unwrap();
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{dt} {frame:?} k={k} cols={cols} elem {i}: {g} vs {e}"
                    );
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} outputs bit-identical");
}
