//! Shared code of mollm's native AArch64 CPU backends, `mollm-arm-neon` (NEON baseline, SDOT
//! where the CPU has dotprod) and `mollm-arm-i8mm` (requires i8mm: SMMLA tiles for prompts).
//!
//! Like the x86 backends, the kernels reproduce the reference's numerics bit for bit (which are
//! llama.cpp's x86 numerics): the same kernel choice per output column
//! (`quant::matmul_kernel`), the same activation conversion, and per output element the same
//! float operations in the same order. What makes that cheap on ARM: the x86 kernels' integer
//! stages are exact, so any instruction that produces the same integer sums serves. ggml's
//! `vec_dot` for the legacy formats keeps eight int32 lanes, lane k summing elements
//! 4k..4k+4 of a block; SDOT (dotprod) yields exactly those lanes, and the NEON baseline
//! builds them with SMULL + pairwise adds. The float stage (one FMA per lane per block, then
//! `hsum_float_8`) is the same per lane on both ISAs. The chains whose integers are sums over
//! 16 or 32 elements (ggml's repack GEMV/GEMM, the tiled K-quant matmul) run on 2-row ×
//! 2-column tiles ([`mmla`]), by SMMLA on `arm-i8mm`.
//!
//! `mat_mul` covers F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K with every chain
//! ggml's x86 build picks ([`matmul`]); every other op of the x86 backends (attention over f32
//! caches, glu, rms_norm, rope, softmax, add, mul, scale, get_rows, set_rows, argmax,
//! ssm_conv, gated_delta_net, rwkv_wkv7, norm, l2_norm, token_shift) runs through `mollm_cpu_common::ops` on its
//! `Isa::Neon` variant ([`ops_isa`]): NEON kernels for ssm_conv, gated_delta_net and
//! rwkv_wkv7, the portable formulas in a NEON frame for the rest; bit-identical to the
//! reference either way.
//!
//! Run-time feature detection picks the path ([`IntPath`]); nothing needs a global
//! `-C target-cpu`, and on other architectures the crate builds with the scalar path only and
//! both backends score 0.

use abi::{HostApi, Op, OpParams, TensorDesc};
use mollm_cpu_common::{CpuBackend, Error};

pub mod kquants;
pub mod matmul;
pub mod mmla;
pub mod repack;
pub mod simd;

/// How a kernel computes its integer lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntPath {
    /// Portable Rust (the twin every SIMD path is tested against).
    Scalar,
    /// NEON: SMULL + SADDLP + ADDP.
    Neon,
    /// NEON + SDOT (Armv8.2 dotprod).
    Dotprod,
    /// SDOT, and SMMLA (Armv8.6 i8mm) for 2×2 tiles ([`mmla::pair_halves`]).
    I8mm,
}

impl IntPath {
    /// The best path of `arm-neon` on this CPU (detected at run time, cached): never
    /// [`IntPath::I8mm`], which is `arm-i8mm`'s.
    pub fn detect() -> IntPath {
        #[cfg(target_arch = "aarch64")]
        {
            use std::sync::OnceLock;
            static P: OnceLock<IntPath> = OnceLock::new();
            *P.get_or_init(|| {
                if std::arch::is_aarch64_feature_detected!("dotprod") {
                    IntPath::Dotprod
                } else {
                    IntPath::Neon
                }
            })
        }
        #[cfg(not(target_arch = "aarch64"))]
        {
            IntPath::Scalar
        }
    }

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            IntPath::Scalar => true,
            IntPath::Neon => cfg!(target_arch = "aarch64"),
            IntPath::Dotprod => IntPath::detect() == IntPath::Dotprod,
            IntPath::I8mm => has_i8mm(),
        }
    }
}

/// Whether the CPU has dotprod and i8mm (every i8mm core has dotprod; both are checked).
fn has_i8mm() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        IntPath::detect() == IntPath::Dotprod && std::arch::is_aarch64_feature_detected!("i8mm")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// The ARM backends: `Arm<false>` is `arm-neon` (NEON baseline, SDOT where the CPU has it),
/// `Arm<true>` is `arm-i8mm` (SDOT GEMV for decode, SMMLA tiles for prompts; opens only where
/// the CPU has i8mm).
pub struct Arm<const I8MM: bool>;

/// The variant of the shared non-matmul ops the ARM backends run: `Isa::Neon` on AArch64
/// (its baseline), the portable one elsewhere (where the backends score 0 and compute nothing).
pub fn ops_isa() -> mollm_cpu_common::ops::Isa {
    if cfg!(target_arch = "aarch64") {
        mollm_cpu_common::ops::Isa::Neon
    } else {
        mollm_cpu_common::ops::Isa::Portable
    }
}

impl<const I8MM: bool> Arm<I8MM> {
    /// The path this backend runs on this CPU ([`IntPath::Scalar`]: it cannot run here).
    fn path() -> IntPath {
        match (I8MM, has_i8mm()) {
            (false, _) => IntPath::detect(),
            (true, true) => IntPath::I8mm,
            (true, false) => IntPath::Scalar,
        }
    }
}

impl<const I8MM: bool> CpuBackend for Arm<I8MM> {
    fn score() -> u32 {
        match Self::path() {
            IntPath::Scalar => 0,
            IntPath::Neon => 10,
            IntPath::Dotprod => 15,
            IntPath::I8mm => 20,
        }
    }

    unsafe fn check(
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        abi::validate(op, inputs, outputs, params).map_err(Error::Invalid)?;
        if Self::path() == IntPath::Scalar {
            return Err(Error::Unsupported(if I8MM {
                "arm-i8mm: this CPU lacks i8mm".into()
            } else {
                "arm-neon: this CPU is not AArch64".into()
            }));
        }
        match op {
            Op::MatMul => matmul::check(
                inputs,
                outputs,
                abi::MatMulAttrs::from_params(params).chain(),
            ),
            // The shared ops: NEON kernels for the recurrent ops, the portable formulas
            // (vectorized by the compiler for NEON, AArch64's baseline) for the rest.
            _ => mollm_cpu_common::ops::check(op, inputs, outputs, params),
        }
    }

    unsafe fn compute(
        host: &HostApi,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        match op {
            Op::MatMul => matmul::run(
                Self::path(),
                host,
                false,
                inputs,
                outputs,
                abi::MatMulAttrs::from_params(params).chain(),
            ),
            _ => mollm_cpu_common::ops::run(ops_isa(), host, op, inputs, outputs, params),
        }
    }

    unsafe fn prepare(
        _host: &HostApi,
        w: &TensorDesc,
        _src: &mollm_cpu_common::SourcePages,
    ) -> Result<mollm_cpu_common::Prepared, Error> {
        // Q4_K matrices of a few MiB: a mapped source's pages are dropped when it is done.
        if Self::path() == IntPath::Scalar {
            return Err(Error::Unsupported("prepare_weight: not an ARM CPU".into()));
        }
        matmul::prepare(w)
    }

    unsafe fn check_prepared(
        kind: u32,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        Self::check(op, inputs, outputs, params)?;
        if op != Op::MatMul {
            return Err(Error::Unsupported(format!(
                "{}: no prepared-weight kernels",
                op.schema().name
            )));
        }
        matmul::check_prepared(kind, inputs)
    }

    unsafe fn compute_prepared(
        host: &HostApi,
        kind: u32,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        // The table's `compute` ran `check_prepared` on this call already (one layout).
        let _ = (kind, op);
        matmul::run(
            Self::path(),
            host,
            true,
            inputs,
            outputs,
            abi::MatMulAttrs::from_params(params).chain(),
        )
    }
}

pub static TABLE_NEON: abi::BackendTable = mollm_cpu_common::table::<Arm<false>>();
pub static TABLE_I8MM: abi::BackendTable = mollm_cpu_common::table::<Arm<true>>();

/// What `mollm_arm_neon`'s `mollm_backend_entry` returns. It requires NEON only (dotprod is
/// used when present).
pub static HEADER_NEON: abi::BackendHeader =
    mollm_cpu_common::header(c"arm-neon".as_ptr(), abi::cpu::ARM_NEON, &TABLE_NEON);

/// What `mollm_arm_i8mm`'s `mollm_backend_entry` returns: it requires NEON, dotprod and i8mm.
pub static HEADER_I8MM: abi::BackendHeader = mollm_cpu_common::header(
    c"arm-i8mm".as_ptr(),
    abi::cpu::ARM_NEON | abi::cpu::ARM_DOTPROD | abi::cpu::ARM_I8MM,
    &TABLE_I8MM,
);
