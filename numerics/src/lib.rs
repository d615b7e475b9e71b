//! ggml's numerics: the scalar twins of the ggml CPU kernels whose rounding shows in results,
//! which the reference (the spec of every op) and every backend compute with, one copy.
//!
//! Apart from the reference so that a backend links these chains and not the spec: the
//! reference says what an op computes; this crate holds the pieces whose bits it is computed
//! with.
//!
//! The oracle is llama.cpp's CPU backend built with `-march=native` on an AVX-512 machine
//! (gnu++17, so GCC contracts `a*b + c` into FMA). Every routine here reproduces the *order* of
//! the floating-point operations of the corresponding SIMD kernel lane by lane, so the results
//! are bit-identical, not merely close:
//!
//! - [`reduce16`]: `_mm512_reduce_add_ps` (GCC's halving tree).
//! - [`dot_vec_f32`] / [`dot_vec_f16`]: `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (4 x 16 FMA
//!   accumulators, `GGML_F32x16_REDUCE`, then the scalar leftovers).
//! - [`dot_tile`]: llamafile's `tinyBLAS<16, __m512>::gemm_bloc` (one 16-lane FMA accumulator
//!   per output, `hsum`), which ggml uses instead of `vec_dot` for F32/F16 weights when the
//!   activation batch has >= 2 columns, `K % 16 == 0` and `N % 4 == 0`.
//! - [`v_expf`]: the AVX-512 `ggml_v_expf` polynomial (used by soft_max on whole 16-blocks and
//!   by `ggml_v_silu`); tails use libm `expf` exactly as ggml's scalar loops do.
//! - [`ssm_conv_dot`]: the per-channel sum of `ggml_compute_forward_ssm_conv_f32`, whose
//!   vectorized and contracted parts split at `L mod 4`.
//! - [`dot_vec_f32_as_built`]: `ggml_vec_dot_f32` leftovers included, as the binary has them
//!   (rounded products, then the last `n mod 4` fused), and [`gated_delta_net_token`], one
//!   token of `ggml_compute_forward_gated_delta_net_f32` on one head's state.
//! - [`rwkv_wkv7_token`]: one token of `ggml_compute_forward_rwkv_wkv7_f32` (its GGML_SIMD
//!   path) on one head's state.
//!
//! The native CPU backends use these same functions (one copy of every chain): the `*_lanes`
//! bodies are `#[inline(always)]` so that a backend instantiates them inside its own
//! `#[target_feature]` frame, where `mul_add` is one FMA instruction and the 16-lane loops
//! vectorize.

pub mod rope;

/// llama.cpp's KV padding (`max(n_pad, 256)` cache rows): attention's row counts and the
/// chains that depend on them.
pub const KV_PAD: i64 = 256;

use half::f16;

/// `_mm512_reduce_add_ps` as GCC implements it: add high/low 256-bit halves, then 128-bit
/// halves, then lanes (2,3) onto (0,1), then lane 1 onto lane 0.
#[inline(always)]
pub fn reduce16(v: &[f32; 16]) -> f32 {
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

/// `(a0 + a2) + (a1 + a3)` lane-wise, then [`reduce16`]: `GGML_F32x16_REDUCE` of four
/// accumulators.
#[inline(always)]
pub fn reduce4x16(acc: &mut [[f32; 16]; 4]) -> f32 {
    for l in 0..16 {
        acc[0][l] += acc[2][l];
        acc[1][l] += acc[3][l];
    }
    for l in 0..16 {
        acc[0][l] += acc[1][l];
    }
    reduce16(&acc[0])
}

/// [`dot_vec_f32`]'s body (no dispatch): for backends' own SIMD frames.
#[inline(always)]
pub fn dot_vec_f32_lanes(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [[0f32; 16]; 4];
    let mut i = 0;
    while i < np {
        let (xs, ys) = (&x[i..i + 64], &y[i..i + 64]);
        for j in 0..4 {
            for l in 0..16 {
                acc[j][l] = xs[j * 16 + l].mul_add(ys[j * 16 + l], acc[j][l]);
            }
        }
        i += 64;
    }
    let mut sumf = reduce4x16(&mut acc);
    for i in np..n {
        // `sumf += x[i]*y[i]` in float, contracted to an FMA by GCC.
        sumf = x[i].mul_add(y[i], sumf);
    }
    sumf
}

/// [`dot_tile`]'s body (no dispatch): for backends' own SIMD frames.
#[inline(always)]
pub fn dot_tile_lanes(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    debug_assert!(n % 16 == 0);
    let mut acc = [0f32; 16];
    for (xs, ys) in x[..n].chunks_exact(16).zip(y[..n].chunks_exact(16)) {
        for l in 0..16 {
            acc[l] = xs[l].mul_add(ys[l], acc[l]);
        }
    }
    reduce16(&acc)
}

/// [`dot_tile_lanes`] of one `x` with four `y`s (each at least as long as `x`): per column
/// the same lanes, products and reduction, so each result equals `dot_tile_lanes(x, y[c])`
/// bit for bit; four independent chains keep the FMA units busy where one waits on its own
/// latency, and `x` is read once for the four.
#[inline(always)]
pub fn dot_tile_lanes_x4(x: &[f32], y: [&[f32]; 4]) -> [f32; 4] {
    let n = x.len() & !15;
    let mut acc = [[0f32; 16]; 4];
    let mut i = 0;
    while i < n {
        let xs = &x[i..i + 16];
        for c in 0..4 {
            let ys = &y[c][i..i + 16];
            for l in 0..16 {
                acc[c][l] = xs[l].mul_add(ys[l], acc[c][l]);
            }
        }
        i += 16;
    }
    [
        reduce16(&acc[0]),
        reduce16(&acc[1]),
        reduce16(&acc[2]),
        reduce16(&acc[3]),
    ]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_vec_f32_fma(x: &[f32], y: &[f32]) -> f32 {
    dot_vec_f32_lanes(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_tile_fma(x: &[f32], y: &[f32]) -> f32 {
    dot_tile_lanes(x, y)
}

#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `ggml_vec_dot_f32` (AVX-512 build), every leftover past the 64-element steps fused: the
/// binary fuses only the last `n mod 4` of them ([`dot_vec_f32_as_built`]), so the two differ
/// where `n mod 64 >= 4`.
pub fn dot_vec_f32(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the features were detected at run time.
        return unsafe { dot_vec_f32_fma(x, y) };
    }
    dot_vec_f32_lanes(x, y)
}

/// llamafile tinyBLAS (AVX-512) dot for one output element; `len % 16 == 0`.
pub fn dot_tile(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the features were detected at run time.
        return unsafe { dot_tile_fma(x, y) };
    }
    dot_tile_lanes(x, y)
}

/// `ggml_vec_dot_f16` (AVX-512 build, no AVX512-FP16) on operands already widened to f32
/// (widening f16 -> f32 is exact): the 64-element steps run like [`dot_vec_f32`], the reduced
/// value goes to f64 and the leftovers accumulate in f64.
pub fn dot_vec_f16(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the features were detected at run time.
        return unsafe { dot_vec_f16_fma(x, y) };
    }
    dot_vec_f16_lanes(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_vec_f16_fma(x: &[f32], y: &[f32]) -> f32 {
    dot_vec_f16_lanes(x, y)
}

/// [`dot_vec_f16`]'s body (no dispatch): for backends' own SIMD frames.
#[inline(always)]
pub fn dot_vec_f16_lanes(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut sumf = dot_vec_f32_lanes(&x[..np], &y[..np]) as f64;
    for i in np..n {
        sumf += (x[i] * y[i]) as f64;
    }
    sumf as f32
}

/// Rounds through f16 (round to nearest even), as `GGML_CPU_FP32_TO_FP16` does.
#[inline(always)]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Scalar twin of the AVX-512 `ggml_v_expf` (one lane).
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23f
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0f
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20f
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1f
    );
    let u = b * b;
    let c_a = f32::from_bits(0x3c07_2010); // 0x1.0e4020p-7f
    let c_b = f32::from_bits(0x3d2b_9f17); // 0x1.573e2ep-5f
    let c_c = f32::from_bits(0x3e2a_af33); // 0x1.555e66p-3f
    let c_d = f32::from_bits(0x3eff_fedb); // 0x1.fffdb6p-2f
    let c_e = f32::from_bits(0x3f7f_fff6); // 0x1.ffffecp-1f
    let j = c_a
        .mul_add(b, c_b)
        .mul_add(u, c_c.mul_add(b, c_d))
        .mul_add(u, c_e.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        // _CMP_GT_OQ is false for NaN, so NaN falls through to scalef below.
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // _mm512_scalef_ps(j, n) = j * 2^floor(n), rounded once (n is integral here).
    if j.is_nan() || n.is_nan() {
        return f32::NAN;
    }
    // 2^e is exact in f64 for |e| <= 192, so the product rounds once, to f32.
    let e = n.floor() as i32;
    (j as f64 * f64::from_bits(((e + 1023) as u64) << 52)) as f32
}

/// `ggml_v_silu` lane: x / (1 + v_expf(0 - x)).
#[inline(always)]
pub fn v_silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// `ggml_silu_f32`: x / (1 + expf(-x)).
#[inline(always)]
pub fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// One output of `ggml_compute_forward_ssm_conv_f32`: `sumf += s[j] * c[j]` over the taps,
/// from `0.0f`, as GCC compiles that loop for AVX-512 (read from the disassembly of
/// llama.cpp 0c1e570's `libggml-cpu.so`). It is vectorized in groups of 8 taps while 8
/// remain, then one group of 4 if 4 remain: each group's products come from one `vmulps`
/// (rounded) and are added to the sum one by one in order, which is what `acc += s * c` does
/// tap by tap. The last `len mod 4` taps take the scalar remainder loop, which GCC contracts
/// into `vfmadd231ss`. `mul_add` rounds once on every CPU, so the bits are the same
/// everywhere.
#[inline(always)]
pub fn ssm_conv_dot(s: &[f32], c: &[f32]) -> f32 {
    let n = c.len();
    let vectorized = n & !3;
    let mut acc = 0f32;
    for j in 0..vectorized {
        acc += s[j] * c[j];
    }
    for j in vectorized..n {
        acc = s[j].mul_add(c[j], acc);
    }
    acc
}

/// [`dot_vec_f32_as_built`]'s body (no dispatch): for backends' own SIMD frames.
///
/// `ggml_vec_dot_f32` as llama.cpp 0c1e570's AVX-512 `libggml-cpu.so` computes it (read from
/// its disassembly): the 64-element steps and their reduction as [`dot_vec_f32_lanes`], then
/// the `n mod 64` leftovers `sumf += x[i]*y[i]`, which GCC vectorized in groups of 8 while 8
/// remain, then one of 4: each group's products come from one `vmulps` (rounded) and are
/// added to `sumf` one by one in order. Only the last `n mod 4` take the scalar loop, which
/// GCC contracts into `vfmadd231ss`. [`dot_vec_f32`] fuses every leftover instead: the two
/// agree where `n mod 64 < 4` (head sizes 64, 128, 256, the golden models' widths).
#[inline(always)]
pub fn dot_vec_f32_as_built_lanes(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut sumf = dot_vec_f32_lanes(&x[..np], &y[..np]);
    let rounded = np + ((n - np) & !3);
    for i in np..rounded {
        sumf += x[i] * y[i];
    }
    for i in rounded..n {
        sumf = x[i].mul_add(y[i], sumf);
    }
    sumf
}

/// `ggml_vec_dot_f32` (AVX-512 build), leftovers as the binary computes them: see
/// [`dot_vec_f32_as_built_lanes`].
pub fn dot_vec_f32_as_built(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the features were detected at run time.
        return unsafe { dot_vec_f32_as_built_fma(x, y) };
    }
    dot_vec_f32_as_built_lanes(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_vec_f32_as_built_fma(x: &[f32], y: &[f32]) -> f32 {
    dot_vec_f32_as_built_lanes(x, y)
}

/// One token of `ggml_compute_forward_gated_delta_net_f32` (llama.cpp 0c1e570, checked
/// against its AVX-512 binary) on one head's state `m` (`n x n`, row `j` = value index `j`,
/// key index `i` fastest), in place; `o` gets the token's output row. `gate` holds one log
/// decay, or one per key (KDA); `d` is `n` floats of scratch.
///
/// 1. `m *= expf(gate)`: libm `expf`, then one f32 multiply per element (`vmulps`; the KDA
///    form multiplies column `i` by `expf(gate[i])`).
/// 2. `d[j] = (v[j] - dot(m[j], k)) * beta`: a subtraction and a multiplication, each rounded.
/// 3. `m[j][i] = fma(k[i], d[j], m[j][i])`: `ggml_vec_mad_f32`, inlined, is fused at every
///    element (zmm steps of 64, then ymm, xmm and scalar `vfmadd` on the leftovers).
/// 4. `o[j] = dot(m[j], q) * scale`, with `scale = 1/sqrtf(n)` (q is not scaled first).
///
/// `dot` is [`dot_vec_f32_as_built_lanes`]. Elementwise steps vectorize in any frame without
/// changing a bit; the dots are each one sequential chain.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net_token(
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    gate: &[f32],
    beta: f32,
    scale: f32,
    d: &mut [f32],
    o: &mut [f32],
) {
    let n = v.len();
    if gate.len() == n && n > 1 {
        for (e, g) in d.iter_mut().zip(gate) {
            *e = g.exp();
        }
        for row in m.chunks_exact_mut(n) {
            for (x, e) in row.iter_mut().zip(&d[..n]) {
                *x *= *e;
            }
        }
    } else {
        let e = gate[0].exp();
        for x in m.iter_mut() {
            *x *= e;
        }
    }
    for (j, row) in m.chunks_exact(n).enumerate() {
        d[j] = (v[j] - dot_vec_f32_as_built_lanes(row, k)) * beta;
    }
    for (row, &dj) in m.chunks_exact_mut(n).zip(&d[..n]) {
        for (x, &ki) in row.iter_mut().zip(k) {
            *x = ki.mul_add(dj, *x);
        }
    }
    for (oj, row) in o.iter_mut().zip(m.chunks_exact(n)) {
        *oj = dot_vec_f32_as_built_lanes(row, q) * scale;
    }
}

/// [`gated_delta_net_token`] in an FMA frame where the CPU has one (the same bits: `mul_add`
/// rounds once either way, it is only faster).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net_token_dispatch(
    m: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    gate: &[f32],
    beta: f32,
    scale: f32,
    d: &mut [f32],
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn fma(
            m: &mut [f32],
            q: &[f32],
            k: &[f32],
            v: &[f32],
            gate: &[f32],
            beta: f32,
            scale: f32,
            d: &mut [f32],
            o: &mut [f32],
        ) {
            gated_delta_net_token(m, q, k, v, gate, beta, scale, d, o)
        }
        // SAFETY: the features were detected at run time.
        return unsafe { fma(m, q, k, v, gate, beta, scale, d, o) };
    }
    gated_delta_net_token(m, q, k, v, gate, beta, scale, d, o)
}

/// One token of `ggml_compute_forward_rwkv_wkv7_f32` (llama.cpp 0c1e570, its GGML_SIMD path
/// as the AVX-512 build compiles it: GGML_F32_STEP 64, four 16-lane accumulators,
/// `GGML_F32_VEC_FMA(a, b, c) = a + b*c` fused) on one head's state `m` (`n x n`, row `i` =
/// value/output index, key index `j` fastest), in place; `o` gets the token's output row.
///
/// For each row `i`, from the row as it was before the token:
/// 1. `sa = dot(a, m[i])`;
/// 2. `m[i][j] = fma(sa, b[j], fma(m[i][j], w[j], v[i]*k[j]))`: the product `v[i]*k[j]`
///    rounded (`GGML_F32_VEC_MUL`), then two fused steps;
/// 3. `o[i] = dot(m[i], r)` over the new row.
///
/// `dot` is [`dot_vec_f32_lanes`]: fused accumulators over 64-element steps, reduced as
/// `GGML_F32x16_REDUCE`; the `n mod 64` leftovers fused into that sum one by one. llama.cpp
/// has no leftovers (its loop reads whole 64-steps past the row where `n mod 64 != 0`: it
/// supports only multiples of 64, RWKV-7's heads are 64); this is mollm's definition there.
/// The update is element-wise and vectorizes in any frame without changing a bit.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn rwkv_wkv7_token(
    m: &mut [f32],
    r: &[f32],
    w: &[f32],
    k: &[f32],
    v: &[f32],
    a: &[f32],
    b: &[f32],
    o: &mut [f32],
) {
    let n = v.len();
    for ((row, &vi), oi) in m.chunks_exact_mut(n).zip(v).zip(o.iter_mut()) {
        let sa = dot_vec_f32_lanes(a, row);
        for j in 0..n {
            let kv = vi * k[j];
            row[j] = sa.mul_add(b[j], row[j].mul_add(w[j], kv));
        }
        *oi = dot_vec_f32_lanes(row, r);
    }
}

/// [`rwkv_wkv7_token`] in an FMA frame where the CPU has one (the same bits: `mul_add`
/// rounds once either way, it is only faster).
#[allow(clippy::too_many_arguments)]
pub fn rwkv_wkv7_token_dispatch(
    m: &mut [f32],
    r: &[f32],
    w: &[f32],
    k: &[f32],
    v: &[f32],
    a: &[f32],
    b: &[f32],
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn fma(
            m: &mut [f32],
            r: &[f32],
            w: &[f32],
            k: &[f32],
            v: &[f32],
            a: &[f32],
            b: &[f32],
            o: &mut [f32],
        ) {
            rwkv_wkv7_token(m, r, w, k, v, a, b, o)
        }
        // SAFETY: the features were detected at run time.
        return unsafe { fma(m, r, w, k, v, a, b, o) };
    }
    rwkv_wkv7_token(m, r, w, k, v, a, b, o)
}

/// `MAX(a, b)` as ggml's macro: `a > b ? a : b` (so a NaN element wins over a number, and a
/// NaN running max is replaced by the next element).
#[inline]
pub fn ggml_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `ggml_vec_soft_max_f32` (AVX-512): writes exp(x - max) to `y`, returns the sum (f64).
/// Whole 16-element blocks use [`v_expf`] and add their `_mm512_reduce_add_ps` to the f64 sum;
/// the tail uses libm `expf` and adds each term in f64.
pub fn soft_max_f32(x: &[f32], y: &mut [f32], max: f32) -> f64 {
    let n = x.len();
    let mut sum = 0f64;
    let mut i = 0;
    while i + 15 < n {
        let mut v = [0f32; 16];
        for l in 0..16 {
            v[l] = v_expf(x[i + l] - max);
            y[i + l] = v[l];
        }
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

/// `ggml_gelu_f32` as compiled (GCC fuses `1 + A*x*x`).
pub fn gelu_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = f32::from_bits(0x3f4c_422a); // 0.79788456080286535587989211986876f
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

static GELU_TABLE: std::sync::OnceLock<Box<[u16]>> = std::sync::OnceLock::new();

/// `f16(gelu(x))` for every f16 bit pattern `x` (`ggml_table_gelu_f16`), built once.
pub fn gelu_table() -> &'static [u16] {
    GELU_TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|i| f16::from_f32(gelu_f32(f16::from_bits(i).to_f32())).to_bits())
            .collect()
    })
}

/// ggml's GELU with `GGML_GELU_FP16`: 0 for x <= -10, x for x >= 10, otherwise a lookup in a
/// table of `f16(gelu(f16 value))` indexed by the f16 bits of x (x rounded to nearest even).
pub fn gelu_fp16_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(gelu_table()[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_close_to_expf() {
        for i in -2000..2000 {
            let x = i as f32 * 0.05;
            let (a, b) = (v_expf(x), x.exp());
            if !b.is_finite() {
                assert_eq!(a, b);
                continue;
            }
            assert!((a - b).abs() <= b * 4e-7 + 1e-38, "x={x}: {a} vs {b}");
        }
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(0.0), 1.0);
        assert!(v_expf(f32::NAN).is_nan());
        assert_eq!(v_expf(200.0), f32::INFINITY);
    }

    #[test]
    fn dots_agree_with_f64() {
        let x: Vec<f32> = (0..200)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let y: Vec<f32> = (0..200)
            .map(|i| ((i * 53 % 89) as f32 - 44.0) / 13.0)
            .collect();
        let exact: f64 = x.iter().zip(&y).map(|(a, b)| *a as f64 * *b as f64).sum();
        for v in [
            dot_vec_f32(&x, &y),
            dot_tile(&x[..192], &y[..192]) + dot_vec_f32(&x[192..], &y[192..]),
            dot_vec_f16(&x, &y),
        ] {
            assert!((v as f64 - exact).abs() < 1e-3, "{v} vs {exact}");
        }
    }

    #[test]
    fn gelu_table_matches_formula() {
        for i in -100..100 {
            let x = i as f32 * 0.1;
            let g = 0.5
                * x
                * (1.0
                    + ((2.0f32 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
            assert!(
                (gelu_fp16_table(x) - g).abs() < 1e-2 * (1.0 + g.abs()),
                "{x}"
            );
        }
        assert_eq!(gelu_fp16_table(-11.0), 0.0);
        assert_eq!(gelu_fp16_table(12.0), 12.0);
    }
}

/// `ggml_norm` of one row in place (LayerNorm without its gain and bias), as the AVX-512 build
/// computes it: the mean from an f64 sum of the values, rounded to f32; then
/// `ggml_vec_cvar_f32`: each 16-block's `x - mean` stored and its squares added by
/// `_mm512_reduce_add_ps` ([`reduce16`]) into an f64 sum, the tail one square at a time; the
/// variance rounded to f32; the row times `1 / sqrtf(var + eps)`.
pub fn norm_row(x: &mut [f32], eps: f32) {
    let n = x.len();
    let sum: f64 = x.iter().map(|&v| v as f64).sum();
    let mean = (sum as f32) / n as f32;
    let mut acc = 0f64;
    let mut i = 0;
    while i + 16 <= n {
        let mut sq = [0f32; 16];
        for l in 0..16 {
            let d = x[i + l] - mean;
            x[i + l] = d;
            sq[l] = d * d;
        }
        acc += reduce16(&sq) as f64;
        i += 16;
    }
    for v in &mut x[i..] {
        let d = *v - mean;
        *v = d;
        acc += (d * d) as f64;
    }
    let var = (acc / n as f64) as f32;
    let scale = 1.0f32 / (var + eps).sqrt();
    for v in x.iter_mut() {
        *v *= scale;
    }
}

/// `ggml_l2_norm` of one row in place: the squares (each rounded to f32) summed in f64, then
/// the row times `1 / fmaxf(sqrtf((float)sum), eps)`.
pub fn l2_norm_row(x: &mut [f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let scale = 1.0f32 / ggml_max((sum as f32).sqrt(), eps);
    for v in x.iter_mut() {
        *v *= scale;
    }
}
