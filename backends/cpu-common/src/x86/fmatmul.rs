//! [`crate::fmatmul`]'s dot in an AVX2 + FMA frame, where the CPU has them: the same chain,
//! its `mul_add`s one instruction each.

use crate::fmatmul::{dot_body, Chain};

/// `dot_body(chain, x, y)` compiled for AVX2 + FMA; `None` where the CPU lacks them.
pub(crate) fn dot(chain: Chain, x: &[f32], y: &[f32]) -> Option<f32> {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_frame(chain: Chain, x: &[f32], y: &[f32]) -> f32 {
        dot_body(chain, x, y)
    }
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the features were detected.
        return Some(unsafe { fma_frame(chain, x, y) });
    }
    None
}

/// `dot_tile_lanes_x4(x, y)` compiled for AVX2 + FMA; `None` where the CPU lacks them.
pub(crate) fn dot_x4(x: &[f32], y: [&[f32]; 4]) -> Option<[f32; 4]> {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_frame(x: &[f32], y: [&[f32]; 4]) -> [f32; 4] {
        ::numerics::dot_tile_lanes_x4(x, y)
    }
    if std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the features were detected.
        return Some(unsafe { fma_frame(x, y) });
    }
    None
}

/// `[dot_tile_lanes_x4(x0, y), dot_tile_lanes_x4(x1, y)]` with AVX-512 registers: the same 16
/// lanes per chain, each `mul_add` one `vfmadd`, eight chains in eight registers, each `y`
/// loaded once for both rows; `None` where the CPU lacks AVX-512.
pub(crate) fn dot_2x4(x0: &[f32], x1: &[f32], y: [&[f32]; 4]) -> Option<[[f32; 4]; 2]> {
    #[target_feature(enable = "avx512f")]
    unsafe fn frame(x0: &[f32], x1: &[f32], y: [&[f32]; 4]) -> [[f32; 4]; 2] {
        use core::arch::x86_64::*;
        let n = x0.len().min(x1.len()) & !15;
        assert!(
            y.iter().all(|v| v.len() >= n),
            "columns shorter than the rows"
        );
        let mut acc = [_mm512_setzero_ps(); 8];
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n, and every operand holds n values.
            unsafe {
                let a = _mm512_loadu_ps(x0.as_ptr().add(i));
                let b = _mm512_loadu_ps(x1.as_ptr().add(i));
                for c in 0..4 {
                    let v = _mm512_loadu_ps(y[c].as_ptr().add(i));
                    acc[c] = _mm512_fmadd_ps(a, v, acc[c]);
                    acc[4 + c] = _mm512_fmadd_ps(b, v, acc[4 + c]);
                }
            }
            i += 16;
        }
        let lanes = |v: __m512| {
            let mut t = [0f32; 16];
            // SAFETY: t holds 16 values.
            unsafe { _mm512_storeu_ps(t.as_mut_ptr(), v) };
            ::numerics::reduce16(&t)
        };
        [
            [lanes(acc[0]), lanes(acc[1]), lanes(acc[2]), lanes(acc[3])],
            [lanes(acc[4]), lanes(acc[5]), lanes(acc[6]), lanes(acc[7])],
        ]
    }
    if super::has_avx512() {
        // SAFETY: the features were detected.
        return Some(unsafe { frame(x0, x1, y) });
    }
    None
}

#[cfg(test)]
mod tests {
    /// The blocked kernels give what the reference's one-column tile chain gives, bit for bit
    /// (values of mixed signs and magnitudes, so that any change of order shows).
    #[test]
    fn blocked_tile_kernels_equal_the_reference_chain() {
        let mut s = 0x9e3779b97f4a7c15u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 + (s & 7)) as f32
                })
                .collect()
        };
        for k in [16usize, 48, 384, 1536] {
            let (x0, x1) = (rnd(k), rnd(k));
            let ys: Vec<Vec<f32>> = (0..4).map(|_| rnd(k)).collect();
            let y = [&ys[0][..], &ys[1][..], &ys[2][..], &ys[3][..]];
            let want = |x: &[f32]| y.map(|c| ::numerics::dot_tile(x, c).to_bits());
            if let Some(v) = super::dot_x4(&x0, y) {
                assert_eq!(v.map(f32::to_bits), want(&x0), "x4, k={k}");
            }
            if let Some(v) = super::dot_2x4(&x0, &x1, y) {
                assert_eq!(v[0].map(f32::to_bits), want(&x0), "2x4 row 0, k={k}");
                assert_eq!(v[1].map(f32::to_bits), want(&x1), "2x4 row 1, k={k}");
            }
        }
    }
}
