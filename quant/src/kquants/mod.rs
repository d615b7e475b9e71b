//! ggml's 256-element "K" super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the activation
//! format Q8_K (layouts from ggml-common.h).
//!
//! Each weight block unpacks into an `[i8; 256]` (or `[u8; 256]`) of quants in element order
//! plus its sub-block scales; dequantization and the dot products both work from that.
//! Dequantization follows `dequantize_row_*` in ggml-quants.c; the dot products follow the
//! generic `ggml_vec_dot_*_q8_K` in ggml-cpu/quants.c, including their 8-lane float
//! accumulators (`sums[8]`) and the per-block order of float operations.

use crate::block::{blocks, check_layout, Block};
use crate::util::*;
use abi::DType;
use half::f16;

pub const QK_K: usize = 256;

macro_rules! impl_block {
    ($t:ty, $dt:expr, $bytes:expr) => {
        check_layout!($t, $dt, QK_K, $bytes);
        impl Block for $t {
            const DTYPE: DType = $dt;
            const ELEMS: usize = QK_K;
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

#[inline(always)]
fn put(o: &mut [u8], off: usize, b: &[u8]) {
    o[off..off + b.len()].copy_from_slice(b);
}

/// `block_q2_K`: 16 sub-blocks of 16; `x = d*(sc&15)*q - dmin*(sc>>4)`, q in 0..4.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: f16,
    pub dmin: f16,
}
impl Default for BlockQ2K {
    fn default() -> Self {
        Self {
            scales: [0; 16],
            qs: [0; 64],
            d: f16::ZERO,
            dmin: f16::ZERO,
        }
    }
}
impl BlockQ2K {
    fn parse(b: &[u8]) -> Self {
        Self {
            scales: arr(b, 0),
            qs: arr(b, 16),
            d: f16_at(b, 80),
            dmin: f16_at(b, 82),
        }
    }
    fn store(&self, o: &mut [u8]) {
        put(o, 0, &self.scales);
        put(o, 16, &self.qs);
        put(o, 80, &self.d.to_bits().to_le_bytes());
        put(o, 82, &self.dmin.to_bits().to_le_bytes());
    }
    /// Quants in element order: element `128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 256] {
        let mut a = [0i8; 256];
        for n in 0..2 {
            for j in 0..4 {
                for l in 0..32 {
                    a[128 * n + 32 * j + l] = ((self.qs[32 * n + l] >> (2 * j)) & 3) as i8;
                }
            }
        }
        a
    }
}
impl_block!(BlockQ2K, DType::Q2_K, 84);

/// `block_q3_K`: 16 sub-blocks of 16 with 6-bit signed scales; `x = d*(sc-32)*(q-4)` where q's
/// high bit lives in `hmask`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    pub hmask: [u8; 32],
    pub qs: [u8; 64],
    pub scales: [u8; 12],
    pub d: f16,
}
impl Default for BlockQ3K {
    fn default() -> Self {
        Self {
            hmask: [0; 32],
            qs: [0; 64],
            scales: [0; 12],
            d: f16::ZERO,
        }
    }
}
impl BlockQ3K {
    fn parse(b: &[u8]) -> Self {
        Self {
            hmask: arr(b, 0),
            qs: arr(b, 32),
            scales: arr(b, 96),
            d: f16_at(b, 108),
        }
    }
    fn store(&self, o: &mut [u8]) {
        put(o, 0, &self.hmask);
        put(o, 32, &self.qs);
        put(o, 96, &self.scales);
        put(o, 108, &self.d.to_bits().to_le_bytes());
    }
    /// Signed quants (-4..4) in element order.
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 256] {
        let mut a = [0i8; 256];
        for n in 0..2 {
            for j in 0..4 {
                let m = 1u8 << (4 * n + j);
                for l in 0..32 {
                    let q = ((self.qs[32 * n + l] >> (2 * j)) & 3) as i8;
                    let sub = if self.hmask[l] & m != 0 { 0 } else { 4 };
                    a[128 * n + 32 * j + l] = q - sub;
                }
            }
        }
        a
    }
    /// The 16 scales, already minus 32.
    #[inline(always)]
    pub fn unpack_scales(&self) -> [i8; 16] {
        let s = &self.scales;
        let mut out = [0i8; 16];
        for (j, o) in out.iter_mut().enumerate() {
            let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
            let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            *o = (low | (high << 4)) as i8 - 32;
        }
        out
    }
}
impl_block!(BlockQ3K, DType::Q3_K, 110);

/// ggml `get_scale_min_k4` for all 8 sub-blocks: 6-bit scales and mins packed in 12 bytes.
#[inline(always)]
pub fn scale_min_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    (sc, m)
}

/// `block_q4_K`: 8 sub-blocks of 32; `x = d*sc*q - dmin*m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; 128],
}
impl Default for BlockQ4K {
    fn default() -> Self {
        Self {
            d: f16::ZERO,
            dmin: f16::ZERO,
            scales: [0; 12],
            qs: [0; 128],
        }
    }
}
impl BlockQ4K {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
            scales: arr(b, 4),
            qs: arr(b, 16),
        }
    }
    fn store(&self, o: &mut [u8]) {
        put(o, 0, &self.d.to_bits().to_le_bytes());
        put(o, 2, &self.dmin.to_bits().to_le_bytes());
        put(o, 4, &self.scales);
        put(o, 16, &self.qs);
    }
    /// Quants in element order: 64-element chunks take low then high nibbles of 32 bytes.
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 256] {
        let mut a = [0i8; 256];
        for (out, q) in a.chunks_exact_mut(64).zip(self.qs.chunks_exact(32)) {
            let (lo, hi) = out.split_at_mut(32);
            for l in 0..32 {
                lo[l] = (q[l] & 0xF) as i8;
                hi[l] = (q[l] >> 4) as i8;
            }
        }
        a
    }
}
impl_block!(BlockQ4K, DType::Q4_K, 144);

/// `block_q5_K`: as Q4_K with a fifth bit per quant in `qh`; q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}
impl Default for BlockQ5K {
    fn default() -> Self {
        Self {
            d: f16::ZERO,
            dmin: f16::ZERO,
            scales: [0; 12],
            qh: [0; 32],
            qs: [0; 128],
        }
    }
}
impl BlockQ5K {
    fn parse(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
            scales: arr(b, 4),
            qh: arr(b, 16),
            qs: arr(b, 48),
        }
    }
    fn store(&self, o: &mut [u8]) {
        put(o, 0, &self.d.to_bits().to_le_bytes());
        put(o, 2, &self.dmin.to_bits().to_le_bytes());
        put(o, 4, &self.scales);
        put(o, 16, &self.qh);
        put(o, 48, &self.qs);
    }
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 256] {
        let mut a = [0i8; 256];
        for (j, (out, q)) in a
            .chunks_exact_mut(64)
            .zip(self.qs.chunks_exact(32))
            .enumerate()
        {
            let (lo, hi) = out.split_at_mut(32);
            let (s1, s2) = (2 * j, 2 * j + 1);
            for l in 0..32 {
                lo[l] = ((q[l] & 0xF) | (((self.qh[l] >> s1) & 1) << 4)) as i8;
                hi[l] = ((q[l] >> 4) | (((self.qh[l] >> s2) & 1) << 4)) as i8;
            }
        }
        a
    }
}
impl_block!(BlockQ5K, DType::Q5_K, 176);

/// `block_q6_K`: 16 sub-blocks of 16 with int8 scales; `x = d*sc*(q-32)`, q in 0..64.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: f16,
}
impl Default for BlockQ6K {
    fn default() -> Self {
        Self {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: f16::ZERO,
        }
    }
}
impl BlockQ6K {
    fn parse(b: &[u8]) -> Self {
        Self {
            ql: arr(b, 0),
            qh: arr(b, 128),
            scales: arr_i8(b, 192),
            d: f16_at(b, 208),
        }
    }
    fn store(&self, o: &mut [u8]) {
        put(o, 0, &self.ql);
        put(o, 128, &self.qh);
        put(o, 192, &self.scales.map(|s| s as u8));
        put(o, 208, &self.d.to_bits().to_le_bytes());
    }
    /// Signed quants (-32..32) in element order.
    #[inline(always)]
    pub fn unpack(&self) -> [i8; 256] {
        let mut a = [0i8; 256];
        for n in 0..2 {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            let out = &mut a[128 * n..128 * n + 128];
            for l in 0..32 {
                out[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                out[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        a
    }
}
impl_block!(BlockQ6K, DType::Q6_K, 210);

/// `block_q8_K`: activation format; f32 scale, `bsums[j]` = sum of quants `16j..16j+16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}
impl Default for BlockQ8K {
    fn default() -> Self {
        Self {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        }
    }
}
impl BlockQ8K {
    fn parse(b: &[u8]) -> Self {
        let mut bsums = [0i16; 16];
        for (j, s) in bsums.iter_mut().enumerate() {
            *s = le_u16(b, 260 + 2 * j) as i16;
        }
        Self {
            d: f32::from_le_bytes(arr(b, 0)),
            qs: arr_i8(b, 4),
            bsums,
        }
    }
    fn store(&self, o: &mut [u8]) {
        put(o, 0, &self.d.to_le_bytes());
        put(o, 4, &self.qs.map(|q| q as u8));
        for (j, s) in self.bsums.iter().enumerate() {
            put(o, 260 + 2 * j, &s.to_le_bytes());
        }
    }
}
impl_block!(BlockQ8K, DType::Q8_K, 292);

// ---------------------------------------------------------------- dequantize

pub(crate) fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) {
    let out = dst.chunks_exact_mut(QK_K);
    match dtype {
        DType::Q2_K => out.zip(blocks::<BlockQ2K>(src)).for_each(|(y, b)| {
            let (d, min) = (fp16_to_f32(b.d.to_bits()), fp16_to_f32(b.dmin.to_bits()));
            let a = b.unpack();
            for (g, (y, q)) in y.chunks_exact_mut(16).zip(a.chunks_exact(16)).enumerate() {
                let sc = b.scales[g];
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                y.iter_mut()
                    .zip(q)
                    .for_each(|(y, &q)| *y = dl * q as f32 - ml);
            }
        }),
        DType::Q3_K => out.zip(blocks::<BlockQ3K>(src)).for_each(|(y, b)| {
            let d = fp16_to_f32(b.d.to_bits());
            let (a, sc) = (b.unpack(), b.unpack_scales());
            for (g, (y, q)) in y.chunks_exact_mut(16).zip(a.chunks_exact(16)).enumerate() {
                let dl = d * sc[g] as f32;
                y.iter_mut().zip(q).for_each(|(y, &q)| *y = dl * q as f32);
            }
        }),
        DType::Q4_K => out.zip(blocks::<BlockQ4K>(src)).for_each(|(y, b)| {
            let (sc, m) = scale_min_k4(&b.scales);
            dequant_k32(
                y,
                &b.unpack(),
                fp16_to_f32(b.d.to_bits()),
                fp16_to_f32(b.dmin.to_bits()),
                &sc,
                &m,
            );
        }),
        DType::Q5_K => out.zip(blocks::<BlockQ5K>(src)).for_each(|(y, b)| {
            let (sc, m) = scale_min_k4(&b.scales);
            dequant_k32(
                y,
                &b.unpack(),
                fp16_to_f32(b.d.to_bits()),
                fp16_to_f32(b.dmin.to_bits()),
                &sc,
                &m,
            );
        }),
        DType::Q6_K => out.zip(blocks::<BlockQ6K>(src)).for_each(|(y, b)| {
            let d = fp16_to_f32(b.d.to_bits());
            let a = b.unpack();
            // ggml: y[l + 32k] = d * sc[is + 2k] * q with is = l/16, i.e. sub-block of 16 by element.
            for (g, (y, q)) in y.chunks_exact_mut(16).zip(a.chunks_exact(16)).enumerate() {
                let dl = d * b.scales[g] as f32;
                y.iter_mut().zip(q).for_each(|(y, &q)| *y = dl * q as f32);
            }
        }),
        DType::Q8_K => out.zip(blocks::<BlockQ8K>(src)).for_each(|(y, b)| {
            y.iter_mut()
                .zip(b.qs)
                .for_each(|(y, q)| *y = b.d * q as f32);
        }),
        _ => unreachable!("kquants::dequantize({dtype})"),
    }
}

#[inline(always)]
fn dequant_k32(y: &mut [f32], a: &[i8; 256], d: f32, min: f32, sc: &[u8; 8], m: &[u8; 8]) {
    for (s, (y, q)) in y.chunks_exact_mut(32).zip(a.chunks_exact(32)).enumerate() {
        let d1 = d * sc[s] as f32;
        let m1 = min * m[s] as f32;
        y.iter_mut()
            .zip(q)
            .for_each(|(y, &q)| *y = d1 * q as f32 - m1);
    }
}

// ---------------------------------------------------------------- dot products

/// `ggml_vec_dot_q2_K_q8_K_generic`: per block `sumf += dall*isum - dmin*summs`.
fn dot_q2_k(w: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks::<BlockQ2K>(w).zip(blocks::<BlockQ8K>(act)) {
        let summs: i32 = y
            .bsums
            .iter()
            .zip(&x.scales)
            .map(|(&b, &s)| b as i32 * (s >> 4) as i32)
            .sum();
        let dall = y.d * fp16_to_f32(x.d.to_bits());
        let dmin = y.d * fp16_to_f32(x.dmin.to_bits());
        let a = x.unpack();
        let mut isum = 0i32;
        for (g, (q2, q8)) in a.chunks_exact(16).zip(y.qs.chunks_exact(16)).enumerate() {
            isum += (x.scales[g] & 0xF) as i32 * dot_i8(q2, q8);
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Shared tail of the 8-lane K-quant dot products: `aux32[l] += scale * (q8*a)` over
/// sub-blocks of `sub` elements, then `sums[l] += d * aux32[l]`.
#[inline(always)]
fn lanes_k(a: &[i8; 256], q8: &[i8; 256], scales: &[i32], sub: usize, d: f32, sums: &mut [f32; 8]) {
    let mut aux32 = [0i32; 8];
    for ((qa, qy), &s) in a.chunks_exact(sub).zip(q8.chunks_exact(sub)).zip(scales) {
        let lanes = dot_i8_lanes(qa, qy);
        for l in 0..8 {
            aux32[l] += s * lanes[l];
        }
    }
    for l in 0..8 {
        sums[l] += d * aux32[l] as f32;
    }
}

#[inline(always)]
fn finish(mut sumf: f32, sums: &[f32; 8]) -> f32 {
    for s in sums {
        sumf += s;
    }
    sumf
}

/// `ggml_vec_dot_q3_K_q8_K_generic`.
fn dot_q3_k(w: &[u8], act: &[u8]) -> f32 {
    let mut sums = [0.0f32; 8];
    for (x, y) in blocks::<BlockQ3K>(w).zip(blocks::<BlockQ8K>(act)) {
        let sc = x.unpack_scales().map(|s| s as i32);
        let d = fp16_to_f32(x.d.to_bits()) * y.d;
        lanes_k(&x.unpack(), &y.qs, &sc, 16, d, &mut sums);
    }
    finish(0.0, &sums)
}

/// `ggml_vec_dot_q4_K_q8_K_generic` / `q5_K`: mins enter through Q8_K's `bsums`.
#[inline(always)]
fn dot_k32(
    a: &[i8; 256],
    scales: &[u8; 12],
    d: f16,
    dmin: f16,
    y: &BlockQ8K,
    sums: &mut [f32; 8],
    sumf: &mut f32,
) {
    let (sc, m) = scale_min_k4(scales);
    let mut sumi = 0i32;
    for (j, &b) in y.bsums.iter().enumerate() {
        sumi += b as i32 * m[j / 2] as i32;
    }
    let sc = sc.map(|s| s as i32);
    lanes_k(a, &y.qs, &sc, 32, fp16_to_f32(d.to_bits()) * y.d, sums);
    let dmin = fp16_to_f32(dmin.to_bits()) * y.d;
    *sumf -= dmin * sumi as f32;
}

fn dot_q4_k(w: &[u8], act: &[u8]) -> f32 {
    let (mut sums, mut sumf) = ([0.0f32; 8], 0.0f32);
    for (x, y) in blocks::<BlockQ4K>(w).zip(blocks::<BlockQ8K>(act)) {
        dot_k32(
            &x.unpack(),
            &x.scales,
            x.d,
            x.dmin,
            &y,
            &mut sums,
            &mut sumf,
        );
    }
    finish(sumf, &sums)
}

fn dot_q5_k(w: &[u8], act: &[u8]) -> f32 {
    let (mut sums, mut sumf) = ([0.0f32; 8], 0.0f32);
    for (x, y) in blocks::<BlockQ5K>(w).zip(blocks::<BlockQ8K>(act)) {
        dot_k32(
            &x.unpack(),
            &x.scales,
            x.d,
            x.dmin,
            &y,
            &mut sums,
            &mut sumf,
        );
    }
    finish(sumf, &sums)
}

/// `ggml_vec_dot_q6_K_q8_K_generic`.
fn dot_q6_k(w: &[u8], act: &[u8]) -> f32 {
    let mut sums = [0.0f32; 8];
    for (x, y) in blocks::<BlockQ6K>(w).zip(blocks::<BlockQ8K>(act)) {
        let sc = x.scales.map(|s| s as i32);
        lanes_k(
            &x.unpack(),
            &y.qs,
            &sc,
            16,
            fp16_to_f32(x.d.to_bits()) * y.d,
            &mut sums,
        );
    }
    finish(0.0, &sums)
}

pub(crate) fn vec_dot(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    match dtype {
        DType::Q2_K => dot_q2_k(w, act),
        DType::Q3_K => dot_q3_k(w, act),
        DType::Q4_K => dot_q4_k(w, act),
        DType::Q5_K => dot_q5_k(w, act),
        DType::Q6_K => dot_q6_k(w, act),
        _ => unreachable!("kquants::vec_dot({dtype})"),
    }
}

// ---------------------------------------------------------------- x86-exact kernels

// The twins of llama.cpp's x86 K-quant kernels live in repack.rs (a child module so that
// they can use this module's block types).
mod repack;
pub(crate) use repack::quantize_row_q8_k_4x8;

// The twin of the tiled K-quant matmul (ggml-cpu/tiled/) lives in tiled.rs.
mod tiled;

/// One matmul output element as llama.cpp's x86 build computes it with `kernel` (see
/// `crate::matmul_kernel`); bit-identical for the formats that `repack.rs` emulates.
pub(crate) fn dot_x86(kernel: crate::Kernel, dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_fma() {
        // SAFETY: the CPU has FMA and AVX2 (checked at run time).
        return unsafe { dot_x86_fma(kernel, dtype, w, act) };
    }
    dot_x86_any(kernel, dtype, w, act)
}

/// The same scalar code compiled with FMA enabled, so `mul_add` is one instruction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,avx2")]
unsafe fn dot_x86_fma(kernel: crate::Kernel, dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    dot_x86_any(kernel, dtype, w, act)
}

#[cfg(target_arch = "x86_64")]
fn has_fma() -> bool {
    use std::sync::OnceLock;
    static FMA: OnceLock<bool> = OnceLock::new();
    *FMA.get_or_init(|| is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2"))
}

#[inline(always)]
fn dot_x86_any(kernel: crate::Kernel, dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    use crate::Kernel::{RepackGemm, RepackGemv, Tiled};
    match (kernel, dtype) {
        (Tiled, _) => tiled::dot(dtype, w, act),
        (RepackGemv, DType::Q4_K) => repack::gemv_q4_k(w, act),
        (RepackGemm, DType::Q4_K) => repack::gemm_q4_k(w, act),
        (_, DType::Q4_K) => repack::vec_dot_q4_k(w, act),
        (_, DType::Q6_K) => repack::vec_dot_q6_k(w, act),
        (_, DType::Q5_K) => repack::vec_dot_q5_k(w, act),
        (RepackGemv, DType::Q2_K) => repack::gemv_q2_k(w, act),
        (RepackGemm, DType::Q2_K) => repack::gemm_q2_k(w, act),
        (_, DType::Q2_K) => repack::vec_dot_q2_k(w, act),
        // Not yet emulated: ggml's generic order.
        _ => vec_dot(dtype, w, act),
    }
}
