//! RWKV-7's graph ops (llama.cpp's `rwkv7`): the token shift kept per sequence (the ABI's
//! `token_shift`), the lerps between a token and the one before, and the time-mix core around
//! the ABI's `l2_norm`, `rwkv_wkv7` and `norm` (LayerNorm itself is the ABI's `norm` node).
//! What is computed here is elementwise, as ggml's CPU code computes it (single IEEE
//! operations, libm `expf`/`tanhf`), or a per-head f64 sum in order, so the bits are
//! llama.cpp's.

use super::recurrent::{sigmoid, values, values_mut};
use crate::error::Result;
use crate::exec::Exec;
use crate::tensor::Weight;
use abi::{DType, Op, OpParams, TensorDesc};

/// The `token_shift` node: per sequence, the ABI's `token_shift` on its columns of `x` and
/// its state (prev - x column by column, the state before the first; the last column becomes
/// the state).
pub(crate) fn token_shift<'a>(
    ex: &Exec,
    seqs: impl Iterator<Item = (&'a mut [f32], usize)>,
    x: TensorDesc,
    out: TensorDesc,
) -> Result<()> {
    let e = x.ne[0];
    let mut t0 = 0;
    for (st, ts) in seqs {
        if ts == 0 {
            continue;
        }
        let cols = |d: &TensorDesc| {
            let at = d.data.wrapping_add(t0 * e as usize * 4);
            TensorDesc::contiguous(at, DType::F32, &[e, ts as i64, 1])
        };
        let sd = TensorDesc::contiguous(st.as_mut_ptr() as *mut u8, DType::F32, &[e, 1]);
        ex.call_desc(
            Op::TokenShift,
            &[cols(&x), sd],
            &[cols(&out), sd],
            OpParams::default(),
        )?;
        t0 += ts;
    }
    Ok(())
}

/// The `lerp` node: `sx * mu[index] + x` (ggml's mul, then add), `mu` `[E, ..]` with its rows
/// `index * E ..`.
pub(crate) fn lerp(sx: TensorDesc, x: TensorDesc, mu: &Weight, index: usize, out: TensorDesc) {
    let e = sx.ne[0] as usize;
    // SAFETY: as `layer_norm`; mu an f32 host weight of at least (index + 1) * E values.
    let (sx, x, y, mu) = unsafe { (values(&sx), values(&x), values_mut(&out), values(&mu.desc)) };
    let mu = &mu[index * e..(index + 1) * e];
    for (t, col) in y.chunks_exact_mut(e).enumerate() {
        for (i, v) in col.iter_mut().enumerate() {
            *v = sx[t * e + i] * mu[i] + x[t * e + i];
        }
    }
}

/// Elementwise functions of one value, as ggml's unary ops compute them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    /// `tanhf`.
    Tanh,
    /// `ggml_sqr(ggml_relu(x))`: x > 0 ? x * x : 0.
    ReluSqr,
}

pub(crate) fn unary(x: TensorDesc, out: TensorDesc, f: Unary) {
    // SAFETY: x and out are contiguous f32 activations of this step of one shape.
    let (x, y) = unsafe { (values(&x), values_mut(&out)) };
    for (o, &v) in y.iter_mut().zip(x) {
        *o = match f {
            Unary::Tanh => v.tanh(),
            Unary::ReluSqr => {
                let r = if v > 0.0 { v } else { 0.0 };
                r * r
            }
        };
    }
}

/// The time-mix core's operands: this step's projections `[E, T]` and the layer's f32
/// vectors `[E]`.
pub(crate) struct TimeMix<'a> {
    pub r: TensorDesc,
    /// `W2 tanh(W1 x_w)` (before `w0`).
    pub w: TensorDesc,
    pub k: TensorDesc,
    pub v: TensorDesc,
    /// `A2 (A1 x_a)` (before `a0`).
    pub a: TensorDesc,
    pub g: TensorDesc,
    /// Layer 0's values and `V2 (V1 x_v)` (before `v0`), for every later layer.
    pub v_first: Option<(TensorDesc, TensorDesc, &'a Weight)>,
    pub w0: &'a Weight,
    pub a0: &'a Weight,
    pub k_k: &'a Weight,
    pub k_a: &'a Weight,
    pub r_k: &'a Weight,
    pub ln_w: &'a Weight,
    pub ln_b: &'a Weight,
    pub head_size: usize,
}

/// The `rwkv7_time_mix` node: llama.cpp's `build_rwkv7_time_mix` from its projections to
/// the input of `time_mix_output`, in its order of operations:
/// w = expf(sigmoid(w + w0) * -0.606531); v += (v_first - v) * sigmoid(v_mix + v0) (after
/// layer 0); a = sigmoid(a + a0); kk = l2_norm(k * k_k) per head (eps 1e-12); ka = k * k_a,
/// k += a * ka - ka; per sequence the ABI `rwkv_wkv7`(r, w, k, v, -kk, kk * a) on its state;
/// then per head `ggml_norm` (eps 64e-5) times `ln_w` plus `ln_b`, plus v times the head's
/// f64 sum of k * r * r_k, times g.
pub(crate) fn time_mix<'a>(
    ex: &Exec,
    seqs: impl Iterator<Item = (&'a mut [f32], usize)>,
    m: &TimeMix,
    out: TensorDesc,
) -> Result<()> {
    let (e, s) = (m.r.ne[0] as usize, m.head_size);
    let h = e / s;
    // SAFETY: the projections are contiguous f32 [E, T] activations of this step and out one
    // more in its own slot; the vectors f32 host weights [E] (compile checks all of it).
    let (r, wl, k0, v0, al, g, o) = unsafe {
        (
            values(&m.r),
            values(&m.w),
            values(&m.k),
            values(&m.v),
            values(&m.a),
            values(&m.g),
            values_mut(&out),
        )
    };
    let vec = |w: &Weight| unsafe { values(&w.desc) };
    let (w0, a0, k_k, k_a, r_k) = (vec(m.w0), vec(m.a0), vec(m.k_k), vec(m.k_a), vec(m.r_k));
    let n = r.len();
    let mut w = vec![0f32; n];
    for i in 0..n {
        w[i] = (sigmoid(wl[i] + w0[i % e]) * -0.606531f32).exp();
    }
    let mut v = v0.to_vec();
    if let Some((vf, vm, vb)) = &m.v_first {
        // SAFETY: as the projections above.
        let (vf, vm, vb) = unsafe { (values(vf), values(vm), values(&vb.desc)) };
        for i in 0..n {
            v[i] += (vf[i] - v[i]) * sigmoid(vm[i] + vb[i % e]);
        }
    }
    let a: Vec<f32> = (0..n).map(|i| sigmoid(al[i] + a0[i % e])).collect();
    let mut kk_raw: Vec<f32> = (0..n).map(|i| k0[i] * k_k[i % e]).collect();
    let mut kk = vec![0f32; n];
    let heads = |v: &mut [f32]| {
        TensorDesc::contiguous(
            v.as_mut_ptr() as *mut u8,
            DType::F32,
            &[s as i64, (n / s) as i64],
        )
    };
    let l2 = abi::L2NormAttrs { eps: 1e-12 }.to_params();
    ex.call_desc(Op::L2Norm, &[heads(&mut kk_raw)], &[heads(&mut kk)], l2)?;
    let mut k = k0.to_vec();
    for i in 0..n {
        let ka = k0[i] * k_a[i % e];
        k[i] += a[i] * ka - ka;
    }
    let mut neg_kk: Vec<f32> = kk.iter().map(|&x| -x).collect();
    let mut b: Vec<f32> = kk.iter().zip(&a).map(|(&x, &y)| x * y).collect();
    let (mut rr, mut ww, mut kv) = (r.to_vec(), w, k.clone());
    let mut t0 = 0;
    for (st, ts) in seqs {
        let span = t0 * e..(t0 + ts) * e;
        let d = |buf: &mut [f32]| {
            TensorDesc::contiguous(
                buf[span.clone()].as_mut_ptr() as *mut u8,
                DType::F32,
                &[s as i64, h as i64, ts as i64, 1],
            )
        };
        let sd = TensorDesc::contiguous(
            st.as_mut_ptr() as *mut u8,
            DType::F32,
            &[s as i64, s as i64, h as i64, 1],
        );
        let ins = [
            d(&mut rr),
            d(&mut ww),
            d(&mut kv),
            d(&mut v),
            d(&mut neg_kk),
            d(&mut b),
            sd,
        ];
        let od = d(o);
        ex.call_desc(Op::RwkvWkv7, &ins, &[od, sd], OpParams::default())?;
        t0 += ts;
    }
    // Group norm over each head (ggml_norm, eps 64e-5), times ln_w, plus ln_b.
    let mut normed = vec![0f32; n];
    let cols = |v: &mut [f32]| {
        TensorDesc::contiguous(
            v.as_mut_ptr() as *mut u8,
            DType::F32,
            &[e as i64, (n / e) as i64],
        )
    };
    let gn = abi::NormAttrs {
        eps: 64e-5,
        group: s as i64,
    }
    .to_params();
    let ins = [cols(o), m.ln_w.desc, m.ln_b.desc];
    ex.call_desc(Op::Norm, &ins, &[cols(&mut normed)], gn)?;
    for (hi, head) in o.chunks_exact_mut(s).enumerate() {
        let at = hi * s;
        let c = at % e;
        let rk: f64 = (0..s)
            .map(|j| (k[at + j] * r[at + j] * r_k[c + j]) as f64)
            .sum();
        let rk = rk as f32;
        for j in 0..s {
            head[j] = (normed[at + j] + v[at + j] * rk) * g[at + j];
        }
    }
    Ok(())
}
