//! Plain element formats: F32, F16, BF16.
//!
//! Dot products follow ggml's scalar `ggml_vec_dot_{f32,f16,bf16}` (ggml-cpu/vec.cpp): each
//! product is formed in f32 (exact for f16×f16 and bf16×bf16) and accumulated in `ggml_float`
//! (f64). We keep 8 independent f64 partial sums so the loop vectorizes; the difference from a
//! single sequential f64 sum is far below f32 resolution of the result.

use crate::util::*;
use abi::DType;

const _: () = assert!(DType::F16.info().block_bytes == 2 && DType::BF16.info().block_bytes == 2);
const _: () = assert!(DType::F32.info().block_bytes == 4);

pub(crate) fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::F32 => dst.iter_mut().zip(src.chunks_exact(4)).for_each(|(y, b)| {
            *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }),
        DType::F16 => dst.iter_mut().zip(src.chunks_exact(2)).for_each(|(y, b)| {
            *y = fp16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }),
        DType::BF16 => dst.iter_mut().zip(src.chunks_exact(2)).for_each(|(y, b)| {
            *y = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }),
        _ => unreachable!("float::dequantize({dtype})"),
    }
}

/// F32 copy, `GGML_FP32_TO_FP16` (round to nearest even) or `GGML_FP32_TO_BF16` (ggml's
/// rounding, NaN forced quiet). On x86 `ggml_cpu_fp32_to_fp16` uses F16C `_mm256_cvtps_ph(x, 0)`,
/// also round-to-nearest-even, and `ggml_cpu_fp32_to_bf16` is the scalar `GGML_FP32_TO_BF16`
/// loop, so the same functions serve as activation conversions.
pub(crate) fn quantize(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::F32 => dst
            .chunks_exact_mut(4)
            .zip(src)
            .for_each(|(o, &x)| o.copy_from_slice(&x.to_le_bytes())),
        DType::F16 => dst
            .chunks_exact_mut(2)
            .zip(src)
            .for_each(|(o, &x)| o.copy_from_slice(&f32_to_fp16(x).to_le_bytes())),
        DType::BF16 => dst
            .chunks_exact_mut(2)
            .zip(src)
            .for_each(|(o, &x)| o.copy_from_slice(&f32_to_bf16(x).to_le_bytes())),
        _ => unreachable!("float::quantize({dtype})"),
    }
}

#[inline(always)]
fn dot_by<const W: usize>(w: &[u8], a: &[u8], conv: impl Fn(&[u8]) -> f32 + Copy) -> f32 {
    let load8 = |b: &[u8]| -> [f32; 8] { core::array::from_fn(|l| conv(&b[l * W..l * W + W])) };
    let mut acc = [0.0f64; 8];
    let (wc, ac) = (w.chunks_exact(8 * W), a.chunks_exact(8 * W));
    let (wr, ar) = (wc.remainder(), ac.remainder());
    for (wb, ab) in wc.zip(ac) {
        let (x, y) = (load8(wb), load8(ab));
        for l in 0..8 {
            acc[l] += (x[l] * y[l]) as f64;
        }
    }
    let mut sum = 0.0f64;
    for (wb, ab) in wr.chunks_exact(W).zip(ar.chunks_exact(W)) {
        sum += (conv(wb) * conv(ab)) as f64;
    }
    let total = acc.iter().sum::<f64>() + sum;
    total as f32
}

pub(crate) fn vec_dot(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    match dtype {
        DType::F32 => dot_by::<4>(w, act, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F16 => dot_by::<2>(w, act, |b| fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        DType::BF16 => dot_by::<2>(w, act, |b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        _ => unreachable!("float::vec_dot({dtype})"),
    }
}
