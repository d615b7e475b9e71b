//! Shared code of mollm's native x86 CPU backends (`mollm-x86-avx2`, `mollm-x86-avx512`).
//!
//! The kernels are SIMD twins of the reference's x86 kernels: the same kernel choice per
//! output column (`quant::matmul_kernel`), the same activation conversion
//! (`quant::quantize_activations_for`), and for every output element the same float
//! operations in the same order as `quant::dot_with`, so results are bit-identical to the
//! reference (and so to llama.cpp's x86 build). ISA-specific code lives behind
//! `#[target_feature]` in [`simd`] and runs only after run-time detection ([`Isa::detected`]);
//! nothing needs a global `-C target-cpu`.
//!
//! What is implemented: `mat_mul` with F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K
//! weights, every x86 kernel ggml picks for those formats (vec_dot, tinyBLAS, the Q4_0/Q4_K
//! repack GEMV/GEMM, the tiled K-quant matmul), Q4_K weights repacked at load ([`q4k16`]),
//! Q4_1 / Q8_0 on AVX-512 and Q4_1 / Q5_0 on AVX2 ([`legacy16`]), on AVX-512 mollm's
//! formats ([`wr16`]) too;
//! and, through `mollm_cpu_common::ops` in its AVX2/AVX-512 variants, bit-identical to the
//! reference: attention (f32 caches), glu, rms_norm, rope (no YaRN), add, mul, scale,
//! get_rows, set_rows (f32), softmax, argmax, ssm_conv, gated_delta_net, rwkv_wkv7, norm, l2_norm, token_shift. Everything
//! else (f16 caches, YaRN, other formats) answers `Unsupported` in `supports`, so the host runs
//! it on the reference.
//!
//! Each cdylib exports `mollm_backend_entry` returning [`HEADER_AVX2`] or [`HEADER_AVX512`].

use abi::{BackendHeader, BackendTable, HostApi, Op, OpParams, TensorDesc};
use mollm_cpu_common::CpuBackend;

#[cfg(target_arch = "x86_64")]
pub mod actq;
pub mod amx;
#[cfg(target_arch = "x86_64")]
mod hsum;
#[cfg(target_arch = "x86_64")]
pub mod kq512;
pub mod legacy16;
pub mod matmul;
pub mod par;
pub mod q4k16;
#[cfg(target_arch = "x86_64")]
pub mod q6kamx;
#[cfg(target_arch = "x86_64")]
pub mod simd;
pub mod wr16;

/// Bits of `BackendHeader::cpu_features` (the CPU features a library's kernels use).
pub mod features {
    pub use abi::cpu::{
        X86_AVX2 as AVX2, X86_AVX512BW as AVX512BW, X86_AVX512F as AVX512F,
        X86_AVX512VL as AVX512VL, X86_AVX512VNNI as AVX512VNNI, X86_F16C as F16C, X86_FMA as FMA,
    };
}

/// The instruction set a backend instance computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Isa {
    /// AVX2 + FMA + F16C.
    Avx2 = 0,
    /// AVX2 + FMA + F16C + AVX-512 F/BW/VL/VNNI.
    Avx512 = 1,
}

pub const ISA_AVX2: u8 = Isa::Avx2 as u8;
pub const ISA_AVX512: u8 = Isa::Avx512 as u8;

impl Isa {
    pub const fn from_u8(v: u8) -> Isa {
        if v == ISA_AVX512 {
            Isa::Avx512
        } else {
            Isa::Avx2
        }
    }

    /// The `cpu_features` bits of a library built for this ISA.
    pub const fn feature_bits(self) -> u64 {
        use features::*;
        match self {
            Isa::Avx2 => AVX2 | FMA | F16C,
            Isa::Avx512 => AVX2 | FMA | F16C | AVX512F | AVX512BW | AVX512VL | AVX512VNNI,
        }
    }

    /// Whether this CPU runs the ISA (run-time detection, cached).
    pub fn detected(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::sync::OnceLock;
            static AVX2: OnceLock<bool> = OnceLock::new();
            static AVX512: OnceLock<bool> = OnceLock::new();
            let avx2 = *AVX2.get_or_init(|| {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            });
            match self {
                Isa::Avx2 => avx2,
                Isa::Avx512 => {
                    avx2 && *AVX512.get_or_init(|| {
                        is_x86_feature_detected!("avx512f")
                            && is_x86_feature_detected!("avx512bw")
                            && is_x86_feature_detected!("avx512vl")
                            && is_x86_feature_detected!("avx512vnni")
                    })
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The variant of the shared non-matmul ops (`mollm_cpu_common::ops`) for this tier.
    pub fn ops(self) -> mollm_cpu_common::ops::Isa {
        match self {
            Isa::Avx2 => mollm_cpu_common::ops::Isa::Avx2,
            Isa::Avx512 => mollm_cpu_common::ops::Isa::Avx512,
        }
    }

    /// `score()` of the backend: 0 when the CPU lacks the ISA.
    pub fn score(self) -> u32 {
        match (self, self.detected()) {
            (_, false) => 0,
            (Isa::Avx2, true) => 20,
            (Isa::Avx512, true) => 30,
        }
    }
}

pub use mollm_cpu_common::Error;

#[cfg(target_arch = "x86_64")]
pub(crate) fn simd_has_kernel(kernel: quant::Kernel, dtype: abi::DType) -> bool {
    simd::has_kernel(kernel, dtype)
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn simd_has_kernel(_: quant::Kernel, _: abi::DType) -> bool {
    false
}

/// Converts an activation row with SIMD (`actq`), or answers `false` (then quant converts it).
pub(crate) fn simd_quantize_row(
    kernel: quant::Kernel,
    dtype: abi::DType,
    src: &[f32],
    dst: &mut [u8],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.detected() {
        // SAFETY: AVX2/FMA/F16C detected; the caller sizes `dst` for the converted row.
        return unsafe { actq::quantize_row(kernel, dtype, src, dst) };
    }
    let _ = (kernel, dtype, src, dst);
    false
}

/// # Safety
/// As `simd::rows_avx2` / `simd::rows_avx512` (the CPU supports `isa`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn simd_rows(
    isa: Isa,
    kernel: quant::Kernel,
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    w_stride: usize,
    act: *const u8,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx2 => simd::rows_avx2(kernel, dtype, n, w, w_stride, act, out),
        Isa::Avx512 => simd::rows_avx512(kernel, dtype, n, w, w_stride, act, out),
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "x86 kernels on {isa:?}: {kernel:?} {dtype} {n} {w:?} {w_stride} {act:?} {}",
        out.len()
    )
}

/// # Safety
/// As `simd::tile_avx2` / `simd::tile_avx512` (the CPU supports `isa`).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn simd_tile(
    isa: Isa,
    kernels: &[quant::Kernel],
    dtype: abi::DType,
    n: usize,
    w: *const u8,
    w_stride: usize,
    act: *const u8,
    a_stride: usize,
    nrows: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx2 => simd::tile_avx2(kernels, dtype, n, w, w_stride, act, a_stride, nrows, out),
        Isa::Avx512 => simd::tile_avx512(kernels, dtype, n, w, w_stride, act, a_stride, nrows, out),
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "x86 kernels on {isa:?}: {kernels:?} {dtype} {n} {w:?} {w_stride} {act:?} {a_stride} {nrows} {}",
        out.len()
    )
}

// ---------------------------------------------------------------- op entry points

/// Whether `compute` accepts this call (schema check, then formats/shapes/kernels).
///
/// # Safety
/// Descriptors as in an `OpCall` (data pointers may be null).
pub unsafe fn check(
    isa: Isa,
    op: Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    params: &OpParams,
) -> Result<(), Error> {
    abi::validate(op, inputs, outputs, params).map_err(Error::Invalid)?;
    if !isa.detected() {
        return Err(Error::Unsupported(format!("this CPU lacks {isa:?}")));
    }
    match op {
        Op::MatMul => matmul::check(
            inputs,
            outputs,
            abi::MatMulAttrs::from_params(params).chain(),
        ),
        _ => mollm_cpu_common::ops::check(op, inputs, outputs, params),
    }
}

/// Runs one op.
///
/// # Safety
/// A call on valid memory, as `BackendTable::compute` receives it.
pub unsafe fn compute_op(
    isa: Isa,
    host: &HostApi,
    op: Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    params: &OpParams,
) -> Result<(), Error> {
    check(isa, op, inputs, outputs, params)?;
    match op {
        Op::MatMul => matmul::run(
            isa,
            host,
            inputs,
            outputs,
            abi::MatMulAttrs::from_params(params).chain(),
        ),
        _ => mollm_cpu_common::ops::run(isa.ops(), host, op, inputs, outputs, params),
    }
}

// ---------------------------------------------------------------- the C table

/// The x86 backend computing with `ISA` ([`ISA_AVX2`] or [`ISA_AVX512`]); the C table, panic
/// catching and error texts come from `mollm-cpu-common`.
pub struct X86<const ISA: u8>;

impl<const ISA: u8> CpuBackend for X86<ISA> {
    fn score() -> u32 {
        Isa::from_u8(ISA).score()
    }

    unsafe fn check(
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        check(Isa::from_u8(ISA), op, inputs, outputs, params)
    }

    unsafe fn compute(
        host: &HostApi,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        compute_op(Isa::from_u8(ISA), host, op, inputs, outputs, params)
    }

    unsafe fn prepare(
        host: &HostApi,
        w: &TensorDesc,
        src: &mollm_cpu_common::SourcePages,
    ) -> Result<mollm_cpu_common::Prepared, Error> {
        matmul::prepare(Isa::from_u8(ISA), host, w, src)
    }

    unsafe fn check_prepared(
        kind: u32,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        abi::validate(op, inputs, outputs, params).map_err(Error::Invalid)?;
        if op == Op::GetRows && kind == matmul::KIND_LEGACY16 {
            // A tied embedding table, read from its repack.
            return legacy16::check_get_rows(inputs, outputs);
        }
        if op == Op::GetRows && kind == matmul::KIND_COPY {
            // A tied table copied as it is: the same layout, read by the plain kernel.
            return check(Isa::from_u8(ISA), op, inputs, outputs, params);
        }
        if op != Op::MatMul {
            return Err(Error::Unsupported(format!(
                "{}: no prepared-weight kernels",
                op.schema().name
            )));
        }
        matmul::check_prepared(
            Isa::from_u8(ISA),
            kind,
            inputs,
            outputs,
            abi::MatMulAttrs::from_params(params).chain(),
        )
    }

    unsafe fn compute_prepared(
        host: &HostApi,
        kind: u32,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        // The table's `compute` ran `check_prepared` on this call already.
        if op == Op::GetRows && kind == matmul::KIND_COPY {
            return compute_op(Isa::from_u8(ISA), host, op, inputs, outputs, params);
        }
        if op == Op::GetRows {
            return legacy16::get_rows(inputs, outputs);
        }
        if kind == matmul::KIND_WR16 {
            return wr16::run(host, inputs, outputs);
        }
        matmul::run_weights(
            Isa::from_u8(ISA),
            host,
            kind,
            inputs,
            outputs,
            abi::MatMulAttrs::from_params(params).chain(),
        )
    }
}

pub static TABLE_AVX2: BackendTable = mollm_cpu_common::table::<X86<ISA_AVX2>>();
pub static TABLE_AVX512: BackendTable = mollm_cpu_common::table::<X86<ISA_AVX512>>();

/// What `mollm_x86_avx2`'s `mollm_backend_entry` returns.
pub static HEADER_AVX2: BackendHeader =
    mollm_cpu_common::header(c"x86-avx2".as_ptr(), Isa::Avx2.feature_bits(), &TABLE_AVX2);

/// What `mollm_x86_avx512`'s `mollm_backend_entry` returns.
pub static HEADER_AVX512: BackendHeader = mollm_cpu_common::header(
    c"x86-avx512".as_ptr(),
    Isa::Avx512.feature_bits(),
    &TABLE_AVX512,
);

pub use mollm_cpu_common::last_error_string;

/// Safe entry to the SIMD kernels (tests, benchmarks): `out[r]` = output element of `kernel`
/// for weight row `r` of `w` (`out.len()` packed rows of `n` elements of `dtype`) and the
/// activation row `act` (already converted with `quant::quantize_activations_for`).
///
/// # Panics
/// If the CPU lacks `isa`, there is no SIMD kernel for `(kernel, dtype)`, or sizes disagree.
pub fn dot_rows(
    isa: Isa,
    kernel: quant::Kernel,
    dtype: abi::DType,
    n: usize,
    w: &[u8],
    act: &[u8],
    out: &mut [f32],
) {
    assert!(isa.detected(), "this CPU lacks {isa:?}");
    assert!(
        simd_has_kernel(kernel, dtype),
        "no SIMD {kernel:?} kernel for {dtype}"
    );
    let rb = quant::row_bytes(dtype, n).expect("whole blocks");
    assert_eq!(w.len(), rb * out.len(), "weight size");
    assert_eq!(
        Some(act.len()),
        quant::row_bytes(quant::vec_dot_type(dtype), n),
        "activation size"
    );
    // SAFETY: checked above.
    unsafe { simd_rows(isa, kernel, dtype, n, w.as_ptr(), rb, act.as_ptr(), out) }
}

/// Safe entry to the multi-column kernels (tests, benchmarks): `out[c * rows + r]` = output
/// element of `kernels[c]` for weight row `r` of `w` (`rows` packed rows of `n` elements of
/// `dtype`) and activation column `c` of `act` (`kernels.len()` converted rows, packed).
///
/// # Panics
/// If the CPU lacks `isa`, a kernel has no SIMD twin, or sizes disagree.
pub fn dot_tile(
    isa: Isa,
    kernels: &[quant::Kernel],
    dtype: abi::DType,
    n: usize,
    w: &[u8],
    act: &[u8],
    out: &mut [f32],
) {
    assert!(isa.detected(), "this CPU lacks {isa:?}");
    for &k in kernels {
        assert!(
            simd_has_kernel(k, dtype),
            "no SIMD {k:?} kernel for {dtype}"
        );
    }
    let rb = quant::row_bytes(dtype, n).expect("whole blocks");
    let ab = quant::row_bytes(quant::vec_dot_type(dtype), n).expect("whole blocks");
    let cols = kernels.len();
    assert!(cols > 0 && out.len() % cols == 0, "output size");
    let rows = out.len() / cols;
    assert_eq!(w.len(), rb * rows, "weight size");
    assert_eq!(act.len(), ab * cols, "activation size");
    // SAFETY: checked above.
    unsafe {
        simd_tile(
            isa,
            kernels,
            dtype,
            n,
            w.as_ptr(),
            rb,
            act.as_ptr(),
            ab,
            rows,
            out,
        )
    }
}
