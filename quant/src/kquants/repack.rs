//! Bit-exact scalar twins of llama.cpp's x86 K-quant matmul kernels.
//!
//! Greedy-decoding parity with llama.cpp needs the same float operations in the same order
//! (activations are re-quantized to 8 bits at every matmul, so one ulp can flip a rounding).
//! Integer parts are exact in every kernel (no i16 saturation is reachable with ggml's Q8_K
//! range of ±127), so each twin computes the same integer lane/partial sums directly from the
//! plain GGUF row and then replays the float ops: `_mm256_fmadd_ps` = one-rounding [`fma`],
//! `hsum_float_8`, and the scale products `d_w * d_a` rounded once.
//!
//! What ggml runs on this CPU (x86-64 with AVX2/AVX-512, `GGML_USE_CPU_REPACK`):
//!
//! * Q4_K with `ne[1] % 8 == 0` is repacked to `block_q4_Kx8` (`q4_K_8x8_q8_K`,
//!   ggml-cpu/repack.cpp `ggml_repack_get_optimal_repack_type`, `ggml_cpu_has_avx2()` arm);
//!   Q2_K with `ne[1] % 8 == 0` to `block_q2_Kx8` (`q2_K_8x8_q8_K`, `ggml_cpu_has_avx512()` arm).
//!   Q3_K, Q5_K, Q6_K are not repacked on x86 (only NEON arms exist for Q5_K/Q6_K).
//! * Repacked: `tensor_traits::forward_mul_mat` (repack.cpp) quantizes activation columns in
//!   groups of four with `ggml_quantize_mat_q8_K_4x8` and the `n_cols % 4` remaining ones with
//!   `quantize_row_q8_K`; `forward_mul_mat_one_chunk` runs `ggml_gemm_*_8x8_q8_K` over the
//!   first `n_cols - n_cols % 4` columns when `n_cols > 3`, and `ggml_gemv_*_8x8_q8_K` over each
//!   remaining column. The kernels are in ggml-cpu/arch/x86/repack.cpp. Each output element
//!   depends only on its own weight row and activation column (the 16-row/16-column AVX-512
//!   blocks and the AVX2 tails do the same per-element float ops), so the twins work per
//!   element from the plain row.
//! * Not repacked: `ggml_compute_forward_mul_mat` → `ggml_vec_dot_*_q8_K` (ggml-cpu/arch/x86/
//!   quants.c, `__AVX2__` branch); llamafile's tinyBLAS has no K-quant cases (sgemm.cpp).

use super::{scale_min_k4, BlockQ2K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::block::blocks;
use crate::util::*;

// ---------------------------------------------------------------- activations

/// `ggml_quantize_mat_q8_K_4x8` (AVX2 branch) for one of its four rows. Values equal
/// `quantize_row_q8_K_ref` except for the sign of the scale when the largest magnitude `M`
/// occurs with both signs: x86 uses `iscale = -127/M` if any element equals `+M`, else
/// `127/M`, where the reference takes the sign of the first such element. Rounding
/// (`_mm256_round_ps` nearest-even) and `d = 1/iscale` are as in the reference. Bsums hold the
/// same per-16 sums (the interleaved storage is ggml's, not ours).
pub(crate) fn quantize_q8_k_4x8(x: &[f32]) -> BlockQ8K {
    let mut y = BlockQ8K::default();
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        return y;
    }
    let iscale = if x.iter().any(|&v| v == amax) {
        -127.0 / amax
    } else {
        127.0 / amax
    };
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).clamp(-128, 127) as i8;
    }
    for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
    }
    y.d = 1.0 / iscale;
    y
}

pub(crate) fn quantize_row_q8_k_4x8(src: &[f32], dst: &mut [u8]) {
    crate::kquants_ref::quantize_with(quantize_q8_k_4x8, src, dst);
}

// ---------------------------------------------------------------- Q4_K

/// Per 32-element sub-block of a Q4_K block: `sc[s] * Σ q·q8` and the mins term pieces.
#[inline(always)]
fn q4k_parts(x: &BlockQ4K, y: &BlockQ8K) -> ([i32; 8], [i32; 8]) {
    let (sc, m) = scale_min_k4(&x.scales);
    let a = x.unpack();
    let mut isum = [0i32; 8];
    let mut imin = [0i32; 8];
    for s in 0..8 {
        isum[s] = sc[s] as i32 * dot_i8(&a[32 * s..32 * s + 32], &y.qs[32 * s..32 * s + 32]);
        imin[s] = m[s] as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32);
    }
    (isum, imin)
}

/// `ggml_gemv_q4_K_8x8_q8_K`: one fma per super block for the scaled sums and one for the mins,
/// `acc - acc_min` at the end.
pub(crate) fn gemv_q4_k(w: &[u8], act: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        let (isum, imin) = q4k_parts(&x, &y);
        let dw = fp16_to_f32(x.d.to_bits()) * y.d;
        let dm = fp16_to_f32(x.dmin.to_bits()) * y.d;
        acc = fma(isum.iter().sum::<i32>() as f32, dw, acc);
        accm = fma(imin.iter().sum::<i32>() as f32, dm, accm);
    }
    acc - accm
}

/// `ggml_gemm_q4_K_8x8_q8_K`: the fmas run per pair of sub-blocks (`sb` loop, 64 elements).
pub(crate) fn gemm_q4_k(w: &[u8], act: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        let (isum, imin) = q4k_parts(&x, &y);
        let dw = fp16_to_f32(x.d.to_bits()) * y.d;
        let dm = fp16_to_f32(x.dmin.to_bits()) * y.d;
        for sb in 0..4 {
            acc = fma((isum[2 * sb] + isum[2 * sb + 1]) as f32, dw, acc);
            accm = fma((imin[2 * sb] + imin[2 * sb + 1]) as f32, dm, accm);
        }
    }
    acc - accm
}

/// `ggml_vec_dot_q4_K_q8_K`, AVX2 branch: 8 int lanes (lane `l` = bytes `4l..4l+4` of every
/// 32-element sub-block, times its scale), `acc = fma(d, lane, acc)`; mins in 4 lanes
/// `fma(-dmin, m[2k]s[2k] + m[2k+1]s[2k+1], acc_m)`; `hsum_float_8(acc) + ((m0+m2)+(m1+m3))`.
pub(crate) fn vec_dot_q4_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut accm = [0.0f32; 4];
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        let d = y.d * fp16_to_f32(x.d.to_bits());
        let dmin = -y.d * fp16_to_f32(x.dmin.to_bits());
        let (sc, m) = scale_min_k4(&x.scales);
        let q8s: [i32; 8] = core::array::from_fn(|j| {
            (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32) as i16 as i32
        });
        for k in 0..4 {
            let prod = m[2 * k] as i32 * q8s[2 * k] + m[2 * k + 1] as i32 * q8s[2 * k + 1];
            accm[k] = fma(dmin, prod as f32, accm[k]);
        }
        let a = x.unpack();
        let mut sumi = [0i32; 8];
        for s in 0..8 {
            let lanes = dot_i8_quads(
                a[32 * s..32 * s + 32].try_into().unwrap(),
                y.qs[32 * s..32 * s + 32].try_into().unwrap(),
            );
            for l in 0..8 {
                sumi[l] += sc[s] as i32 * lanes[l] as i32;
            }
        }
        for l in 0..8 {
            acc[l] = fma(d, sumi[l] as f32, acc[l]);
        }
    }
    let m01 = [accm[0] + accm[2], accm[1] + accm[3]];
    hsum_float_8(&acc) + (m01[0] + m01[1])
}

// ---------------------------------------------------------------- Q6_K

/// `ggml_vec_dot_q6_K_q8_K`, AVX2 branch: unsigned 6-bit quants (0..64) in 8 int lanes (lane `l`
/// = bytes `4l..4l+4` of each 32-element group times the scale of its 16-element half), minus
/// `32 * (bsum[2l]*sc[2l] + bsum[2l+1]*sc[2l+1])`; `acc = fma(d, lane, acc)`; `hsum_float_8`.
pub(crate) fn vec_dot_q6_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in blocks::<BlockQ6K>(w).zip(blocks::<BlockQ8K>(act)) {
        let d = y.d * fp16_to_f32(x.d.to_bits());
        let a = x.unpack();
        let mut sumi = [0i32; 8];
        for g in 0..8 {
            for l in 0..8 {
                let sc = x.scales[2 * g + (l >= 4) as usize] as i32;
                let mut s = 0i32;
                for e in 32 * g + 4 * l..32 * g + 4 * l + 4 {
                    s += (a[e] as i32 + 32) * y.qs[e] as i32;
                }
                sumi[l] += sc * s;
            }
        }
        for l in 0..8 {
            let sub = (y.bsums[2 * l] as i32 * x.scales[2 * l] as i32
                + y.bsums[2 * l + 1] as i32 * x.scales[2 * l + 1] as i32)
                << 5;
            acc[l] = fma(d, (sumi[l] - sub) as f32, acc[l]);
        }
    }
    hsum_float_8(&acc)
}

// ---------------------------------------------------------------- Q5_K, Q2_K (vec_dot)

/// `ggml_vec_dot_q5_K_q8_K`, AVX2 branch: the Q4_K lane structure with 5-bit quants; the mins
/// are reduced to one integer per block and enter as `summs += dmin * isum` (GCC contracts it
/// to an fma); `hsum_float_8(acc) + summs`.
pub(crate) fn vec_dot_q5_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut summs = 0.0f32;
    for (x, y) in blocks::<BlockQ5K>(w).zip(blocks::<BlockQ8K>(act)) {
        let d = y.d * fp16_to_f32(x.d.to_bits());
        let dmin = -y.d * fp16_to_f32(x.dmin.to_bits());
        let (sc, m) = scale_min_k4(&x.scales);
        let mut imin = 0i32;
        for j in 0..8 {
            imin +=
                m[j] as i32 * ((y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32) as i16 as i32);
        }
        summs = fma(dmin, imin as f32, summs);
        let a = x.unpack();
        let mut sumi = [0i32; 8];
        for s in 0..8 {
            let lanes = dot_i8_quads(
                a[32 * s..32 * s + 32].try_into().unwrap(),
                y.qs[32 * s..32 * s + 32].try_into().unwrap(),
            );
            for l in 0..8 {
                sumi[l] += sc[s] as i32 * lanes[l] as i32;
            }
        }
        for l in 0..8 {
            acc[l] = fma(d, sumi[l] as f32, acc[l]);
        }
    }
    hsum_float_8(&acc) + summs
}

/// `ggml_vec_dot_q2_K_q8_K`, AVX2 branch: per block first `acc = fma(-dmin, m[2l]b[2l] +
/// m[2l+1]b[2l+1], acc)` (8 lanes over the 16 bsums), then `acc = fma(d, lane, acc)` with lane
/// `l` = bytes `4l..4l+4` of each 32-element group times the scale of its 16-element half.
pub(crate) fn vec_dot_q2_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (x, y) in blocks::<BlockQ2K>(w).zip(blocks::<BlockQ8K>(act)) {
        let d = y.d * fp16_to_f32(x.d.to_bits());
        let dmin = -y.d * fp16_to_f32(x.dmin.to_bits());
        for l in 0..8 {
            let prod = (x.scales[2 * l] >> 4) as i32 * y.bsums[2 * l] as i32
                + (x.scales[2 * l + 1] >> 4) as i32 * y.bsums[2 * l + 1] as i32;
            acc[l] = fma(dmin, prod as f32, acc[l]);
        }
        let a = x.unpack();
        let mut sumi = [0i32; 8];
        for g in 0..8 {
            for l in 0..8 {
                let sc = (x.scales[2 * g + (l >= 4) as usize] & 0xF) as i32;
                let mut s = 0i32;
                for e in 32 * g + 4 * l..32 * g + 4 * l + 4 {
                    s += a[e] as i32 * y.qs[e] as i32;
                }
                sumi[l] += sc * s;
            }
        }
        for l in 0..8 {
            acc[l] = fma(d, sumi[l] as f32, acc[l]);
        }
    }
    hsum_float_8(&acc)
}

// ---------------------------------------------------------------- Q2_K (repacked)

/// Per 16-element sub-block of a Q2_K block: `(sc & 15) * Σ q·q8` and `(sc >> 4) * bsum`.
#[inline(always)]
fn q2k_parts(x: &BlockQ2K, y: &BlockQ8K) -> ([i32; 16], [i32; 16]) {
    let a = x.unpack();
    let mut isum = [0i32; 16];
    let mut imin = [0i32; 16];
    for g in 0..16 {
        isum[g] = (x.scales[g] & 0xF) as i32
            * dot_i8(&a[16 * g..16 * g + 16], &y.qs[16 * g..16 * g + 16]);
        imin[g] = (x.scales[g] >> 4) as i32 * y.bsums[g] as i32;
    }
    (isum, imin)
}

/// `ggml_gemv_q2_K_8x8_q8_K`: as Q4_K's gemv, one fma per super block for each accumulator.
pub(crate) fn gemv_q2_k(w: &[u8], act: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for (x, y) in blocks::<BlockQ2K>(w).zip(blocks::<BlockQ8K>(act)) {
        let (isum, imin) = q2k_parts(&x, &y);
        let dw = fp16_to_f32(x.d.to_bits()) * y.d;
        let dm = fp16_to_f32(x.dmin.to_bits()) * y.d;
        acc = fma(isum.iter().sum::<i32>() as f32, dw, acc);
        accm = fma(imin.iter().sum::<i32>() as f32, dm, accm);
    }
    acc - accm
}

/// `ggml_gemm_q2_K_8x8_q8_K`: the fmas run per 128-element half (`sb` loop).
pub(crate) fn gemm_q2_k(w: &[u8], act: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0.0f32, 0.0f32);
    for (x, y) in blocks::<BlockQ2K>(w).zip(blocks::<BlockQ8K>(act)) {
        let (isum, imin) = q2k_parts(&x, &y);
        let dw = fp16_to_f32(x.d.to_bits()) * y.d;
        let dm = fp16_to_f32(x.dmin.to_bits()) * y.d;
        for sb in 0..2 {
            acc = fma(isum[8 * sb..8 * sb + 8].iter().sum::<i32>() as f32, dw, acc);
            accm = fma(
                imin[8 * sb..8 * sb + 8].iter().sum::<i32>() as f32,
                dm,
                accm,
            );
        }
    }
    acc - accm
}
