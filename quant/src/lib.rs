//! Block quantization formats with scalar twins.
//!
//! PUBLIC API CONTRACT (other crates code against these signatures; keep them):
//! - `dequantize_row(dtype, src, dst)`: `src` holds exactly `dst.len()` elements of `dtype`.
//! - `quantize_row(dtype, src, dst)`: ggml's reference quantizer for that format.
//! - `vec_dot_type(dtype)`: the format activations are converted to before a dot product with
//!   a weight row of `dtype`, exactly as ggml's CPU backend does.
//! - `quantize_activations(dtype, src, dst)`: converts an f32 activation row into
//!   `vec_dot_type(dtype)` the way ggml's x86 CPU path does (its rounding included).
//! - `vec_dot(dtype, n, w, act)`: dot product of a weight row of `dtype` with an activation row
//!   already in `vec_dot_type(dtype)`, as ggml computes it.
//!
//! Formats: F32, F16, BF16 (`float`), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (`legacy`), Q2_K..Q6_K
//! and Q8_K (`kquants`, quantizers in `kquants_ref`). Block structs are `#[repr(C)]` with the
//! GGUF byte size (checked at compile time against `abi`), parsed from unaligned little-endian
//! bytes through [`Block`].
//!
//! Summation order is part of the contract. Greedy decoding re-quantizes activations to 8 bits
//! at every matmul, so a one-ulp difference can flip a rounding and then snowball into other
//! tokens. [`matmul_kernel`] names the kernel llama.cpp's x86 build runs for a matmul of a given
//! format and shape (`vec_dot`, llamafile tinyBLAS, the CPU repack GEMV/GEMM, the tiled K-quant
//! GEMM), and [`dot_with`] reproduces that kernel's float operations in scalar code, lane by
//! lane, bit for bit; tests in `quant/tests/x86_exact_*.rs` hold each one to fixtures recorded
//! from the real compiled kernels (scripts/quant_x86_fixtures_*.py). The plain [`vec_dot`]
//! follows the x86 kernels for the 32-element formats and ggml's generic kernels for K-quants.

use abi::DType;

mod block;
mod float;
mod kquants;
mod kquants_ref;
mod legacy;
pub mod mollm;
mod util;

pub use block::Block;
pub use kquants::{scale_min_k4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
pub use kquants_ref::{
    quantize_q2_k, quantize_q3_k, quantize_q4_k, quantize_q5_k, quantize_q6_k, quantize_q8_k,
};
pub use legacy::{
    quantize_q4_0, quantize_q4_1, quantize_q5_0, quantize_q5_1, quantize_q8_0_ref,
    quantize_q8_0_x86, quantize_q8_1_ref, quantize_q8_1_x86, BlockQ4_0, BlockQ4_1, BlockQ5_0,
    BlockQ5_1, BlockQ8_0, BlockQ8_1, QK,
};
pub use util::{bf16_to_f32, f32_to_bf16, f32_to_fp16, fp16_to_f32, nearest_int};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// The format has no implementation for this operation.
    Unsupported { dtype: DType, what: &'static str },
    /// Buffer sizes do not match the element count.
    Size {
        dtype: DType,
        elements: usize,
        bytes: usize,
    },
}

impl core::fmt::Display for QuantError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            QuantError::Unsupported { dtype, what } => {
                write!(f, "{what} is not implemented for {dtype}")
            }
            QuantError::Size {
                dtype,
                elements,
                bytes,
            } => {
                write!(f, "{elements} elements of {dtype} do not fit {bytes} bytes")
            }
        }
    }
}

impl std::error::Error for QuantError {}

/// Bytes taken by a row of `n` elements of `dtype`, or `None` if `n` is not a whole number of
/// blocks (or overflows).
pub fn row_bytes(dtype: DType, n: usize) -> Option<usize> {
    dtype
        .row_bytes(n as u64)
        .and_then(|b| usize::try_from(b).ok())
}

fn check(dtype: DType, elements: usize, bytes: usize) -> Result<(), QuantError> {
    match row_bytes(dtype, elements) {
        Some(b) if b == bytes => Ok(()),
        _ => Err(QuantError::Size {
            dtype,
            elements,
            bytes,
        }),
    }
}

/// ggml's `dequantize_row_*` (ggml-quants.c) for every supported format, plus F32/F16/BF16.
/// Q8_1 (which ggml never dequantizes) decodes as `d * q`.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check(dtype, dst.len(), src.len())?;
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => float::dequantize(dtype, src, dst),
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q8_1 => {
            legacy::dequantize(dtype, src, dst)
        }
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q8_K => {
            kquants::dequantize(dtype, src, dst)
        }
        DType::W4G32 | DType::W4G128 | DType::W8PC | DType::A8G128 => {
            mollm::dequantize(dtype, src, dst)
        }
        _ => {
            return Err(QuantError::Unsupported {
                dtype,
                what: "dequantize_row",
            })
        }
    }
    Ok(())
}

/// ggml's reference quantizers `quantize_row_*_ref` (ggml-quants.c), the ones used to write
/// model files; F16/BF16 use `GGML_FP32_TO_FP16` / `GGML_FP32_TO_BF16`. For the formats
/// activations are converted to, see [`quantize_activations`], which differs for Q8_0/Q8_1.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check(dtype, src.len(), dst.len())?;
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => float::quantize(dtype, src, dst),
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q8_1 => {
            legacy::quantize_ref(dtype, src, dst)
        }
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q8_K => {
            kquants_ref::quantize_ref(dtype, src, dst)
        }
        // W8PC: one scale per call, so callers pass one whole row.
        DType::W4G32 | DType::W4G128 | DType::W8PC | DType::A8G128 => {
            mollm::quantize(dtype, src, dst)
        }
        _ => {
            return Err(QuantError::Unsupported {
                dtype,
                what: "quantize_row",
            })
        }
    }
    Ok(())
}

/// ggml-cpu's `type_traits_cpu[dtype].vec_dot_type` (ggml-cpu.c): Q4_0/Q5_0/Q8_0 → Q8_0,
/// Q4_1/Q5_1/Q8_1 → Q8_1, Q2_K..Q6_K → Q8_K, F16 → F16, BF16 → BF16, everything else (F32,
/// and formats ggml has no dot product for) → F32.
pub fn vec_dot_type(dtype: DType) -> DType {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => DType::Q8_0,
        DType::Q4_1 | DType::Q5_1 | DType::Q8_1 => DType::Q8_1,
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => DType::Q8_K,
        DType::F16 => DType::F16,
        DType::BF16 => DType::BF16,
        DType::W4G32 | DType::W4G128 | DType::W8PC => mollm::act_type(dtype),
        _ => DType::F32,
    }
}

/// Converts an f32 activation row into `vec_dot_type(dtype)` exactly as ggml's x86 CPU backend
/// (`type_traits_cpu[vec_dot_type].from_float`, AVX2/AVX-512 build) does:
/// - Q8_0: x86 `quantize_row_q8_0` ([`quantize_q8_0_x86`]): `d = max/127`, `id = 127/max`,
///   round half to even (`_mm256_round_ps(_MM_ROUND_NEAREST)`), unlike `_ref`'s `roundf`.
/// - Q8_1: x86 `quantize_row_q8_1` ([`quantize_q8_1_x86`]): as Q8_0, `s = f16(d * sum(q))`.
/// - Q8_K: x86 `quantize_row_q8_K` is `quantize_row_q8_K_ref` ([`quantize_q8_k`]).
/// - F16: `ggml_cpu_fp32_to_fp16` (F16C, round to nearest even); BF16: `ggml_cpu_fp32_to_bf16`
///   (scalar `GGML_FP32_TO_BF16`); F32: copy.
pub fn quantize_activations(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let vt = vec_dot_type(dtype);
    check(vt, src.len(), dst.len())?;
    match vt {
        DType::Q8_0 => legacy::quantize_with(quantize_q8_0_x86, src, dst),
        DType::Q8_1 => legacy::quantize_with(quantize_q8_1_x86, src, dst),
        DType::Q8_K => kquants_ref::quantize_with(quantize_q8_k, src, dst),
        DType::A8G128 => mollm::quantize_a8g128(src, dst),
        DType::F32 | DType::F16 | DType::BF16 => float::quantize(vt, src, dst),
        _ => {
            return Err(QuantError::Unsupported {
                dtype,
                what: "quantize_activations",
            })
        }
    }
    Ok(())
}

/// Dot product of `n` elements: a weight row `w` of `dtype` with an activation row `act` in
/// `vec_dot_type(dtype)` (see [`quantize_activations`]).
///
/// Quantized formats follow ggml's generic kernels (`ggml_vec_dot_*_q8_*_generic` in
/// ggml-cpu/quants.c): exact integer block sums, then the same float expression per block
/// (and for K-quants the same 8 float lanes). F32/F16/BF16: f32 products summed in f64, as
/// ggml's scalar `ggml_vec_dot_{f32,f16,bf16}`.
///
/// # Panics
/// If `dtype` has no dot product or the buffers do not hold exactly `n` elements.
pub fn vec_dot(dtype: DType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let vt = vec_dot_type(dtype);
    assert_eq!(
        row_bytes(dtype, n),
        Some(w.len()),
        "vec_dot: weight row is not {n} elements of {dtype}"
    );
    assert_eq!(
        row_bytes(vt, n),
        Some(act.len()),
        "vec_dot: activation row is not {n} elements of {vt}"
    );
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has FMA and AVX2 (checked at run time).
        return unsafe { vec_dot_fma(dtype, w, act) };
    }
    vec_dot_any(dtype, w, act)
}

/// The same scalar code compiled with FMA enabled, so `mul_add` is one instruction rather than
/// a libm call. Results are identical either way: `mul_add` always rounds once.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,avx2")]
unsafe fn vec_dot_fma(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    vec_dot_any(dtype, w, act)
}

#[cfg(target_arch = "x86_64")]
fn has_fma() -> bool {
    use std::sync::OnceLock;
    static FMA: OnceLock<bool> = OnceLock::new();
    *FMA.get_or_init(|| is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2"))
}

#[inline(always)]
fn vec_dot_any(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => float::vec_dot(dtype, w, act),
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => {
            legacy::vec_dot(dtype, w, act)
        }
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => {
            kquants::vec_dot(dtype, w, act)
        }
        DType::W4G32 | DType::W4G128 | DType::W8PC => mollm::vec_dot(dtype, w, act),
        _ => panic!("vec_dot is not implemented for {dtype}"),
    }
}

/// Which of ggml's x86 CPU kernels computes an output element of a matmul. ggml picks by
/// format and shape (`ggml_compute_forward_mul_mat`: llamafile's tinyBLAS for some formats when
/// there are several columns, the CPU "repack" layouts for others, `vec_dot` otherwise), and
/// each kernel sums in its own float order. The reference mirrors the choice so that its
/// results are bit-identical to llama.cpp's x86 build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `ggml_vec_dot_*` (x86 AVX2/AVX-512 branch).
    VecDot,
    /// llamafile `tinyBLAS` (sgemm.cpp).
    TinyBlas,
    /// repack.cpp GEMV over interleaved rows (one activation column).
    RepackGemv,
    /// repack.cpp GEMM over interleaved rows (groups of four activation columns).
    RepackGemm,
    /// ggml-cpu/tiled/ K-quant GEMM (`ggml_compute_forward_mul_mat_tiled`), whole matmuls of
    /// non-repacked K-quant weights with at least 8 activation columns.
    Tiled,
}

/// The kernel ggml's x86 build uses for output column `col` of a matmul of a `[k, n_rows]`
/// weight of `dtype` with `n_cols` activation columns.
/// [`matmul_kernel`] for a call with mat_mul's `chain_cols` attribute: `chain == 0` is one
/// call of `n_cols` columns; `chain == g > 0` computes the columns as separate calls of `g`.
pub fn matmul_kernel_in(
    dtype: DType,
    k: usize,
    n_rows: usize,
    n_cols: usize,
    col: usize,
    chain: usize,
) -> Kernel {
    let g = if chain == 0 { n_cols } else { chain };
    matmul_kernel(dtype, k, n_rows, g, col % g.max(1))
}

pub fn matmul_kernel(dtype: DType, k: usize, n_rows: usize, n_cols: usize, col: usize) -> Kernel {
    let _ = (k, n_rows, n_cols, col);
    match dtype {
        // Q4_0 with n_rows % 8 == 0 lives in the CPU repack buffer on AVX2/AVX-512
        // (repack.cpp `ggml_repack_get_optimal_repack_type`: `ggml_cpu_has_avx2()` and
        // `ne[1] % 8 == 0` -> `q4_0_8x8_q8_0`; `repack_q4_0_to_q4_0_8_bl` also needs
        // `ne[0] % 8 == 0`, always true for whole blocks). Its `forward_mul_mat_one_chunk` runs
        // GEMM over the first `n_cols - n_cols % 4` columns (only if `n_cols > 3`) and GEMV over
        // the rest; the extra-buffer op is dispatched before `ggml_compute_forward_mul_mat`,
        // so tinyBLAS never sees these weights. (Weights outside the repack buffer, e.g. an
        // output matrix tied to `token_embd`, or a run with `--no-repack`, take the arm below.)
        DType::Q4_0 if n_rows % 8 == 0 => {
            if col < n_cols / 4 * 4 {
                Kernel::RepackGemm
            } else {
                Kernel::RepackGemv
            }
        }
        // llamafile_sgemm (llamafile/sgemm.cpp), tried in ggml_compute_forward_mul_mat
        // (ggml-cpu.c) after src1 is quantized to Q8_0: rejects `n < 2` (n = n_cols), otherwise
        // `tinyBLAS_Q0_AVX` takes the whole matmul for Q8_0, Q4_0 and Q5_0 (no alignment or
        // shape conditions). Q5_1 (and Q4_1) have no tinyBLAS instance: always vec_dot.
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 if n_cols >= 2 => Kernel::TinyBlas,
        DType::Q4_0 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => Kernel::VecDot,
        // K-quants (see src/kquants/repack.rs): repack.cpp `ggml_repack_get_optimal_repack_type` puts
        // Q4_K with `ne[1] % 8 == 0` in the repack buffer on AVX2 (`q4_K_8x8_q8_K`) and Q2_K
        // with `ne[1] % 8 == 0` on AVX-512 (`q2_K_8x8_q8_K`); `forward_mul_mat_one_chunk` then
        // runs GEMM over the first `n_cols - n_cols % 4` columns (if `n_cols > 3`) and GEMV over
        // the rest. Q3_K/Q5_K/Q6_K are never repacked on x86, and tinyBLAS has no K-quant case
        // (llamafile/sgemm.cpp), so they (and Q2_K/Q4_K rows not divisible by 8, or weights
        // outside the repack buffer such as a tied `token_embd` output) take the arms below.
        DType::Q2_K | DType::Q4_K if n_rows % 8 == 0 => {
            if col < n_cols / 4 * 4 {
                Kernel::RepackGemm
            } else {
                Kernel::RepackGemv
            }
        }
        // Everything else of Q2_K..Q6_K reaches `ggml_compute_forward_mul_mat`, which first
        // offers the op to the tiled K-quant matmul (ggml-cpu/tiled/tiled.cpp, see
        // src/kquants/tiled.rs): `ggml_tiled_supported` (x86 AVX+ build, `src0->extra == NULL`, type
        // Q2_K..Q6_K or IQ*) and `ggml_tiled_min_batch(src1->ne[1])` = `n_cols >= 8` (unless
        // `GGML_CPU_TILED_MM=0` or `GGML_CPU_TILED_MM_FORCE=1` in the environment). It then
        // computes every column. With fewer columns: `ggml_vec_dot_*_q8_K` (arch/x86/quants.c).
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K if n_cols >= 8 => {
            Kernel::Tiled
        }
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => Kernel::VecDot,
        _ => Kernel::VecDot,
    }
}

/// Converts an activation row for `kernel` (see [`quantize_activations`], which is the
/// `VecDot` case).
pub fn quantize_activations_for(
    kernel: Kernel,
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    match kernel {
        // Legacy formats: every kernel takes `quantize_row_q8_0` rows (x86); the repack GEMM's
        // `ggml_quantize_mat_q8_0_4x8` is the same per row, only interleaved.
        _ if matches!(dtype, DType::Q4_0 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0) => {
            quantize_activations(dtype, src, dst)
        }
        // K-quant repack GEMM: `ggml_quantize_mat_q8_K_4x8`, which differs from
        // `quantize_row_q8_K` in the scale's sign when +max and -max both occur.
        Kernel::RepackGemm if matches!(dtype, DType::Q2_K | DType::Q4_K) => {
            check(DType::Q8_K, src.len(), dst.len())?;
            kquants::quantize_row_q8_k_4x8(src, dst);
            Ok(())
        }
        // Tiled K-quant matmul: `from_float` of Q8_K, i.e. `quantize_row_q8_K` per column.
        _ => quantize_activations(dtype, src, dst),
    }
}

/// One output element computed as `kernel` computes it; `vec_dot` is the `VecDot` case.
pub fn dot_with(kernel: Kernel, dtype: DType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    match kernel {
        _ if matches!(dtype, DType::Q4_0 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0) => {
            legacy::dot_with(kernel, dtype, n, w, act)
        }
        _ if matches!(
            dtype,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K
        ) =>
        {
            assert_eq!(
                row_bytes(dtype, n),
                Some(w.len()),
                "dot_with: weight row is not {n} elements of {dtype}"
            );
            assert_eq!(
                row_bytes(DType::Q8_K, n),
                Some(act.len()),
                "dot_with: activation row is not {n} elements of Q8_K"
            );
            kquants::dot_x86(kernel, dtype, w, act)
        }
        _ => vec_dot(dtype, n, w, act),
    }
}
