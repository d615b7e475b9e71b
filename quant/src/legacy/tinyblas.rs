//! llamafile's `tinyBLAS_Q0_AVX` (ggml-cpu/llamafile/sgemm.cpp) for Q4_0 / Q5_0 / Q8_0 weights
//! against Q8_0 activations, as this machine's x86 build runs it (AVX-512 VNNI, so
//! `VECTOR_REGISTERS == 32`; `__AVX2__ && __F16C__`, so the 4xN / Mx4 tiles are `gemm4xN` /
//! `gemmMx4`, the rest `gemm<RM, RN>`).
//!
//! Every tile shape computes each output element `C[j][i]` with the same chain: an `__m256`
//! `Cv` of eight lanes, per block `l`
//! `Cv = madd(unhalf(A[i][l].d) * unhalf(B[j][l].d), updot(|a|, sign(b, a)), Cv)`
//! (`madd` = `_mm256_fmadd_ps`; `gemm4xN`/`gemmMx4` form the same product with `_mm_mul_ps`;
//! `updot` = `_mm256_dpbusd_epi32` then `_mm256_cvtepi32_ps`: lane `k` is the exact int32 sum
//! of elements `4k..4k+4`), then `hsum(Cv)`: `hi128 + lo128`, `movehl`, `movehdup`, i.e.
//! `hsum_float_8`. The result therefore does not depend on the tile nor on the thread split,
//! and equals the x86 `ggml_vec_dot_*_q8_0` bit for bit (fixtures: tests/x86_exact_legacy.rs).

use super::{BlockQ4_0, BlockQ5_0, BlockQ8_0};
use crate::block::blocks;
use crate::util::*;
use abi::DType;

/// One output element of `tinyBLAS_Q0_AVX::gemm*` for a weight row `w` of `dtype` and a Q8_0
/// activation row `act`.
#[inline(always)]
pub(crate) fn dot_q0(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    let mut cv = [0f32; 8];
    let mut madd = |da: half::f16, db: half::f16, a: &[i8; 32], b: &[i8; 32]| {
        let d = fp16_to_f32(da.to_bits()) * fp16_to_f32(db.to_bits());
        let q = dot_i8_quads(a, b);
        for k in 0..8 {
            cv[k] = fma(d, q[k], cv[k]);
        }
    };
    let ys = blocks::<BlockQ8_0>(act);
    match dtype {
        DType::Q4_0 => blocks::<BlockQ4_0>(w)
            .zip(ys)
            .for_each(|(x, y)| madd(x.d, y.d, &x.unpack(), &y.qs)),
        DType::Q5_0 => blocks::<BlockQ5_0>(w)
            .zip(ys)
            .for_each(|(x, y)| madd(x.d, y.d, &x.unpack(), &y.qs)),
        DType::Q8_0 => blocks::<BlockQ8_0>(w)
            .zip(ys)
            .for_each(|(x, y)| madd(x.d, y.d, &x.qs, &y.qs)),
        _ => unreachable!("tinyBLAS_Q0_AVX has no {dtype} instance"),
    }
    hsum_float_8(&cv)
}
