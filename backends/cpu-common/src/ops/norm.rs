//! rms_norm: ggml's f64 sum of squares, then the scaled row times the weight. norm: ggml_norm
//! per group, then the gain and the bias. l2_norm: ggml_l2_norm. (The same numerics as the
//! reference: `numerics::norm_row` / `l2_norm_row`, inside the ISA frame.)

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::*;
#[cfg(x86)]
use crate::x86::norm::*;

/// rms_norm row: f64 sum of f32 squares, in order; `y = (x * scale) * w`.
#[inline(always)]
pub(crate) unsafe fn rms_row_body(v: &mut [f32], w: &[f32], eps: f32) {
    let mut sum = 0f64;
    for &e in v.iter() {
        sum += (e * e) as f64;
    }
    rms_scale_body(v, w, sum, eps);
}
isa_dispatch!(rms_row => rms_row_body(v: &mut [f32], w: &[f32], eps: f32));

/// The rest of [`rms_row_body`], from the row's sum of squares.
#[inline(always)]
pub(crate) unsafe fn rms_scale_body(v: &mut [f32], w: &[f32], sum: f64, eps: f32) {
    let mean = (sum / v.len() as f64) as f32;
    let sc = 1.0f32 / (mean + eps).sqrt();
    for (e, &g) in v.iter_mut().zip(w) {
        *e = *e * sc * g;
    }
}
isa_dispatch!(rms_scale => rms_scale_body(v: &mut [f32], w: &[f32], sum: f64, eps: f32));

pub(crate) unsafe fn rms_norm(
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
    let nrows = x.nrows();
    // Eight rows at a time where the ISA gathers (prompts, batched steps), one otherwise.
    let group = if matches!(isa, Isa::Avx2 | Isa::Avx512) && nrows >= 8 {
        8
    } else {
        1
    };
    for_rows(host, (nrows + group - 1) / group, x.ne[0] * group, |gi| {
        let r0 = gi * group;
        let rows: Vec<i64> = (r0..(r0 + group).min(nrows)).collect();
        #[allow(unused_mut)]
        let mut sums: Option<[f64; 8]> = None;
        #[cfg(x86)]
        if rows.len() == 8 {
            let base = row_ptr(&x, 0, 0, 0) as *const f32;
            let mut offs = [0i32; 8];
            let mut fits = true;
            for (o, &r) in offs.iter_mut().zip(&rows) {
                let (i1, i2, i3) = split_row(&x, r);
                let d = (row_ptr(&x, i1, i2, i3) as isize - base as isize) / 4;
                match i32::try_from(d) {
                    Ok(d) => *o = d,
                    Err(_) => fits = false,
                }
            }
            if fits {
                sums = Some(sums8(base, &offs, k));
            }
        }
        let mut v = vec![0f32; k];
        for (j, &r) in rows.iter().enumerate() {
            let (i1, i2, i3) = split_row(&x, r);
            read_into(&x, i1, i2, i3, &mut v);
            match sums {
                Some(s) => rms_scale(isa, &mut v, &w, s[j], eps),
                None => rms_row(isa, &mut v, &w, eps),
            }
            write_from(&out, i1, i2, i3, &v);
        }
    });
}

/// One `norm` row: each group through `ggml_norm`, then `y * w + b` (two roundings).
#[inline(always)]
pub(crate) unsafe fn norm_row_body(v: &mut [f32], w: &[f32], b: &[f32], group: usize, eps: f32) {
    for g in v.chunks_exact_mut(group) {
        ::numerics::norm_row(g, eps);
    }
    for ((y, &wv), &bv) in v.iter_mut().zip(w).zip(b) {
        *y = *y * wv + bv;
    }
}
isa_dispatch!(norm_row => norm_row_body(v: &mut [f32], w: &[f32], b: &[f32], group: usize,
    eps: f32));

pub(crate) unsafe fn norm(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    a: abi::NormAttrs,
) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    let (mut w, mut b) = (vec![0f32; k], vec![0f32; k]);
    read_into(&inputs[1], 0, 0, 0, &mut w);
    read_into(&inputs[2], 0, 0, 0, &mut b);
    let group = a.group_len(x.ne[0]) as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        norm_row(isa, &mut v, &w, &b, group, a.eps);
        write_from(&out, i1, i2, i3, &v);
    });
}

#[inline(always)]
pub(crate) unsafe fn l2_row_body(v: &mut [f32], eps: f32) {
    ::numerics::l2_norm_row(v, eps);
}
isa_dispatch!(l2_row => l2_row_body(v: &mut [f32], eps: f32));

pub(crate) unsafe fn l2_norm(
    isa: Isa,
    host: &HostApi,
    inputs: &[TensorDesc],
    outputs: &[TensorDesc],
    eps: f32,
) {
    let (x, out) = (inputs[0], outputs[0]);
    let k = x.ne[0] as usize;
    for_rows(host, x.nrows(), x.ne[0], |r| {
        let (i1, i2, i3) = split_row(&x, r);
        let mut v = vec![0f32; k];
        read_into(&x, i1, i2, i3, &mut v);
        l2_row(isa, &mut v, eps);
        write_from(&out, i1, i2, i3, &v);
    });
}

#[cfg(test)]
mod tests {
    #[cfg(x86)]
    use super::*;

    /// Eight rows' gathered sums equal each row's own sequential f64 sum, bit for bit (rows
    /// apart by a stride, in any order, large and tiny values).
    #[cfg(x86)]
    #[test]
    fn gathered_sums_equal_the_row_chain() {
        if !Isa::Avx2.detected() {
            return;
        }
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let m = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0;
            m * [1.0f32, 1e-3, 1e3, 1e-20][(s & 3) as usize]
        };
        for k in [1usize, 7, 64, 640, 1537] {
            let stride = k + 5;
            let data: Vec<f32> = (0..stride * 9).map(|_| rnd()).collect();
            let offs: [i32; 8] = [8, 0, 3, 1, 7, 2, 6, 4].map(|r| (r * stride) as i32);
            let got = unsafe { sums8(data.as_ptr(), &offs, k) };
            for (j, &o) in offs.iter().enumerate() {
                let mut want = 0f64;
                for &e in &data[o as usize..o as usize + k] {
                    want += (e * e) as f64;
                }
                assert_eq!(got[j].to_bits(), want.to_bits(), "k {k} row {j}");
            }
        }
    }
}
