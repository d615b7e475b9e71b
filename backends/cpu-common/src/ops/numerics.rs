//! ggml's numerics as the reference computes them, in SIMD: the exps (AVX2/AVX-512 twins of
//! the reference's `v_expf`) and `soft_max_f32`. Shared by softmax, glu and attention.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;
#[cfg(x86)]
use crate::x86::numerics::*;

// The scalar twins are the reference's (one copy): `reduce16`, `v_expf` (which the SIMD exps
// below equal bit for bit), SiLU, `ggml_max`, the GELU table.
pub(crate) use ::numerics::reduce16;
#[cfg(test)]
pub(crate) use ::numerics::v_silu;
pub(crate) use ::numerics::{
    gated_delta_net_token, gelu_table, ggml_max, rwkv_wkv7_token, silu_scalar, ssm_conv_dot, v_expf,
};

/// `ggml_vec_soft_max_f32` (AVX-512): exps into `y`, their sum in f64. The 16-lane steps
/// by [`expf16`] (SIMD, bit-identical to [`v_expf`] per lane).
#[inline(always)]
pub(crate) unsafe fn soft_max_f32(isa: Isa, x: &[f32], y: &mut [f32], max: f32) -> f64 {
    let n = x.len();
    let mut sum = 0f64;
    let mut i = 0;
    #[cfg(x86)]
    if isa == Isa::Avx512 {
        while i + 255 < n {
            for s in exp_sums256(x.as_ptr().add(i), max, y.as_mut_ptr().add(i)) {
                sum += s as f64;
            }
            i += 256;
        }
    }
    while i + 15 < n {
        let mut v = [0f32; 16];
        expf16(isa, x[i..i + 16].try_into().unwrap(), max, &mut v);
        y[i..i + 16].copy_from_slice(&v);
        sum += reduce16(&v) as f64;
        i += 16;
    }
    while i < n {
        let v = (x[i] - max).exp();
        sum += v as f64;
        y[i] = v;
        i += 1;
    }
    sum
}

/// `out[l] = v_expf(x[l] - max)` for 16 lanes.
#[inline(always)]
pub(crate) unsafe fn expf16(isa: Isa, x: &[f32; 16], max: f32, out: &mut [f32; 16]) {
    match isa {
        #[cfg(x86)]
        Isa::Avx512 => expf16_avx512(x, max, out),
        #[cfg(x86)]
        Isa::Avx2 => {
            expf8_avx2(
                x[..8].try_into().unwrap(),
                max,
                (&mut out[..8]).try_into().unwrap(),
            );
            expf8_avx2(
                x[8..].try_into().unwrap(),
                max,
                (&mut out[8..]).try_into().unwrap(),
            );
        }
        _ => {
            for l in 0..16 {
                out[l] = v_expf(x[l] - max);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD exps (both ISAs) equal the scalar twin `v_expf` bit for bit, across the range
    /// (underflow to subnormals and zero, overflow, -inf, exact integers).
    #[test]
    fn expf16_matches_v_expf() {
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::NEG_INFINITY,
            -1e30,
            1e30,
            88.7,
            89.0,
        ];
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            let range = [1.0f32, 20.0, 110.0, 200.0][(s % 4) as usize];
            xs.push((u - 0.8) * range);
        }
        for k in -160..100 {
            xs.push(k as f32 * std::f32::consts::LN_2);
            xs.push(k as f32);
        }
        while xs.len() % 16 != 0 {
            xs.push(-3.0);
        }
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if !isa.detected() {
                continue;
            }
            for max in [0.0f32, 1.5, -2.0] {
                for c in xs.chunks_exact(16) {
                    let x: &[f32; 16] = c.try_into().unwrap();
                    let mut got = [0f32; 16];
                    unsafe { expf16(isa, x, max, &mut got) };
                    for l in 0..16 {
                        let want = v_expf(x[l] - max);
                        assert_eq!(
                            got[l].to_bits(),
                            want.to_bits(),
                            "{isa:?} x={} max={max}: {} vs {want}",
                            x[l],
                            got[l]
                        );
                    }
                }
            }
        }
    }
}
