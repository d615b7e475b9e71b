//! Scalar helpers shared by every format: half-precision conversions and ggml's rounding.

use half::f16;

/// ggml `GGML_FP16_TO_FP32`: exact widening.
///
/// Branch-free: the f16 exponent/mantissa bits are placed in an f32 and rescaled by 2^112,
/// which is exact for normal and subnormal halves; infinities and NaNs are patched by a select.
/// (`half`'s portable conversion is branchy and dominated the dot products.)
#[inline(always)]
pub fn fp16_to_f32(bits: u16) -> f32 {
    let h = bits as u32;
    let sign = (h & 0x8000) << 16;
    let mag = (h & 0x7fff) << 13;
    let scaled = f32::from_bits(mag) * f32::from_bits(0x7780_0000); // 2^112
    let finite = scaled.to_bits();
    // exponent 31: inf, or NaN with the same payload made quiet (as F16C `vcvtph2ps` does)
    let quiet = if h & 0x03ff != 0 { 0x0040_0000 } else { 0 };
    let special = mag | 0x7f80_0000 | quiet;
    let out = if (h & 0x7c00) == 0x7c00 {
        special
    } else {
        finite
    };
    f32::from_bits(out | sign)
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

// ---------------------------------------------------------------- x86 lane emulation
//
// llama.cpp's x86 kernels accumulate in 8 f32 lanes (one `__m256`) with fused multiply-adds
// and reduce with `hsum_float_8`. Greedy decoding is chaotic enough (activations are
// re-quantized to 8 bits at every matmul, so one ulp can flip a rounding) that parity needs
// the same float operations in the same order; these helpers are that order, in scalar code.

/// `fma(a, b, c)` with one rounding, as `_mm256_fmadd_ps` and GCC's contracted `a*b + c`.
#[inline(always)]
pub(crate) fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// ggml's `hsum_float_8`: `(x0+x4) + (x2+x6)` and `(x1+x5) + (x3+x7)`, then their sum.
#[inline(always)]
pub(crate) fn hsum_float_8(x: &[f32; 8]) -> f32 {
    let r = [x[4] + x[0], x[5] + x[1], x[6] + x[2], x[7] + x[3]];
    let r0 = r[0] + r[2];
    let r1 = r[1] + r[3];
    r0 + r1
}

/// Eight int32 lanes of a 32-byte block product, lane `k` summing elements `4k..4k+4`: what
/// `_mm256_dpbusd_epi32` / `mul_sum_us8_pairs_float` leave before `_mm256_cvtepi32_ps`.
#[inline(always)]
pub(crate) fn dot_i8_quads(a: &[i8; 32], b: &[i8; 32]) -> [f32; 8] {
    let mut out = [0f32; 8];
    for k in 0..8 {
        let mut s = 0i32;
        for e in 4 * k..4 * k + 4 {
            s += a[e] as i32 * b[e] as i32;
        }
        out[k] = s as f32;
    }
    out
}
