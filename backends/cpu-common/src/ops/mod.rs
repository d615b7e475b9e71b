//! Native versions of the non-matmul ops for every CPU backend, bit-identical to the reference
//! backend (which
//! mirrors llama.cpp's AVX-512 build). Where the order of float operations matters, the
//! reference's scalar formulas are replayed exactly (see `numerics/src/lib.rs`); SIMD is used
//! only where the lane structure *is* the reference's structure: the 16-lane FMA accumulators
//! of `ggml_vec_dot_f32` / tinyBLAS in attention, and element-wise loops (add, mul, scale,
//! `p·V` accumulation per output element). Every row body runs inside a `#[target_feature]`
//! function (`isa_dispatch!`), so the compiler may vectorize independent element-wise work with the
//! ISA's registers; that never changes a result, since each element's operations are the same.
//!
//! The x86 pieces (AVX2/AVX-512 registers, gathers, prefetches) live in `crate::x86`, in files
//! named as the ones here, and are reached through [`Isa`] at `#[cfg(x86)]` points; the
//! AArch64 pieces (NEON registers: the recurrent ops ssm_conv, gated_delta_net and rwkv_wkv7)
//! live in `crate::arm`, reached on [`Isa::Neon`] at `#[cfg(neon)]` points. The other ops run
//! their portable bodies in the NEON frame on ARM.
//! [`Isa::Portable`] runs the same formulas as plain Rust (the scalar twins of the SIMD
//! pieces), so any CPU gets the reference's exact results; the compiler still vectorizes the
//! element-wise loops for the target's baseline (NEON on AArch64).
//!
//! Supported: host memory, f32 tensors with packed elements (`nb[0] == 4`), any row strides.
//! attention: f32 or f16 K/V caches (f16: the reference's ggml_vec_dot_f16 / tinyBLAS chains,
//! q and the probabilities rounded to f16). rope: no YaRN (`ext_factor != 0` ->
//! Unsupported). set_rows: f32 or f16 destination (round to nearest even). ssm_conv: the
//! reference's scalar chain per output (any `taps`). gated_delta_net: the reference's token
//! step per (head, sequence), either gate form, any head size. rwkv_wkv7: the reference's
//! token step per (head, sequence), any head size. norm, l2_norm: the reference's rows
//! (`numerics`), any group. token_shift: per sequence, exact.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use crate::par::{parallel_for, SyncPtr};
use crate::{split_row, Error};
use abi::{DType, HostApi, Op, OpParams, TensorDesc};
use abi::{GluAttrs, RmsNormAttrs, ScaleAttrs, SoftmaxAttrs};

/// Which code the ops run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 AVX2 + FMA + F16C (the kernels in `crate::x86`; never detected without the
    /// crate's `x86` feature).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL (+ the AVX2 set), as `Avx2`.
    Avx512,
    /// AArch64 NEON (the kernels in `crate::arm`; never detected without the crate's `neon`
    /// feature, always with it: NEON is AArch64's baseline).
    Neon,
}

impl Isa {
    /// Whether this CPU runs the variant.
    pub fn detected(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(x86)]
            Isa::Avx2 => crate::x86::has_avx2(),
            #[cfg(x86)]
            Isa::Avx512 => crate::x86::has_avx512(),
            #[cfg(neon)]
            Isa::Neon => true,
            _ => false,
        }
    }
}

pub use ::numerics::KV_PAD;

/// The ops this module computes.
pub const OPS: &[Op] = &[
    Op::Attention,
    Op::Glu,
    Op::RmsNorm,
    Op::Rope,
    Op::Add,
    Op::Mul,
    Op::Scale,
    Op::GetRows,
    Op::SetRows,
    Op::Softmax,
    Op::Argmax,
    Op::SsmConv,
    Op::GatedDeltaNet,
    Op::RwkvWkv7,
    Op::Norm,
    Op::L2Norm,
    Op::TokenShift,
];

// ---------------------------------------------------------------- ISA frames

/// Defines `$name(isa, args..)`, which runs the `#[inline(always)]` body `$body(args..)`
/// inside a function compiled for `isa` (`#[target_feature]`), so the body's element-wise
/// loops and `mul_add`s use the ISA's vector and FMA instructions.
macro_rules! isa_dispatch {
    ($name:ident => $body:ident($($arg:ident: $ty:ty),*)) => {
        #[inline]
        pub(crate) unsafe fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(x86)]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2($($arg: $ty),*) {
                $body($($arg),*)
            }
            #[cfg(x86)]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
            unsafe fn avx512($($arg: $ty),*) {
                $body($($arg),*)
            }
            #[cfg(neon)]
            #[target_feature(enable = "neon")]
            unsafe fn neon($($arg: $ty),*) {
                $body($($arg),*)
            }
            match isa {
                #[cfg(neon)]
                Isa::Neon => neon($($arg),*),
                #[cfg(x86)]
                Isa::Avx2 => avx2($($arg),*),
                #[cfg(x86)]
                Isa::Avx512 => avx512($($arg),*),
                _ => $body($($arg),*),
            }
        }
    };
}

pub(crate) mod argmax;
pub(crate) mod attention;
pub(crate) mod elementwise;
pub(crate) mod gated_delta_net;
pub(crate) mod get_rows;
pub(crate) mod glu;
pub(crate) mod norm;
pub(crate) mod numerics;
pub(crate) mod rope;
pub(crate) mod rwkv_wkv7;
pub(crate) mod set_rows;
pub(crate) mod softmax;
pub(crate) mod ssm_conv;
pub(crate) mod token_shift;

use argmax::*;
use attention::*;
use elementwise::*;
use gated_delta_net::*;
use get_rows::*;
use glu::*;
use norm::*;
use numerics::*;
use rope::*;
use rwkv_wkv7::*;
use set_rows::*;
use softmax::*;
use ssm_conv::*;
use token_shift::*;

#[allow(unused_imports)] // x86 kernels only
pub(crate) use ::numerics::reduce16;

// ---------------------------------------------------------------- checks

pub(crate) fn unsupported<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error::Unsupported(msg.into()))
}

pub(crate) fn invalid<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error::Invalid(msg.into()))
}

/// Host memory, non-negative strides; f32/i32 tensors with packed elements; block formats and
/// f16 with packed rows.
pub(crate) fn layout(op: Op, t: &TensorDesc) -> Result<(), Error> {
    let name = op.schema().name;
    let dt = t
        .dtype()
        .ok_or_else(|| Error::Invalid(format!("{name}: unknown dtype id {}", t.dtype)))?;
    if t.buffer != 0 {
        return unsupported(format!("{name}: device buffers"));
    }
    if t.nb.iter().any(|&b| b < 0) {
        return unsupported(format!("{name}: negative strides"));
    }
    let es = dt.info().block_bytes as i64;
    if t.ne[0] > 1 && t.nb[0] != es {
        return unsupported(format!("{name}: {dt} elements must be packed"));
    }
    if matches!(dt, DType::F32 | DType::I32) {
        for d in 0..abi::MAX_DIMS {
            if t.ne[d] > 1 && t.nb[d] % es != 0 {
                return invalid(format!("{name}: stride nb[{d}] is not a multiple of {es}"));
            }
        }
    }
    Ok(())
}

pub(crate) fn need_dtype(op: Op, t: &TensorDesc, dt: DType) -> Result<(), Error> {
    if t.dtype() != Some(dt) {
        return unsupported(format!(
            "{}: {} operands are not implemented by this backend",
            op.schema().name,
            t.dtype().map(|d| d.to_string()).unwrap_or_default()
        ));
    }
    Ok(())
}

pub(crate) fn dequantizable(dt: DType) -> bool {
    let info = dt.info();
    let src = vec![0u8; info.block_bytes as usize];
    let mut dst = vec![0f32; info.block_len as usize];
    quant::dequantize_row(dt, &src, &mut dst).is_ok()
}

/// Whether this module computes this (schema-validated) call.
pub fn check(
    op: Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<(), Error> {
    for t in inputs.iter().chain(outputs) {
        layout(op, t)?;
    }
    match op {
        Op::Attention => {
            let window = abi::AttentionAttrs::from_params(p).window;
            if window < 0 {
                return invalid(format!("attention: negative window {window}"));
            }
            need_dtype(op, &inputs[0], DType::F32)?;
            for t in &inputs[1..3] {
                if t.dtype() != Some(DType::F16) {
                    need_dtype(op, t, DType::F32)?;
                }
            }
            for t in [&inputs[0], &inputs[1], &inputs[2], &outputs[0]] {
                if t.ne[3] != 1 {
                    return unsupported("attention: 4-d operands");
                }
            }
            if let Some(t) = inputs.get(4) {
                need_dtype(op, t, DType::I32)?;
            }
        }
        Op::Rope => {
            let r = abi::RopeAttrs::from_params(p);
            if !matches!(r.mode, abi::ROPE_NORMAL | abi::ROPE_NEOX) {
                return invalid(format!("rope: unknown mode {}", r.mode));
            }
            if r.ext_factor != 0.0 {
                return unsupported("rope: YaRN (ext_factor != 0) is not implemented");
            }
            need_dtype(op, &inputs[0], DType::F32)?;
        }
        Op::Glu => {
            let act = abi::GluAttrs::from_params(p).act;
            if !matches!(act, abi::GLU_SILU | abi::GLU_GELU_TANH) {
                return invalid(format!("glu: unknown activation {act}"));
            }
        }
        Op::GetRows => {
            let dt = inputs[0].dtype().expect("validated");
            if !dequantizable(dt) {
                return unsupported(format!("get_rows: {dt} tables"));
            }
        }
        Op::SetRows => {
            if outputs[0].dtype() != Some(DType::F16) || inputs[2].dtype() != Some(DType::F16) {
                need_dtype(op, &outputs[0], DType::F32)?;
                need_dtype(op, &inputs[2], DType::F32)?;
            }
        }
        // F32 operands (the schema) with packed windows (`layout`): any taps, any strides.
        Op::SsmConv => {}
        // F32 operands (the schema) with packed rows (`layout`): either gate, any strides.
        Op::GatedDeltaNet => {}
        // F32 operands (the schema) with packed rows (`layout`): any head size, any strides.
        Op::RwkvWkv7 => {}
        // F32 operands (the schema) with packed rows (`layout`): any group, any strides.
        Op::Norm | Op::L2Norm | Op::TokenShift => {}
        Op::MatMul => unreachable!("handled by matmul"),
        _ => {}
    }
    for t in inputs.iter().chain(outputs) {
        if matches!(t.dtype(), Some(DType::F32) | Some(DType::I32)) {
            continue;
        }
        // Tables of get_rows, f16 caches of attention and set_rows (checked above).
        let f16_cache = t.dtype() == Some(DType::F16) && matches!(op, Op::Attention | Op::SetRows);
        if !matches!(op, Op::GetRows) && !f16_cache {
            return unsupported(format!(
                "{}: {} operands",
                op.schema().name,
                t.dtype().unwrap()
            ));
        }
    }
    Ok(())
}

/// Null / misaligned data of a non-empty tensor: invalid (as the reference).
pub(crate) fn data_ok(t: &TensorDesc) -> Result<(), Error> {
    if t.numel().unwrap_or(0) == 0 {
        return Ok(());
    }
    if t.data.is_null() {
        return invalid("null data pointer");
    }
    let align = match t.dtype() {
        Some(DType::F32) | Some(DType::I32) => 4,
        Some(DType::F16) | Some(DType::BF16) => 2,
        _ => 1,
    };
    if (t.data as usize) % align != 0 {
        return invalid(format!("data pointer is not {align}-byte aligned"));
    }
    Ok(())
}

// ---------------------------------------------------------------- tensor access

#[inline(always)]
pub(crate) fn row_ptr(t: &TensorDesc, i1: i64, i2: i64, i3: i64) -> *mut u8 {
    t.data
        .wrapping_offset((i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]) as isize)
}

/// Asks for the `bytes` at `p` in the caches ahead of their use (a hint: never faults).
#[inline(always)]
pub(crate) fn prefetch_bytes(p: *const u8, bytes: usize) {
    #[cfg(x86)]
    crate::x86::prefetch::<false>(p, bytes);
    let _ = (p, bytes);
}

/// Rows ahead of the one in use whose K or V bytes attention asks for: a decode query reads
/// each cache row once, from memory the other sequences' steps have pushed out of L2.
pub(crate) const ATTN_PREFETCH_ROWS: i64 = 6;

/// Copies an f32 row (packed elements) into `dst` (so outputs may alias inputs).
#[inline(always)]
pub(crate) unsafe fn read_into(t: &TensorDesc, i1: i64, i2: i64, i3: i64, dst: &mut [f32]) {
    let n = t.ne[0] as usize;
    core::ptr::copy(row_ptr(t, i1, i2, i3) as *const f32, dst.as_mut_ptr(), n);
}

#[inline(always)]
pub(crate) unsafe fn write_from(t: &TensorDesc, i1: i64, i2: i64, i3: i64, v: &[f32]) {
    let n = t.ne[0] as usize;
    core::ptr::copy(v.as_ptr(), row_ptr(t, i1, i2, i3) as *mut f32, n);
}

#[inline(always)]
pub(crate) unsafe fn read_i32(t: &TensorDesc, i: i64) -> i32 {
    (t.data.wrapping_offset((i * t.nb[0]) as isize) as *const i32).read()
}

/// `f(row)` for every row, in parallel tasks when the work is large (the split never changes
/// a result).
pub(crate) unsafe fn for_rows<F: Fn(i64)>(host: &HostApi, nrows: i64, row_len: i64, f: F) {
    let total = nrows.saturating_mul(row_len.max(1));
    // From 4096 elements: a batched decode step's rows (16 sequences of 576-1536) split
    // too. (Zen 4, 2 threads, SmolLM2 with 16 sequences: glu 194 -> 106 ms, rms_norm 93 -> 65
    // over the run, and the run 475-543 -> 585-594 tokens/s in three interleaved rounds,
    // against a 32768 threshold; 1024 measured the same as 4096.)
    let n_tasks = if total < 4096 || host.n_threads <= 1 {
        1
    } else {
        (host.n_threads as i64 * 4).min(nrows).max(1)
    };
    let per = (nrows + n_tasks - 1) / n_tasks.max(1);
    parallel_for(host, n_tasks as u32, |t| {
        let start = t as i64 * per;
        for r in start..(start + per).min(nrows) {
            f(r);
        }
    });
}

// ---------------------------------------------------------------- ggml scalar twins

/// Runs one checked op.
///
/// # Safety
/// A checked call on valid memory; the CPU supports `isa`.
pub unsafe fn run(
    isa: Isa,
    host: &HostApi,
    op: Op,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<(), Error> {
    for t in inputs.iter().chain(outputs) {
        data_ok(t)?;
    }
    match op {
        Op::Attention => return attention(isa, host, inputs, outputs, p),
        Op::Glu => glu(isa, host, inputs, outputs, GluAttrs::from_params(p).act),
        Op::RmsNorm => rms_norm(isa, host, inputs, outputs, RmsNormAttrs::from_params(p).eps),
        Op::Rope => rope(isa, host, inputs, outputs, p),
        Op::Add => binary(isa, host, inputs, outputs, false),
        Op::Mul => binary(isa, host, inputs, outputs, true),
        Op::Scale => scale(isa, host, inputs, outputs, ScaleAttrs::from_params(p).s),
        Op::Softmax => softmax(
            isa,
            host,
            inputs,
            outputs,
            SoftmaxAttrs::from_params(p).scale,
        ),
        Op::Argmax => argmax(host, inputs, outputs),
        Op::SsmConv => ssm_conv(isa, host, inputs, outputs),
        Op::GatedDeltaNet => gated_delta_net(isa, host, inputs, outputs),
        Op::RwkvWkv7 => rwkv_wkv7(isa, host, inputs, outputs),
        Op::Norm => norm(isa, host, inputs, outputs, abi::NormAttrs::from_params(p)),
        Op::L2Norm => l2_norm(
            isa,
            host,
            inputs,
            outputs,
            abi::L2NormAttrs::from_params(p).eps,
        ),
        Op::TokenShift => token_shift(isa, host, inputs, outputs),
        Op::GetRows => return get_rows(host, inputs, outputs),
        Op::SetRows => return set_rows(inputs, outputs),
        Op::MatMul => unreachable!("handled by matmul"),
    }
    Ok(())
}
