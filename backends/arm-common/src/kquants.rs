//! The K-quant and repack `mat_mul` chains on ARM: Q4_K (ggml's x86 vec_dot, the repack
//! GEMV/GEMM and the tiled matmul), Q6_K (vec_dot, tiled) and the Q4_0 repack chain, each
//! bit-identical to quant's scalar twin of the x86 kernel (quant/src/repack.rs, tiled.rs).
//!
//! Every one of these chains starts from the same exact integers: per 32-element group, the
//! eight quad sums (lane k = elements 4k..4k+4), which SDOT or SMULL+ADDP produce
//! ([`crate::simd::quads`]); the chains then differ only in how they scale, group and round
//! those integers, which runs here as scalar code in the twin's order.
//!
//! Not tuned yet (no ARM machine to measure on): weights are unpacked per block with quant's
//! scalar code. The structure is the x86 one (GEMV chain for decode, GEMM / tiled chains for
//! prompts), so the integer stage can move to repacked weights and SMMLA later without
//! touching the float chains.

use crate::simd::{act_block, hsum_float_8, quads, unpack};
use crate::IntPath;
use abi::DType;
use quant::{fp16_to_f32, scale_min_k4, Block, BlockQ4K, BlockQ6K, BlockQ8K, Kernel};

/// Whether [`dot`] computes `kernel`'s output elements for `dt`.
pub fn has_kernel(kernel: Kernel, dt: DType) -> bool {
    match dt {
        DType::Q4_K => matches!(
            kernel,
            Kernel::VecDot | Kernel::RepackGemv | Kernel::RepackGemm | Kernel::Tiled
        ),
        DType::Q6_K => matches!(kernel, Kernel::VecDot | Kernel::Tiled),
        DType::Q4_0 => matches!(kernel, Kernel::RepackGemv | Kernel::RepackGemm),
        _ => false,
    }
}

/// One output element of `kernel` (see [`has_kernel`]): weight row `w`, activation row `act`
/// converted for `kernel` (`quant::quantize_activations_for`).
///
/// # Safety
/// The CPU runs `path`.
pub unsafe fn dot(path: IntPath, kernel: Kernel, dt: DType, w: &[u8], act: &[u8]) -> f32 {
    match (dt, kernel) {
        (DType::Q4_K, Kernel::RepackGemv) => q4k_repack::<false>(path, w, act),
        (DType::Q4_K, Kernel::RepackGemm) => q4k_repack::<true>(path, w, act),
        (DType::Q4_K, Kernel::Tiled) => q4k_tiled(path, w, act),
        (DType::Q4_K, _) => q4k_vec_dot(path, w, act),
        (DType::Q6_K, Kernel::Tiled) => q6k_tiled(path, w, act),
        (DType::Q6_K, _) => q6k_vec_dot(path, w, act),
        (DType::Q4_0, _) => q4_0_repack(path, w, act),
        _ => unreachable!("no ARM {kernel:?} chain for {dt}"),
    }
}

fn blocks<B: Block>(b: &[u8]) -> impl Iterator<Item = B> + '_ {
    b.chunks_exact(B::BYTES).map(B::read)
}

/// `q[g][k]`: quad sums of 32-element group `g` of `a` against `y` (as i8 codes).
#[inline(always)]
unsafe fn group_quads(path: IntPath, a: &[i8; 256], y: &[i8; 256]) -> [[i32; 8]; 8] {
    core::array::from_fn(|g| quads(path, &a[32 * g..32 * g + 32], &y[32 * g..32 * g + 32]))
}

/// Per 32-element sub-block: `sc[s] · Σ q·q8` and `m[s] · (bsums[2s] + bsums[2s+1])`.
#[inline(always)]
unsafe fn q4k_parts(path: IntPath, x: &BlockQ4K, y: &BlockQ8K) -> ([i32; 8], [i32; 8]) {
    let (sc, m) = scale_min_k4(&x.scales);
    let q = group_quads(path, &x.unpack(), &y.qs);
    let isum = core::array::from_fn(|s| sc[s] as i32 * q[s].iter().sum::<i32>());
    let imin =
        core::array::from_fn(|s| m[s] as i32 * (y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32));
    (isum, imin)
}

/// quant's `gemv_q4_k` (`GEMM == false`: one fma per block) and `gemm_q4_k` (one per pair of
/// sub-blocks); `acc - accm` at the end.
unsafe fn q4k_repack<const GEMM: bool>(path: IntPath, w: &[u8], act: &[u8]) -> f32 {
    let (mut acc, mut accm) = (0f32, 0f32);
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        let (isum, imin) = q4k_parts(path, &x, &y);
        let dw = fp16_to_f32(x.d.to_bits()) * y.d;
        let dm = fp16_to_f32(x.dmin.to_bits()) * y.d;
        if GEMM {
            for sb in 0..4 {
                acc = ((isum[2 * sb] + isum[2 * sb + 1]) as f32).mul_add(dw, acc);
                accm = ((imin[2 * sb] + imin[2 * sb + 1]) as f32).mul_add(dm, accm);
            }
        } else {
            acc = (isum.iter().sum::<i32>() as f32).mul_add(dw, acc);
            accm = (imin.iter().sum::<i32>() as f32).mul_add(dm, accm);
        }
    }
    acc - accm
}

/// quant's `repack::vec_dot_q4_k` (ggml's AVX2 lanes): lane l = Σ_s sc[s]·quad l of s.
unsafe fn q4k_vec_dot(path: IntPath, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut accm = [0f32; 4];
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        let d = y.d * fp16_to_f32(x.d.to_bits());
        let dmin = -y.d * fp16_to_f32(x.dmin.to_bits());
        let (sc, m) = scale_min_k4(&x.scales);
        let q8s: [i32; 8] = core::array::from_fn(|j| {
            (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32) as i16 as i32
        });
        for k in 0..4 {
            let prod = m[2 * k] as i32 * q8s[2 * k] + m[2 * k + 1] as i32 * q8s[2 * k + 1];
            accm[k] = dmin.mul_add(prod as f32, accm[k]);
        }
        let q = group_quads(path, &x.unpack(), &y.qs);
        let mut sumi = [0i32; 8];
        for s in 0..8 {
            for l in 0..8 {
                sumi[l] += sc[s] as i32 * q[s][l];
            }
        }
        for l in 0..8 {
            acc[l] = d.mul_add(sumi[l] as f32, acc[l]);
        }
    }
    let m01 = [accm[0] + accm[2], accm[1] + accm[3]];
    hsum_float_8(&acc) + (m01[0] + m01[1])
}

/// quant's tiled `dot_k4`: `s1` = Σ sc·dot, `s2` = Σ m·bsum (wrapping, as vpmulld/vpaddd);
/// `res = s1·d`, `res = fma(-dmin, s2, res)`, `acc = fma(res, yd, acc)`.
unsafe fn q4k_tiled(path: IntPath, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        let (sc, m) = scale_min_k4(&x.scales);
        let q = group_quads(path, &x.unpack(), &y.qs);
        let mut s1 = 0i32;
        let mut s2 = 0i32;
        for s in 0..8 {
            let raw: i32 = q[s].iter().sum();
            s1 = s1.wrapping_add(raw.wrapping_mul(sc[s] as i32));
            let bsum = y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32;
            s2 = s2.wrapping_add(m[s] as i32 * bsum);
        }
        let mut res = s1 as f32 * fp16_to_f32(x.d.to_bits());
        res = (-fp16_to_f32(x.dmin.to_bits())).mul_add(s2 as f32, res);
        acc = res.mul_add(y.d, acc);
    }
    acc
}

/// Q6_K codes `0..64` (`unpack() + 32`), as i8.
#[inline(always)]
fn q6k_codes(x: &BlockQ6K) -> [i8; 256] {
    x.unpack().map(|v| v + 32)
}

/// quant's `repack::vec_dot_q6_k` (ggml's AVX2 lanes): lane l = Σ_g sc(half of l)·quad l of
/// g over unsigned codes, minus `32·(bsum[2l]·sc[2l] + bsum[2l+1]·sc[2l+1])`.
unsafe fn q6k_vec_dot(path: IntPath, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (x, y) in blocks::<BlockQ6K>(w).zip(blocks::<BlockQ8K>(act)) {
        let d = y.d * fp16_to_f32(x.d.to_bits());
        let q = group_quads(path, &q6k_codes(&x), &y.qs);
        let mut sumi = [0i32; 8];
        for g in 0..8 {
            for l in 0..8 {
                sumi[l] += x.scales[2 * g + (l >= 4) as usize] as i32 * q[g][l];
            }
        }
        for l in 0..8 {
            let sub = (y.bsums[2 * l] as i32 * x.scales[2 * l] as i32
                + y.bsums[2 * l + 1] as i32 * x.scales[2 * l + 1] as i32)
                << 5;
            acc[l] = d.mul_add((sumi[l] - sub) as f32, acc[l]);
        }
    }
    hsum_float_8(&acc)
}

/// quant's tiled Q6_K: per 16-element half `h` of group `g`, `raw · sc[2g + h]` (wrapping),
/// over signed codes; `res = s1·d`, `acc = fma(res, yd, acc)`.
unsafe fn q6k_tiled(path: IntPath, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in blocks::<BlockQ6K>(w).zip(blocks::<BlockQ8K>(act)) {
        let q = group_quads(path, &x.unpack(), &y.qs);
        let mut s1 = 0i32;
        for g in 0..8 {
            for h in 0..2 {
                let raw: i32 = q[g][4 * h..4 * h + 4].iter().sum();
                s1 = s1.wrapping_add(raw.wrapping_mul(x.scales[2 * g + h] as i32));
            }
        }
        let res = s1 as f32 * fp16_to_f32(x.d.to_bits());
        acc = res.mul_add(y.d, acc);
    }
    acc
}

/// quant's `dot_repack_q4_0`: per block the exact sum of all 32 products, then
/// `acc = fma(f32(sum), dx·dy, acc)`.
unsafe fn q4_0_repack(path: IntPath, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in w.chunks_exact(18).zip(act.chunks_exact(34)) {
        let (a, dx, _) = unpack(DType::Q4_0, x);
        let (dy, _, qa) = act_block(false, y);
        let b: [i8; 32] = core::array::from_fn(|e| qa[e] as i8);
        let sumi: i32 = quads(path, &a, &b).iter().sum();
        let d = dx * dy;
        acc = (sumi as f32).mul_add(d, acc);
    }
    acc
}
