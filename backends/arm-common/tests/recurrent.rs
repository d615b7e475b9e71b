//! The recurrent ops (ssm_conv, gated_delta_net, rwkv_wkv7) through the shared ops' NEON
//! variant (`Isa::Neon`, the kernels in cpu-common's `src/arm/`), its portable twin and the
//! `arm-neon` backend, against the reference backend, bit for bit (output bytes): conformance
//! cases, then head sizes of whole 64-element steps (64, 128) and with leftovers (1, 3, 16,
//! 48, 72, 100), several heads, tokens and sequences, both gate forms, the state updated in
//! place and apart. On x86 (no NEON) only the portable variant runs; under
//! `qemu-aarch64 -cpu max` or `-cpu cortex-a53` all three do. Shapes are small: CI emulates.

use abi::{BackendTable, DType, Op, OpCall, OpParams, Status, TensorDesc};
use conformance::cases::{case, Case, Owned, Rng};
use mollm_cpu_common::ops::Isa;
use mollm_cpu_common::CpuBackend;

/// The shared ops on one variant, behind a table.
struct Ops<const NEON: bool>;

impl<const NEON: bool> CpuBackend for Ops<NEON> {
    fn score() -> u32 {
        1
    }
    unsafe fn check(
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), mollm_cpu_common::Error> {
        abi::validate(op, inputs, outputs, params).map_err(mollm_cpu_common::Error::Invalid)?;
        mollm_cpu_common::ops::check(op, inputs, outputs, params)
    }
    unsafe fn compute(
        host: &abi::HostApi,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), mollm_cpu_common::Error> {
        let isa = if NEON { Isa::Neon } else { Isa::Portable };
        mollm_cpu_common::ops::run(isa, host, op, inputs, outputs, params)
    }
}

static PORTABLE: BackendTable = mollm_cpu_common::table::<Ops<false>>();
static NEON: BackendTable = mollm_cpu_common::table::<Ops<true>>();

/// The tables under test on this CPU, by name.
fn tables() -> Vec<(&'static str, &'static BackendTable)> {
    let mut v = vec![("portable", &PORTABLE)];
    if Isa::Neon.detected() {
        v.push(("neon", &NEON));
        v.push(("arm-neon", &mollm_arm_common::TABLE_NEON));
    } else {
        eprintln!("no NEON variant on this CPU: the portable one only");
    }
    v
}

/// Runs `c` on `table`; with `state` (an input index) the second output is that input, updated
/// in place. Returns the output bytes: the first output, then the new state.
fn run(table: &'static BackendTable, c: &Case, state: Option<usize>) -> Vec<Vec<u8>> {
    let host = reference::scoped_threads_host(2);
    let mut ctx = core::ptr::null_mut();
    assert_eq!((table.init)(&host, &mut ctx), 0);
    let mut c = c.clone();
    // Poison the outputs: every element must be written.
    for o in c.outputs.iter_mut() {
        o.data.iter_mut().for_each(|b| *b = 0xA5);
    }
    let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
    let mut outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
    if let Some(i) = state {
        outs[1] = ins[i];
    }
    let call = OpCall::new(c.op, &ins, &outs, c.params);
    let st = Status::from_raw((table.compute)(ctx, &call));
    (table.shutdown)(ctx);
    assert_eq!(st, Status::Ok, "{}", c.label);
    match state {
        Some(i) => vec![c.outputs[0].data.clone(), c.inputs[i].data.clone()],
        None => c.outputs.iter().map(|o| o.data.clone()).collect(),
    }
}

/// `c` on every table against the reference: asserts 0 differing bits and returns how many
/// floats each table compared.
fn same(c: &Case, state: Option<usize>) -> usize {
    let want = run(&reference::TABLE, c, state);
    let mut floats = 0;
    for (name, table) in tables() {
        let got = run(table, c, state);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            if g != w {
                let f = |b: &[u8]| -> Vec<u32> {
                    b.chunks_exact(4)
                        .map(|x| u32::from_le_bytes(x.try_into().unwrap()))
                        .collect()
                };
                let (gf, wf) = (f(g), f(w));
                let i = gf.iter().zip(&wf).position(|(a, b)| a != b).unwrap();
                panic!(
                    "{name} {} (in place: {}), output {k}, element {i}: bits {:08x} vs \
                     reference {:08x}",
                    c.label,
                    state.is_some(),
                    gf[i],
                    wf[i]
                );
            }
            floats += g.len() / 4;
        }
    }
    floats
}

#[test]
fn recurrent_conformance_cases_match_the_reference_bit_for_bit() {
    for op in [Op::SsmConv, Op::GatedDeltaNet, Op::RwkvWkv7] {
        let (mut n, mut floats) = (0, 0);
        for seed in 0..40 {
            let c = case(op, seed);
            floats += same(&c, None);
            n += 1;
        }
        eprintln!(
            "{}: {n} conformance cases, {floats} floats, 0 bits differ",
            op.name()
        );
    }
}

/// A gated_delta_net case: head size `n`, `h` v heads over `hq` q/k heads, `t` tokens of `s`
/// sequences, a gate per key (`kda`) or per head; unit-length keys and queries as the models
/// give them, decays <= 1, betas in (0, 1).
fn gdn_case(r: &mut Rng, n: i64, h: i64, hq: i64, t: i64, s: i64, kda: bool) -> Case {
    let unit = 1.0 / (n as f32).sqrt();
    let gn = if kda { n } else { 1 };
    let g: Vec<f32> = r
        .vec((gn * h * t * s) as usize, 0.5)
        .iter()
        .map(|x| -x.abs())
        .collect();
    let beta: Vec<f32> = r
        .vec((h * t * s) as usize, 1.0)
        .iter()
        .map(|x| 1.0 / (1.0 + (-x).exp()))
        .collect();
    Case {
        op: Op::GatedDeltaNet,
        label: format!("n={n} h={h} hq={hq} t={t} seqs={s} kda={kda}"),
        inputs: vec![
            Owned::f32(&[n, hq, t, s], &r.vec((n * hq * t * s) as usize, unit)),
            Owned::f32(&[n, hq, t, s], &r.vec((n * hq * t * s) as usize, unit)),
            Owned::f32(&[n, h, t, s], &r.vec((n * h * t * s) as usize, 1.0)),
            Owned::f32(&[gn, h, t, s], &g),
            Owned::f32(&[1, h, t, s], &beta),
            Owned::f32(&[n, n, h, s], &r.vec((n * n * h * s) as usize, 0.3)),
        ],
        outputs: vec![
            Owned::zeros(DType::F32, &[n, h, t, s]),
            Owned::zeros(DType::F32, &[n, n, h, s]),
        ],
        params: OpParams::default(),
    }
}

#[test]
fn gated_delta_net_neon_matches_the_reference_bit_for_bit() {
    let mut r = Rng::new(13);
    // (head size, v heads, q/k heads, tokens, sequences)
    #[rustfmt::skip]
    let shapes: &[(i64, i64, i64, i64, i64)] = &[
        (64, 4, 2, 3, 2), (128, 2, 1, 2, 2), (16, 3, 3, 4, 1), (48, 2, 1, 3, 2),
        (72, 2, 2, 2, 1), (1, 3, 1, 2, 2), (3, 2, 2, 3, 1), (100, 1, 1, 2, 1), (64, 2, 2, 0, 1),
    ];
    let (mut n_cases, mut floats) = (0, 0);
    for &(n, h, hq, t, s) in shapes {
        for kda in [false, true] {
            let c = gdn_case(&mut r, n, h, hq, t, s, kda);
            for state in [None, Some(5)] {
                floats += same(&c, state);
                n_cases += 1;
            }
        }
    }
    eprintln!("gated_delta_net: {n_cases} cases, {floats} floats, 0 bits differ");
}

/// An rwkv_wkv7 case: head size `n`, `h` heads, `t` tokens of `s` sequences; operands as the
/// RWKV-7 graph makes them (a = -kk, b = kk * iclr with kk of unit length, decays in
/// (0.55, 1), keys and receptances of about unit length).
fn wkv7_case(r: &mut Rng, n: i64, h: i64, t: i64, s: i64) -> Case {
    let len = (n * h * t * s) as usize;
    let unit = 1.0 / (n as f32).sqrt();
    let w: Vec<f32> = r
        .vec(len, 1.0)
        .iter()
        .map(|x| (-0.606531 / (1.0 + (-x).exp())).exp())
        .collect();
    let mut kk = r.vec(len, 1.0);
    for row in kk.chunks_mut(n.max(1) as usize) {
        let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        row.iter_mut().for_each(|x| *x /= norm);
    }
    let a: Vec<f32> = kk.iter().map(|x| -x).collect();
    let b: Vec<f32> = kk
        .iter()
        .zip(r.vec(len, 1.0))
        .map(|(x, g)| x / (1.0 + (-g).exp()))
        .collect();
    let x = [n, h, t, s];
    Case {
        op: Op::RwkvWkv7,
        label: format!("n={n} h={h} t={t} seqs={s}"),
        inputs: vec![
            Owned::f32(&x, &r.vec(len, unit)),
            Owned::f32(&x, &w),
            Owned::f32(&x, &r.vec(len, unit)),
            Owned::f32(&x, &r.vec(len, 1.0)),
            Owned::f32(&x, &a),
            Owned::f32(&x, &b),
            Owned::f32(&[n, n, h, s], &r.vec((n * n * h * s) as usize, 0.3)),
        ],
        outputs: vec![
            Owned::zeros(DType::F32, &x),
            Owned::zeros(DType::F32, &[n, n, h, s]),
        ],
        params: OpParams::default(),
    }
}

#[test]
fn rwkv_wkv7_neon_matches_the_reference_bit_for_bit() {
    let mut r = Rng::new(14);
    // (head size, heads, tokens, sequences)
    #[rustfmt::skip]
    let shapes: &[(i64, i64, i64, i64)] = &[
        (64, 4, 3, 2), (128, 2, 2, 2), (16, 3, 4, 1), (48, 2, 3, 2), (72, 2, 2, 1),
        (1, 3, 2, 2), (5, 2, 3, 1), (100, 1, 2, 1), (64, 2, 0, 1),
    ];
    let (mut n_cases, mut floats) = (0, 0);
    for &(n, h, t, s) in shapes {
        let c = wkv7_case(&mut r, n, h, t, s);
        for state in [None, Some(6)] {
            floats += same(&c, state);
            n_cases += 1;
        }
    }
    eprintln!("rwkv_wkv7: {n_cases} cases, {floats} floats, 0 bits differ");
}

/// ssm_conv at every split of its sum (fused taps only, 4 rounded + fused, 8 rounded), channel
/// counts around the NEON kernel's groups of 4, and on padded rows (windows and output rows
/// apart by more than their length).
#[test]
fn ssm_conv_neon_matches_the_reference_bit_for_bit() {
    let mut r = Rng::new(12);
    // (taps, tokens, channels, sequences)
    #[rustfmt::skip]
    let shapes: &[(i64, i64, i64, i64)] = &[
        (1, 3, 9, 2), (2, 1, 7, 1), (3, 2, 64, 2), (4, 3, 33, 2), (5, 2, 3, 3), (6, 1, 5, 2),
        (7, 5, 17, 2), (8, 4, 40, 1), (9, 3, 16, 2), (13, 2, 12, 1), (4, 1, 1024, 1),
    ];
    let (mut n_cases, mut floats) = (0, 0);
    for &(taps, t, n, s) in shapes {
        let w = taps - 1 + t;
        let c = Case {
            op: Op::SsmConv,
            label: format!("taps={taps} t={t} n={n} seqs={s}"),
            inputs: vec![
                Owned::f32(&[w, n, s], &r.vec((w * n * s) as usize, 1.0)),
                Owned::f32(&[taps, n], &r.vec((taps * n) as usize, 0.5)),
            ],
            outputs: vec![Owned::zeros(DType::F32, &[n, t, s])],
            params: OpParams::default(),
        };
        floats += same(&c, None);
        n_cases += 1;
    }
    // Padded rows: sx's windows 3 floats apart (and its sequences 5 more), out's rows 2.
    let (taps, t, n, s) = (4i64, 3i64, 6i64, 2i64);
    let w = taps - 1 + t;
    let (sx_row, sx_seq, out_row) = (w + 3, (w + 3) * n + 5, n + 2);
    let mut sx = r.vec((sx_seq * s) as usize, 1.0);
    let mut c = r.vec((taps * n) as usize, 0.5);
    let mk = |p: &mut [f32], ne: [i64; 3], nb: [i64; 3]| {
        let mut d = TensorDesc::contiguous(p.as_mut_ptr() as *mut u8, DType::F32, &ne);
        d.nb[..3].copy_from_slice(&nb.map(|b| b * 4));
        d
    };
    let ins = [
        mk(&mut sx, [w, n, s], [1, sx_row, sx_seq]),
        mk(&mut c, [taps, n, 1], [1, taps, taps * n]),
    ];
    let padded = |table: &'static BackendTable| {
        let host = reference::scoped_threads_host(2);
        let mut ctx = core::ptr::null_mut();
        assert_eq!((table.init)(&host, &mut ctx), 0);
        let mut o = vec![f32::NAN; (out_row * t * s) as usize];
        let outs = [mk(&mut o, [n, t, s], [1, out_row, out_row * t])];
        let call = OpCall::new(Op::SsmConv, &ins, &outs, OpParams::default());
        assert_eq!(Status::from_raw((table.compute)(ctx, &call)), Status::Ok);
        (table.shutdown)(ctx);
        o
    };
    let want = padded(&reference::TABLE);
    for (name, table) in tables() {
        let got = padded(table);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} padded rows, element {i}");
        }
        floats += got.len();
    }
    n_cases += 1;
    eprintln!("ssm_conv: {n_cases} cases, {floats} floats, 0 bits differ");
}
