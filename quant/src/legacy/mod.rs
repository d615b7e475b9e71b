//! ggml's 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (layouts from ggml-common.h).
//!
//! Dequantization follows `dequantize_row_*` (ggml-quants.c), the reference quantizers follow
//! `quantize_row_*_ref`, and the dot products follow the generic `ggml_vec_dot_*_q8_*`
//! (ggml-cpu/quants.c), including the order of their float operations.

use crate::block::{blocks, check_layout, Block};
use crate::util::*;
use abi::DType;
use half::f16;

pub const QK: usize = 32;

macro_rules! impl_block {
    ($t:ty, $dt:expr, $bytes:expr) => {
        check_layout!($t, $dt, QK, $bytes);
        impl Block for $t {
            const DTYPE: DType = $dt;
            const ELEMS: usize = QK;
            const BYTES: usize = $bytes;
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                Self::parse(b)
            }
            #[inline(always)]
            fn write(&self, out: &mut [u8]) {
                self.store(out)
            }
        }
    };
}

/// `block_q4_0`: `x = d * (q - 8)`, q in 0..16; low nibbles hold elements 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}
impl BlockQ4_0 {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            qs: arr(b, 2),
        }
    }
    fn store(&self, o: &mut [u8]) {
        o[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        o[2..18].copy_from_slice(&self.qs);
    }
    /// Signed quants, element order.
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 32] {
        let mut a = [0i8; 32];
        for j in 0..16 {
            a[j] = (self.qs[j] & 0x0F) as i8 - 8;
            a[j + 16] = (self.qs[j] >> 4) as i8 - 8;
        }
        a
    }
}
impl_block!(BlockQ4_0, DType::Q4_0, 18);

/// `block_q4_1`: `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; 16],
}
impl BlockQ4_1 {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            m: f16_at(b, 2),
            qs: arr(b, 4),
        }
    }
    fn store(&self, o: &mut [u8]) {
        o[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        o[2..4].copy_from_slice(&self.m.to_bits().to_le_bytes());
        o[4..20].copy_from_slice(&self.qs);
    }
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 32] {
        let mut a = [0i8; 32];
        for j in 0..16 {
            a[j] = (self.qs[j] & 0x0F) as i8;
            a[j + 16] = (self.qs[j] >> 4) as i8;
        }
        a
    }
}
impl_block!(BlockQ4_1, DType::Q4_1, 20);

/// 5-bit quants: low nibbles in `qs`, bit 4 of element j in bit j of the little-endian `qh`.
#[inline(always)]
fn unpack5(qs: &[u8; 16], qh: [u8; 4], offset: i8) -> [i8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut a = [0i8; 32];
    for j in 0..16 {
        let h0 = (((qh >> j) & 1) << 4) as u8;
        let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
        a[j] = ((qs[j] & 0x0F) | h0) as i8 - offset;
        a[j + 16] = ((qs[j] >> 4) | h1) as i8 - offset;
    }
    a
}

/// `block_q5_0`: `x = d * (q - 16)`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
impl BlockQ5_0 {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            qh: arr(b, 2),
            qs: arr(b, 6),
        }
    }
    fn store(&self, o: &mut [u8]) {
        o[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        o[2..6].copy_from_slice(&self.qh);
        o[6..22].copy_from_slice(&self.qs);
    }
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 32] {
        unpack5(&self.qs, self.qh, 16)
    }
}
impl_block!(BlockQ5_0, DType::Q5_0, 22);

/// `block_q5_1`: `x = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
impl BlockQ5_1 {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            m: f16_at(b, 2),
            qh: arr(b, 4),
            qs: arr(b, 8),
        }
    }
    fn store(&self, o: &mut [u8]) {
        o[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        o[2..4].copy_from_slice(&self.m.to_bits().to_le_bytes());
        o[4..8].copy_from_slice(&self.qh);
        o[8..24].copy_from_slice(&self.qs);
    }
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 32] {
        unpack5(&self.qs, self.qh, 0)
    }
}
impl_block!(BlockQ5_1, DType::Q5_1, 24);

/// `block_q8_0`: `x = d * q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}
impl BlockQ8_0 {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            qs: arr_i8(b, 2),
        }
    }
    fn store(&self, o: &mut [u8]) {
        o[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        for (o, &q) in o[2..34].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
    }
}
impl_block!(BlockQ8_0, DType::Q8_0, 34);

/// `block_q8_1`: `x = d * q`; `s = d * sum(q)` (only used by dot products with Q4_1/Q5_1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; 32],
}
impl BlockQ8_1 {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            s: f16_at(b, 2),
            qs: arr_i8(b, 4),
        }
    }
    fn store(&self, o: &mut [u8]) {
        o[0..2].copy_from_slice(&self.d.to_bits().to_le_bytes());
        o[2..4].copy_from_slice(&self.s.to_bits().to_le_bytes());
        for (o, &q) in o[4..36].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
    }
}
impl_block!(BlockQ8_1, DType::Q8_1, 36);

#[inline(always)]
fn h(x: f32) -> f16 {
    f16::from_bits(f32_to_fp16(x))
}

// ---------------------------------------------------------------- dequantize

pub(crate) fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let out = dst.chunks_exact_mut(QK);
    match dtype {
        DType::Q4_0 => out.zip(blocks::<BlockQ4_0>(src)).for_each(|(y, b)| {
            let d = fp16_to_f32(b.d.to_bits());
            y.iter_mut()
                .zip(b.unpack())
                .for_each(|(y, q)| *y = q as f32 * d);
        }),
        DType::Q4_1 => out.zip(blocks::<BlockQ4_1>(src)).for_each(|(y, b)| {
            let (d, m) = (fp16_to_f32(b.d.to_bits()), fp16_to_f32(b.m.to_bits()));
            y.iter_mut()
                .zip(b.unpack())
                .for_each(|(y, q)| *y = q as f32 * d + m);
        }),
        DType::Q5_0 => out.zip(blocks::<BlockQ5_0>(src)).for_each(|(y, b)| {
            let d = fp16_to_f32(b.d.to_bits());
            y.iter_mut()
                .zip(b.unpack())
                .for_each(|(y, q)| *y = q as f32 * d);
        }),
        DType::Q5_1 => out.zip(blocks::<BlockQ5_1>(src)).for_each(|(y, b)| {
            let (d, m) = (fp16_to_f32(b.d.to_bits()), fp16_to_f32(b.m.to_bits()));
            y.iter_mut()
                .zip(b.unpack())
                .for_each(|(y, q)| *y = q as f32 * d + m);
        }),
        DType::Q8_0 => out.zip(blocks::<BlockQ8_0>(src)).for_each(|(y, b)| {
            let d = fp16_to_f32(b.d.to_bits());
            y.iter_mut().zip(b.qs).for_each(|(y, q)| *y = q as f32 * d);
        }),
        // ggml has no dequantize_row_q8_1; this is the obvious `d * q`.
        DType::Q8_1 => out.zip(blocks::<BlockQ8_1>(src)).for_each(|(y, b)| {
            let d = fp16_to_f32(b.d.to_bits());
            y.iter_mut().zip(b.qs).for_each(|(y, q)| *y = q as f32 * d);
        }),
        _ => unreachable!("legacy::dequantize({dtype})"),
    }
}

// ---------------------------------------------------------------- reference quantizers

/// Value with the largest magnitude (the first one on ties), as the `_ref` quantizers find it.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `quantize_row_q4_0_ref`.
pub fn quantize_q4_0(x: &[f32]) -> BlockQ4_0 {
    let max = signed_absmax(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for j in 0..16 {
        // C: MIN(15, (int8_t)(x*id + 8.5f)); float->int conversion truncates.
        let q0 = ((x[j] * id + 8.5) as i32 as i8).min(15) as u8;
        let q1 = ((x[j + 16] * id + 8.5) as i32 as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_0 { d: h(d), qs }
}

/// `quantize_row_q4_1_ref`.
pub fn quantize_q4_1(x: &[f32]) -> BlockQ4_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let q0 = (((x[j] - min) * id + 0.5) as i32 as i8).min(15) as u8;
        let q1 = (((x[j + 16] - min) * id + 0.5) as i32 as i8).min(15) as u8;
        qs[j] = q0 | (q1 << 4);
    }
    BlockQ4_1 {
        d: h(d),
        m: h(min),
        qs,
    }
}

fn pack5(q: &[u8; 32]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        qh |= ((q[j] as u32 & 0x10) >> 4) << j;
        qh |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    (qs, qh.to_le_bytes())
}

/// `quantize_row_q5_0_ref`.
pub fn quantize_q5_0(x: &[f32]) -> BlockQ5_0 {
    let max = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id + 16.5) as i32 as i8).min(31) as u8;
    }
    let (qs, qh) = pack5(&q);
    BlockQ5_0 { d: h(d), qh, qs }
}

/// `quantize_row_q5_1_ref` (no clamp to 31 there: `(uint8_t)(x0 + 0.5f)`).
pub fn quantize_q5_1(x: &[f32]) -> BlockQ5_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v - min) * id + 0.5) as i32 as u8;
    }
    let (qs, qh) = pack5(&q);
    BlockQ5_1 {
        d: h(d),
        m: h(min),
        qh,
        qs,
    }
}

#[inline(always)]
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// `quantize_row_q8_0_ref`: `d = amax/127`, `id = 1/d`, `roundf` (ties away from zero).
pub fn quantize_q8_0_ref(x: &[f32]) -> BlockQ8_0 {
    let d = amax(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    BlockQ8_0 { d: h(d), qs }
}

/// `quantize_row_q8_1_ref`: as Q8_0 ref plus `s = f16(sum(q) * d)`.
pub fn quantize_q8_1_ref(x: &[f32]) -> BlockQ8_1 {
    let d = amax(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    let sum: i32 = qs.iter().map(|&q| q as i32).sum();
    BlockQ8_1 {
        d: h(d),
        s: h(sum as f32 * d),
        qs,
    }
}

/// x86 `quantize_row_q8_0` (ggml-cpu/arch/x86/quants.c, AVX/AVX2 branch), which is what a
/// llama.cpp x86 build runs on activations: `d = max/127`, `id = max != 0 ? 127/max : 0`
/// (not `1/d`), and `_mm256_round_ps(.., _MM_ROUND_NEAREST)` = round half to EVEN.
pub fn quantize_q8_0_x86(x: &[f32]) -> BlockQ8_0 {
    let max = amax(x);
    let d = max / 127.0;
    let id = if max != 0.0 { 127.0 / max } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    BlockQ8_0 { d: h(d), qs }
}

/// x86 `quantize_row_q8_1` (AVX2 branch): quants as [`quantize_q8_0_x86`];
/// `s = GGML_CPU_FP32_TO_FP16(d * hsum_i32_8(sum of quants))`, with `d` the unrounded f32 scale.
pub fn quantize_q8_1_x86(x: &[f32]) -> BlockQ8_1 {
    let b = quantize_q8_0_x86(x);
    let max = amax(x);
    let d = max / 127.0;
    let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
    BlockQ8_1 {
        d: b.d,
        s: h(d * sum as f32),
        qs: b.qs,
    }
}

pub(crate) fn quantize_with<B: Block>(f: fn(&[f32]) -> B, src: &[f32], dst: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(B::BYTES)) {
        f(x).write(o);
    }
}

pub(crate) fn quantize_ref(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::Q4_0 => quantize_with(quantize_q4_0, src, dst),
        DType::Q4_1 => quantize_with(quantize_q4_1, src, dst),
        DType::Q5_0 => quantize_with(quantize_q5_0, src, dst),
        DType::Q5_1 => quantize_with(quantize_q5_1, src, dst),
        DType::Q8_0 => quantize_with(quantize_q8_0_ref, src, dst),
        DType::Q8_1 => quantize_with(quantize_q8_1_ref, src, dst),
        _ => unreachable!("legacy::quantize_ref({dtype})"),
    }
}

// ---------------------------------------------------------------- dot products

/// llama.cpp's x86 `ggml_vec_dot_{q4_0,q5_0,q8_0}_q8_0` / `{q4_1,q5_1}_q8_1`
/// (ggml-cpu/arch/x86/quants.c, `__AVX2__` branch, as built with -march=native on an AVX-512
/// VNNI CPU), reproduced bit for bit: one `__m256` of eight f32 lanes, lane `k` holding the
/// int32 sum of elements `4k..4k+4` of each block (`mul_sum_i8_pairs_float` /
/// `mul_sum_us8_pairs_float`, exact), scaled and accumulated with one FMA per block, then
/// `hsum_float_8`. Fixtures: quant/tests/x86_exact_legacy.rs.
#[inline(always)]
pub(crate) fn vec_dot(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    // `acc = _mm256_fmadd_ps(d, q, acc)` with `d = FP16_TO_FP32(x.d) * FP16_TO_FP32(y.d)`.
    let mut step = |d: f32, xy: [f32; 8]| {
        for k in 0..8 {
            acc[k] = fma(d, xy[k], acc[k]);
        }
    };
    match dtype {
        DType::Q4_0 => {
            for (x, y) in blocks::<BlockQ4_0>(w).zip(blocks::<BlockQ8_0>(act)) {
                step(
                    fp16_to_f32(x.d.to_bits()) * fp16_to_f32(y.d.to_bits()),
                    dot_i8_quads(&x.unpack(), &y.qs),
                );
            }
        }
        DType::Q5_0 => {
            for (x, y) in blocks::<BlockQ5_0>(w).zip(blocks::<BlockQ8_0>(act)) {
                step(
                    fp16_to_f32(x.d.to_bits()) * fp16_to_f32(y.d.to_bits()),
                    dot_i8_quads(&x.unpack(), &y.qs),
                );
            }
        }
        DType::Q8_0 => {
            for (x, y) in blocks::<BlockQ8_0>(w).zip(blocks::<BlockQ8_0>(act)) {
                step(
                    fp16_to_f32(x.d.to_bits()) * fp16_to_f32(y.d.to_bits()),
                    dot_i8_quads(&x.qs, &y.qs),
                );
            }
        }
        DType::Q4_1 | DType::Q5_1 => {
            // `acc = _mm256_fmadd_ps(q, dx*dy, acc)`; the min terms `summs += m*s` are summed
            // (GCC contracts them to FMA) on the side and added after `hsum_float_8`.
            let mut summs = 0f32;
            let mut one = |d: f16, m: f16, q: [i8; 32], y: &BlockQ8_1| {
                summs = fma(fp16_to_f32(m.to_bits()), fp16_to_f32(y.s.to_bits()), summs);
                step(
                    fp16_to_f32(d.to_bits()) * fp16_to_f32(y.d.to_bits()),
                    dot_i8_quads(&q, &y.qs),
                );
            };
            if dtype == DType::Q4_1 {
                for (x, y) in blocks::<BlockQ4_1>(w).zip(blocks::<BlockQ8_1>(act)) {
                    one(x.d, x.m, x.unpack(), &y);
                }
            } else {
                for (x, y) in blocks::<BlockQ5_1>(w).zip(blocks::<BlockQ8_1>(act)) {
                    one(x.d, x.m, x.unpack(), &y);
                }
            }
            return hsum_float_8(&acc) + summs;
        }
        _ => unreachable!("legacy::vec_dot({dtype})"),
    }
    hsum_float_8(&acc)
}

/// The CPU "repack" kernels for Q4_0 rows interleaved eight at a time (`block_q4_0x8`,
/// repack.cpp `repack_q4_0_to_q4_0_8_bl`): `ggml_gemv_q4_0_8x8_q8_0` and
/// `ggml_gemm_q4_0_8x8_q8_0` (ggml-cpu/arch/x86/repack.cpp, `gemv_q4_b32_8x8_q8_0_lut_avx` /
/// `gemm_q4_b32_8x8_q8_0_lut_avx`, AVX2 and AVX-512 variants alike). Each output row is one
/// f32 lane: per block the exact int32 dot of all 32 elements, then
/// `acc = fma(float(sumi), d_w * d_a, acc)`; no horizontal sum. GEMM and GEMV agree bit for
/// bit, and GEMM's activations (`ggml_quantize_mat_q8_0_4x8`) are per row identical to
/// `quantize_row_q8_0` (both checked by the oracle, quant/tools/x86_oracle_legacy.c).
#[inline(always)]
pub(crate) fn dot_repack_q4_0(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (x, y) in blocks::<BlockQ4_0>(w).zip(blocks::<BlockQ8_0>(act)) {
        let sumi = dot_i8(&x.unpack(), &y.qs);
        acc = fma(
            sumi as f32,
            fp16_to_f32(x.d.to_bits()) * fp16_to_f32(y.d.to_bits()),
            acc,
        );
    }
    acc
}

/// One output element of `kernel` for a legacy format (the `dot_with` arms). Activations are
/// Q8_0 (Q8_1 for Q4_1/Q5_1) rows as `quantize_activations` makes them for every kernel.
pub(crate) fn dot_with(kernel: crate::Kernel, dtype: DType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    use crate::Kernel;
    match (kernel, dtype) {
        (Kernel::VecDot, _) => crate::vec_dot(dtype, n, w, act),
        (Kernel::TinyBlas, DType::Q4_0 | DType::Q5_0 | DType::Q8_0)
        | (Kernel::RepackGemv | Kernel::RepackGemm, DType::Q4_0) => {
            let vt = crate::vec_dot_type(dtype);
            assert_eq!(
                crate::row_bytes(dtype, n),
                Some(w.len()),
                "dot_with: weight row is not {n} elements of {dtype}"
            );
            assert_eq!(
                crate::row_bytes(vt, n),
                Some(act.len()),
                "dot_with: activation row is not {n} elements of {vt}"
            );
            #[cfg(target_arch = "x86_64")]
            if crate::has_fma() {
                // SAFETY: the CPU has FMA and AVX2 (checked at run time).
                return unsafe { kernel_dot_fma(kernel, dtype, w, act) };
            }
            kernel_dot_any(kernel, dtype, w, act)
        }
        _ => panic!("dot_with: ggml has no {kernel:?} kernel for {dtype}"),
    }
}

/// `kernel_dot_any` compiled with FMA enabled so `mul_add` is one instruction (same results).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,avx2")]
unsafe fn kernel_dot_fma(kernel: crate::Kernel, dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    kernel_dot_any(kernel, dtype, w, act)
}

#[inline(always)]
fn kernel_dot_any(kernel: crate::Kernel, dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    match kernel {
        crate::Kernel::TinyBlas => tinyblas::dot_q0(dtype, w, act),
        _ => dot_repack_q4_0(w, act),
    }
}

/// llamafile tinyBLAS (`tinyBLAS_Q0_AVX`), kept in its own file.
pub(crate) mod tinyblas;
