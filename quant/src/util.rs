//! Scalar helpers shared by every format: half-precision conversions and ggml's rounding.

use half::f16;

/// ggml `GGML_FP16_TO_FP32`: exact widening.
#[inline(always)]
pub fn fp16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// ggml `GGML_FP32_TO_FP16` (and `GGML_CPU_FP32_TO_FP16`, F16C `vcvtps2ph` with imm 0 on x86):
/// round to nearest, ties to even.
#[inline(always)]
pub fn f32_to_fp16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// ggml `GGML_BF16_TO_FP32`: the 16 bits become the high half of an f32.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// ggml `ggml_compute_fp32_to_bf16` (`GGML_FP32_TO_BF16`): NaN is truncated and forced quiet
/// (`| 64`), everything else rounds to nearest, ties to even (overflow rounds to infinity).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// ggml `nearest_int` (ggml-quants.c): adds 1.5·2^23 so the FPU rounds (ties to even under the
/// default rounding mode) and reads the integer back out of the mantissa. Valid for
/// |x| <= 4194303, like the C version.
#[inline(always)]
pub fn nearest_int(fval: f32) -> i32 {
    debug_assert!(fval.abs() <= 4194303.0 || fval.is_nan());
    let val = fval + 12582912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

#[inline(always)]
pub(crate) fn le_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f16 {
    f16::from_bits(le_u16(b, off))
}

#[inline(always)]
pub(crate) fn arr<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    b[off..off + N].try_into().expect("slice length")
}

#[inline(always)]
pub(crate) fn arr_i8<const N: usize>(b: &[u8], off: usize) -> [i8; N] {
    let a: [u8; N] = arr(b, off);
    a.map(|v| v as i8)
}

/// Integer dot product of two equally long i8 slices; written so it autovectorizes.
#[inline(always)]
pub(crate) fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// Per-lane integer dot product: lane `l` sums `a[8c + l] * b[8c + l]` over chunks `c`.
/// This is the `aux16`/`aux32` lane structure of ggml's generic K-quant dot products.
#[inline(always)]
pub(crate) fn dot_i8_lanes(a: &[i8], b: &[i8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += ca[l] as i32 * cb[l] as i32;
        }
    }
    lanes
}
