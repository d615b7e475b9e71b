//! The K-quant and repack `mat_mul` chains on ARM: Q4_K (ggml's x86 vec_dot, the repack
//! GEMV/GEMM and the tiled matmul), Q6_K (vec_dot, tiled) and the Q4_0 repack chain, each
//! bit-identical to quant's scalar twin of the x86 kernel (quant/src/kquants/repack.rs, tiled.rs).
//!
//! Every one of these chains starts from the same exact integers: per 32-element group, the
//! eight quad sums (lane k = elements 4k..4k+4), which SDOT or SMULL+ADDP produce
//! ([`crate::simd::quads`]). The vec_dot chains keep the quads apart; the others (repack
//! GEMV/GEMM, tiled) only need sums over 16-element halves, so they also run on 2-row ×
//! 2-column tiles ([`tile`]) where one weight block is unpacked once for two columns and
//! SMMLA computes the four products at once on `arm-i8mm` ([`crate::mmla`]). The float
//! stages run as scalar code in the twin's order.
//!
//! Not tuned yet (no ARM machine to measure on): weights are unpacked per block with quant's
//! scalar code; the structure is the x86 one (GEMV chain for decode, tiles for prompts).

use crate::mmla::{halves, pair_halves};
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
        _ if has_tile(kernel, dt) => {
            let mut run = Run::default();
            for_blocks(dt, [w, w], [act, act], |x, y| {
                let h = halves_of(path, dt, &x.codes[0], y[0]);
                step(kernel, &mut run, &x.blk[0], y[0], &h);
            });
            run.finish(kernel)
        }
        (DType::Q4_K, _) => q4k_vec_dot(path, w, act),
        (DType::Q6_K, _) => q6k_vec_dot(path, w, act),
        _ => unreachable!("no ARM {kernel:?} chain for {dt}"),
    }
}

fn blocks<B: Block>(b: &[u8]) -> impl Iterator<Item = B> + '_ {
    b.chunks_exact(B::BYTES).map(B::read)
}

/// Whether `kernel`'s chain for `dt` needs only integer sums over 16-element halves, so that
/// [`tile`] computes it on 2×2 tiles (SMMLA on `arm-i8mm`): ggml's repack GEMV/GEMM chains
/// (Q4_K, Q4_0) and the tiled Q4_K/Q6_K matmul.
pub fn has_tile(kernel: Kernel, dt: DType) -> bool {
    match dt {
        DType::Q4_K => matches!(
            kernel,
            Kernel::RepackGemv | Kernel::RepackGemm | Kernel::Tiled
        ),
        DType::Q6_K => kernel == Kernel::Tiled,
        DType::Q4_0 => matches!(kernel, Kernel::RepackGemv | Kernel::RepackGemm),
        _ => false,
    }
}

/// Weight rows `w[0]`, `w[1]` against activation columns `act[0]`, `act[1]` (converted for
/// `kernel`) for a [`has_tile`] chain: `out[2i + j]` is element (row i, column j), each
/// bit-identical to [`dot`] on that row and column.
///
/// # Safety
/// The CPU runs `path`.
pub unsafe fn tile(
    path: IntPath,
    kernel: Kernel,
    dt: DType,
    w: [&[u8]; 2],
    act: [&[u8]; 2],
) -> [f32; 4] {
    let mut runs = [Run::default(); 4];
    for_blocks(dt, w, act, |x, y| {
        let ys = [y[0].codes(), y[1].codes()];
        let h = if dt == DType::Q4_0 {
            let t = pair_halves::<2>(path, [&x.codes[0], &x.codes[1]], ys);
            t.map(|v| core::array::from_fn(|i| if i < 2 { v[i] } else { 0 }))
        } else {
            pair_halves::<16>(path, [&x.codes[0], &x.codes[1]], ys)
        };
        for (t, run) in runs.iter_mut().enumerate() {
            step(kernel, run, &x.blk[t / 2], y[t % 2], &h[t]);
        }
    });
    runs.map(|r| r.finish(kernel))
}

/// A Q4_K block's scales as the chains use them (f16 converted exactly, 6-bit fields
/// unpacked): what [`crate::repack`] stores per block.
#[derive(Clone, Copy)]
pub(crate) struct Q4KScales {
    pub d: f32,
    pub dmin: f32,
    pub sc: [u8; 8],
    pub m: [u8; 8],
}

impl Q4KScales {
    pub fn of(x: &BlockQ4K) -> Q4KScales {
        let (sc, m) = scale_min_k4(&x.scales);
        Q4KScales {
            d: fp16_to_f32(x.d.to_bits()),
            dmin: fp16_to_f32(x.dmin.to_bits()),
            sc,
            m,
        }
    }
}

/// One weight block as a tile chain needs it: the block and its integer codes.
struct WBlocks {
    blk: [WBlock; 2],
    codes: [[i8; 256]; 2],
}

pub(crate) enum WBlock {
    Q4K(Q4KScales),
    Q6K(BlockQ6K),
    /// Q4_0: the block scale.
    Q4_0(f32),
}

/// One activation block: Q8_K, or Q8_0 (scale, 32 codes) for the Q4_0 chain.
pub(crate) enum ABlock<'a> {
    Q8K(BlockQ8K),
    Q8_0(f32, &'a [u8]),
}

impl ABlock<'_> {
    pub(crate) fn codes(&self) -> &[i8] {
        match self {
            ABlock::Q8K(y) => &y.qs,
            // SAFETY: u8 and i8 have one layout.
            ABlock::Q8_0(_, q) => unsafe { core::slice::from_raw_parts(q.as_ptr().cast(), 32) },
        }
    }
}

/// Walks the blocks of two weight rows and two activation rows side by side (the same row
/// twice where [`dot`] needs one).
#[inline(always)]
fn for_blocks(
    dt: DType,
    w: [&[u8]; 2],
    act: [&[u8]; 2],
    mut f: impl FnMut(&WBlocks, [&ABlock; 2]),
) {
    let (wb, ab) = match dt {
        DType::Q4_0 => (18, 34),
        _ => (dt.info().block_bytes as usize, BlockQ8K::BYTES),
    };
    let nb = w[0].len() / wb;
    for b in 0..nb {
        let wblk = |i: usize| -> (WBlock, [i8; 256]) {
            let bytes = &w[i][b * wb..(b + 1) * wb];
            match dt {
                DType::Q4_K => {
                    let x = BlockQ4K::read(bytes);
                    (WBlock::Q4K(Q4KScales::of(&x)), x.unpack())
                }
                DType::Q6_K => {
                    let x = BlockQ6K::read(bytes);
                    let c = x.unpack();
                    (WBlock::Q6K(x), c)
                }
                _ => {
                    let (q, d, _) = unpack(DType::Q4_0, bytes);
                    let mut c = [0i8; 256];
                    c[..32].copy_from_slice(&q);
                    (WBlock::Q4_0(d), c)
                }
            }
        };
        let ((b0, c0), (b1, c1)) = (wblk(0), wblk(1));
        let ablk = |j: usize| {
            let bytes = &act[j][b * ab..(b + 1) * ab];
            match dt {
                DType::Q4_0 => {
                    let (d, _, q) = act_block(false, bytes);
                    ABlock::Q8_0(d, q)
                }
                _ => ABlock::Q8K(BlockQ8K::read(bytes)),
            }
        };
        let (y0, y1) = (ablk(0), ablk(1));
        f(
            &WBlocks {
                blk: [b0, b1],
                codes: [c0, c1],
            },
            [&y0, &y1],
        );
    }
}

/// [`halves`] of one block (two for Q4_0's 32 elements, 16 for a K-quant's 256).
#[inline(always)]
unsafe fn halves_of(path: IntPath, dt: DType, codes: &[i8; 256], y: &ABlock) -> [i32; 16] {
    if dt == DType::Q4_0 {
        let h = halves::<2>(path, codes, y.codes());
        core::array::from_fn(|i| if i < 2 { h[i] } else { 0 })
    } else {
        halves::<16>(path, codes, y.codes())
    }
}

/// A tile chain's running sums for one output element.
#[derive(Clone, Copy, Default)]
pub(crate) struct Run {
    acc: f32,
    accm: f32,
}

impl Run {
    pub(crate) fn finish(self, kernel: Kernel) -> f32 {
        match kernel {
            // ggml's repack chains subtract the minimum terms at the end (Q4_0's stay 0).
            Kernel::RepackGemv | Kernel::RepackGemm => self.acc - self.accm,
            _ => self.acc,
        }
    }
}

/// One block of a [`has_tile`] chain, from the exact half sums `h` (`h[i]` = Σ over elements
/// `16i..16i+16`), in quant's scalar twin's float order.
#[inline(always)]
pub(crate) fn step(kernel: Kernel, run: &mut Run, x: &WBlock, y: &ABlock, h: &[i32; 16]) {
    match (x, y) {
        (WBlock::Q4K(x), ABlock::Q8K(y)) => {
            let (sc, m) = (x.sc, x.m);
            let group = |s: usize| h[2 * s] + h[2 * s + 1];
            let bsum = |s: usize| y.bsums[2 * s] as i32 + y.bsums[2 * s + 1] as i32;
            if kernel == Kernel::Tiled {
                // quant's tiled `dot_k4`: `s1` = Σ sc·dot, `s2` = Σ m·bsum (wrapping, as
                // vpmulld/vpaddd); `res = s1·d`, `res = fma(-dmin, s2, res)`, then
                // `acc = fma(res, yd, acc)`.
                let (mut s1, mut s2) = (0i32, 0i32);
                for s in 0..8 {
                    s1 = s1.wrapping_add(group(s).wrapping_mul(sc[s] as i32));
                    s2 = s2.wrapping_add(m[s] as i32 * bsum(s));
                }
                let mut res = s1 as f32 * x.d;
                res = (-x.dmin).mul_add(s2 as f32, res);
                run.acc = res.mul_add(y.d, run.acc);
            } else {
                // quant's `gemv_q4_k` (one fma per block) and `gemm_q4_k` (one per pair of
                // sub-blocks); `acc - accm` at the end.
                let isum: [i32; 8] = core::array::from_fn(|s| sc[s] as i32 * group(s));
                let imin: [i32; 8] = core::array::from_fn(|s| m[s] as i32 * bsum(s));
                let dw = x.d * y.d;
                let dm = x.dmin * y.d;
                if kernel == Kernel::RepackGemm {
                    for sb in 0..4 {
                        run.acc = ((isum[2 * sb] + isum[2 * sb + 1]) as f32).mul_add(dw, run.acc);
                        run.accm = ((imin[2 * sb] + imin[2 * sb + 1]) as f32).mul_add(dm, run.accm);
                    }
                } else {
                    run.acc = (isum.iter().sum::<i32>() as f32).mul_add(dw, run.acc);
                    run.accm = (imin.iter().sum::<i32>() as f32).mul_add(dm, run.accm);
                }
            }
        }
        (WBlock::Q6K(x), ABlock::Q8K(y)) => {
            // quant's tiled Q6_K over signed codes: per half, `raw · sc` (wrapping);
            // `res = s1·d`, `acc = fma(res, yd, acc)`.
            let mut s1 = 0i32;
            for (i, &v) in h.iter().enumerate() {
                s1 = s1.wrapping_add(v.wrapping_mul(x.scales[i] as i32));
            }
            let res = s1 as f32 * fp16_to_f32(x.d.to_bits());
            run.acc = res.mul_add(y.d, run.acc);
        }
        (WBlock::Q4_0(dx), ABlock::Q8_0(dy, _)) => {
            // quant's `dot_repack_q4_0`: `acc = fma(f32(Σ), dx·dy, acc)`.
            run.acc = ((h[0] + h[1]) as f32).mul_add(dx * dy, run.acc);
        }
        _ => unreachable!("tile chain: mismatched blocks"),
    }
}

/// `q[g][k]`: quad sums of 32-element group `g` of `a` against `y` (as i8 codes).
#[inline(always)]
unsafe fn group_quads(path: IntPath, a: &[i8; 256], y: &[i8; 256]) -> [[i32; 8]; 8] {
    core::array::from_fn(|g| quads(path, &a[32 * g..32 * g + 32], &y[32 * g..32 * g + 32]))
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
