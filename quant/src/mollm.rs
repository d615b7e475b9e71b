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

/// 1.5 * 2^23: for |y| < 2^22, `(y + ROUND_MAGIC) - ROUND_MAGIC` is `y` rounded to an integer
/// in the current (nearest-even) mode. (`round_ties_even` is a libm call on baseline x86-64.)
const ROUND_MAGIC: f32 = 12_582_912.0;

/// The group's value of largest magnitude (the first of them), or the scale bits of a group
/// that codes to all zeros (0: every value is 0; infinity or NaN: one is not finite).
fn largest(x: &[f32]) -> Result<f32, u16> {
    let (mut vmax, mut m) = (0f32, 0f32);
    for &v in x {
        if v.abs() > m {
            (m, vmax) = (v.abs(), v);
        }
    }
    if m == 0.0 || !m.is_finite() {
        return Err(f32_to_fp16(if m.is_finite() { 0.0 } else { m }));
    }
    Ok(vmax)
}

/// One 4-bit group: the f16 scale bits and the codes `q` (-8..=7).
///
/// Candidate scales map the largest-magnitude value to a code between ±6 and ±8 (both signs,
/// since the code range is one step longer on the negative side); each candidate's codes are
/// refined once by least squares (`d = Σxq / Σq²`), and the f16 scale with the least squared
/// error wins.
fn quantize_w4_group(x: &[f32], q: &mut [i8]) -> u16 {
    let vmax = match largest(x) {
        Ok(v) => v,
        Err(bits) => {
            q.fill(0);
            return bits;
        }
    };
    // Every candidate's sums run in element order, as in a plain loop per candidate; the
    // candidates sit side by side in LANES-wide arrays, so that the independent chains overlap
    // (one candidate at a time is a chain of dependent float adds: most of a minute per 135M
    // weights) and vectorize. The results are those of one candidate at a time, bit for bit.
    const LANES: usize = 8;
    // The first guesses: t = 6, 6.25, ..., 8, each with both signs (18, padded to 24).
    let mut d0 = [1f32; 24];
    for i in 0..=8 {
        let t = 6.0 + 0.25 * i as f32;
        for (s, sign) in [1.0f32, -1.0].into_iter().enumerate() {
            d0[2 * i + s] = vmax / (sign * t);
        }
    }
    // Their least-squares refinements `Σxq / Σq²` (the first guess when every code is 0).
    let mut d1 = [1f32; 24];
    for (dc, rc) in d0.chunks_exact(LANES).zip(d1.chunks_exact_mut(LANES)) {
        let div: [f32; LANES] = core::array::from_fn(|l| divisor(dc[l]));
        let (mut sxq, mut sqq) = ([0f32; LANES], [0f32; LANES]);
        for &v in x {
            for l in 0..LANES {
                let c = code(v, div[l]);
                sxq[l] += v * c;
                sqq[l] += c * c;
            }
        }
        for l in 0..LANES {
            rc[l] = if sqq[l] > 0.0 { sxq[l] / sqq[l] } else { dc[l] };
        }
    }
    // The f16 scales tried, in order: per first guess, itself then its refinement (36, padded).
    let mut bits = [0u16; 40];
    let mut df = [1f32; 40];
    for g in 0..18 {
        for (j, d) in [d0[g], d1[g]].into_iter().enumerate() {
            bits[2 * g + j] = f32_to_fp16(d);
            df[2 * g + j] = fp16_to_f32(bits[2 * g + j]);
        }
    }
    let mut err = [0f32; 40];
    for (dc, ec) in df.chunks_exact(LANES).zip(err.chunks_exact_mut(LANES)) {
        let div: [f32; LANES] = core::array::from_fn(|l| divisor(dc[l]));
        let mut e = [0f32; LANES];
        for &v in x {
            for l in 0..LANES {
                let r = v - code(v, div[l]) * dc[l];
                e[l] += r * r;
            }
        }
        ec.copy_from_slice(&e);
    }
    let mut best = (f32::INFINITY, 0u16);
    for k in 0..36 {
        if df[k] != 0.0 && df[k].is_finite() && err[k] < best.0 {
            best = (err[k], bits[k]);
        }
    }
    let div = divisor(fp16_to_f32(best.1));
    for (c, &v) in q.iter_mut().zip(x) {
        *c = code(v, div) as i8;
    }
    best.1
}

/// The 4-bit code of `v` at scale `d` as a float: `round(v / d)` clamped to -8..=7, 0 when
/// `d` is 0. `div` is [`divisor`]`(d)`. Branch-free, so that lanes of candidates vectorize:
/// clamping the quotient to ±16 first changes no result (beyond ±8.5 the clamp decides) and
/// keeps it in the range where [`ROUND_MAGIC`] rounds.
#[inline(always)]
fn code(v: f32, div: f32) -> f32 {
    let y = v / div;
    let y = if y < -16.0 { -16.0 } else { y };
    let y = if y > 16.0 { 16.0 } else { y };
    let r = (y + ROUND_MAGIC) - ROUND_MAGIC;
    let r = if r < -8.0 { -8.0 } else { r };
    if r > 7.0 {
        7.0
    } else {
        r
    }
}

/// The divisor [`code`] takes for scale `d`: `d`, or infinity for 0 (every quotient 0).
#[inline(always)]
fn divisor(d: f32) -> f32 {
    if d == 0.0 {
        f32::INFINITY
    } else {
        d
    }
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

#[cfg(test)]
mod tests {
    use super::{code, divisor, largest, quantize_w4_group};
    use crate::util::{f32_to_fp16, fp16_to_f32};

    /// The 4-bit group search written plainly, one candidate after another (the definition
    /// `quantize_w4_group` computes in lanes).
    fn w4_group_plain(x: &[f32], q: &mut [i8]) -> u16 {
        let vmax = match largest(x) {
            Ok(v) => v,
            Err(bits) => {
                q.fill(0);
                return bits;
            }
        };
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

    /// Same scale bits and codes as the plain search: random groups of 32 and 128 at scales
    /// from subnormal to huge, groups with one outlier, all-equal and all-zero groups.
    #[test]
    fn w4_group_lanes_equal_the_plain_search() {
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for trial in 0..4000 {
            let n = if trial % 2 == 0 { 32 } else { 128 };
            let scale = [1e-42f32, 1e-20, 1e-3, 1.0, 300.0, 1e30][trial % 6];
            let mut x: Vec<f32> = (0..n).map(|_| next() * scale).collect();
            match trial % 7 {
                0 => x[trial % n] *= 40.0,
                1 => x.fill(scale),
                2 => x.fill(0.0),
                _ => {}
            }
            let (mut a, mut b) = (vec![0i8; n], vec![0i8; n]);
            let (da, db) = (quantize_w4_group(&x, &mut a), w4_group_plain(&x, &mut b));
            assert_eq!((da, &a), (db, &b), "trial {trial}: {x:?}");
        }
    }

    /// `code` is `round_ties_even(v / d)` clamped to -8..=7 (0 for d = 0): ties, both signs,
    /// quotients near and far past the clamp, huge and tiny values.
    #[test]
    fn code_is_the_clamped_rounded_quotient() {
        let mut vs: Vec<f32> = (-80..=80).map(|i| i as f32 * 0.25).collect();
        vs.extend([
            4_194_303.5,
            6_539_225.5,
            8_388_609.0,
            -1e30,
            1e30,
            1e-40,
            -0.0,
        ]);
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            vs.push(f32::from_bits((s >> 32) as u32 & 0xCAFF_FFFF));
        }
        for v in vs.into_iter().filter(|x| x.is_finite()) {
            for d in [1.0f32, -1.0, 0.5, 3.0, 1e-30, 0.0] {
                let want = if d == 0.0 {
                    0.0
                } else {
                    (v / d).round_ties_even().clamp(-8.0, 7.0)
                };
                assert_eq!(code(v, divisor(d)), want, "v={v} d={d}");
            }
        }
    }
}
