//! The AArch64 pieces of the shared ops: NEON twins of the portable code in [`crate::ops`],
//! one file per op file there (as `crate::x86`). Built only with the `neon` feature on an
//! AArch64 target (`cfg(neon)`, see `build.rs`), which the ARM backends ask for; NEON is
//! AArch64's baseline, so [`crate::ops::Isa::Neon`] needs no detection.
//!
//! Each kernel gives the same bits as the portable twin it replaces (the ARM backends' tests
//! compare both with the reference under qemu), so an op's result never depends on the ISA
//! that ran it: the reference's fused steps are `vfmaq_f32`, its rounded ones `vmulq_f32`
//! then `vaddq_f32`, and its reductions add in its own order ([`dot::reduce`]).

pub(crate) mod dot;
pub(crate) mod gated_delta_net;
pub(crate) mod rwkv_wkv7;
pub(crate) mod ssm_conv;
