//! Weights repacked at load (`prepare_weight`) for the ARM backends: Q4_K matrices whose rows
//! ggml's x86 build puts in its repack buffer (`ne[1] % 8 == 0`; every column then runs a
//! repack GEMV/GEMM chain, all of them [`crate::kquants::has_tile`] chains) are stored as
//! pairs of rows, block by block:
//!
//! ```text
//! [d0 d1 dmin0 dmin1: f32] [sc0 m0 sc1 m1: 8 × u8 each] [qs: 256 bytes]
//! ```
//!
//! with the scales decoded once (the chains' values exactly: f16 → f32 is exact) and the
//! nibbles interleaved so that one 16-byte load at `16·(4p + j)` holds bytes `32p + 8j ..+8`
//! of row 0 then of row 1: masked, it is SMMLA's weight operand for elements `64p + 8j ..+8`
//! of both rows; shifted, for elements `64p + 32 + 8j ..+8`. 304 bytes per pair of blocks
//! against 288 in the file.
//!
//! Other formats stay as they are (Q4_0's repack chain runs on tiles from the file layout;
//! no model here has enough Q4_0 to be worth a layout).

use crate::kquants::{step, ABlock, Q4KScales, Run, WBlock};
use crate::mmla;
use crate::IntPath;
use abi::DType;
use quant::{Block, BlockQ4K, BlockQ8K, Kernel};

/// The layout's number in `Prepared::kind`.
pub const KIND_Q4K_PAIRS: u32 = 1;
/// Bytes of one pair of Q4_K blocks.
pub const PAIR_BLOCK: usize = 48 + 256;
/// Rows a weight must have a multiple of (ggml's condition for its repack chains).
pub const ROWS: usize = 8;

/// Bytes of a `k × n` Q4_K weight in this layout.
pub fn repacked_bytes(k: usize, n: usize) -> usize {
    n / 2 * (k / 256) * PAIR_BLOCK
}

/// Repacks `n` rows of `rb` bytes (`k / 256` Q4_K blocks each) into `dst`
/// ([`repacked_bytes`] long).
pub fn repack(src: &[u8], rb: usize, k: usize, n: usize, dst: &mut [u8]) {
    let nb = k / 256;
    for pair in 0..n / 2 {
        for b in 0..nb {
            let x: [BlockQ4K; 2] = core::array::from_fn(|r| {
                let o = (2 * pair + r) * rb + b * BlockQ4K::BYTES;
                BlockQ4K::read(&src[o..o + BlockQ4K::BYTES])
            });
            let s = x.each_ref().map(Q4KScales::of);
            let out = &mut dst[(pair * nb + b) * PAIR_BLOCK..][..PAIR_BLOCK];
            for (i, v) in [s[0].d, s[1].d, s[0].dmin, s[1].dmin].iter().enumerate() {
                out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
            }
            for r in 0..2 {
                out[16 + 16 * r..24 + 16 * r].copy_from_slice(&s[r].sc);
                out[24 + 16 * r..32 + 16 * r].copy_from_slice(&s[r].m);
            }
            let qs = &mut out[48..];
            for p in 0..4 {
                for j in 0..4 {
                    for r in 0..2 {
                        let o = 16 * (4 * p + j) + 8 * r;
                        qs[o..o + 8].copy_from_slice(&x[r].qs[32 * p + 8 * j..32 * p + 8 * j + 8]);
                    }
                }
            }
        }
    }
}

/// Both rows' scales of one pair block.
fn scales(blk: &[u8]) -> [Q4KScales; 2] {
    let f = |i: usize| f32::from_le_bytes(blk[4 * i..4 * i + 4].try_into().unwrap());
    core::array::from_fn(|r| Q4KScales {
        d: f(r),
        dmin: f(2 + r),
        sc: blk[16 + 16 * r..24 + 16 * r].try_into().unwrap(),
        m: blk[24 + 16 * r..32 + 16 * r].try_into().unwrap(),
    })
}

/// Both rows' codes (0..16) in element order from a pair block's 256 `qs` bytes.
pub fn unpack_pair(qs: &[u8]) -> [[i8; 256]; 2] {
    let mut c = [[0i8; 256]; 2];
    for p in 0..4 {
        for j in 0..4 {
            for r in 0..2 {
                for i in 0..8 {
                    let b = qs[16 * (4 * p + j) + 8 * r + i];
                    c[r][64 * p + 8 * j + i] = (b & 0x0F) as i8;
                    c[r][64 * p + 32 + 8 * j + i] = (b >> 4) as i8;
                }
            }
        }
    }
    c
}

/// `mmla::pair_halves` of one pair block (`qs`: its 256 interleaved bytes) against two Q8_K
/// columns: SMMLA straight from the layout on [`IntPath::I8mm`], the unpacked codes otherwise.
///
/// # Safety
/// The CPU runs `path`.
#[inline(always)]
unsafe fn q4k_pair_halves(path: IntPath, qs: &[u8], y: [&[i8]; 2]) -> [[i32; 16]; 4] {
    match path {
        #[cfg(target_arch = "aarch64")]
        IntPath::I8mm => mmla::q4k_pair_halves_i8mm(qs, y),
        _ => {
            let c = unpack_pair(qs);
            mmla::pair_halves_by_quads(path, [&c[0], &c[1]], y)
        }
    }
}

/// [`crate::kquants::tile`] on a repacked pair of rows (`pair_row`: its `k / 256` pair
/// blocks) against activation columns `act` (Q8_K, converted for `kernel`): `out[2i + j]` is
/// (row i, column j), bit-identical to the chain on the file's rows. A single column is
/// passed twice.
///
/// # Safety
/// The CPU runs `path`.
pub unsafe fn tile(path: IntPath, kernel: Kernel, pair_row: &[u8], act: [&[u8]; 2]) -> [f32; 4] {
    let mut runs = [Run::default(); 4];
    for (b, blk) in pair_row.chunks_exact(PAIR_BLOCK).enumerate() {
        let ys =
            act.map(|a| ABlock::Q8K(BlockQ8K::read(&a[b * BlockQ8K::BYTES..][..BlockQ8K::BYTES])));
        let h = q4k_pair_halves(path, &blk[48..], [ys[0].codes(), ys[1].codes()]);
        let s = scales(blk);
        for (t, run) in runs.iter_mut().enumerate() {
            step(kernel, run, &WBlock::Q4K(s[t / 2]), &ys[t % 2], &h[t]);
        }
    }
    runs.map(|r| r.finish(kernel))
}

/// Whether `dt` with `n` rows is repacked by [`repack`].
pub fn repacks(dt: DType, n: usize) -> bool {
    dt == DType::Q4_K && n % ROWS == 0 && n > 0
}
