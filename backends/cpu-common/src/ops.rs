//! Native versions of the non-matmul ops for every CPU backend, bit-identical to the reference
//! backend (which
//! mirrors llama.cpp's AVX-512 build). Where the order of float operations matters, the
//! reference's scalar formulas are replayed exactly (see `reference/src/ggml.rs`); SIMD is used
//! only where the lane structure *is* the reference's structure: the 16-lane FMA accumulators
//! of `ggml_vec_dot_f32` / tinyBLAS in attention, and element-wise loops (add, mul, scale,
//! `p·V` accumulation per output element). Every row body runs inside a `#[target_feature]`
//! function (`isa_dispatch!`), so the compiler may vectorize independent element-wise work with the
//! ISA's registers; that never changes a result, since each element's operations are the same.
//!
//! [`Isa::Portable`] runs the same formulas as plain Rust (the scalar twins of the x86 SIMD
//! pieces), so any CPU gets the reference's exact results; the compiler still vectorizes the
//! element-wise loops for the target's baseline (NEON on AArch64).
//!
//! Supported: host memory, f32 tensors with packed elements (`nb[0] == 4`), any row strides.
//! attention: f32 or f16 K/V caches (f16: the reference's ggml_vec_dot_f16 / tinyBLAS chains,
//! q and the probabilities rounded to f16). rope: no YaRN (`ext_factor != 0` ->
//! Unsupported). set_rows: f32 or f16 destination (round to nearest even).

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use crate::par::{parallel_for, SyncPtr};
use crate::{split_row, Error};
use abi::{DType, HostApi, Op, OpParams, TensorDesc};

/// Which code the ops run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL (+ the AVX2 set).
    Avx512,
}

impl Isa {
    /// Whether this CPU runs the variant.
    pub fn detected(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.detected()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// llama.cpp's KV padding (`max(n_pad, 256)`), as the reference.
pub const KV_PAD: i64 = 256;

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
];

// ---------------------------------------------------------------- ISA frames

/// Defines `$name(isa, args..)`, which runs the `#[inline(always)]` body `$body(args..)`
/// inside a function compiled for `isa` (`#[target_feature]`), so the body's element-wise
/// loops and `mul_add`s use the ISA's vector and FMA instructions.
macro_rules! isa_dispatch {
    ($name:ident => $body:ident($($arg:ident: $ty:ty),*)) => {
        #[inline]
        unsafe fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2($($arg: $ty),*) {
                $body($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
            unsafe fn avx512($($arg: $ty),*) {
                $body($($arg),*)
            }
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => avx2($($arg),*),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => avx512($($arg),*),
                _ => $body($($arg),*),
            }
        }
    };
}

// ---------------------------------------------------------------- checks

fn unsupported<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error::Unsupported(msg.into()))
}

fn invalid<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error::Invalid(msg.into()))
}

/// Host memory, non-negative strides; f32/i32 tensors with packed elements; block formats and
/// f16 with packed rows.
fn layout(op: Op, t: &TensorDesc) -> Result<(), Error> {
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

fn need_dtype(op: Op, t: &TensorDesc, dt: DType) -> Result<(), Error> {
    if t.dtype() != Some(dt) {
        return unsupported(format!(
            "{}: {} operands are not implemented by this backend",
            op.schema().name,
            t.dtype().map(|d| d.to_string()).unwrap_or_default()
        ));
    }
    Ok(())
}

fn dequantizable(dt: DType) -> bool {
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
            if p.i[1] < 0 {
                return invalid(format!("attention: negative window {}", p.i[1]));
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
            if !matches!(p.i[0], abi::ROPE_NORMAL | abi::ROPE_NEOX) {
                return invalid(format!("rope: unknown mode {}", p.i[0]));
            }
            if p.f[2] != 0.0 {
                return unsupported("rope: YaRN (ext_factor != 0) is not implemented");
            }
            need_dtype(op, &inputs[0], DType::F32)?;
        }
        Op::Glu => {
            if !matches!(p.i[0], abi::GLU_SILU | abi::GLU_GELU_TANH) {
                return invalid(format!("glu: unknown activation {}", p.i[0]));
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
fn data_ok(t: &TensorDesc) -> Result<(), Error> {
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
fn row_ptr(t: &TensorDesc, i1: i64, i2: i64, i3: i64) -> *mut u8 {
    t.data
        .wrapping_offset((i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]) as isize)
}

/// Asks for the `bytes` at `p` in the caches ahead of their use (a hint: never faults).
#[inline(always)]
fn prefetch_bytes(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        // SAFETY: prefetch never faults, whatever the address.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(off) as *const i8,
            )
        };
    }
    let _ = (p, bytes);
}

/// Rows ahead of the one in use whose K or V bytes attention asks for: a decode query reads
/// each cache row once, from memory the other sequences' steps have pushed out of L2.
const ATTN_PREFETCH_ROWS: i64 = 6;

/// Copies an f32 row (packed elements) into `dst` (so outputs may alias inputs).
#[inline(always)]
unsafe fn read_into(t: &TensorDesc, i1: i64, i2: i64, i3: i64, dst: &mut [f32]) {
    let n = t.ne[0] as usize;
    core::ptr::copy(row_ptr(t, i1, i2, i3) as *const f32, dst.as_mut_ptr(), n);
}

#[inline(always)]
unsafe fn write_from(t: &TensorDesc, i1: i64, i2: i64, i3: i64, v: &[f32]) {
    let n = t.ne[0] as usize;
    core::ptr::copy(v.as_ptr(), row_ptr(t, i1, i2, i3) as *mut f32, n);
}

#[inline(always)]
unsafe fn read_i32(t: &TensorDesc, i: i64) -> i32 {
    (t.data.wrapping_offset((i * t.nb[0]) as isize) as *const i32).read()
}

/// `f(row)` for every row, in parallel tasks when the work is large (the split never changes
/// a result).
unsafe fn for_rows<F: Fn(i64)>(host: &HostApi, nrows: i64, row_len: i64, f: F) {
    let total = nrows.saturating_mul(row_len.max(1));
    let n_tasks = if total < 32 * 1024 || host.n_threads <= 1 {
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

/// `_mm512_reduce_add_ps` as GCC implements it.
#[inline(always)]
pub(crate) fn reduce16(v: &[f32; 16]) -> f32 {
    let mut t8 = [0f32; 8];
    for i in 0..8 {
        t8[i] = v[i + 8] + v[i];
    }
    let mut t4 = [0f32; 4];
    for i in 0..4 {
        t4[i] = t8[i + 4] + t8[i];
    }
    let a = t4[0] + t4[2];
    let b = t4[1] + t4[3];
    a + b
}

/// Scalar twin of the AVX-512 `ggml_v_expf` (one lane), as the reference (the SIMD
/// [`expf16`] is tested against it).
#[cfg_attr(not(test), allow(dead_code))]
#[inline(always)]
fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000);
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let u = b * b;
    let c_a = f32::from_bits(0x3c07_2010);
    let c_b = f32::from_bits(0x3d2b_9f17);
    let c_c = f32::from_bits(0x3e2a_af33);
    let c_d = f32::from_bits(0x3eff_fedb);
    let c_e = f32::from_bits(0x3f7f_fff6);
    let j = c_a
        .mul_add(b, c_b)
        .mul_add(u, c_c.mul_add(b, c_d))
        .mul_add(u, c_e.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    if j.is_nan() || n.is_nan() {
        return f32::NAN;
    }
    // n is integral here; 2^n is exact in f64 (|n| <= 192), so one rounding follows, as in
    // the reference's `j as f64 * 2f64.powi(n)`.
    let e = n.floor() as i32;
    (j as f64 * f64::from_bits(((e + 1023) as u64) << 52)) as f32
}

#[cfg_attr(not(test), allow(dead_code))]
#[inline(always)]
fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

#[inline(always)]
fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ggml_vec_soft_max_f32` (AVX-512): exps into `y`, their sum in f64. The 16-lane steps
/// by [`expf16`] (SIMD, bit-identical to [`v_expf`] per lane).
#[inline(always)]
unsafe fn soft_max_f32(isa: Isa, x: &[f32], y: &mut [f32], max: f32) -> f64 {
    let n = x.len();
    let mut sum = 0f64;
    let mut i = 0;
    while i + 15 < n {
        let mut v = [0f32; 16];
        expf16(isa, x[i..i + 16].try_into().unwrap(), max, &mut v);
        y[i..i + 16].copy_from_slice(&v);
        sum += reduce16(&v) as f64;
        i += 16;
    }
    while i < n {
        let v = (x[i] - max).exp();
        sum += v as f64;
        y[i] = v;
        i += 1;
    }
    sum
}

/// `out[l] = v_expf(x[l] - max)` for 16 lanes.
#[inline(always)]
unsafe fn expf16(isa: Isa, x: &[f32; 16], max: f32, out: &mut [f32; 16]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => expf16_avx512(x, max, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            expf8_avx2(
                x[..8].try_into().unwrap(),
                max,
                (&mut out[..8]).try_into().unwrap(),
            );
            expf8_avx2(
                x[8..].try_into().unwrap(),
                max,
                (&mut out[8..]).try_into().unwrap(),
            );
        }
        _ => {
            for l in 0..16 {
                out[l] = v_expf(x[l] - max);
            }
        }
    }
}

/// `ggml_v_expf` (AVX-512 build) on `x - max`: the polynomial, `_mm512_scalef_ps`, and the
/// |n| > 192 lanes set to 0 or infinity, as [`v_expf`] replays it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn expf16_avx512(x: &[f32; 16], max: f32, out: &mut [f32; 16]) {
    use core::arch::x86_64::*;
    let x = _mm512_sub_ps(_mm512_loadu_ps(x.as_ptr()), _mm512_set1_ps(max));
    let r = _mm512_set1_ps(f32::from_bits(0x4b40_0000));
    let z = _mm512_fmadd_ps(x, _mm512_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(
        n,
        _mm512_set1_ps(f32::from_bits(0x35bf_be8e)),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(f32::from_bits(0x3f31_7200)), x),
    );
    let u = _mm512_mul_ps(b, b);
    let j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(
            _mm512_fmadd_ps(
                _mm512_set1_ps(f32::from_bits(0x3c07_2010)),
                b,
                _mm512_set1_ps(f32::from_bits(0x3d2b_9f17)),
            ),
            u,
            _mm512_fmadd_ps(
                _mm512_set1_ps(f32::from_bits(0x3e2a_af33)),
                b,
                _mm512_set1_ps(f32::from_bits(0x3eff_fedb)),
            ),
        ),
        u,
        _mm512_fmadd_ps(
            _mm512_set1_ps(f32::from_bits(0x3f7f_fff6)),
            b,
            _mm512_set1_ps(1.0),
        ),
    );
    let mut res = _mm512_scalef_ps(j, n);
    let d = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    if d != 0 {
        let le = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let alt = _mm512_mask_blend_ps(le, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
        res = _mm512_mask_blend_ps(d, res, alt);
    }
    _mm512_storeu_ps(out.as_mut_ptr(), res);
}

/// Four lanes of `f32(f64(j) * 2^e)` (`e` in the normal f64 exponent range).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn scale_half(
    j: core::arch::x86_64::__m128,
    e: core::arch::x86_64::__m128i,
) -> core::arch::x86_64::__m128 {
    use core::arch::x86_64::*;
    let p = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_add_epi64(
        _mm256_cvtepi32_epi64(e),
        _mm256_set1_epi64x(1023),
    )));
    _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(j), p))
}

/// [`expf16_avx512`] for eight lanes with AVX2: `scalef` replayed as `f64(j) * 2^n` rounded
/// once to f32 (exact product, so the same single rounding).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn expf8_avx2(x: &[f32; 8], max: f32, out: &mut [f32; 8]) {
    use core::arch::x86_64::*;
    let x = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr()), _mm256_set1_ps(max));
    let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000));
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        _mm256_set1_ps(f32::from_bits(0x35bf_be8e)),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x),
    );
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3c07_2010)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3d2b_9f17)),
            ),
            u,
            _mm256_fmadd_ps(
                _mm256_set1_ps(f32::from_bits(0x3e2a_af33)),
                b,
                _mm256_set1_ps(f32::from_bits(0x3eff_fedb)),
            ),
        ),
        u,
        _mm256_fmadd_ps(
            _mm256_set1_ps(f32::from_bits(0x3f7f_fff6)),
            b,
            _mm256_set1_ps(1.0),
        ),
    );
    // |n| > 192 lanes are replaced below; clamp so their exponents stay harmless.
    let nc = _mm256_min_ps(
        _mm256_max_ps(n, _mm256_set1_ps(-192.0)),
        _mm256_set1_ps(192.0),
    );
    let ni = _mm256_cvtps_epi32(nc);
    let mut res = _mm256_set_m128(
        scale_half(
            _mm256_extractf128_ps::<1>(j),
            _mm256_extracti128_si256::<1>(ni),
        ),
        scale_half(_mm256_castps256_ps128(j), _mm256_castsi256_si128(ni)),
    );
    let d = _mm256_cmp_ps::<_CMP_GT_OQ>(
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), n),
        _mm256_set1_ps(192.0),
    );
    if _mm256_movemask_ps(d) != 0 {
        let le = _mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps());
        let alt = _mm256_blendv_ps(_mm256_set1_ps(f32::INFINITY), _mm256_setzero_ps(), le);
        res = _mm256_blendv_ps(res, alt, d);
    }
    // NaN lanes (n is NaN) stay NaN through the product, as in `v_expf`.
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(n, n);
    res = _mm256_blendv_ps(res, _mm256_set1_ps(f32::NAN), nan);
    _mm256_storeu_ps(out.as_mut_ptr(), res);
}

#[inline(always)]
fn ggml_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

fn gelu_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = f32::from_bits(0x3f4c_422a);
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

static GELU_TABLE: std::sync::OnceLock<Box<[u16]>> = std::sync::OnceLock::new();

fn gelu_table() -> &'static [u16] {
    GELU_TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| quant::f32_to_fp16(gelu_f32(quant::fp16_to_f32(i))))
            .collect()
    })
}

// ---------------------------------------------------------------- element-wise ops

#[inline(always)]
unsafe fn add_row_body(x: &mut [f32], y: &[f32]) {
    for c in x.chunks_exact_mut(y.len()) {
        for (v, &w) in c.iter_mut().zip(y) {
            *v += w;
        }
    }
}
isa_dispatch!(add_row => add_row_body(x: &mut [f32], y: &[f32]));

#[inline(always)]
unsafe fn mul_row_body(x: &mut [f32], y: &[f32]) {
    for c in x.chunks_exact_mut(y.len()) {
        for (v, &w) in c.iter_mut().zip(y) {
            *v *= w;
        }
    }
}
isa_dispatch!(mul_row => mul_row_body(x: &mut [f32], y: &[f32]));

#[inline(always)]
unsafe fn scale_row_body(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}
isa_dispatch!(scale_row => scale_row_body(x: &mut [f32], s: f32));

/// SwiGLU row: whole 16-blocks through `ggml_v_silu`, the tail through `ggml_silu_f32`.
#[inline(always)]
unsafe fn swiglu_row_body(isa: Isa, x: &mut [f32], g: &[f32]) {
    let k = x.len();
    let full = k & !15;
    // v_silu(x) * g = (x / (1 + v_expf(0 - x))) * g, the exps 16 lanes at a time.
    let mut i = 0;
    while i < full {
        let mut nx = [0f32; 16];
        for l in 0..16 {
            nx[l] = 0.0 - x[i + l];
        }
        let mut e = [0f32; 16];
        expf16(isa, &nx, 0.0, &mut e);
        for l in 0..16 {
            x[i + l] = x[i + l] / (1.0 + e[l]) * g[i + l];
        }
        i += 16;
    }
    for i in full..k {
        x[i] = silu_scalar(x[i]) * g[i];
    }
}
isa_dispatch!(swiglu_row => swiglu_row_body(isa_: Isa, x: &mut [f32], g: &[f32]));

/// GeGLU row through ggml's f16 GELU table.
#[inline(always)]
unsafe fn geglu_row_body(x: &mut [f32], g: &[f32], t: &[u16]) {
    for i in 0..x.len() {
        let v = x[i];
        x[i] = if v <= -10.0 {
            0.0
        } else {
            let gl = if v >= 10.0 {
                v
            } else {
                quant::fp16_to_f32(t[quant::f32_to_fp16(v) as usize])
            };
            gl * g[i]
        };
    }
}
isa_dispatch!(geglu_row => geglu_row_body(x: &mut [f32], g: &[f32], t: &[u16]));

/// rms_norm row: f64 sum of f32 squares, in order; `y = (x * scale) * w`.
#[inline(always)]
unsafe fn rms_row_body(v: &mut [f32], w: &[f32], eps: f32) {
    let mut sum = 0f64;
    for &e in v.iter() {
        sum += (e * e) as f64;
    }
    let mean = (sum / v.len() as f64) as f32;
    let sc = 1.0f32 / (mean + eps).sqrt();
    for (e, &g) in v.iter_mut().zip(w) {
        *e = *e * sc * g;
    }
}
isa_dispatch!(rms_row => rms_row_body(v: &mut [f32], w: &[f32], eps: f32));

/// Rotation of one head: `y0 = fma(x0, cos, -(x1*sin))`, `y1 = fma(x0, sin, x1*cos)`.
#[inline(always)]
unsafe fn rope_row_body(v: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    for i0 in (0..n_dims).step_by(2) {
        let (c, s) = (cache[i0], cache[i0 + 1]);
        let (a, b) = if neox {
            (i0 / 2, i0 / 2 + n_dims / 2)
        } else {
            (i0, i0 + 1)
        };
        let (x0, x1) = (v[a], v[b]);
        v[a] = x0.mul_add(c, -(x1 * s));
        v[b] = x0.mul_add(s, x1 * c);
    }
}
isa_dispatch!(rope_row => rope_row_body(v: &mut [f32], cache: &[f32], n_dims: usize, neox: bool));

/// Softmax of `src` (already scaled) into `w`.
#[inline(always)]
unsafe fn softmax_row_body(isa: Isa, src: &[f32], w: &mut [f32]) {
    let max = src.iter().fold(f32::NEG_INFINITY, |m, &v| ggml_max(m, v));
    let sum = soft_max_f32(isa, src, w, max);
    let inv = (1.0 / sum) as f32;
    for e in w.iter_mut() {
        *e *= inv;
    }
}
isa_dispatch!(softmax_row => softmax_row_body(isa_: Isa, src: &[f32], w: &mut [f32]));

unsafe fn binary(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    mul: bool,
) {
    let (a, b, out) = (inputs[0], inputs[1], outputs[0]);
    let k = a.ne[0] as usize;
    let kb = b.ne[0] as usize;
    for_rows(host, a.nrows(), a.ne[0], |r| {
        let (i1, i2, i3) = split_row(&a, r);
        let mut x = vec![0f32; k];
        let mut y = vec![0f32; kb];
        read_into(&a, i1, i2, i3, &mut x);
        read_into(&b, i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3], &mut y);
        if mul {
            mul_row(isa, &mut x, &y);
        } else {
            add_row(isa, &mut x, &y);
        }
        write_from(&out, i1, i2, i3, &x);
    });
}

unsafe fn scale(isa: Isa, host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc], s: f32) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        scale_row(isa, &mut v, s);
        write_from(&out, i1, i2, i3, &v);
    });
}

unsafe fn glu(isa: Isa, host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc], act: i64) {
    let (gate, up, out) = (inputs[0], inputs[1], outputs[0]);
    let k = gate.ne[0] as usize;
    let table = if act == abi::GLU_SILU {
        None
    } else {
        Some(gelu_table())
    };
    for_rows(host, gate.nrows(), gate.ne[0], |r| {
        let (i1, i2, i3) = split_row(&gate, r);
        let mut x = vec![0f32; k];
        let mut g = vec![0f32; k];
        read_into(&gate, i1, i2, i3, &mut x);
        read_into(&up, i1, i2, i3, &mut g);
        match table {
            None => swiglu_row(isa, isa, &mut x, &g),
            Some(t) => geglu_row(isa, &mut x, &g, t),
        }
        write_from(&out, i1, i2, i3, &x);
    });
}

unsafe fn rms_norm(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    eps: f32,
) {
    let (x, wt, out) = (inputs[0], inputs[1], outputs[0]);
    let k = x.ne[0] as usize;
    let mut w = vec![0f32; k];
    read_into(&wt, 0, 0, 0, &mut w);
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        rms_row(isa, &mut v, &w, eps);
        write_from(&out, i1, i2, i3, &v);
    });
}

unsafe fn rope(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) {
    let (x, pos, out) = (inputs[0], inputs[1], outputs[0]);
    let (mode, n_dims) = (p.i[0], p.i[1] as usize);
    let (freq_base, freq_scale, attn_factor) = (p.f[0], p.f[1], p.f[3]);
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    // ggml_rope_cache_init without YaRN (ext_factor == 0: checked).
    let caches: Vec<Vec<f32>> = (0..x.ne[2])
        .map(|t| {
            let mut cache = vec![0f32; n_dims];
            let mut theta = read_i32(&pos, t) as f32;
            for i0 in (0..n_dims).step_by(2) {
                let th = freq_scale * theta;
                cache[i0] = th.cos() * attn_factor;
                cache[i0 + 1] = th.sin() * attn_factor;
                theta *= theta_scale;
            }
            cache
        })
        .collect();
    let neox = mode == abi::ROPE_NEOX;
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        rope_row(isa, &mut v, &caches[i2 as usize], n_dims, neox);
        write_from(&out, i1, i2, i3, &v);
    });
}

unsafe fn softmax(isa: Isa, host: &HostApi, inputs: &[TensorDesc], outputs: &[TensorDesc], s: f32) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut src = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut src);
        let mut w = vec![0f32; k];
        scale_row(isa, &mut src, s);
        softmax_row(isa, isa, &src, &mut w);
        write_from(&out, i1, i2, i3, &w);
    });
}

/// The index of the first largest element, NaN skipped; 0 when every element is NaN (the
/// reference's scan). The largest value first, in 16 lanes (`f32::max` passes over a NaN),
/// then the first element equal to it: the same index, vectorized (a 49152-token
/// vocabulary per decoding sequence per step).
fn first_max(v: &[f32]) -> usize {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for j in 0..16 {
            lanes[j] = lanes[j].max(c[j]);
        }
    }
    let m = lanes
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    v.iter().position(|&e| e == m).unwrap_or(0)
}

unsafe fn argmax(inputs: &[TensorDesc], outputs: &[TensorDesc]) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    let mut v = vec![0f32; k];
    for r in 0..x.nrows() {
        let (i1, i2, i3) = split_row(&x, r);
        read_into(&x, i1, i2, i3, &mut v);
        let idx = first_max(&v) as i32;
        let p = out
            .data
            .wrapping_offset((i1 * out.nb[0] + i2 * out.nb[1] + i3 * out.nb[2]) as isize)
            as *mut i32;
        p.write(idx);
    }
}

unsafe fn get_rows(
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
) -> Result<(), Error> {
    let (table, ids, out) = (inputs[0], inputs[1], outputs[0]);
    let dt = table.dtype().expect("validated");
    let m = ids.ne[0];
    let mut rows = Vec::with_capacity(m as usize);
    for i in 0..m {
        let id = read_i32(&ids, i) as i64;
        if id < 0 || id >= table.ne[1] {
            return invalid(format!(
                "get_rows: id {id} at {i} outside 0..{}",
                table.ne[1]
            ));
        }
        rows.push(id);
    }
    let k = table.ne[0] as usize;
    let bytes = dt.row_bytes(k as u64).expect("validated") as usize;
    let err = std::sync::Mutex::new(None);
    for_rows(host, m, table.ne[0], |i| {
        let src = core::slice::from_raw_parts(row_ptr(&table, rows[i as usize], 0, 0), bytes);
        let mut dst = vec![0f32; k];
        if let Err(e) = quant::dequantize_row(dt, src, &mut dst) {
            err.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(Error::Unsupported(format!("get_rows: {e}")));
            return;
        }
        write_from(&out, i, 0, 0, &dst);
    });
    match err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

unsafe fn set_rows(inputs: &[TensorDesc], outputs: &[TensorDesc]) -> Result<(), Error> {
    let (src, idx, dst_in, dst) = (inputs[0], inputs[1], inputs[2], outputs[0]);
    let m = src.ne[1];
    let mut rows = Vec::with_capacity(m as usize);
    for i in 0..m {
        let r = read_i32(&idx, i) as i64;
        if r < 0 || r >= dst.ne[1] {
            return invalid(format!(
                "set_rows: index {r} at {i} outside 0..{}",
                dst.ne[1]
            ));
        }
        rows.push(r);
    }
    let k = dst.ne[0] as usize;
    let f16 = dst.dtype() == Some(DType::F16);
    let es = if f16 { 2 } else { 4 };
    if dst_in.data != dst.data || dst_in.nb != dst.nb {
        for r in 0..dst.ne[1] {
            core::ptr::copy(row_ptr(&dst_in, r, 0, 0), row_ptr(&dst, r, 0, 0), es * k);
        }
    }
    let mut v = vec![0f32; k];
    for (i, &r) in rows.iter().enumerate() {
        read_into(&src, i as i64, 0, 0, &mut v);
        if f16 {
            // Packed f16 elements (checked by `layout`), rounded to nearest even.
            let d = row_ptr(&dst, r, 0, 0) as *mut u16;
            for (e, &x) in v.iter().enumerate() {
                d.add(e).write_unaligned(quant::f32_to_fp16(x));
            }
        } else {
            write_from(&dst, r, 0, 0, &v);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- attention

/// `ggml_vec_dot_f32` (AVX-512 build): 4 x 16 FMA accumulators over 64-element steps,
/// `GGML_F32x16_REDUCE`, then scalar FMA leftovers.
#[inline(always)]
unsafe fn dot_vec_f32(isa: Isa, x: *const f32, y: *const f32, n: usize) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => dot512(x, y, n),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => dot256(x, y, n),
        // SAFETY: `n` floats at `x` and at `y` (the caller's contract).
        _ => crate::fmatmul::vec_dot_f32(
            core::slice::from_raw_parts(x, n),
            core::slice::from_raw_parts(y, n),
        ),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn dot512(x: *const f32, y: *const f32, n: usize) -> f32 {
    use core::arch::x86_64::*;
    let np = n & !63;
    let mut acc = [0f32; 16];
    let mut a = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < np {
        for j in 0..4 {
            a[j] = _mm512_fmadd_ps(
                _mm512_loadu_ps(x.add(i + 16 * j)),
                _mm512_loadu_ps(y.add(i + 16 * j)),
                a[j],
            );
        }
        i += 64;
    }
    a[0] = _mm512_add_ps(a[0], a[2]);
    a[1] = _mm512_add_ps(a[1], a[3]);
    a[0] = _mm512_add_ps(a[0], a[1]);
    _mm512_storeu_ps(acc.as_mut_ptr(), a[0]);
    let mut sumf = reduce16(&acc);
    for i in np..n {
        sumf = (*x.add(i)).mul_add(*y.add(i), sumf);
    }
    sumf
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot256(x: *const f32, y: *const f32, n: usize) -> f32 {
    use core::arch::x86_64::*;
    let np = n & !63;
    let mut acc = [0f32; 16];
    // 16-lane accumulator j = (a[2j], a[2j+1]).
    let mut a = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i < np {
        for j in 0..8 {
            a[j] = _mm256_fmadd_ps(
                _mm256_loadu_ps(x.add(i + 8 * j)),
                _mm256_loadu_ps(y.add(i + 8 * j)),
                a[j],
            );
        }
        i += 64;
    }
    for h in 0..2 {
        a[h] = _mm256_add_ps(a[h], a[4 + h]);
        a[2 + h] = _mm256_add_ps(a[2 + h], a[6 + h]);
        a[h] = _mm256_add_ps(a[h], a[2 + h]);
    }
    _mm256_storeu_ps(acc.as_mut_ptr(), a[0]);
    _mm256_storeu_ps(acc.as_mut_ptr().add(8), a[1]);
    let mut sumf = reduce16(&acc);
    for i in np..n {
        sumf = (*x.add(i)).mul_add(*y.add(i), sumf);
    }
    sumf
}

/// Row `dst` = row `x` + row `y` (rows of `du` floats at `p`), element-wise. A plain function
/// (not a closure) so that it is inlined into, and vectorized for, the ISA frame.
#[inline(always)]
unsafe fn fold_rows(p: *mut f32, du: usize, dst: usize, x: usize, y: usize) {
    let (d, x, y) = (
        p.add(dst * du),
        p.add(x * du) as *const f32,
        p.add(y * du) as *const f32,
    );
    for i in 0..du {
        *d.add(i) = *x.add(i) + *y.add(i);
    }
}

#[inline(always)]
fn round_up(v: i64, m: i64) -> i64 {
    (v + m - 1) / m * m
}

/// One attention call, shared by its tasks.
struct Attn {
    isa: Isa,
    q: TensorDesc,
    k: TensorDesc,
    v: TensorDesc,
    out: TensorDesc,
    group: i64,
    n_kv: i64,
    n_eff: i64,
    window: i64,
    scale: f32,
    softcap: f32,
    kqv_tile: bool,
    /// f16 caches: q (for K) and the probabilities (for V) rounded to f16, and K's chain is
    /// tinyBLAS when `kq_tile`, ggml_vec_dot_f16 otherwise.
    k_f16: bool,
    v_f16: bool,
    kq_tile: bool,
    positions: Vec<i64>,
    /// The pool row of each of the sequence's rows (paged caches).
    rows: abi::PagedRows,
}

/// V row `(hk, j)` as f32: in place for an f32 cache, widened into `buf` for f16.
#[inline(always)]
unsafe fn v_row<'a>(
    v: &TensorDesc,
    hk: i64,
    j: i64,
    du: usize,
    buf: &'a mut [f32],
    f16: bool,
) -> &'a [f32] {
    let p = row_ptr(v, hk, j, 0);
    if f16 {
        widen_f16(p, buf);
        buf
    } else {
        core::slice::from_raw_parts(p as *const f32, du)
    }
}

/// An f16 cache row of `n` packed elements, widened exactly.
#[inline(always)]
unsafe fn widen_f16(p: *const u8, dst: &mut [f32]) {
    let p = p as *const u16;
    for (i, d) in dst.iter_mut().enumerate() {
        *d = quant::fp16_to_f32(p.add(i).read_unaligned());
    }
}

#[inline(always)]
fn round_f16(x: f32) -> f32 {
    quant::fp16_to_f32(quant::f32_to_fp16(x))
}

/// Output rows `(h, t)` for `h` in `h0..h1` (heads of one KV head) of attention, as
/// `reference::ops::attention::run` computes each for f32 caches (same kernels, lanes and
/// order), with the `p·V` accumulators stored lane-major (`acc[lane][i]`) so the per-row
/// update is a contiguous FMA over the head. The heads share each K and V row load; every
/// head keeps its own scores, accumulators and sums.
#[inline(always)]
unsafe fn attn_task_body(a: &Attn, h0: i64, h1: i64, t: i64) {
    let (q, k, v, out) = (&a.q, &a.k, &a.v, &a.out);
    let (n_kv, n_eff, window) = (a.n_kv, a.n_eff, a.window);
    let du = q.ne[0] as usize;
    let nh = (h1 - h0) as usize;
    let hk = h0 / a.group;
    let pt = a.positions[t as usize];
    let visible = |j: i64| j <= pt && (window == 0 || pt - j < window);
    let last = (n_kv - 1).min(pt);
    let mut qv = vec![0f32; du * nh];
    for g in 0..nh {
        read_into(q, h0 + g as i64, t, 0, &mut qv[g * du..(g + 1) * du]);
    }
    if a.k_f16 {
        for x in qv.iter_mut() {
            *x = round_f16(*x);
        }
    }
    // Widened rows of f16 caches.
    let mut krow = vec![0f32; if a.k_f16 { du } else { 0 }];
    let mut vrow = vec![0f32; if a.v_f16 { du } else { 0 }];
    let len = if last < 0 {
        n_eff.min(16)
    } else {
        round_up(last + 1, 16).min(n_eff)
    } as usize;
    let mut w = vec![f32::NEG_INFINITY; len * nh];
    let lanes: usize = if a.kqv_tile { 16 } else { 64 };
    let np = if a.kqv_tile {
        n_eff as usize
    } else {
        n_eff as usize & !63
    };
    let span = if last < 0 {
        0
    } else {
        (round_up(last + 1, lanes as i64) as usize).min(n_eff as usize)
    };
    let simd_end = span.min(np);
    let mut res = vec![0f32; du * nh];
    for j in 0..=last {
        if !visible(j) {
            continue;
        }
        if j + ATTN_PREFETCH_ROWS <= last {
            let kb = du * if a.k_f16 { 2 } else { 4 };
            prefetch_bytes(row_ptr(k, hk, a.rows.get(j + ATTN_PREFETCH_ROWS), 0), kb);
        }
        let kr = row_ptr(k, hk, a.rows.get(j), 0) as *const f32;
        if a.k_f16 {
            widen_f16(kr as *const u8, &mut krow);
        }
        for g in 0..nh {
            let s = if !a.k_f16 {
                dot_vec_f32(a.isa, kr, qv.as_ptr().add(g * du), du)
            } else if a.kq_tile {
                crate::fmatmul::dot_tile(&krow, &qv[g * du..(g + 1) * du])
            } else {
                crate::fmatmul::vec_dot_f16(&krow, &qv[g * du..(g + 1) * du])
            };
            let s = if a.softcap > 0.0 {
                ((s * (1.0 / a.softcap)).tanh() * a.softcap) * a.scale
            } else {
                s * a.scale
            };
            w[g * len + j as usize] = s;
        }
    }
    let mut src = vec![0f32; len];
    for g in 0..nh {
        let wg = &mut w[g * len..(g + 1) * len];
        let max = wg.iter().fold(f32::NEG_INFINITY, |m, &x| ggml_max(m, x));
        src.copy_from_slice(wg);
        let sum = soft_max_f32(a.isa, &src, wg, max);
        let inv = (1.0 / sum) as f32;
        for x in wg.iter_mut() {
            *x *= inv;
            if a.v_f16 {
                *x = round_f16(*x);
            }
        }
    }
    let hs = du * lanes; // accumulator floats per head
    let mut acc = vec![0f32; hs * nh];
    let v_end = simd_end.min(len);
    for j in 0..v_end {
        if j + (ATTN_PREFETCH_ROWS as usize) < v_end {
            let vb = du * if a.v_f16 { 2 } else { 4 };
            let jn = (j as i64) + ATTN_PREFETCH_ROWS;
            prefetch_bytes(row_ptr(v, hk, a.rows.get(jn), 0), vb);
        }
        let vr = v_row(v, hk, a.rows.get(j as i64), du, &mut vrow, a.v_f16);
        let lane = j % lanes;
        for g in 0..nh {
            let pj = w[g * len + j];
            if pj == 0.0 {
                continue;
            }
            let acc_l = &mut acc[g * hs + lane * du..g * hs + (lane + 1) * du];
            for i in 0..du {
                acc_l[i] = vr[i].mul_add(pj, acc_l[i]);
            }
        }
    }
    // The lane reductions (`reduce16` per output, after folding 64 lanes to 16 as
    // GGML_F32x16_REDUCE does), one element-wise step at a time over the whole head, in place:
    // the same additions per output, vectorized across outputs.
    for g in 0..nh {
        let p = acc.as_mut_ptr().add(g * hs);
        macro_rules! fold {
            ($d:expr, $x:expr, $y:expr) => {
                fold_rows(p, du, $d, $x, $y)
            };
        }
        if !a.kqv_tile {
            // g0 = A[l] + A[32+l]; g1 = A[16+l] + A[48+l]; g0 += g1
            for l in 0..16 {
                fold!(l, l, 32 + l);
                fold!(16 + l, 16 + l, 48 + l);
                fold!(l, l, 16 + l);
            }
        }
        // reduce16: t8 = v[8+i] + v[i]; t4 = t8[4+i] + t8[i]; (t4[0]+t4[2]) + (t4[1]+t4[3])
        for l in 0..8 {
            fold!(l, l + 8, l);
        }
        for l in 0..4 {
            fold!(l, l + 4, l);
        }
        fold!(0, 0, 2);
        fold!(1, 1, 3);
        fold!(0, 0, 1);
        res[g * du..(g + 1) * du].copy_from_slice(&acc[g * hs..g * hs + du]);
    }
    // ggml_vec_dot leftovers (rows past the last 64-step): f32 FMA (f32 V), or products
    // summed in f64 (f16 V, ggml_vec_dot_f16's tail).
    if !a.kqv_tile && (np as i64) < n_eff && span > np {
        let mut tail64: Vec<f64> = if a.v_f16 {
            res.iter().map(|&x| x as f64).collect()
        } else {
            Vec::new()
        };
        for j in np..(n_eff as usize) {
            if j as i64 >= n_kv {
                continue; // padding: v treated as zero
            }
            let vr = v_row(v, hk, a.rows.get(j as i64), du, &mut vrow, a.v_f16);
            for g in 0..nh {
                let pj = if j < len { w[g * len + j] } else { 0.0 };
                if a.v_f16 {
                    let r = &mut tail64[g * du..(g + 1) * du];
                    for i in 0..du {
                        r[i] += (vr[i] * pj) as f64;
                    }
                } else {
                    let r = &mut res[g * du..(g + 1) * du];
                    for i in 0..du {
                        r[i] = vr[i].mul_add(pj, r[i]);
                    }
                }
            }
        }
        if a.v_f16 {
            for (r, &x) in res.iter_mut().zip(&tail64) {
                *r = x as f32;
            }
        }
    }
    for g in 0..nh {
        let h = h0 + g as i64;
        for (i, &x) in res[g * du..(g + 1) * du].iter().enumerate() {
            let off = i as i64 * out.nb[0] + h * out.nb[1] + t * out.nb[2];
            // each (h, t) output row is written by one task only.
            (out.data.wrapping_offset(off as isize) as *mut f32).write(x);
        }
    }
}
isa_dispatch!(attn_task => attn_task_body(a: &Attn, h0: i64, h1: i64, t: i64));

unsafe fn attention(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    p: &OpParams,
) -> Result<(), Error> {
    // One call per sequence's worth of work (several with the `seqs` operand, ABI 1.4), all
    // in one parallel_for: a decode step's sequences each have one query, too little to
    // split across threads alone.
    let calls = abi::attention_seqs(inputs, &outputs[0], p).map_err(Error::Invalid)?;
    let mut parts = Vec::with_capacity(calls.len());
    for c in &calls {
        parts.push(attention_call(isa, c.inputs(), &c.out, &c.params)?);
    }
    // Tasks: (sequence, token, KV head, piece of its query heads). Whole groups share K/V
    // loads best; they are split only when there would be fewer than two tasks per thread.
    let want = 2 * host.n_threads.max(1) as usize;
    let (hq, hkv) = (inputs[0].ne[1], inputs[1].ne[1]);
    let group = hq / hkv;
    let (g, kt) = (
        group.max(1) as usize,
        (hkv * inputs[0].ne[2]).max(1) as usize,
    );
    let pieces = want.div_ceil(kt).clamp(1, g);
    let per = g.div_ceil(pieces);
    let (per, pieces) = (per as i64, g.div_ceil(per) as i64);
    // The first task of each sequence, then the total.
    let mut first = Vec::with_capacity(parts.len() + 1);
    let mut n_tasks = 0i64;
    for a in &parts {
        first.push(n_tasks);
        n_tasks += hkv * pieces * a.q.ne[2];
    }
    first.push(n_tasks);
    let shared = SyncPtr(parts.as_ptr() as *mut u8);
    let first = &first;
    parallel_for(host, n_tasks as u32, |task| {
        let _ = &shared;
        let task = task as i64;
        let s = first.partition_point(|&f| f <= task) - 1;
        // SAFETY: `parts` outlives parallel_for; tasks write disjoint output rows.
        let a = &*(shared.0 as *const Attn).add(s);
        let task = task - first[s];
        let (piece, t) = (task % (hkv * pieces), task / (hkv * pieces));
        let (hk, pc) = (piece / pieces, piece % pieces);
        let h0 = hk * group + pc * per;
        let h1 = (h0 + per).min((hk + 1) * group);
        attn_task(isa, a, h0, h1, t);
    });
    Ok(())
}

/// The shared state of one sequence's attention (a one-sequence call's inputs).
///
/// # Safety
/// A validated one-sequence attention call on valid memory.
unsafe fn attention_call(
    isa: Isa,
    inputs: &[TensorDesc],
    out: &TensorDesc,
    p: &OpParams,
) -> Result<Attn, Error> {
    let (q, k, pos) = (inputs[0], inputs[1], inputs[3]);
    let (d, hq, nt) = (q.ne[0], q.ne[1], q.ne[2]);
    let hkv = k.ne[1];
    let rows = abi::PagedRows::new(inputs.get(4), p.i[2], k.ne[2]).map_err(Error::Invalid)?;
    let c = rows.len;
    let n_kv = p.i[0];
    let n_eff = round_up(n_kv, KV_PAD).min(c).max(n_kv);
    Ok(Attn {
        isa,
        q,
        k,
        v: inputs[2],
        out: *out,
        group: hq / hkv,
        n_kv,
        n_eff,
        window: p.i[1],
        scale: p.f[0],
        softcap: p.f[1],
        kqv_tile: nt >= 2 && n_eff % 16 == 0 && d % 4 == 0,
        k_f16: k.dtype() == Some(DType::F16),
        v_f16: inputs[2].dtype() == Some(DType::F16),
        // As reference::ops::attention: ggml's mul_mat choice for an f16 K.
        kq_tile: k.dtype() == Some(DType::F16) && nt >= 2 && d % 16 == 0 && n_eff % 4 == 0,
        positions: (0..nt).map(|t| read_i32(&pos, t) as i64).collect(),
        rows,
    })
}

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
        Op::Glu => glu(isa, host, inputs, outputs, p.i[0]),
        Op::RmsNorm => rms_norm(isa, host, inputs, outputs, p.f[0]),
        Op::Rope => rope(isa, host, inputs, outputs, p),
        Op::Add => binary(isa, host, inputs, outputs, false),
        Op::Mul => binary(isa, host, inputs, outputs, true),
        Op::Scale => scale(isa, host, inputs, outputs, p.f[0]),
        Op::Softmax => softmax(isa, host, inputs, outputs, p.f[0]),
        Op::Argmax => argmax(inputs, outputs),
        Op::GetRows => return get_rows(host, inputs, outputs),
        Op::SetRows => return set_rows(inputs, outputs),
        Op::MatMul => unreachable!("handled by matmul"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SwiGLU rows (SIMD exps) equal the scalar twin `v_silu(x) * g` (and `silu_scalar` on
    /// the tail) bit for bit.
    #[test]
    fn swiglu_matches_scalar_twin() {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = |scale: f32| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
        };
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if !isa.detected() {
                continue;
            }
            for k in [16usize, 64, 69, 1536] {
                for scale in [1.0f32, 20.0, 300.0] {
                    let x: Vec<f32> = (0..k).map(|_| rnd(scale)).collect();
                    let g: Vec<f32> = (0..k).map(|_| rnd(4.0)).collect();
                    let mut got = x.clone();
                    unsafe { swiglu_row(isa, isa, &mut got, &g) };
                    for i in 0..k {
                        let want = if i < k & !15 {
                            v_silu(x[i]) * g[i]
                        } else {
                            silu_scalar(x[i]) * g[i]
                        };
                        assert_eq!(
                            got[i].to_bits(),
                            want.to_bits(),
                            "{isa:?} x={} g={}",
                            x[i],
                            g[i]
                        );
                    }
                }
            }
        }
    }

    /// The SIMD exps (both ISAs) equal the scalar twin `v_expf` bit for bit, across the range
    /// (underflow to subnormals and zero, overflow, -inf, exact integers).
    #[test]
    fn expf16_matches_v_expf() {
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            f32::NEG_INFINITY,
            -1e30,
            1e30,
            88.7,
            89.0,
        ];
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..200_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            let range = [1.0f32, 20.0, 110.0, 200.0][(s % 4) as usize];
            xs.push((u - 0.8) * range);
        }
        for k in -160..100 {
            xs.push(k as f32 * std::f32::consts::LN_2);
            xs.push(k as f32);
        }
        while xs.len() % 16 != 0 {
            xs.push(-3.0);
        }
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if !isa.detected() {
                continue;
            }
            for max in [0.0f32, 1.5, -2.0] {
                for c in xs.chunks_exact(16) {
                    let x: &[f32; 16] = c.try_into().unwrap();
                    let mut got = [0f32; 16];
                    unsafe { expf16(isa, x, max, &mut got) };
                    for l in 0..16 {
                        let want = v_expf(x[l] - max);
                        assert_eq!(
                            got[l].to_bits(),
                            want.to_bits(),
                            "{isa:?} x={} max={max}: {} vs {want}",
                            x[l],
                            got[l]
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod first_max_tests {
    use super::first_max;

    /// The reference's scan: the first strictly larger element wins, NaN skipped.
    fn scan(v: &[f32]) -> usize {
        let mut best: Option<(usize, f32)> = None;
        for (i, &e) in v.iter().enumerate() {
            if !e.is_nan() && best.map_or(true, |(_, b)| e > b) {
                best = Some((i, e));
            }
        }
        best.map_or(0, |(i, _)| i)
    }

    #[test]
    fn equals_the_scan_on_ties_zeros_nans_and_infinities() {
        let (nan, inf) = (f32::NAN, f32::INFINITY);
        let cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![nan; 40],
            vec![-inf; 33],
            vec![nan, -inf, 3.0, nan],
            vec![-0.0, 0.0, -0.0],
            (0..100).map(|i| ((i * 37) % 17) as f32).collect(),
            (0..49).map(|i| if i == 47 { inf } else if i % 5 == 0 { nan } else { -(i as f32) }).collect(),
            (0..64).map(|i| if i < 20 { 1.0 } else { 2.0 }).collect(),
        ];
        for v in &cases {
            assert_eq!(first_max(v), scan(v), "{v:?}");
        }
        let mut x = 12345u32;
        for n in [1usize, 15, 16, 17, 100, 49152] {
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                    ((x >> 20) % 64) as f32 - 32.0
                })
                .collect();
            assert_eq!(first_max(&v), scan(&v), "n = {n}");
        }
    }
}
