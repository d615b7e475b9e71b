//! ggml's reference K-quant quantizers (`quantize_row_q{2..6}_K_ref`, `quantize_row_q8_K_ref`)
//! and their helpers `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants` (ggml-quants.c),
//! transcribed with the same float operation order.

use crate::block::Block;
use crate::kquants::*;
use crate::util::{f32_to_fp16, fp16_to_f32, nearest_int};
use abi::DType;
use half::f16;

const GROUP_MAX_EPS: f32 = 1e-15;

#[inline(always)]
fn h(x: f32) -> f16 {
    f16::from_bits(f32_to_fp16(x))
}
#[inline(always)]
fn hf(x: f16) -> f32 {
    fp16_to_f32(x.to_bits())
}

/// `make_qx_quants` with `qw = NULL`. `L` receives quants offset by `nmax`.
fn make_qx_quants(x: &[f32], nmax: i32, l_out: &mut [i8], rmse_type: i32) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for i in 0..n {
            let l = nearest_int(iscale * x[i]);
            l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let (rmse_type, return_early) = if rmse_type < 0 {
        (-rmse_type, true)
    } else {
        (rmse_type, false)
    };
    let weight = |v: f32| -> f32 {
        match rmse_type {
            1 => v * v,
            2 => 1.0,
            3 => v.abs(),
            _ => v.abs().sqrt(),
        }
    };
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = weight(x[i]);
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = weight(x[i]);
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` (`do_rmse = true` is the only use in the reference quantizer).
fn make_q3_quants(x: &[f32], nmax: i32, l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                    if new_l != l_out[i] as i32 {
                        slx += w * x[i] * new_l as f32;
                        sl2 += w * new_l as f32 * new_l as f32;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in l_out[..n].iter_mut() {
            *l += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// `make_qkx2_quants`: returns `(scale, the_min)`; `l_out` receives quants in `0..=nmax`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut laux = [0u8; 32];
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let mut diff = scale * l as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let mut diff = this_scale * laux[i] as f32 + this_min - x[i];
                diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `quantize_row_q2_K_ref`.
pub fn quantize_q2_k(x: &[f32]) -> BlockQ2K {
    let mut y = BlockQ2K::default();
    let mut l = [0u8; QK_K];
    let mut mins = [0.0f32; 16];
    let mut scales = [0.0f32; 16];
    let q4scale = 15.0f32;
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let mut weights = [0.0f32; 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (s, m) = make_qkx2_quants(
            xs,
            &weights,
            3,
            &mut l[16 * j..16 * j + 16],
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for j in 0..16 {
            y.scales[j] = nearest_int(iscale * scales[j]) as u8;
        }
        y.d = h(max_scale / q4scale);
    } else {
        y.scales = [0; 16];
        y.d = h(0.0);
    }
    if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for j in 0..16 {
            let li = nearest_int(iscale * mins[j]);
            y.scales[j] |= (li << 4) as u8;
        }
        y.dmin = h(max_min / q4scale);
    } else {
        y.dmin = h(0.0);
    }
    for j in 0..16 {
        let d = hf(y.d) * (y.scales[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = hf(y.dmin) * (y.scales[j] >> 4) as f32;
        for ii in 0..16 {
            let li = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
            l[16 * j + ii] = li as u8;
        }
    }
    for n in 0..2 {
        let j = 128 * n;
        for k in 0..32 {
            y.qs[32 * n + k] =
                l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
    y
}

/// `quantize_row_q3_K_ref`.
pub fn quantize_q3_k(x: &[f32]) -> BlockQ3K {
    let mut y = BlockQ3K::default();
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(
            &x[16 * j..16 * j + 16],
            4,
            &mut l[16 * j..16 * j + 16],
            true,
        );
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    y.scales = [0; 12];
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let li = nearest_int(iscale * scales[j]) as i8;
            let li = (li.clamp(-32, 31) + 32) as u8;
            if j < 8 {
                y.scales[j] = li & 0xF;
            } else {
                y.scales[j - 8] |= (li & 0xF) << 4;
            }
            let hi = li >> 4;
            y.scales[j % 4 + 8] |= hi << (2 * (j / 4));
        }
        y.d = h(1.0 / iscale);
    } else {
        y.d = h(0.0);
    }
    let sc = y.unpack_scales();
    for j in 0..16 {
        let d = hf(y.d) * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let li = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            l[16 * j + ii] = (li + 4) as i8;
        }
    }
    y.hmask = [0; 32];
    let (mut m, mut hm) = (0usize, 1u8);
    for lj in l.iter_mut() {
        if *lj > 3 {
            y.hmask[m] |= hm;
            *lj -= 4;
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm <<= 1;
        }
    }
    for n in 0..2 {
        let j = 128 * n;
        for k in 0..32 {
            y.qs[32 * n + k] =
                (l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6))
                    as u8;
        }
    }
    y
}

/// Shared body of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`: returns
/// `(d, dmin, packed scales, quants in 0..=nmax in element order)`.
fn quantize_k32(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> (f16, f16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut mins = [0.0f32; 8];
    let mut scales = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0.0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = h(max_scale / 63.0);
    let dmin = h(max_min / 63.0);
    let (sc, m) = scale_min_k4(&packed);
    for j in 0..8 {
        let dd = hf(d) * sc[j] as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = hf(dmin) * m[j] as f32;
        for ii in 0..32 {
            let li = nearest_int((x[32 * j + ii] + dm) / dd).clamp(0, nmax);
            l[32 * j + ii] = li as u8;
        }
    }
    (d, dmin, packed, l)
}

/// `quantize_row_q4_K_ref`.
pub fn quantize_q4_k(x: &[f32]) -> BlockQ4K {
    let (d, dmin, scales, l) = quantize_k32(x, 15, -1.0, 20);
    let mut qs = [0u8; 128];
    for (q, lc) in qs.chunks_exact_mut(32).zip(l.chunks_exact(64)) {
        for k in 0..32 {
            q[k] = lc[k] | (lc[k + 32] << 4);
        }
    }
    BlockQ4K {
        d,
        dmin,
        scales,
        qs,
    }
}

/// `quantize_row_q5_K_ref`.
pub fn quantize_q5_k(x: &[f32]) -> BlockQ5K {
    let (d, dmin, scales, l) = quantize_k32(x, 31, -0.5, 15);
    let mut qs = [0u8; 128];
    let mut qh = [0u8; 32];
    let (mut m1, mut m2) = (1u8, 2u8);
    for (q, lc) in qs.chunks_exact_mut(32).zip(l.chunks_exact(64)) {
        for k in 0..32 {
            let mut l1 = lc[k];
            if l1 > 15 {
                l1 -= 16;
                qh[k] |= m1;
            }
            let mut l2 = lc[k + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[k] |= m2;
            }
            q[k] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
    BlockQ5K {
        d,
        dmin,
        scales,
        qh,
        qs,
    }
}

/// `quantize_row_q6_K_ref`.
pub fn quantize_q6_k(x: &[f32]) -> BlockQ6K {
    let mut y = BlockQ6K::default();
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let scale = make_qx_quants(
            &x[16 * ib..16 * ib + 16],
            32,
            &mut l[16 * ib..16 * ib + 16],
            1,
        );
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        return BlockQ6K::default();
    }
    let iscale = -128.0 / max_scale;
    y.d = h(1.0 / iscale);
    for ib in 0..16 {
        y.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for j in 0..16 {
        let d = hf(y.d) * y.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let li = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (li + 32) as i8;
        }
    }
    for n in 0..2 {
        let j = 128 * n;
        let (ql, qh) = (
            &mut y.ql[64 * n..64 * n + 64],
            &mut y.qh[32 * n..32 * n + 32],
        );
        for k in 0..32 {
            let q1 = l[j + k] as u8 & 0xF;
            let q2 = l[j + k + 32] as u8 & 0xF;
            let q3 = l[j + k + 64] as u8 & 0xF;
            let q4 = l[j + k + 96] as u8 & 0xF;
            ql[k] = q1 | (q3 << 4);
            ql[k + 32] = q2 | (q4 << 4);
            qh[k] = (l[j + k] as u8 >> 4)
                | ((l[j + k + 32] as u8 >> 4) << 2)
                | ((l[j + k + 64] as u8 >> 4) << 4)
                | ((l[j + k + 96] as u8 >> 4) << 6);
        }
    }
    y
}

/// `quantize_row_q8_K_ref`, which is also what x86 runs for activations: ggml-cpu/arch/x86/
/// quants.c defines `quantize_row_q8_K` as a plain call to `quantize_row_q8_K_ref`.
/// `iscale = -127/max` (signed max), `nearest_int` (ties to even), `MIN(127, v)`, `d = 1/iscale`.
pub fn quantize_q8_k(x: &[f32]) -> BlockQ8K {
    let mut y = BlockQ8K::default();
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return y;
    }
    let iscale = -127.0 / max;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, q) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
    }
    y.d = 1.0 / iscale;
    y
}

pub(crate) fn quantize_with<B: Block>(f: fn(&[f32]) -> B, src: &[f32], dst: &mut [u8]) {
    for (x, o) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(B::BYTES)) {
        f(x).write(o);
    }
}

pub(crate) fn quantize_ref(dtype: DType, src: &[f32], dst: &mut [u8]) {
    match dtype {
        DType::Q2_K => quantize_with(quantize_q2_k, src, dst),
        DType::Q3_K => quantize_with(quantize_q3_k, src, dst),
        DType::Q4_K => quantize_with(quantize_q4_k, src, dst),
        DType::Q5_K => quantize_with(quantize_q5_k, src, dst),
        DType::Q6_K => quantize_with(quantize_q6_k, src, dst),
        DType::Q8_K => quantize_with(quantize_q8_k, src, dst),
        _ => unreachable!("kquants_ref::quantize_ref({dtype})"),
    }
}
