//! Shared code of mollm's native AArch64 CPU backends (`mollm-arm-neon`; `mollm-arm-i8mm` is
//! to follow).
//!
//! Like the x86 backends, the kernels reproduce the reference's numerics bit for bit (which are
//! llama.cpp's x86 numerics): the same kernel choice per output column
//! (`quant::matmul_kernel`), the same activation conversion, and per output element the same
//! float operations in the same order. What makes that cheap on ARM: the x86 kernels' integer
//! stages are exact, so any instruction that produces the same integer sums serves. ggml's
//! `vec_dot` for the legacy formats keeps eight int32 lanes, lane k summing elements
//! 4k..4k+4 of a block; SDOT (dotprod) yields exactly those lanes, and the NEON baseline
//! builds them with SMULL + pairwise adds. The float stage (one FMA per lane per block, then
//! `hsum_float_8`) is the same per lane on both ISAs.
//!
//! Implemented so far: `mat_mul` for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights wherever ggml's
//! x86 build runs `vec_dot` or llamafile's tinyBLAS (the same per-element chain): decode for
//! all five, prompts for all but Q4_0 rows in the repack buffer; and every other op of the
//! x86 backends (attention over f32 caches, glu, rms_norm, rope, softmax, add, mul, scale,
//! get_rows, set_rows, argmax) through the portable variant of `mollm_cpu_common::ops`,
//! bit-identical to the reference. K-quant and repack matmuls answer `Unsupported` in
//! `supports`, so the host runs them on the next backend (the reference), and `mollm ops`
//! says so.
//!
//! Run-time feature detection picks the path ([`IntPath`]); nothing needs a global
//! `-C target-cpu`, and on other architectures the crate builds with the scalar path only and
//! the backend scores 0.

use abi::{HostApi, Op, OpParams, TensorDesc};
use mollm_cpu_common::{CpuBackend, Error};

pub mod kquants;
pub mod matmul;
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
}

impl IntPath {
    /// The best path this CPU runs (detected at run time, cached).
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
        }
    }
}

/// The `arm-neon` backend: NEON baseline, SDOT where the CPU has it.
pub struct ArmNeon;

impl CpuBackend for ArmNeon {
    fn score() -> u32 {
        match IntPath::detect() {
            IntPath::Scalar => 0,
            IntPath::Neon => 10,
            IntPath::Dotprod => 15,
        }
    }

    unsafe fn check(
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), Error> {
        abi::validate(op, inputs, outputs, params).map_err(Error::Invalid)?;
        if IntPath::detect() == IntPath::Scalar {
            return Err(Error::Unsupported(
                "arm-neon: this CPU is not AArch64".into(),
            ));
        }
        match op {
            Op::MatMul => matmul::check(inputs, outputs),
            // The shared ops' portable variant: the reference's formulas in plain Rust,
            // vectorized by the compiler for NEON (AArch64's baseline).
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
            Op::MatMul => matmul::run(IntPath::detect(), host, inputs, outputs),
            _ => mollm_cpu_common::ops::run(
                mollm_cpu_common::ops::Isa::Portable,
                host,
                op,
                inputs,
                outputs,
                params,
            ),
        }
    }
}

pub static TABLE_NEON: abi::BackendTable = mollm_cpu_common::table::<ArmNeon>();

/// What `mollm_arm_neon`'s `mollm_backend_entry` returns. It requires NEON only (dotprod is
/// used when present).
pub static HEADER_NEON: abi::BackendHeader =
    mollm_cpu_common::header(c"arm-neon".as_ptr(), abi::cpu::ARM_NEON, &TABLE_NEON);
