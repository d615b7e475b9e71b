//! Recurrent layers: graph ops whose result depends on state each sequence keeps from one step
//! to the next (see [`crate::kv`] on recurrent state), and the small elementwise ops around
//! them. The state is per sequence, so each sequence of a step runs on its own window; the ABI
//! ops (`ssm_conv`, `gated_delta_net`) compute, the executor keeps the state. The elementwise
//! parts are single IEEE operations or libm calls, as llama.cpp's CPU code does them, so the
//! host computes them.

use crate::error::Result;
use crate::exec::Exec;
use crate::tensor::Weight;
use abi::{DType, Op, OpParams, TensorDesc};

/// The f32 values of a contiguous activation.
///
/// # Safety
/// `d` must be a contiguous f32 tensor (an activation of this step or a host weight) that
/// nothing writes while the slice lives.
pub(super) unsafe fn values<'a>(d: &TensorDesc) -> &'a [f32] {
    std::slice::from_raw_parts(d.data as *const f32, d.numel().unwrap_or(0) as usize)
}

/// # Safety
/// `d` must be a contiguous f32 activation of this step that nothing else reads or writes
/// while the slice lives.
pub(super) unsafe fn values_mut<'a>(d: &TensorDesc) -> &'a mut [f32] {
    std::slice::from_raw_parts_mut(d.data as *mut f32, d.numel().unwrap_or(0) as usize)
}

/// One sequence's causal convolution: the window per channel (its `state`, the last L-1
/// values, then this step's `ts` values `val(t, c)`) through the ABI's `ssm_conv` with `w`
/// `[L, n]` into `conv` `[n, ts]`; the window's last L-1 columns become the state.
fn conv_seq(
    ex: &Exec,
    st: &mut [f32],
    w: &Weight,
    n: usize,
    ts: usize,
    val: impl Fn(usize, usize) -> f32,
    win: &mut Vec<f32>,
    conv: &mut Vec<f32>,
) -> Result<()> {
    let d = w.ne()[0] as usize - 1;
    let width = d + ts;
    win.clear();
    win.resize(width * n, 0f32);
    for (c, row) in win.chunks_exact_mut(width).enumerate() {
        row[..d].copy_from_slice(&st[c * d..(c + 1) * d]);
    }
    // Token by token, so that the step's columns are read in order.
    for t in 0..ts {
        for c in 0..n {
            win[c * width + d + t] = val(t, c);
        }
    }
    conv.clear();
    conv.resize(n * ts, 0f32);
    let wd = TensorDesc::contiguous(
        win.as_mut_ptr() as *mut u8,
        DType::F32,
        &[width as i64, n as i64, 1],
    );
    let od = TensorDesc::contiguous(
        conv.as_mut_ptr() as *mut u8,
        DType::F32,
        &[n as i64, ts as i64, 1],
    );
    ex.call_desc(Op::SsmConv, &[wd, w.desc], &[od], OpParams::default())?;
    for (c, row) in win.chunks_exact(width).enumerate() {
        st[c * d..(c + 1) * d].copy_from_slice(&row[ts..]);
    }
    Ok(())
}

/// The `short_conv` node (LFM2's gated short convolution, llama.cpp's `build_shortconv_block`):
/// `bcx` `[3n, T]` (b, c and x, one block of rows each), `w` `[L, n]`, `out` `[n, T]`; recurrent
/// state `state` holds each sequence's last `L-1` values of `b*x` per channel, time innermost
/// (llama.cpp's conv state layout). The products are single IEEE multiplications, so the
/// host computes them; the convolution is the ABI's `ssm_conv`. `seqs`: per sequence of the
/// step, in token order, its state and its token count.
pub(crate) fn short_conv<'a>(
    ex: &Exec,
    seqs: impl Iterator<Item = (&'a mut [f32], usize)>,
    bcx: TensorDesc,
    w: &Weight,
    out: TensorDesc,
) -> Result<()> {
    let n = out.ne[0] as usize;
    // SAFETY: bcx is a contiguous f32 [3n, T] activation of this step and out a contiguous f32
    // [n, T] one (the plan gives them separate slots).
    let (x, y) = unsafe { (values(&bcx), values_mut(&out)) };
    SCRATCH.with(|s| {
        let [win, conv, _] = &mut *s.borrow_mut();
        let mut t0 = 0;
        for (st, ts) in seqs {
            let col = |t: usize| &x[(t0 + t) * 3 * n..(t0 + t + 1) * 3 * n];
            let bx = |t: usize, c: usize| col(t)[c] * col(t)[2 * n + c];
            conv_seq(ex, st, w, n, ts, bx, win, conv)?;
            for t in 0..ts {
                for c in 0..n {
                    y[(t0 + t) * n + c] = col(t)[n + c] * conv[t * n + c];
                }
            }
            t0 += ts;
        }
        Ok(())
    })
}

thread_local! {
    /// Scratch the recurrent ops reuse from step to step: windows, convolutions, ones.
    static SCRATCH: std::cell::RefCell<[Vec<f32>; 3]> = Default::default();
}

/// The `causal_conv` node: per sequence the convolution of its window (state, then this
/// step's columns of `x` `[C, T]`) with `w` `[L, C]` into `out` `[C, T]`, then, when asked,
/// silu as ggml_silu computes it: the ABI's `glu` with silu of the convolution times ones
/// (an exact product), on the backend's vector code.
pub(crate) fn causal_conv<'a>(
    ex: &Exec,
    seqs: impl Iterator<Item = (&'a mut [f32], usize)>,
    x: TensorDesc,
    w: &Weight,
    out: TensorDesc,
    silu: bool,
) -> Result<()> {
    let n = out.ne[0] as usize;
    // SAFETY: x and out are contiguous f32 [C, T] activations of this step in separate slots.
    let (x, y) = unsafe { (values(&x), values_mut(&out)) };
    SCRATCH.with(|s| {
        let [win, conv, ones] = &mut *s.borrow_mut();
        let mut t0 = 0;
        for (st, ts) in seqs {
            let val = |t: usize, c: usize| x[(t0 + t) * n + c];
            conv_seq(ex, st, w, n, ts, val, win, conv)?;
            let dst = &mut y[t0 * n..(t0 + ts) * n];
            if silu {
                if ones.len() < n * ts {
                    ones.resize(n * ts, 1.0);
                }
                let d = |p: *mut f32| {
                    TensorDesc::contiguous(p as *mut u8, DType::F32, &[n as i64, ts as i64])
                };
                let p = abi::GluAttrs { act: abi::GLU_SILU }.to_params();
                let ins = [d(conv.as_mut_ptr()), d(ones.as_mut_ptr())];
                ex.call_desc(Op::Glu, &ins, &[d(dst.as_mut_ptr())], p)?;
            } else {
                dst.copy_from_slice(&conv[..n * ts]);
            }
            t0 += ts;
        }
        Ok(())
    })
}

/// The `gelu` node: ggml_gelu as the ABI's `glu` (GELU) of x times ones, an exact product,
/// on the backend's vector code; x and out are f32 activations of one shape.
pub(super) fn gelu_node(ex: &Exec, x: TensorDesc, out: TensorDesc) -> Result<()> {
    let n = x.ne.iter().product::<i64>() as usize;
    SCRATCH.with(|s| {
        let ones = &mut s.borrow_mut()[2];
        if ones.len() < n {
            ones.resize(n, 1.0);
        }
        let mut up = x;
        up.data = ones.as_mut_ptr() as *mut u8;
        up.buffer = 0;
        let p = abi::GluAttrs {
            act: abi::GLU_GELU_TANH,
        }
        .to_params();
        ex.call_desc(Op::Glu, &[x, up], &[out], p)
    })
}

/// `ggml_sigmoid`: 1 / (1 + expf(-x)).
pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ggml_softplus`: x above 20, else logf(1 + expf(x)).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// llama.cpp's `build_gdn_l2_norm` on one head: `ggml_rms_norm` with eps / n (the squares
/// summed in f64), then `ggml_scale` by 1 / sqrtf(n).
fn gdn_l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps / n).sqrt();
    let after = 1.0f32 / n.sqrt();
    for v in x.iter_mut() {
        *v = (*v * scale) * after;
    }
}

/// Shape of a `delta_net` node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DeltaNetShape {
    pub k_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    /// v head h reads q/k head h / (H / k_heads) (Qwen3-Next) rather than h mod k_heads.
    pub grouped: bool,
}

/// The `delta_net` node (the core of Qwen3.5's `build_layer_attn_linear`): `qkv` `[C, T]`
/// after the convolution, `beta`/`alpha` `[H, T]` raw projections, `dt_bias`/`a` f32 `[H]`;
/// per sequence the ABI `gated_delta_net` on its state, which it updates in place; `out`
/// `[S*H, T]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_net<'a>(
    ex: &Exec,
    seqs: impl Iterator<Item = (&'a mut [f32], usize)>,
    qkv: TensorDesc,
    beta: TensorDesc,
    alpha: TensorDesc,
    dt_bias: &Weight,
    a: &Weight,
    out: TensorDesc,
    sh: DeltaNetShape,
) -> Result<()> {
    let (s, hk) = (sh.head_dim, sh.k_heads);
    let h = beta.ne[0] as usize;
    let c = qkv.ne[0] as usize;
    // SAFETY: the operands are contiguous f32 activations of this step in separate slots, the
    // weights f32 [H] in host memory (compile checks their types and shapes).
    let (x, bt, al, o) = unsafe {
        (
            values(&qkv),
            values(&beta),
            values(&alpha),
            values_mut(&out),
        )
    };
    let (dtb, av) = unsafe { (values(&dt_bias.desc), values(&a.desc)) };
    // q and k as the op reads them: k_heads heads, or H when grouped heads are spread out.
    let hq = if sh.grouped { h } else { hk };
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    let (mut g, mut b) = (Vec::new(), Vec::new());
    let mut t0 = 0;
    for (st, ts) in seqs {
        q.clear();
        k.clear();
        v.clear();
        g.clear();
        b.clear();
        for t in t0..t0 + ts {
            let col = &x[t * c..(t + 1) * c];
            let (qc, rest) = col.split_at(hk * s);
            let (kc, vc) = rest.split_at(hk * s);
            for (src, dst) in [(qc, &mut q), (kc, &mut k)] {
                let at = dst.len();
                dst.extend_from_slice(src);
                dst[at..]
                    .chunks_exact_mut(s)
                    .for_each(|hd| gdn_l2_norm(hd, sh.eps));
                if sh.grouped && hq != hk {
                    // Each key head's value heads in turn: copies, so the norm commutes.
                    let normed = dst.split_off(at);
                    for hv in 0..h {
                        let kh = hv / (h / hk);
                        dst.extend_from_slice(&normed[kh * s..(kh + 1) * s]);
                    }
                }
            }
            v.extend_from_slice(vc);
            for j in 0..h {
                b.push(sigmoid(bt[t * h + j]));
                g.push(softplus(al[t * h + j] + dtb[j]) * av[j]);
            }
        }
        let d = |buf: &mut Vec<f32>, ne: [usize; 4]| {
            TensorDesc::contiguous(
                buf.as_mut_ptr() as *mut u8,
                DType::F32,
                &ne.map(|x| x as i64),
            )
        };
        let ins = [
            d(&mut q, [s, hq, ts, 1]),
            d(&mut k, [s, hq, ts, 1]),
            d(&mut v, [s, h, ts, 1]),
            d(&mut g, [1, h, ts, 1]),
            d(&mut b, [1, h, ts, 1]),
            TensorDesc::contiguous(
                st.as_mut_ptr() as *mut u8,
                DType::F32,
                &[s as i64, s as i64, h as i64, 1],
            ),
        ];
        let od = TensorDesc::contiguous(
            o[t0 * s * h..].as_mut_ptr() as *mut u8,
            DType::F32,
            &[s as i64, h as i64, ts as i64, 1],
        );
        ex.call_desc(Op::GatedDeltaNet, &ins, &[od, ins[5]], OpParams::default())?;
        t0 += ts;
    }
    Ok(())
}

/// The `rows` node: rows `offset..offset + len` of each `period` of every column.
pub(crate) fn rows(x: TensorDesc, out: TensorDesc, period: usize, offset: usize, len: usize) {
    // SAFETY: x and out are contiguous f32 activations of this step in separate slots.
    let (x, y) = unsafe { (values(&x), values_mut(&out)) };
    for (src, dst) in x.chunks_exact(period).zip(y.chunks_exact_mut(len)) {
        dst.copy_from_slice(&src[offset..offset + len]);
    }
}

/// The `sigmoid` node.
pub(crate) fn sigmoid_node(x: TensorDesc, out: TensorDesc) {
    // SAFETY: x and out are contiguous f32 activations of this step of one shape.
    let (x, y) = unsafe { (values(&x), values_mut(&out)) };
    for (o, &v) in y.iter_mut().zip(x) {
        *o = sigmoid(v);
    }
}
