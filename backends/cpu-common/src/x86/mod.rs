//! The x86-64 pieces of the shared ops: AVX2 and AVX-512 twins of the portable code in
//! [`crate::ops`], [`crate::wmatmul`] and [`crate::fmatmul`], one file per op file there (ggml
//! keeps its ISAs apart the same way, in `ggml-cpu/arch/x86`). Built only with the `x86`
//! feature on an x86-64 target (`cfg(x86)`, see `build.rs`), which the x86 backends ask for.
//!
//! Each kernel gives the same bits as the portable twin it replaces (the crate's tests and the
//! conformance suite compare them), so an op's result never depends on the ISA that ran it.

pub(crate) mod attention;
pub(crate) mod fmatmul;
pub(crate) mod gated_delta_net;
pub(crate) mod glu;
pub(crate) mod norm;
pub(crate) mod numerics;
pub(crate) mod wmatmul;

/// AVX2 with FMA and F16C ([`crate::ops::Isa::Avx2`]).
pub(crate) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// AVX-512 F/BW/VL and the AVX2 set ([`crate::ops::Isa::Avx512`]).
pub(crate) fn has_avx512() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

/// Asks for the `bytes` at `p` into L1 (`T0`) or L2 (`T1`), one request per 64-byte line.
/// A prefetch never faults, whatever the address.
#[inline(always)]
pub(crate) fn prefetch<const L2: bool>(p: *const u8, bytes: usize) {
    use core::arch::x86_64::*;
    for off in (0..bytes).step_by(64) {
        let a = p.wrapping_add(off) as *const i8;
        // SAFETY: prefetch never faults.
        unsafe {
            match L2 {
                true => _mm_prefetch::<_MM_HINT_T1>(a),
                false => _mm_prefetch::<_MM_HINT_T0>(a),
            }
        }
    }
}
