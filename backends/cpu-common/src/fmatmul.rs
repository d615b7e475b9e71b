//! `mat_mul` with F32 / F16 weights: the reference's choice and float order (ggml's AVX-512
//! `ggml_vec_dot_f32` / `ggml_vec_dot_f16`, or llamafile's tinyBLAS tile when the activation
//! matrix has >= 2 columns, `K % 16 == 0` and `N % 4 == 0`), lane for lane, so results are
//! bit-identical to `::numerics::{dot_vec_f32, dot_vec_f16, dot_tile}` (whose bodies it
//! instantiates). Plain Rust
//! (`mul_add` is one fused instruction on AArch64, and on x86 inside the AVX2+FMA frame).

#![allow(clippy::needless_range_loop)]

use crate::par::{parallel_for, SyncPtr};
use crate::{split_row, Error};
use abi::{DType, HostApi, TensorDesc};

/// Weight rows per task.
const ROWS_PER_TASK: usize = 32;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Chain {
    VecF32,
    VecF16,
    Tile,
}

/// # Safety
/// A validated F32/F16 mat_mul on valid host memory with packed weight rows.
/// `avx512`: the caller's backend may use AVX-512 (and the CPU has it).
pub unsafe fn run(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    chain: usize,
    avx512: bool,
) -> Result<(), Error> {
    let (w, x, out) = (&inputs[0], &inputs[1], &outputs[0]);
    let dt = w.dtype().expect("validated");
    let (k, n, cols) = (w.ne[0] as usize, w.ne[1] as usize, x.nrows() as usize);
    if n == 0 || cols == 0 {
        return Ok(());
    }
    let col_index: Vec<(i64, i64, i64)> = (0..cols as i64).map(|c| split_row(x, c)).collect();
    // Activations as f32 columns, rounded through f16 for F16 weights (as ggml converts them).
    let mut act = vec![0f32; cols * k];
    for (c, &(i1, i2, i3)) in col_index.iter().enumerate() {
        let base = x
            .data
            .wrapping_offset((i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]) as isize);
        for e in 0..k {
            let v = (base.wrapping_offset(e as isize * x.nb[0] as isize) as *const f32)
                .read_unaligned();
            act[c * k + e] = if dt == DType::F16 {
                quant::fp16_to_f32(quant::f32_to_fp16(v))
            } else {
                v
            };
        }
    }
    // mat_mul's chain_cols: the columns as separate calls of `chain` columns (0: one call).
    let group = if chain == 0 { x.ne[1] } else { chain as i64 };
    let tile = group >= 2 && k % 16 == 0 && n % 4 == 0 && (dt == DType::F16 || x.is_contiguous());
    let chain = match (tile, dt) {
        (true, _) => Chain::Tile,
        (false, DType::F32) => Chain::VecF32,
        _ => Chain::VecF16,
    };
    let (wp, op) = (SyncPtr(w.data), SyncPtr(out.data));
    let (act, col_index) = (&act, &col_index);
    let (w, out) = (*w, *out);
    parallel_for(host, n.div_ceil(ROWS_PER_TASK) as u32, |t| {
        // One weight row as f32 (F16 widened, exactly).
        let load = |r: usize, wrow: &mut [f32]| {
            let row = wp.0.wrapping_offset(r as isize * w.nb[1] as isize);
            for (e, d) in wrow.iter_mut().enumerate() {
                let p = row.wrapping_add(e * dt.info().block_bytes as usize);
                *d = if dt == DType::F16 {
                    quant::fp16_to_f32((p as *const u16).read_unaligned())
                } else {
                    (p as *const f32).read_unaligned()
                };
            }
        };
        let put = |r: usize, c: usize, v: f32| {
            let (i1, i2, i3) = col_index[c];
            let off = r as i64 * out.nb[0] + i1 * out.nb[1] + i2 * out.nb[2] + i3 * out.nb[3];
            // SAFETY: each (row, column) is written by exactly one task.
            unsafe { (op.0.wrapping_offset(off as isize) as *mut f32).write_unaligned(v) };
        };
        let col = |c: usize| &act[c * k..(c + 1) * k];
        let cols4 = |c: usize| [col(c), col(c + 1), col(c + 2), col(c + 3)];
        let (mut wrow, mut wrow2) = (vec![0f32; k], vec![0f32; k]);
        let (r0, r1) = (
            t as usize * ROWS_PER_TASK,
            ((t as usize + 1) * ROWS_PER_TASK).min(n),
        );
        let mut r = r0;
        // The tile chain two rows by four columns at a time where AVX-512 has the registers
        // for it, else a row by four columns: each result is the one-at-a-time chain's.
        while avx512 && chain == Chain::Tile && r + 2 <= r1 {
            load(r, &mut wrow);
            load(r + 1, &mut wrow2);
            let mut c = 0;
            while c + 4 <= cols {
                let v = dot_2x4(&wrow, &wrow2, cols4(c));
                for j in 0..4 {
                    put(r, c + j, v[0][j]);
                    put(r + 1, c + j, v[1][j]);
                }
                c += 4;
            }
            for c in c..cols {
                put(r, c, dot(chain, &wrow, col(c)));
                put(r + 1, c, dot(chain, &wrow2, col(c)));
            }
            r += 2;
        }
        for r in r..r1 {
            load(r, &mut wrow);
            let mut c = 0;
            if chain == Chain::Tile {
                while c + 4 <= cols {
                    for (j, v) in dot_x4(&wrow, cols4(c)).into_iter().enumerate() {
                        put(r, c + j, v);
                    }
                    c += 4;
                }
            }
            for c in c..cols {
                put(r, c, dot(chain, &wrow, col(c)));
            }
        }
    });
    Ok(())
}

fn dot(chain: Chain, x: &[f32], y: &[f32]) -> f32 {
    #[cfg(x86)]
    if let Some(v) = crate::x86::fmatmul::dot(chain, x, y) {
        return v;
    }
    dot_body(chain, x, y)
}

/// Four outputs of the tile chain, one weight row against four columns.
fn dot_x4(x: &[f32], y: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(x86)]
    if let Some(v) = crate::x86::fmatmul::dot_x4(x, y) {
        return v;
    }
    ::numerics::dot_tile_lanes_x4(x, y)
}

/// Eight outputs of the tile chain, two weight rows against four columns (AVX-512 only).
fn dot_2x4(x0: &[f32], x1: &[f32], y: [&[f32]; 4]) -> [[f32; 4]; 2] {
    #[cfg(x86)]
    if let Some(v) = crate::x86::fmatmul::dot_2x4(x0, x1, y) {
        return v;
    }
    [
        ::numerics::dot_tile_lanes_x4(x0, y),
        ::numerics::dot_tile_lanes_x4(x1, y),
    ]
}

/// One output of `chain`: the reference's chains, inlined into the caller's ISA frame.
#[inline(always)]
pub(crate) fn dot_body(chain: Chain, x: &[f32], y: &[f32]) -> f32 {
    use ::numerics::{dot_tile_lanes, dot_vec_f16_lanes, dot_vec_f32_lanes};
    match chain {
        Chain::VecF32 => dot_vec_f32_lanes(x, y),
        Chain::VecF16 => dot_vec_f16_lanes(x, y),
        Chain::Tile => dot_tile_lanes(x, y),
    }
}
