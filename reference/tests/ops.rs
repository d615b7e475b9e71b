//! Hand-computed cases per op, ABI behaviour, and quantized matmul agreement.

use abi::{DType, Op, OpCall, OpParams, Status, TensorDesc};
use half::f16;
use reference::{scoped_threads_host, serial_host};

fn f32d(v: &mut [f32], shape: &[i64]) -> TensorDesc {
    TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, DType::F32, shape)
}
fn i32d(v: &mut [i32], shape: &[i64]) -> TensorDesc {
    TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, DType::I32, shape)
}
fn run(op: Op, i: &[TensorDesc], o: &[TensorDesc], p: OpParams) {
    unsafe { reference::run(&serial_host(), op, i, o, &p) }
        .unwrap_or_else(|e| panic!("{op:?}: {e}"));
}
fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn rms_norm_small() {
    let mut x = vec![1.0, 2.0, 3.0, 4.0];
    let mut w = vec![1.0, 1.0, 2.0, 0.5];
    let mut y = vec![0.0; 4];
    let p = abi::RmsNormAttrs { eps: 0.0 }.to_params();
    run(
        Op::RmsNorm,
        &[f32d(&mut x, &[4]), f32d(&mut w, &[4])],
        &[f32d(&mut y, &[4])],
        p,
    );
    let s = 1.0 / 7.5f32.sqrt();
    let want = [1.0 * s, 2.0 * s, 3.0 * s * 2.0, 4.0 * s * 0.5];
    for (a, b) in y.iter().zip(want) {
        assert!(close(*a, b, 1e-6), "{y:?}");
    }
}

fn rope_params(mode: i64, n_dims: i64) -> OpParams {
    abi::RopeAttrs::new(mode, n_dims, 10000.0, 4096).to_params()
}

#[test]
fn rope_identity_at_zero_and_known_angle() {
    // D = 6, H = 1, T = 2, n_dims = 4; positions 0 and 1.
    let src: Vec<f32> = (1..=12).map(|v| v as f32).collect();
    for mode in [abi::ROPE_NORMAL, abi::ROPE_NEOX] {
        let mut x = src.clone();
        let mut pos = vec![0, 1];
        let mut y = vec![0.0; 12];
        run(
            Op::Rope,
            &[f32d(&mut x, &[6, 1, 2]), i32d(&mut pos, &[2])],
            &[f32d(&mut y, &[6, 1, 2])],
            rope_params(mode, 4),
        );
        assert_eq!(&y[..6], &src[..6], "position 0 is the identity");
        assert_eq!(&y[10..12], &src[10..12], "dims past n_dims pass through");
        // theta_0 = 1 rad, theta_1 = 10000^(-1/2) = 0.01.
        let (c0, s0, c1, s1) = (1f32.cos(), 1f32.sin(), 0.01f32.cos(), 0.01f32.sin());
        let t = &src[6..];
        let (pa, pb) = if mode == abi::ROPE_NEOX {
            ((0, 2), (1, 3))
        } else {
            ((0, 1), (2, 3))
        };
        let want0 = (t[pa.0] * c0 - t[pa.1] * s0, t[pa.0] * s0 + t[pa.1] * c0);
        let want1 = (t[pb.0] * c1 - t[pb.1] * s1, t[pb.0] * s1 + t[pb.1] * c1);
        let got = &y[6..];
        assert!(
            close(got[pa.0], want0.0, 1e-6) && close(got[pa.1], want0.1, 1e-6),
            "{mode}: {got:?}"
        );
        assert!(
            close(got[pb.0], want1.0, 1e-5) && close(got[pb.1], want1.1, 1e-5),
            "{mode}: {got:?}"
        );
    }
}

fn attn_params(n_kv: i64, window: i64, scale: f32) -> OpParams {
    abi::AttentionAttrs {
        n_kv,
        window,
        page_rows: 0,
        scale,
        softcap: 0.0,
    }
    .to_params()
}

#[test]
fn attention_single_key_returns_its_value() {
    for dt in [DType::F32, DType::F16] {
        let d = 8;
        let mut q: Vec<f32> = (0..d).map(|i| i as f32 * 0.1).collect();
        let kv: Vec<f32> = (0..d).map(|i| 1.0 + i as f32 * 0.25).collect();
        let (mut kb, mut vb) = (cache(&kv, dt), cache(&kv, dt));
        let mut pos = vec![0];
        let mut out = vec![0.0; d];
        let k = TensorDesc::contiguous(kb.as_mut_ptr(), dt, &[d as i64, 1, 1]);
        let v = TensorDesc::contiguous(vb.as_mut_ptr(), dt, &[d as i64, 1, 1]);
        run(
            Op::Attention,
            &[f32d(&mut q, &[d as i64, 1, 1]), k, v, i32d(&mut pos, &[1])],
            &[f32d(&mut out, &[d as i64, 1, 1])],
            attn_params(1, 0, 0.5),
        );
        assert_eq!(out, kv, "{dt}");
    }
}

fn cache(v: &[f32], dt: DType) -> Vec<u8> {
    match dt {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        _ => v
            .iter()
            .flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes())
            .collect(),
    }
}

#[test]
fn attention_gqa_mapping_and_sliding_window() {
    // D = 4, Hq = 4, Hkv = 2, C = 6 rows; k = 0 so every visible row scores the same and
    // the output is the mean of the visible v rows. v[h][j] = one-hot-ish code (h*100 + j).
    let (d, hq, hkv, c) = (4usize, 4usize, 2usize, 6usize);
    let mut k = vec![0f32; d * hkv * c];
    let mut v = vec![0f32; d * hkv * c];
    for j in 0..c {
        for h in 0..hkv {
            for i in 0..d {
                v[j * hkv * d + h * d + i] = (h * 100 + j * 10 + i) as f32;
            }
        }
    }
    let mut q = vec![1f32; d * hq * 2];
    let mut pos = vec![3, 5];
    for window in [0i64, 2] {
        let mut out = vec![0f32; d * hq * 2];
        run(
            Op::Attention,
            &[
                f32d(&mut q, &[d as i64, hq as i64, 2]),
                f32d(&mut k, &[d as i64, hkv as i64, c as i64]),
                f32d(&mut v, &[d as i64, hkv as i64, c as i64]),
                i32d(&mut pos, &[2]),
            ],
            &[f32d(&mut out, &[d as i64, hq as i64, 2])],
            attn_params(6, window, 1.0),
        );
        for t in 0..2 {
            let p = pos[t] as usize;
            let rows: Vec<usize> = (0..=p)
                .filter(|&j| window == 0 || (p - j) < window as usize)
                .collect();
            for h in 0..hq {
                let hk = h / (hq / hkv);
                for i in 0..d {
                    let want = rows
                        .iter()
                        .map(|&j| (hk * 100 + j * 10 + i) as f32)
                        .sum::<f32>()
                        / rows.len() as f32;
                    let got = out[t * hq * d + h * d + i];
                    assert!(
                        close(got, want, 1e-5),
                        "window {window} t {t} h {h} i {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn attention_softcap_and_scale() {
    // Two keys; scores s = softcap(q.k) * scale (llama.cpp's order); check directly.
    let d = 2;
    let mut q = vec![1.0f32, 2.0];
    let mut k = vec![1.0f32, 0.0, 0.0, 3.0];
    let mut v = vec![1.0f32, 0.0, 0.0, 1.0];
    let mut pos = vec![1];
    let mut out = vec![0f32; 2];
    let mut a = abi::AttentionAttrs::from_params(&attn_params(2, 0, 0.5));
    a.softcap = 2.0;
    let p = a.to_params();
    run(
        Op::Attention,
        &[
            f32d(&mut q, &[d, 1, 1]),
            f32d(&mut k, &[d, 1, 2]),
            f32d(&mut v, &[d, 1, 2]),
            i32d(&mut pos, &[1]),
        ],
        &[f32d(&mut out, &[d, 1, 1])],
        p,
    );
    let s: Vec<f32> = [1.0f32, 6.0]
        .iter()
        .map(|x| 2.0 * (x / 2.0).tanh() * 0.5)
        .collect();
    let e: Vec<f32> = s.iter().map(|x| x.exp()).collect();
    let z = e[0] + e[1];
    assert!(
        close(out[0], e[0] / z, 1e-6) && close(out[1], e[1] / z, 1e-6),
        "{out:?}"
    );
}

#[test]
fn argmax_ties_and_nan() {
    let nan = f32::NAN;
    let mut x = vec![
        1.0,
        3.0,
        3.0,
        2.0,
        nan,
        5.0,
        nan,
        5.0,
        nan,
        nan,
        nan,
        nan,
        -1.0,
        -1.0,
        f32::NEG_INFINITY,
        -2.0,
    ];
    let mut out = vec![-7i32; 4];
    run(
        Op::Argmax,
        &[f32d(&mut x, &[4, 4])],
        &[i32d(&mut out, &[4])],
        OpParams::default(),
    );
    assert_eq!(out, vec![1, 1, 0, 0]);
}

#[test]
fn softmax_rows() {
    let mut x: Vec<f32> = (0..40).map(|i| (i % 7) as f32 - 3.0).collect(); // 2 rows of 20
    let mut y = vec![0f32; 40];
    let p = abi::SoftmaxAttrs { scale: 0.5 }.to_params();
    run(
        Op::Softmax,
        &[f32d(&mut x, &[20, 2])],
        &[f32d(&mut y, &[20, 2])],
        p,
    );
    for r in 0..2 {
        let row = &x[r * 20..(r + 1) * 20];
        let m = row.iter().cloned().fold(f32::MIN, f32::max) * 0.5;
        let z: f64 = row.iter().map(|v| ((v * 0.5 - m) as f64).exp()).sum();
        for i in 0..20 {
            let want = ((row[i] * 0.5 - m) as f64).exp() / z;
            assert!(
                close(y[r * 20 + i], want as f32, 2e-6),
                "{} vs {want}",
                y[r * 20 + i]
            );
        }
    }
}

/// ssm_conv(sx, c): `sx[t, i, s] = 1 + t + 4i + 8s` ([4, 2, 2]: 3 taps, T = 2); channel 0's
/// taps [1, 0, -1] give x_t - x_{t+2} = -2, channel 1's [1, 2, 3] give 6 x_t + 8.
#[test]
fn ssm_conv_slides_each_channels_taps() {
    let mut sx: Vec<f32> = (1..=16).map(|v| v as f32).collect();
    let mut c = vec![1.0, 0.0, -1.0, 1.0, 2.0, 3.0];
    let mut out = vec![0f32; 8];
    run(
        Op::SsmConv,
        &[f32d(&mut sx, &[4, 2, 2]), f32d(&mut c, &[3, 2])],
        &[f32d(&mut out, &[2, 2, 2])],
        OpParams::default(),
    );
    // out[i, t, s]: channel fastest, then token, then sequence.
    assert_eq!(out, [-2.0, 38.0, -2.0, 44.0, -2.0, 86.0, -2.0, 92.0]);
}

/// Which taps are fused (the last `L mod 4`) and which add a rounded product: with
/// a = -(1 + 2^-11) and b = 1 + 2^-12, `a + b*b` is 2^-24 fused and 0 when b*b is rounded first
/// (to 1 + 2^-11, a tie to even).
#[test]
fn ssm_conv_fuses_only_the_last_taps_mod_4() {
    let a = -(1.0 + 2f32.powi(-11));
    let b = 1.0 + 2f32.powi(-12);
    // (taps, the tap of a; b*b follows it)
    for (taps, at, fused) in [
        (2, 0, true),
        (3, 1, true),
        (4, 2, false),
        (5, 3, true),
        (5, 2, false),
        (7, 4, true),
        (8, 6, false),
        (9, 7, true),
        (12, 10, false),
        (13, 11, true),
    ] {
        let mut sx = vec![0f32; taps];
        let mut c = vec![0f32; taps];
        (sx[at], c[at]) = (a, 1.0);
        (sx[at + 1], c[at + 1]) = (b, b);
        let mut out = vec![7f32];
        run(
            Op::SsmConv,
            &[
                f32d(&mut sx, &[taps as i64, 1, 1]),
                f32d(&mut c, &[taps as i64, 1]),
            ],
            &[f32d(&mut out, &[1, 1, 1])],
            OpParams::default(),
        );
        let want = if fused { 2f32.powi(-24) } else { 0.0 };
        assert_eq!(out[0].to_bits(), want.to_bits(), "{taps} taps, a at {at}");
    }
}

/// Operands of one gated_delta_net call, owned: q, k, v, g, beta, state, then out and
/// new_state, with the shapes of head size `n`, `h` v heads over `hq` q/k heads, `t` tokens of
/// `seqs` sequences and `gn` gates per head and token (1, or `n`: one per key).
struct Gdn {
    n: i64,
    h: i64,
    hq: i64,
    t: i64,
    seqs: i64,
    gn: i64,
    bufs: Vec<Vec<f32>>,
}

impl Gdn {
    fn new(n: i64, h: i64, hq: i64, t: i64, seqs: i64, gn: i64) -> Gdn {
        let mut g = Gdn {
            n,
            h,
            hq,
            t,
            seqs,
            gn,
            bufs: Vec::new(),
        };
        g.bufs = g
            .shapes()
            .iter()
            .map(|s| vec![0f32; s.iter().product::<i64>() as usize])
            .collect();
        g
    }
    fn shapes(&self) -> [[i64; 4]; 8] {
        let (n, h, hq, t, s) = (self.n, self.h, self.hq, self.t, self.seqs);
        [
            [n, hq, t, s],
            [n, hq, t, s],
            [n, h, t, s],
            [self.gn, h, t, s],
            [1, h, t, s],
            [n, n, h, s],
            [n, h, t, s],
            [n, n, h, s],
        ]
    }
    /// Runs the call (`in_place`: new_state is the state operand itself); out, new_state.
    fn run(&mut self, host: &abi::HostApi, in_place: bool) -> (Vec<f32>, Vec<f32>) {
        let shapes = self.shapes();
        let mut d: Vec<TensorDesc> = self
            .bufs
            .iter_mut()
            .zip(&shapes)
            .map(|(b, s)| f32d(b, s))
            .collect();
        if in_place {
            d[7] = d[5];
        }
        unsafe {
            reference::run(
                host,
                Op::GatedDeltaNet,
                &d[..6],
                &d[6..],
                &OpParams::default(),
            )
        }
        .unwrap_or_else(|e| panic!("gated_delta_net: {e}"));
        let st = if in_place { 5 } else { 7 };
        (self.bufs[6].clone(), self.bufs[st].clone())
    }
}

/// Head size 2, two v heads over one q/k head, two tokens, decay 1 (g = 0): every value is
/// worked out by hand. M[j][i] = state[i, j]: row j of each head's block.
#[test]
fn gated_delta_net_by_hand() {
    let mut c = Gdn::new(2, 2, 1, 2, 1, 1);
    // q, k per token (one head); v per token and head; beta per token and head.
    c.bufs[0] = vec![1.0, 2.0, 0.0, 1.0];
    c.bufs[1] = vec![1.0, 0.0, 0.0, 1.0];
    c.bufs[2] = vec![3.0, 4.0, 1.0, -1.0, 1.0, 1.0, 2.0, 0.0];
    c.bufs[4] = vec![1.0, 0.5, 1.0, 1.0];
    // Head 0 starts at the identity, head 1 at zero.
    c.bufs[5] = vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0];
    let (o, st) = c.run(&serial_host(), false);
    let s = 1.0 / 2f32.sqrt();
    // Token 0, head 0: d = (v - M k) beta = [3 - 1, 4 - 0] = [2, 4]; M += d k^T (row j gets
    // d_j k) = [[3, 0], [4, 1]]; o = M q = [3, 6]. Head 1: d = [0.5, -0.5], M = [[0.5, 0],
    // [-0.5, 0]], o = [0.5, -0.5]. Token 1, head 0: M k = [0, 1], d = [1, 0], M = [[3, 1],
    // [4, 1]], o = [1, 1]. Head 1: M k = 0, d = [2, 0], M = [[0.5, 2], [-0.5, 0]], o = [2, 0].
    let dots = [3.0, 6.0, 0.5, -0.5, 1.0, 1.0, 2.0, 0.0];
    assert_eq!(o, dots.map(|x: f32| x * s));
    assert_eq!(st, [3.0, 1.0, 4.0, 1.0, 0.5, 2.0, -0.5, 0.0]);
    // A gate of -inf forgets the state (expf(-inf) = 0): head 0's token 0 then starts from
    // zero, d = v = [3, 4], M = [[3, 0], [4, 0]], o = [3, 4]. Per key (KDA), only key 0's
    // column is forgotten: M = [[0, 0], [0, 1]] before the update, d = [3, 4], o = [3, 6].
    let mut one = Gdn::new(2, 1, 1, 1, 1, 1);
    one.bufs[0] = vec![1.0, 2.0];
    one.bufs[1] = vec![1.0, 0.0];
    one.bufs[2] = vec![3.0, 4.0];
    one.bufs[3] = vec![f32::NEG_INFINITY];
    one.bufs[4] = vec![1.0];
    one.bufs[5] = vec![1.0, 0.0, 0.0, 1.0];
    assert_eq!(one.run(&serial_host(), false).0, [3.0 * s, 4.0 * s]);
    let mut kda = Gdn::new(2, 1, 1, 1, 1, 2);
    kda.bufs = one.bufs.clone();
    kda.bufs[3] = vec![f32::NEG_INFINITY, 0.0];
    let (o, st) = kda.run(&serial_host(), false);
    assert_eq!(o, [3.0 * s, 6.0 * s]);
    assert_eq!(st, [3.0, 0.0, 4.0, 1.0]);
    // No tokens: the state as it was.
    let mut none = Gdn::new(2, 2, 1, 0, 1, 1);
    none.bufs[5] = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    assert_eq!(
        none.run(&serial_host(), false),
        (vec![], none.bufs[5].clone())
    );
}

/// Where ggml's AVX-512 binary fuses and where it rounds (a = -(1 + 2^-11), b = 1 + 2^-12:
/// a + b*b is 2^-24 fused and 0 with b*b rounded first). The state update is fused at every
/// element; the dots' leftovers past the 64-element steps add rounded products but fuse the
/// last `n mod 4`.
#[test]
fn gated_delta_net_fuses_the_update_and_the_last_leftovers_mod_4() {
    let a = -(1.0 + 2f32.powi(-11));
    let b = 1.0 + 2f32.powi(-12);
    let tiny = 2f32.powi(-24);
    // The update: M[0] = [a, 0], k = [b, 0], so M k = a*b (exact) and v[0] = a*b + b gives
    // d[0] = b exactly; then M[0][0] = fma(b, b, a).
    let mut c = Gdn::new(2, 1, 1, 1, 1, 1);
    c.bufs[0] = vec![1.0, 0.0];
    c.bufs[1] = vec![b, 0.0];
    c.bufs[2] = vec![a * b + b, 0.0];
    c.bufs[4] = vec![1.0];
    c.bufs[5] = vec![a, 0.0, 0.0, 0.0];
    let (o, st) = c.run(&serial_host(), false);
    assert_eq!(st[0].to_bits(), tiny.to_bits(), "the update is fused");
    assert_eq!(o[0].to_bits(), (tiny / 2f32.sqrt()).to_bits());
    // The output dot of row 0 with q: beta = 0 and k = 0 leave the state as it was.
    // (head size, the element of a; b*b follows it)
    for (n, at, fused) in [
        (2, 0, true),
        (4, 2, false),
        (5, 3, true),
        (5, 2, false),
        (8, 6, false),
        (9, 7, true),
        (13, 11, true),
        (40, 38, false),
        (67, 65, true),
        (70, 66, false),
        (70, 67, true),
    ] {
        let mut c = Gdn::new(n, 1, 1, 1, 1, 1);
        (c.bufs[5][at], c.bufs[0][at]) = (a, 1.0);
        (c.bufs[5][at + 1], c.bufs[0][at + 1]) = (b, b);
        let (o, st) = c.run(&serial_host(), false);
        assert_eq!(st, c.bufs[5], "n = {n}: the state is kept");
        let want = if fused { tiny } else { 0.0 } / (n as f32).sqrt();
        assert_eq!(o[0].to_bits(), want.to_bits(), "n = {n}, a at {at}");
    }
}

/// Sequences and heads apart: a call of two sequences gives each one's result alone; q/k heads
/// broadcast as if tiled; a gate per key that is the same for every key is the scalar gate;
/// the state updated in place and the thread count change nothing.
#[test]
fn gated_delta_net_sequences_heads_and_gates_apart() {
    let (n, h, hq, t) = (5i64, 4i64, 2i64, 3i64);
    let mut c = Gdn::new(n, h, hq, t, 2, 1);
    let mut x = 0.37f32;
    for (i, b) in c.bufs[..6].iter_mut().enumerate() {
        for v in b.iter_mut() {
            x = (x * 3.7 + 0.11).fract();
            *v = match i {
                3 => -x,
                4 => x,
                _ => x - 0.5,
            };
        }
    }
    let (o, st) = c.run(&serial_host(), false);
    assert_eq!(
        c.run(&scoped_threads_host(2), false),
        (o.clone(), st.clone())
    );
    // Each sequence alone: its slice of every operand.
    let per_seq: Vec<usize> = c.bufs.iter().map(|b| b.len() / 2).collect();
    for s in 0..2 {
        let mut one = Gdn::new(n, h, hq, t, 1, 1);
        for (i, b) in one.bufs.iter_mut().enumerate() {
            b.copy_from_slice(&c.bufs[i][s * per_seq[i]..(s + 1) * per_seq[i]]);
        }
        let (o1, st1) = one.run(&serial_host(), false);
        assert_eq!(o1, o[s * per_seq[6]..(s + 1) * per_seq[6]], "sequence {s}");
        assert_eq!(
            st1,
            st[s * per_seq[7]..(s + 1) * per_seq[7]],
            "sequence {s}"
        );
    }
    // q/k heads tiled out to the v heads: head j takes q/k head j mod hq.
    let mut full = Gdn::new(n, h, h, t, 2, 1);
    let rows = |b: &[f32]| b.chunks(n as usize).map(|r| r.to_vec()).collect::<Vec<_>>();
    for i in 0..2 {
        let src = rows(&c.bufs[i]);
        full.bufs[i] = (0..2 * t)
            .flat_map(|ts| {
                (0..h)
                    .flat_map(|j| src[(ts * hq + j % hq) as usize].clone())
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    full.bufs[2..6].clone_from_slice(&c.bufs[2..6]);
    assert_eq!(full.run(&serial_host(), false), (o.clone(), st.clone()));
    // The same gate for every key.
    let mut kda = Gdn::new(n, h, hq, t, 2, n);
    for i in [0, 1, 2, 4, 5] {
        kda.bufs[i] = c.bufs[i].clone();
    }
    kda.bufs[3] = c.bufs[3]
        .iter()
        .flat_map(|&g| vec![g; n as usize])
        .collect();
    assert_eq!(kda.run(&serial_host(), false), (o.clone(), st.clone()));
    // In place: new_state is the state operand (last: it overwrites the state).
    assert_eq!(c.run(&serial_host(), true), (o, st));
}

/// Operands of one rwkv_wkv7 call, owned: r, w, k, v, a, b, state, then out and new_state,
/// with the shapes of head size `n`, `h` heads, `t` tokens of `seqs` sequences.
struct Wkv7 {
    n: i64,
    h: i64,
    t: i64,
    seqs: i64,
    bufs: Vec<Vec<f32>>,
}

impl Wkv7 {
    fn new(n: i64, h: i64, t: i64, seqs: i64) -> Wkv7 {
        let mut c = Wkv7 {
            n,
            h,
            t,
            seqs,
            bufs: Vec::new(),
        };
        c.bufs = c
            .shapes()
            .iter()
            .map(|s| vec![0f32; s.iter().product::<i64>() as usize])
            .collect();
        c
    }
    fn shapes(&self) -> [[i64; 4]; 9] {
        let x = [self.n, self.h, self.t, self.seqs];
        let st = [self.n, self.n, self.h, self.seqs];
        [x, x, x, x, x, x, st, x, st]
    }
    /// Runs the call (`in_place`: new_state is the state operand itself); out, new_state.
    fn run(&mut self, host: &abi::HostApi, in_place: bool) -> (Vec<f32>, Vec<f32>) {
        let shapes = self.shapes();
        let mut d: Vec<TensorDesc> = self
            .bufs
            .iter_mut()
            .zip(&shapes)
            .map(|(b, s)| f32d(b, s))
            .collect();
        if in_place {
            d[8] = d[6];
        }
        unsafe { reference::run(host, Op::RwkvWkv7, &d[..7], &d[7..], &OpParams::default()) }
            .unwrap_or_else(|e| panic!("rwkv_wkv7: {e}"));
        let st = if in_place { 6 } else { 8 };
        (self.bufs[7].clone(), self.bufs[st].clone())
    }
}

/// Head size 2, one head, two tokens: every value worked out by hand. M[i] (row i, the value
/// index) is row i of the state block: state[j, i] with the key index j fastest.
#[test]
fn rwkv_wkv7_by_hand() {
    let mut c = Wkv7::new(2, 1, 2, 1);
    // r, w, k, v, a, b: token 0, then token 1.
    c.bufs[0] = vec![1.0, 1.0, 1.0, 0.0];
    c.bufs[1] = vec![0.5, 1.0, 1.0, 1.0];
    c.bufs[2] = vec![1.0, 2.0, 0.0, 0.0];
    c.bufs[3] = vec![1.0, -1.0, 0.0, 0.0];
    c.bufs[4] = vec![1.0, 0.0, 0.0, 1.0];
    c.bufs[5] = vec![0.0, 1.0, 1.0, 0.0];
    c.bufs[6] = vec![1.0, 0.0, 0.0, 1.0];
    let (o, st) = c.run(&serial_host(), false);
    // Token 0, row 0: M0 = [1, 0], sa = a.M0 = 1, M0 = M0 w + v0 k + sa b = [0.5 + 1, 0 + 2 +
    // 1] = [1.5, 3], out 4.5. Row 1: M1 = [0, 1], sa = 0, M1 = [0 - 1, 1 - 2] = [-1, -1],
    // out -2. Token 1 (w = 1, k = v = 0): row 0: sa = M0[1] = 3, M0 = [1.5 + 3, 3], out 4.5;
    // row 1: sa = -1, M1 = [-2, -1], out -2.
    assert_eq!(o, [4.5, -2.0, 4.5, -2.0]);
    assert_eq!(st, [4.5, 3.0, -2.0, -1.0]);
    // No tokens: the state as it was.
    let mut none = Wkv7::new(2, 2, 0, 1);
    none.bufs[6] = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    assert_eq!(
        none.run(&serial_host(), false),
        (vec![], none.bufs[6].clone())
    );
}

/// Where the AVX-512 build fuses and where it rounds (x = -(1 + 2^-11), y = 1 + 2^-12: x +
/// y*y is 2^-24 fused and 0 with y*y rounded first): v*k is rounded, then M*w + kv and
/// sa*b + that are each fused; the dots fuse within their 16 lanes only, and the leftovers
/// past the 64-element steps (mollm's definition) are fused into the sum.
#[test]
fn rwkv_wkv7_rounds_v_k_and_fuses_the_update() {
    let x = -(1.0 + 2f32.powi(-11));
    let y = 1.0 + 2f32.powi(-12);
    let tiny = 2f32.powi(-24);
    // (M, w, k, v, a, b, the new M): r = 1, so out is the new M.
    for (m, w, k, v, a, b, want) in [
        (y, y, 1.0, x, 0.0, 0.0, tiny), // M*w + kv fused
        (1.0, x, 0.0, 0.0, y, y, tiny), // sa*b + (M*w + kv) fused (sa = y)
        (1.0, x, y, y, 0.0, 0.0, 0.0),  // v*k rounded first
    ] {
        let mut c = Wkv7::new(1, 1, 1, 1);
        for (i, e) in [1.0, w, k, v, a, b, m].into_iter().enumerate() {
            c.bufs[i] = vec![e];
        }
        let (o, st) = c.run(&serial_host(), false);
        assert_eq!(
            st[0].to_bits(),
            want.to_bits(),
            "M {m} w {w} k {k} v {v} a {a} b {b}"
        );
        assert_eq!(o[0].to_bits(), want.to_bits());
    }
    // The output dot of row 0 with r (w = 1, the rest 0: the state is kept): x at element 0,
    // y at `at`, r = 1 at 0 and y at `at`. Lane 1 of the 64-step rounds y*y on its own; a
    // leftover past the steps is fused into the reduced sum.
    for (n, at, want) in [(64, 1, 0.0), (64, 16, 0.0), (65, 64, tiny), (100, 99, tiny)] {
        let mut c = Wkv7::new(n, 1, 1, 1);
        c.bufs[1] = vec![1.0; n as usize];
        (c.bufs[6][0], c.bufs[0][0]) = (x, 1.0);
        (c.bufs[6][at], c.bufs[0][at]) = (y, y);
        let (o, st) = c.run(&serial_host(), false);
        assert_eq!(st, c.bufs[6], "n = {n}: the state is kept");
        assert_eq!(o[0].to_bits(), f32::to_bits(want), "n = {n}, y at {at}");
    }
}

/// Sequences and heads apart: a call of two sequences gives each one's result alone; the
/// state updated in place and the thread count change nothing.
#[test]
fn rwkv_wkv7_sequences_apart_threads_and_in_place() {
    let (n, h, t) = (5i64, 3i64, 4i64);
    let mut c = Wkv7::new(n, h, t, 2);
    let mut x = 0.37f32;
    for (i, b) in c.bufs[..7].iter_mut().enumerate() {
        for v in b.iter_mut() {
            x = (x * 3.7 + 0.11).fract();
            *v = match i {
                1 => 0.5 + x / 2.0,
                4 => -x / 3.0,
                5 => x / 3.0,
                _ => x - 0.5,
            };
        }
    }
    let (o, st) = c.run(&serial_host(), false);
    assert_eq!(
        c.run(&scoped_threads_host(2), false),
        (o.clone(), st.clone())
    );
    let per_seq: Vec<usize> = c.bufs.iter().map(|b| b.len() / 2).collect();
    for s in 0..2 {
        let mut one = Wkv7::new(n, h, t, 1);
        for (i, b) in one.bufs.iter_mut().enumerate() {
            b.copy_from_slice(&c.bufs[i][s * per_seq[i]..(s + 1) * per_seq[i]]);
        }
        let (o1, st1) = one.run(&serial_host(), false);
        assert_eq!(o1, o[s * per_seq[7]..(s + 1) * per_seq[7]], "sequence {s}");
        assert_eq!(
            st1,
            st[s * per_seq[8]..(s + 1) * per_seq[8]],
            "sequence {s}"
        );
    }
    // Two tokens in one call are one token after the other.
    let mut first = Wkv7::new(n, h, 1, 2);
    let tok = |b: &[f32], k: usize| -> Vec<f32> {
        b.chunks((n * h) as usize)
            .enumerate()
            .filter(|(i, _)| *i as i64 % t == k as i64)
            .flat_map(|(_, r)| r.to_vec())
            .collect()
    };
    for (f, b) in first.bufs[..6].iter_mut().zip(&c.bufs) {
        *f = tok(b, 0);
    }
    first.bufs[6] = c.bufs[6].clone();
    let (o0, st0) = first.run(&serial_host(), false);
    assert_eq!(o0, tok(&o, 0));
    let mut rest = Wkv7::new(n, h, t - 1, 2);
    for ((r, b), &len) in rest.bufs[..6].iter_mut().zip(&c.bufs).zip(&per_seq) {
        *r = b
            .chunks(len)
            .flat_map(|seq| seq[(n * h) as usize..].to_vec())
            .collect();
    }
    rest.bufs[6] = st0;
    assert_eq!(rest.run(&serial_host(), false).1, st);
    // In place: new_state is the state operand.
    assert_eq!(c.run(&serial_host(), true), (o, st));
}

#[test]
fn glu_silu_and_gelu() {
    let mut g: Vec<f32> = (0..20).map(|i| i as f32 * 0.5 - 5.0).collect();
    let mut u: Vec<f32> = (0..20).map(|i| 1.0 + i as f32 * 0.1).collect();
    for act in [abi::GLU_SILU, abi::GLU_GELU_TANH] {
        let mut y = vec![0f32; 20];
        let p = abi::GluAttrs { act }.to_params();
        run(
            Op::Glu,
            &[f32d(&mut g, &[20]), f32d(&mut u, &[20])],
            &[f32d(&mut y, &[20])],
            p,
        );
        for i in 0..20 {
            let x = g[i] as f64;
            let a = if act == abi::GLU_SILU {
                x / (1.0 + (-x).exp())
            } else {
                0.5 * x
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
            };
            let tol = if act == abi::GLU_SILU { 1e-6 } else { 2e-3 }; // f16 table
            assert!(
                close(y[i], (a * u[i] as f64) as f32, tol),
                "act {act} x {x}: {} vs {}",
                y[i],
                a * u[i] as f64
            );
        }
    }
}

#[test]
fn add_mul_scale_broadcast() {
    let mut a: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut b = vec![10.0f32, 20.0, 30.0]; // [3] broadcast over [3, 4]
    let mut out = vec![0f32; 12];
    run(
        Op::Add,
        &[f32d(&mut a, &[3, 4]), f32d(&mut b, &[3])],
        &[f32d(&mut out, &[3, 4])],
        OpParams::default(),
    );
    assert_eq!(out[4], 4.0 + 20.0);
    run(
        Op::Mul,
        &[f32d(&mut a, &[3, 4]), f32d(&mut b, &[3])],
        &[f32d(&mut out, &[3, 4])],
        OpParams::default(),
    );
    assert_eq!(out[5], 5.0 * 30.0);
    let p = abi::ScaleAttrs { s: -0.5 }.to_params();
    run(
        Op::Scale,
        &[f32d(&mut a, &[3, 4])],
        &[f32d(&mut out, &[3, 4])],
        p,
    );
    assert_eq!(out[11], -5.5);
    // In place (output aliases a) and a strided (transposed) view of a.
    let ad = f32d(&mut a, &[3, 4]);
    run(Op::Scale, &[ad], &[ad], p);
    assert_eq!(a[2], -1.0);
    let mut t = vec![0f32; 12];
    let mut at = ad;
    at.ne = [4, 3, 1, 1];
    at.nb = [12, 4, 48, 48];
    let p = abi::ScaleAttrs { s: 1.0 }.to_params();
    run(Op::Scale, &[at], &[f32d(&mut t, &[4, 3])], p);
    assert_eq!(t[1], a[3]); // t[0][1] = a[1][0]
}

#[test]
fn get_rows_and_set_rows() {
    let table: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect(); // [3, 4]
    let mut t16: Vec<u8> = cache(&table, DType::F16);
    let mut t32 = table.clone();
    let mut ids = vec![2, 0, 2];
    for (desc, name) in [
        (f32d(&mut t32, &[3, 4]), "f32"),
        (
            TensorDesc::contiguous(t16.as_mut_ptr(), DType::F16, &[3, 4]),
            "f16",
        ),
    ] {
        let mut out = vec![0f32; 9];
        run(
            Op::GetRows,
            &[desc, i32d(&mut ids, &[3])],
            &[f32d(&mut out, &[3, 3])],
            OpParams::default(),
        );
        assert_eq!(
            out,
            vec![3.0, 3.5, 4.0, 0.0, 0.5, 1.0, 3.0, 3.5, 4.0],
            "{name}"
        );
    }
    // set_rows into an f16 cache: rounding to nearest even, other rows untouched.
    let mut src = vec![1.0f32 + 1.0 / 4096.0, 2.0, -3.0, 4.0]; // [2, 2]
    let mut idx = vec![3, 1];
    let mut dst = cache(&[9.0; 8], DType::F16); // [2, 4]
    let dd = TensorDesc::contiguous(dst.as_mut_ptr(), DType::F16, &[2, 4]);
    run(
        Op::SetRows,
        &[f32d(&mut src, &[2, 2]), i32d(&mut idx, &[2]), dd],
        &[dd],
        OpParams::default(),
    );
    let got: Vec<f32> = dst
        .chunks(2)
        .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
        .collect();
    assert_eq!(got, vec![9.0, 9.0, -3.0, 4.0, 9.0, 9.0, 1.0, 2.0]);
    // Out-of-range ids are an argument error, not a panic.
    let mut bad = vec![7, 0, 0];
    let mut out = vec![0f32; 9];
    let e = unsafe {
        reference::run(
            &serial_host(),
            Op::GetRows,
            &[f32d(&mut t32, &[3, 4]), i32d(&mut bad, &[3])],
            &[f32d(&mut out, &[3, 3])],
            &OpParams::default(),
        )
    };
    assert!(matches!(e, Err(reference::Error::Invalid(_))), "{e:?}");
}

fn naive(w: &[f32], x: &[f32], k: usize) -> Vec<f64> {
    let (n, m) = (w.len() / k, x.len() / k);
    let mut out = vec![0f64; n * m];
    for c in 0..m {
        for r in 0..n {
            out[c * n + r] = (0..k)
                .map(|i| w[r * k + i] as f64 * x[c * k + i] as f64)
                .sum();
        }
    }
    out
}

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn matmul_f32_and_f16_match_naive() {
    for &(k, n, m) in &[
        (64usize, 8usize, 1usize),
        (64, 8, 3),
        (40, 6, 2),
        (130, 5, 4),
    ] {
        let mut w = rnd(k * n, 1);
        let mut x = rnd(k * m, 2);
        let want = naive(&w, &x, k);
        for dt in [DType::F32, DType::F16] {
            let mut wb = cache(&w, dt);
            let mut out = vec![0f32; n * m];
            let wd = TensorDesc::contiguous(wb.as_mut_ptr(), dt, &[k as i64, n as i64]);
            let host = scoped_threads_host(2);
            unsafe {
                reference::run(
                    &host,
                    Op::MatMul,
                    &[wd, f32d(&mut x, &[k as i64, m as i64])],
                    &[f32d(&mut out, &[n as i64, m as i64])],
                    &OpParams::default(),
                )
            }
            .unwrap();
            let tol = if dt == DType::F32 { 1e-5 } else { 3e-3 };
            for (a, b) in out.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() < tol * (1.0 + b.abs()),
                    "{dt} {k}x{n}x{m}: {a} vs {b}"
                );
            }
        }
        let _ = &mut w;
    }
}

fn quant_ready() -> bool {
    std::panic::catch_unwind(|| quant::vec_dot_type(DType::Q4_1)).is_ok()
}

#[test]
fn matmul_quantized_agrees_with_dequantized() {
    if !quant_ready() {
        eprintln!("quant is not implemented yet: skipping quantized matmul test");
        return;
    }
    let (k, n, m) = (256usize, 8usize, 3usize);
    let w = rnd(k * n, 3);
    let mut x = rnd(k * m, 4);
    for &dt in &[
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        let rb = dt.row_bytes(k as u64).unwrap() as usize;
        let mut wq = vec![0u8; rb * n];
        for r in 0..n {
            quant::quantize_row(dt, &w[r * k..(r + 1) * k], &mut wq[r * rb..(r + 1) * rb]).unwrap();
        }
        let mut wdq = vec![0f32; k * n];
        for r in 0..n {
            quant::dequantize_row(dt, &wq[r * rb..(r + 1) * rb], &mut wdq[r * k..(r + 1) * k])
                .unwrap();
        }
        let want = naive(&wdq, &x, k);
        let mut out = vec![0f32; n * m];
        let wd = TensorDesc::contiguous(wq.as_mut_ptr(), dt, &[k as i64, n as i64]);
        unsafe {
            reference::run(
                &serial_host(),
                Op::MatMul,
                &[wd, f32d(&mut x, &[k as i64, m as i64])],
                &[f32d(&mut out, &[n as i64, m as i64])],
                &OpParams::default(),
            )
        }
        .unwrap();
        let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
        for (a, b) in out.iter().zip(&want) {
            // The activations are quantized too (8-bit): allow ~1% of the output scale.
            assert!(
                (*a as f64 - b).abs() < 0.02 * scale + 0.05,
                "{dt}: {a} vs {b}"
            );
        }
        // get_rows dequantizes exactly.
        let mut ids = vec![5, 1];
        let mut rows = vec![0f32; 2 * k];
        run(
            Op::GetRows,
            &[wd, i32d(&mut ids, &[2])],
            &[f32d(&mut rows, &[k as i64, 2])],
            OpParams::default(),
        );
        assert_eq!(&rows[..k], &wdq[5 * k..6 * k]);
    }
}

// ---- ABI ----

struct Backend {
    ctx: *mut core::ffi::c_void,
    _host: Box<abi::HostApi>,
}

fn open() -> Backend {
    let host = Box::new(serial_host());
    let hdr = &reference::HEADER;
    hdr.check_layout().unwrap();
    let name = unsafe { core::ffi::CStr::from_ptr(hdr.name) };
    assert_eq!(name.to_str().unwrap(), "reference");
    let mut ctx = core::ptr::null_mut();
    assert_eq!((reference::TABLE.init)(&*host, &mut ctx), 0);
    Backend { ctx, _host: host }
}

impl Drop for Backend {
    fn drop(&mut self) {
        (reference::TABLE.shutdown)(self.ctx);
    }
}

fn call(b: &Backend, c: &OpCall) -> (Status, String) {
    let s = Status::from_raw((reference::TABLE.compute)(b.ctx, c));
    (
        s,
        reference::backend::last_error_string(&reference::TABLE, b.ctx),
    )
}

#[test]
fn abi_errors_are_statuses() {
    let b = open();
    assert_eq!((reference::TABLE.score.unwrap())(), 1);
    let mut x = vec![1.0f32, 2.0, 3.0, 4.0];
    let mut y = vec![0f32; 4];
    let (xd, yd) = (f32d(&mut x, &[4]), f32d(&mut y, &[4]));
    // Good call through the table.
    let p = abi::ScaleAttrs { s: 2.0 }.to_params();
    let ins = [xd];
    let outs = [yd];
    assert_eq!(
        call(&b, &OpCall::new(Op::Scale, &ins, &outs, p)).0,
        Status::Ok
    );
    assert_eq!(y, vec![2.0, 4.0, 6.0, 8.0]);
    // Wrong operand count.
    let (s, e) = call(&b, &OpCall::new(Op::Add, &ins, &outs, OpParams::default()));
    assert_eq!(s, Status::InvalidArgument);
    assert!(e.contains("expects 2 inputs"), "{e}");
    // Unknown dtype id.
    let mut bad = xd;
    bad.dtype = 999;
    let (s, e) = call(&b, &OpCall::new(Op::Scale, &[bad], &outs, p));
    assert_eq!(s, Status::InvalidArgument);
    assert!(e.contains("999"), "{e}");
    // Unknown op id.
    let mut c = OpCall::new(Op::Scale, &ins, &outs, p);
    c.op = 4242;
    let (s, e) = call(&b, &c);
    assert_eq!(s, Status::InvalidArgument);
    assert!(e.contains("4242"), "{e}");
    // Null data with a valid shape.
    let nul = TensorDesc::contiguous(core::ptr::null_mut(), DType::F32, &[4]);
    assert_eq!(
        call(&b, &OpCall::new(Op::Scale, &[nul], &outs, p)).0,
        Status::InvalidArgument
    );
    // Unsupported: a device buffer; supports() answers without data.
    let mut dev = xd;
    dev.buffer = 7;
    assert_eq!(
        call(&b, &OpCall::new(Op::Scale, &[dev], &outs, p)).0,
        Status::Unsupported
    );
    let sup = reference::TABLE.supports.unwrap();
    assert_eq!(
        Status::from_raw(sup(b.ctx, &OpCall::new(Op::Scale, &[nul], &outs, p))),
        Status::Ok
    );
    assert_eq!(
        Status::from_raw(sup(b.ctx, &OpCall::new(Op::Scale, &[dev], &outs, p))),
        Status::Unsupported
    );
    // Bad glu activation id / rope mode are argument errors.
    let gp = abi::GluAttrs { act: 9 }.to_params();
    assert_eq!(
        call(&b, &OpCall::new(Op::Glu, &[xd, xd], &outs, gp)).0,
        Status::InvalidArgument
    );
}

#[test]
fn abi_catches_panics() {
    let b = open();
    let mut x = vec![1.0f32; 4];
    let mut y = vec![0f32; 4];
    let ins = [f32d(&mut x, &[4])];
    let outs = [f32d(&mut y, &[4])];
    reference::backend::panic_on_next_compute();
    let (s, e) = call(
        &b,
        &OpCall::new(Op::Scale, &ins, &outs, OpParams::default()),
    );
    assert_eq!(s, Status::Panic);
    assert!(e.contains("deliberate test panic"), "{e}");
    // The context still works afterwards.
    assert_eq!(
        call(
            &b,
            &OpCall::new(Op::Scale, &ins, &outs, OpParams::default())
        )
        .0,
        Status::Ok
    );
    // A panic inside a parallel task is carried back to the caller.
    let r = std::panic::catch_unwind(|| {
        reference::parallel_for(&scoped_threads_host(2), 4, |i| {
            if i == 3 {
                panic!("task three");
            }
        })
    });
    assert!(backend_kit::par::panic_message(&*r.unwrap_err()).contains("task three"));
}

/// `cargo test -p mollm-reference --release -- --ignored --nocapture bench`
#[test]
#[ignore]
fn bench_matmul() {
    let (k, n) = (576usize, 1536usize);
    for dt in [
        DType::F32,
        DType::F16,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_K,
    ] {
        if dt.info().quantized && !quant_ready() {
            continue;
        }
        let w = rnd(k * n, 5);
        let rb = dt.row_bytes(k as u64).unwrap() as usize;
        let mut wq = vec![0u8; rb * n];
        match dt {
            DType::F32 | DType::F16 => wq = cache(&w, dt),
            _ => {
                for r in 0..n {
                    quant::quantize_row(dt, &w[r * k..(r + 1) * k], &mut wq[r * rb..(r + 1) * rb])
                        .unwrap();
                }
            }
        }
        let wd = TensorDesc::contiguous(wq.as_mut_ptr(), dt, &[k as i64, n as i64]);
        for m in [1usize, 64] {
            let mut x = rnd(k * m, 6);
            let mut out = vec![0f32; n * m];
            for threads in [1u32, 2] {
                let host = scoped_threads_host(threads);
                let iters = if m == 1 { 50 } else { 5 };
                let t0 = std::time::Instant::now();
                for _ in 0..iters {
                    unsafe {
                        reference::run(
                            &host,
                            Op::MatMul,
                            &[wd, f32d(&mut x, &[k as i64, m as i64])],
                            &[f32d(&mut out, &[n as i64, m as i64])],
                            &OpParams::default(),
                        )
                    }
                    .unwrap();
                }
                let ms = t0.elapsed().as_secs_f64() * 1e3 / iters as f64;
                let gflops = 2.0 * (k * n * m) as f64 / ms / 1e6;
                println!(
                    "{dt} [{k}x{n}] x {m} cols, {threads} thr: {ms:.3} ms ({gflops:.2} GFLOP/s)"
                );
            }
        }
    }
}

/// norm: rows [1, 2, 3, 4] and [2, 2, 2, 2]. As one group: mean 2.5, variance 1.25, so
/// (x - 2.5) / sqrt(1.25 + eps) times w plus b; the constant row gives b alone (0 times
/// 1 / sqrt(eps)). In groups of
/// two: [1, 2] and [3, 4] each become [-1, 1] (variance 0.25) times the gain.
#[test]
fn norm_whole_rows_and_groups_by_hand() {
    let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 2.0];
    let mut w = vec![1.0f32, 2.0, 1.0, 0.5];
    let mut b = vec![0.0f32, 0.0, 1.0, -1.0];
    for (group, want) in [
        (
            0i64,
            [(-1.5f32, 1.25f32), (-0.5, 1.25), (0.5, 1.25), (1.5, 1.25)],
        ),
        (2, [(-0.5, 0.25), (0.5, 0.25), (-0.5, 0.25), (0.5, 0.25)]),
    ] {
        let mut y = vec![0f32; 8];
        let p = abi::NormAttrs { eps: 1e-5, group }.to_params();
        let ins = [
            f32d(&mut x, &[4, 2]),
            f32d(&mut w, &[4]),
            f32d(&mut b, &[4]),
        ];
        run(Op::Norm, &ins, &[f32d(&mut y, &[4, 2])], p);
        for i in 0..4 {
            let (d, var) = want[i];
            let expect = d / (var + 1e-5).sqrt() * w[i] + b[i];
            assert!(
                close(y[i], expect, 1e-6),
                "group {group} [{i}]: {} vs {expect}",
                y[i]
            );
            assert_eq!(y[4 + i], b[i], "group {group}: a constant row is its bias");
        }
    }
}

/// l2_norm: [3, 4] becomes [0.6, 0.8]; a row of zeros stays zero (divided by the eps clamp,
/// not by 0); a tiny row is divided by eps rather than by its norm.
#[test]
fn l2_norm_by_hand_and_its_clamp() {
    let mut x = vec![3.0f32, 4.0, 0.0, 0.0, 1e-7, 0.0];
    let mut y = vec![0f32; 6];
    let p = abi::L2NormAttrs { eps: 1e-6 }.to_params();
    run(
        Op::L2Norm,
        &[f32d(&mut x, &[2, 3])],
        &[f32d(&mut y, &[2, 3])],
        p,
    );
    assert!(close(y[0], 0.6, 1e-7) && close(y[1], 0.8, 1e-7), "{y:?}");
    assert_eq!(&y[2..4], &[0.0, 0.0]);
    assert!(close(y[4], 0.1, 1e-6) && y[5] == 0.0, "{y:?}");
}

/// token_shift: two sequences of three columns of 2; out = previous column - column, the
/// state before the first; the new state is each sequence's last column, in place too.
#[test]
fn token_shift_by_hand_and_in_place() {
    let x0: Vec<f32> = (1..=12).map(|v| v as f32).collect(); // [2, 3, 2]
    for in_place in [false, true] {
        let mut x = x0.clone();
        let mut st = vec![10.0f32, 20.0, 30.0, 40.0];
        let mut y = vec![0f32; 12];
        let mut st2 = vec![0f32; 4];
        let sd = f32d(&mut st, &[2, 2]);
        let out_state = if in_place {
            sd
        } else {
            f32d(&mut st2, &[2, 2])
        };
        run(
            Op::TokenShift,
            &[f32d(&mut x, &[2, 3, 2]), sd],
            &[f32d(&mut y, &[2, 3, 2]), out_state],
            OpParams::default(),
        );
        assert_eq!(
            y,
            [9.0, 18.0, -2.0, -2.0, -2.0, -2.0, 23.0, 32.0, -2.0, -2.0, -2.0, -2.0]
        );
        let new = if in_place { &st } else { &st2 };
        assert_eq!(new, &[5.0, 6.0, 11.0, 12.0]);
    }
}
