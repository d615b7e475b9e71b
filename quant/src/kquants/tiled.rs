//! Bit-exact scalar twin of llama.cpp's tiled K-quant matmul (ggml-cpu/tiled/: tiled.cpp,
//! tiled-kernel.cpp), a child module of `kquants` like `repack.rs`.
//!
//! When it runs: `ggml_compute_forward_mul_mat` (ggml-cpu.c) calls
//! `ggml_compute_forward_mul_mat_tiled` first, which takes the whole op when
//! * the build has AVX/AVX2/AVX-512 VNNI (x86 here) and `GGML_CPU_TILED_MM` is unset or non-zero,
//!   and the op is not run with `use_ref`;
//! * `src0->extra == NULL`, i.e. the weight is not in the CPU repack buffer (repacked Q4_K/Q2_K
//!   with `ne[1] % 8 == 0` are dispatched by the extra buffer before `mul_mat` anyway);
//! * src0 is Q6_K, Q5_K, Q4_K, Q3_K, Q2_K (or IQ4_XS, IQ2_XXS/XS/S, IQ3_XXS/S, IQ1_S/M); the
//!   `src1` type test after the type switch in `ggml_tiled_supported` is dead code, src1 is in
//!   practice f32, converted with `quantize_row_q8_K` (= `quantize_row_q8_K_ref`, per column);
//! * `src1->ne[1] >= 8` (`ggml_tiled_min_batch`; `GGML_CPU_TILED_MM_FORCE=1` drops the floor).
//!
//! What it computes (this machine's build is `-march=native` with AVX-512 VNNI/VL/DQ, so the
//! `tiled_run_micro_vnni_8x16` microkernel runs; checked in the disassembly: `vpdpbusd`,
//! `vcvtdq2ps`, `vmulps`, `vfnmadd132ps`, `vfmadd213ps`): for every 256-element block `b`
//! of weight row `i` and activation column `j`, all in exact int32 arithmetic,
//! `s1 = Σ_s scale_s · Σ_{e∈s} w_e · a_e` over the sub-blocks `s` (16 or 32 elements; `w` the
//! signed integer weight, i.e. unsigned codes minus BIAS = 32 for Q6_K, 4 for Q3_K — the kernel
//! computes `raw - BIAS·bsum`, the same integer), and for Q4_K/Q5_K/Q2_K
//! `s2 = Σ_s min_s · bsum_s` (`bsum_s` from the Q8_K `bsums`). Then in f32:
//! `res = f32(s1) * d_w`; with mins `res = fma(-dmin_w, f32(s2), res)` (`_mm512_fnmadd_ps`);
//! `acc = fma(res, d_a, acc)` (GCC contracts the `_mm512_add_ps(acc, _mm512_mul_ps(res, d1))`),
//! `acc` starting at +0.0 and running over the blocks in K order. Both driver paths (256-row
//! windows, and the narrow `num_k` path taken when a window has ≤ 16 columns) accumulate the
//! same per-block values in the same order, so the result does not depend on the thread count
//! or chunking (the oracle checks 1, 2 and 3 threads). Each output element depends only on its
//! own weight row and activation column: no per-tile shared scaling.
//!
//! Unlike `ggml_vec_dot_*_q8_K` (8 float lanes, `d_w*d_a` rounded first, a final horizontal
//! sum) the scales are applied in a different order, hence last-bit differences with vec_dot.

use super::{scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use crate::block::blocks;
use crate::util::*;
use abi::DType;

/// Σ over 16-element sub-blocks of `scale[s] * Σ w·a` (int32, wrapping like `vpmulld/vpaddd`).
#[inline(always)]
fn sum16(w: &[i8; 256], a: &[i8; 256], scale: impl Fn(usize) -> i32, sub: usize) -> i32 {
    let mut s1 = 0i32;
    for s in 0..256 / sub {
        let mut raw = 0i32;
        for e in s * sub..(s + 1) * sub {
            raw += w[e] as i32 * a[e] as i32;
        }
        s1 = s1.wrapping_add(raw.wrapping_mul(scale(s)));
    }
    s1
}

/// The per-block epilogue of `tiled_run_micro_vnni_8x16` and the accumulation into `acc`.
#[inline(always)]
fn step(acc: f32, s1: i32, d: f32, min: Option<(f32, i32)>, da: f32) -> f32 {
    let mut res = s1 as f32 * d;
    if let Some((dmin, s2)) = min {
        res = fma(-dmin, s2 as f32, res);
    }
    fma(res, da, acc)
}

/// One output element of the tiled matmul (weight row `w` of `dtype`, Q8_K activation `act`).
#[inline(always)]
pub(crate) fn dot(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    match dtype {
        DType::Q6_K => dot_q6_k(w, act),
        DType::Q5_K => dot_q5_k(w, act),
        DType::Q4_K => dot_q4_k(w, act),
        DType::Q3_K => dot_q3_k(w, act),
        DType::Q2_K => dot_q2_k(w, act),
        _ => panic!("the tiled matmul has no {dtype} twin"),
    }
}

/// Q6_K: SUBBLK 16, int8 scales, codes - 32 (BIAS 32), no min.
fn dot_q6_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in blocks::<BlockQ6K>(w).zip(blocks::<BlockQ8K>(act)) {
        let s1 = sum16(&x.unpack(), &y.qs, |s| x.scales[s] as i32, 16);
        acc = step(acc, s1, fp16_to_f32(x.d.to_bits()), None, y.d);
    }
    acc
}

/// Q3_K: SUBBLK 16, 6-bit scales - 32, codes (low2 | hbit << 2) - 4 (BIAS 4), no min.
fn dot_q3_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in blocks::<BlockQ3K>(w).zip(blocks::<BlockQ8K>(act)) {
        let sc = x.unpack_scales();
        let s1 = sum16(&x.unpack(), &y.qs, |s| sc[s] as i32, 16);
        acc = step(acc, s1, fp16_to_f32(x.d.to_bits()), None, y.d);
    }
    acc
}

/// Q2_K: SUBBLK 16, scale = low nibble, min = high nibble, codes 0..3.
fn dot_q2_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in blocks::<BlockQ2K>(w).zip(blocks::<BlockQ8K>(act)) {
        let s1 = sum16(&x.unpack(), &y.qs, |s| (x.scales[s] & 0xF) as i32, 16);
        let mut s2 = 0i32;
        for s in 0..16 {
            s2 = s2.wrapping_add((x.scales[s] >> 4) as i32 * y.bsums[s] as i32);
        }
        acc = step(
            acc,
            s1,
            fp16_to_f32(x.d.to_bits()),
            Some((fp16_to_f32(x.dmin.to_bits()), s2)),
            y.d,
        );
    }
    acc
}

/// Q4_K / Q5_K: SUBBLK 32, 6-bit scales and mins (`get_scale_min_k4`), unsigned codes.
fn dot_k4(q: &[i8; 256], scales: &[u8; 12], d: f32, dmin: f32, y: &BlockQ8K, acc: f32) -> f32 {
    let (sc, m) = scale_min_k4(scales);
    let s1 = sum16(q, &y.qs, |s| sc[s] as i32, 32);
    let mut s2 = 0i32;
    for s in 0..8 {
        let bsum = y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32;
        s2 = s2.wrapping_add(m[s] as i32 * bsum);
    }
    step(acc, s1, d, Some((dmin, s2)), y.d)
}

fn dot_q4_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        acc = dot_k4(
            &x.unpack(),
            &x.scales,
            fp16_to_f32(x.d.to_bits()),
            fp16_to_f32(x.dmin.to_bits()),
            &y,
            acc,
        );
    }
    acc
}

fn dot_q5_k(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in blocks::<BlockQ5K>(w).zip(blocks::<BlockQ8K>(act)) {
        acc = dot_k4(
            &x.unpack(),
            &x.scales,
            fp16_to_f32(x.d.to_bits()),
            fp16_to_f32(x.dmin.to_bits()),
            &y,
            acc,
        );
    }
    acc
}
