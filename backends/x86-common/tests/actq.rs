//! The SIMD activation conversions (`actq`) against quant's scalar twins, byte for byte.

use abi::DType;
use mollm_x86_common::{actq, Isa};
use quant::Kernel;

struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
}

/// Rows of several kinds: random, with outliers, exact ties (integers / halves), zero
/// blocks, +max and -max in one block, tiny and huge scales.
fn rows(rng: &mut Rng, n: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for kind in 0..9 {
        for _ in 0..6 {
            let scale = match rng.next_u64() % 4 {
                0 => 1e-6,
                1 => 1.0,
                2 => 300.0,
                _ => 1e4,
            };
            let mut v: Vec<f32> = (0..n)
                .map(|_| match kind {
                    0 => (rng.uniform() - 0.5) * scale,
                    1 => {
                        let x = (rng.uniform() - 0.5) * scale;
                        if rng.next_u64() % 50 == 0 {
                            x * 40.0
                        } else {
                            x
                        }
                    }
                    2 => ((rng.next_u64() % 255) as f32 - 127.0) * 0.5,
                    3 => (rng.next_u64() % 9) as f32 - 4.0,
                    _ => (rng.uniform() - 0.5) * scale,
                })
                .collect();
            match kind {
                4 => v.iter_mut().take(n / 2).for_each(|x| *x = 0.0),
                5 => {
                    // +max and -max in each 32- and 256-block, in both orders
                    for (b, c) in v.chunks_mut(32).enumerate() {
                        let m = scale * 2.0;
                        let (i, j) = (rng.next_u64() as usize % 32, rng.next_u64() as usize % 32);
                        if i != j {
                            c[i] = if b % 2 == 0 { m } else { -m };
                            c[j] = -c[i];
                        }
                    }
                }
                6 => v.iter_mut().for_each(|x| *x = -(x.abs())),
                7 => v
                    .iter_mut()
                    .for_each(|x| *x = if rng.next_u64() % 3 == 0 { -0.0 } else { *x }),
                8 => v.iter_mut().for_each(|x| *x = x.abs() * 1e-30),
                _ => {}
            }
            out.push(v);
        }
    }
    out
}

#[test]
fn simd_activation_rows_match_quant_byte_for_byte() {
    if !Isa::Avx2.detected() {
        eprintln!("no AVX2: SIMD activation conversion not tested");
        return;
    }
    let cases: &[(DType, &[Kernel])] = &[
        (DType::Q4_1, &[Kernel::VecDot]),
        (DType::Q8_0, &[Kernel::VecDot, Kernel::TinyBlas]),
        (DType::Q5_0, &[Kernel::VecDot, Kernel::TinyBlas]),
        (DType::Q6_K, &[Kernel::VecDot, Kernel::Tiled]),
        (
            DType::Q4_K,
            &[Kernel::VecDot, Kernel::RepackGemv, Kernel::Tiled],
        ),
    ];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut checked = 0;
    for &(dt, kernels) in cases {
        for n in [256usize, 512, 1536] {
            let rb = quant::row_bytes(quant::vec_dot_type(dt), n).unwrap();
            for row in rows(&mut rng, n) {
                for &kernel in kernels {
                    assert!(actq::has_simd(kernel, dt));
                    let mut want = vec![0u8; rb];
                    quant::quantize_activations_for(kernel, dt, &row, &mut want).unwrap();
                    let mut got = vec![0xAAu8; rb];
                    let ok = unsafe { actq::quantize_row(kernel, dt, &row, &mut got) };
                    assert!(ok, "{dt} {kernel:?}: no SIMD path for a finite row");
                    assert_eq!(got, want, "{dt} {kernel:?} n={n}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0);
    // non-finite rows are left to quant
    let mut row = vec![1.0f32; 256];
    row[77] = f32::NAN;
    let mut dst = vec![0u8; quant::row_bytes(DType::Q8_K, 256).unwrap()];
    assert!(!unsafe { actq::quantize_row(Kernel::VecDot, DType::Q4_K, &row, &mut dst) });
    row[77] = f32::INFINITY;
    let mut dst = vec![0u8; quant::row_bytes(DType::Q8_1, 256).unwrap()];
    assert!(!unsafe { actq::quantize_row(Kernel::VecDot, DType::Q4_1, &row, &mut dst) });
    // the repack GEMM's interleaved conversion stays scalar
    assert!(!actq::has_simd(Kernel::RepackGemm, DType::Q4_K));
}
