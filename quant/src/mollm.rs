//! mollm's own weight formats, made for decode-time GEMV with integer accumulation (W4A8,
//! W8A8): symmetric, one scale per group, activations quantized in matching groups.
//!
//! | format | block | bytes | layout | activations |
//! |---|---|---|---|---|
//! | `W4G32` | 32 | 18 | f16 scale, 16 bytes: element j in the low nibble of byte j, j+16 in the high one | Q8_0 (x86 `quantize_row_q8_0`) |
//! | `W4G128` | 128 | 66 | f16 scale, 64 bytes: element j low nibble of byte j, j+64 high | `A8G128` |
//! | `W8PC` | 64 | 68 | f32 scale of the whole row (repeated in each block, so rows stay block-addressable), 64 × i8 | Q8_0 |
//! | `A8G128` | 128 | 132 | f32 scale, 128 × i8 (activations only) | |
//!
//! 4-bit codes are `q + 8` with `q` in -8..=7 (symmetric: a scale, no offset); the scale of a
//! group is searched for the least squared error (see `quantize_w4_group`). W8PC:
//! `d = absmax(row)/127`.
//! Values decode as `d · q`.
//!
//! The dot product (the normative float order, which native kernels reproduce bit for bit): per
//! group `g` of the activation format, the exact integer sum `isum_g`, then
//! `lane[g % 8] = fma(dw · da, isum_g, lane[g % 8])` over eight f32 lanes, and at the end
//! ggml's `hsum_float_8` of the lanes. Eight independent chains let a SIMD kernel keep one
//! group per lane.

use crate::util::{f32_to_fp16, fp16_to_f32};
use abi::DType;

/// 4-bit groups: (block elements, block bytes).
fn w4_geometry(dtype: DType) -> (usize, usize) {
    match dtype {
        DType::W4G32 => (32, 18),
        DType::W4G128 => (128, 66),
        _ => unreachable!("{dtype} is not a 4-bit mollm format"),
    }
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// One 4-bit group: the f16 scale bits and the codes `q` (-8..=7).
///
/// Candidate scales map the largest-magnitude value to a code between ±6 and ±8 (both signs,
/// since the code range is one step longer on the negative side); each candidate's codes are
/// refined once by least squares (`d = Σxq / Σq²`), and the f16 scale with the least squared
/// error wins.
fn quantize_w4_group(x: &[f32], q: &mut [i8]) -> u16 {
    let (mut vmax, mut m) = (0f32, 0f32);
    for &v in x {
        if v.abs() > m {
            (m, vmax) = (v.abs(), v);
        }
    }
    if m == 0.0 || !m.is_finite() {
        q.fill(0);
        return f32_to_fp16(if m.is_finite() { 0.0 } else { m });
    }
    let codes = |d: f32, q: &mut [i8]| {
        for (c, &v) in q.iter_mut().zip(x) {
            *c = if d == 0.0 {
                0
            } else {
                (v / d).round_ties_even().clamp(-8.0, 7.0) as i8
            };
        }
    };
    let sse = |d: f32, q: &[i8]| -> f32 {
        x.iter()
            .zip(q)
            .map(|(&v, &c)| (v - c as f32 * d) * (v - c as f32 * d))
            .sum()
    };
    let mut best = (f32::INFINITY, 0u16);
    let mut tmp = vec![0i8; x.len()];
    for i in 0..=8 {
        let t = 6.0 + 0.25 * i as f32;
        for sign in [1.0f32, -1.0] {
            let d0 = vmax / (sign * t);
            codes(d0, &mut tmp);
            let (sxq, sqq) = x.iter().zip(&tmp).fold((0f32, 0f32), |(a, b), (&v, &c)| {
                (a + v * c as f32, b + (c as f32) * (c as f32))
            });
            for d in [d0, if sqq > 0.0 { sxq / sqq } else { d0 }] {
                let bits = f32_to_fp16(d);
                let df = fp16_to_f32(bits);
                if df == 0.0 || !df.is_finite() {
                    continue;
                }
                codes(df, &mut tmp);
                let e = sse(df, &tmp);
                if e < best.0 {
                    best = (e, bits);
                }
            }
        }
    }
    codes(fp16_to_f32(best.1), q);
    best.1
}

/// Quantizes `src` into `dst` (sizes checked by the caller). For `W8PC`, `src` must be one
/// whole row: its scale is the row's.
pub fn quantize(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::W4G32 | DType::W4G128 => {
            let (bl, bb) = w4_geometry(dtype);
            let half = bl / 2;
            let mut q = vec![0i8; bl];
            for (x, b) in src.chunks_exact(bl).zip(dst.chunks_exact_mut(bb)) {
                let d = quantize_w4_group(x, &mut q);
                b[..2].copy_from_slice(&d.to_le_bytes());
                for j in 0..half {
                    b[2 + j] = ((q[j] + 8) as u8) | (((q[j + half] + 8) as u8) << 4);
                }
            }
        }
        DType::W8PC => {
            let m = amax(src);
            let d = m / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (x, b) in src.chunks_exact(64).zip(dst.chunks_exact_mut(68)) {
                b[..4].copy_from_slice(&d.to_le_bytes());
                for (o, &v) in b[4..].iter_mut().zip(x) {
                    *o = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8 as u8;
                }
            }
        }
        DType::A8G128 => quantize_a8g128(src, dst),
        _ => unreachable!("{dtype} is not a mollm format"),
    }
}

/// Activations in 128-element groups: `d = absmax/127`, `q = round_half_even(x · 127/absmax)`.
pub fn quantize_a8g128(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(128).zip(dst.chunks_exact_mut(132)) {
        let m = amax(x);
        let d = m / 127.0;
        let id = if m != 0.0 { 127.0 / m } else { 0.0 };
        b[..4].copy_from_slice(&d.to_le_bytes());
        for (o, &v) in b[4..].iter_mut().zip(x) {
            *o = (v * id).round_ties_even() as i8 as u8;
        }
    }
}

pub fn dequantize(dtype: DType, src: &[u8], dst: &mut [f32]) {
    match dtype {
        DType::W4G32 | DType::W4G128 => {
            let (bl, bb) = w4_geometry(dtype);
            let half = bl / 2;
            for (b, y) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bl)) {
                let d = fp16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                for j in 0..half {
                    y[j] = d * ((b[2 + j] & 0x0F) as i32 - 8) as f32;
                    y[j + half] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
                }
            }
        }
        DType::W8PC | DType::A8G128 => {
            let (bl, bb) = if dtype == DType::W8PC {
                (64, 68)
            } else {
                (128, 132)
            };
            for (b, y) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bl)) {
                let d = f32::from_le_bytes(b[..4].try_into().unwrap());
                for (o, &q) in y.iter_mut().zip(&b[4..]) {
                    *o = d * q as i8 as f32;
                }
            }
        }
        _ => unreachable!("{dtype} is not a mollm format"),
    }
}

/// The activation format each weight format's dot product takes.
pub fn act_type(dtype: DType) -> DType {
    match dtype {
        DType::W4G128 => DType::A8G128,
        _ => DType::Q8_0,
    }
}

/// ggml's `hsum_float_8`.
#[inline(always)]
pub fn hsum8(x: &[f32; 8]) -> f32 {
    let r = [x[4] + x[0], x[5] + x[1], x[6] + x[2], x[7] + x[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// The 4-bit codes of one group as `q` (-8..=7), element order.
#[inline(always)]
pub fn w4_codes<const N: usize>(qs: &[u8]) -> [i8; N] {
    let half = N / 2;
    core::array::from_fn(|e| {
        let b = qs[e % half];
        (if e < half { b & 0x0F } else { b >> 4 }) as i8 - 8
    })
}

/// Per activation group: (weight scale, activation scale, exact integer sum), in order.
fn groups(dtype: DType, w: &[u8], act: &[u8], mut f: impl FnMut(f32, f32, i32)) {
    let dot = |a: &[i8], b: &[u8]| -> i32 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| x as i32 * y as i8 as i32)
            .sum()
    };
    match dtype {
        DType::W4G32 => {
            for (b, a) in w.chunks_exact(18).zip(act.chunks_exact(34)) {
                let q: [i8; 32] = w4_codes(&b[2..]);
                let (dw, da) = (f16_at(b), f16_at(a));
                f(dw, da, dot(&q, &a[2..]));
            }
        }
        DType::W4G128 => {
            for (b, a) in w.chunks_exact(66).zip(act.chunks_exact(132)) {
                let q: [i8; 128] = w4_codes(&b[2..]);
                let da = f32::from_le_bytes(a[..4].try_into().unwrap());
                f(f16_at(b), da, dot(&q, &a[4..]));
            }
        }
        DType::W8PC => {
            for (b, a2) in w.chunks_exact(68).zip(act.chunks_exact(68)) {
                let dw = f32::from_le_bytes(b[..4].try_into().unwrap());
                for h in 0..2 {
                    let a = &a2[34 * h..34 * h + 34];
                    let q: [i8; 32] = core::array::from_fn(|e| b[4 + 32 * h + e] as i8);
                    f(dw, f16_at(a), dot(&q, &a[2..]));
                }
            }
        }
        _ => unreachable!("{dtype} is not a mollm weight format"),
    }
}

fn f16_at(b: &[u8]) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// The dot product of a weight row and an activation row in [`act_type`] (see the module
/// docs for the float order).
pub fn vec_dot(dtype: DType, w: &[u8], act: &[u8]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut g = 0;
    groups(dtype, w, act, |dw, da, isum| {
        lanes[g % 8] = (dw * da).mul_add(isum as f32, lanes[g % 8]);
        g += 1;
    });
    hsum8(&lanes)
}
