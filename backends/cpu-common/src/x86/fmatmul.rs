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
