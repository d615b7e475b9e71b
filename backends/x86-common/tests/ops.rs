//! The native non-matmul ops against the reference backend, bit for bit (output bytes, so
//! `to_bits` of every f32), on seeded random cases (the conformance generator, plus larger
//! attention shapes covering KV padding, both p·V kernels and GQA), on both ISAs and in the portable variant (which the ARM backends run for the ops without NEON kernels).

use abi::{BackendTable, DType, Op, OpCall, OpParams, Status, TensorDesc};
use conformance::cases::{case, Case, Owned, Rng};
use mollm_x86_common::{Isa, HEADER_AVX2, HEADER_AVX512};

struct Instance {
    table: &'static BackendTable,
    ctx: *mut core::ffi::c_void,
}

impl Instance {
    fn new(table: &'static BackendTable, host: &abi::HostApi) -> Instance {
        let mut ctx = core::ptr::null_mut();
        assert_eq!((table.init)(host, &mut ctx), 0);
        Instance { table, ctx }
    }
    fn supports(&self, c: &mut Case) -> Status {
        let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
        let outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
        let call = OpCall::new(c.op, &ins, &outs, c.params);
        Status::from_raw((self.table.supports.unwrap())(self.ctx, &call))
    }
    /// Runs the case; the output bytes (set_rows: the cache, updated in place).
    fn run(&self, c: &mut Case) -> (Status, Vec<Vec<u8>>) {
        let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
        let mut outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
        if c.op == Op::SetRows {
            outs[0] = ins[2];
        }
        let call = OpCall::new(c.op, &ins, &outs, c.params);
        let st = Status::from_raw((self.table.compute)(self.ctx, &call));
        if st != Status::Ok {
            eprintln!(
                "{:?}: {}",
                st,
                mollm_x86_common::last_error_string(self.table, self.ctx)
            );
        }
        let o = if c.op == Op::SetRows {
            vec![c.inputs[2].data.clone()]
        } else {
            c.outputs.iter().map(|o| o.data.clone()).collect()
        };
        (st, o)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        (self.table.shutdown)(self.ctx)
    }
}

/// The shared ops' portable variant behind a table.
struct PortableOps;

impl mollm_cpu_common::CpuBackend for PortableOps {
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
        if op == Op::MatMul {
            return Err(mollm_cpu_common::Error::Unsupported("not here".into()));
        }
        mollm_cpu_common::ops::check(op, inputs, outputs, params)
    }
    unsafe fn compute(
        host: &abi::HostApi,
        op: Op,
        inputs: &[TensorDesc],
        outputs: &[TensorDesc],
        params: &OpParams,
    ) -> Result<(), mollm_cpu_common::Error> {
        use mollm_cpu_common::ops::{run, Isa};
        run(Isa::Portable, host, op, inputs, outputs, params)
    }
}

static PORTABLE: BackendTable = mollm_cpu_common::table::<PortableOps>();

fn tables() -> Vec<(Isa, &'static BackendTable)> {
    // The portable variant is labelled by the tier it is compared beside.
    let mut v = vec![(Isa::Avx2, &PORTABLE)];
    for (isa, h) in [(Isa::Avx2, &HEADER_AVX2), (Isa::Avx512, &HEADER_AVX512)] {
        if isa.detected() {
            v.push((isa, unsafe { &*h.table }));
        } else {
            eprintln!("this CPU lacks {isa:?}: not tested");
        }
    }
    v
}

/// Runs `c` on the reference and on every ISA; asserts identical bytes. Returns whether the
/// native backend supported it (on every ISA).
fn same(c: &Case, host: &abi::HostApi, label: &str) -> bool {
    let refi = Instance::new(&reference::TABLE, host);
    let mut cr = c.clone();
    let (st, want) = refi.run(&mut cr);
    assert_eq!(st, Status::Ok, "reference failed on {label}");
    let mut supported = true;
    for (isa, table) in tables() {
        let me = Instance::new(table, host);
        let mut cm = c.clone();
        // Poison the outputs: every element must be written.
        for o in cm.outputs.iter_mut() {
            o.data.iter_mut().for_each(|b| *b = 0xA5);
        }
        if me.supports(&mut cm) != Status::Ok {
            supported = false;
            continue;
        }
        let (st, got) = me.run(&mut cm);
        assert_eq!(st, Status::Ok, "{isa:?} {label}");
        for (g, w) in got.iter().zip(&want) {
            if g != w {
                let f = |b: &[u8]| -> Vec<u32> {
                    b.chunks_exact(4)
                        .map(|x| u32::from_le_bytes(x.try_into().unwrap()))
                        .collect()
                };
                let (gf, wf) = (f(g), f(w));
                let i = gf.iter().zip(&wf).position(|(a, b)| a != b).unwrap();
                panic!(
                    "{isa:?} {label}: element {i}: {} vs reference {} (bits {:08x} vs {:08x})",
                    f32::from_bits(gf[i]),
                    f32::from_bits(wf[i]),
                    gf[i],
                    wf[i]
                );
            }
        }
    }
    supported
}

#[test]
fn every_native_op_matches_reference_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    for &op in mollm_cpu_common::ops::OPS {
        let mut n_supported = 0;
        for seed in 0..120 {
            let c = case(op, seed);
            let label = format!("{} seed {seed} ({})", op.name(), c.label);
            if same(&c, &host, &label) {
                n_supported += 1;
            }
        }
        eprintln!("{}: {n_supported}/120 cases native", op.name());
        assert!(n_supported > 0, "{}: no case ran natively", op.name());
    }
}

fn attention_case(
    r: &mut Rng,
    d: i64,
    hkv: i64,
    group: i64,
    cache: i64,
    t: i64,
    n_kv: i64,
    window: i64,
    softcap: f32,
) -> Case {
    let hq = hkv * group;
    let pos0 = n_kv - t;
    let pos: Vec<i32> = (0..t).map(|i| (pos0 + i) as i32).collect();
    let p = abi::AttentionAttrs {
        n_kv,
        window,
        page_rows: 0,
        scale: 1.0 / (d as f32).sqrt(),
        softcap,
    }
    .to_params();
    let q = Owned::f32(&[d, hq, t], &r.vec((d * hq * t) as usize, 1.0));
    let kc = Owned::f32(&[d, hkv, cache], &r.vec((d * hkv * cache) as usize, 1.0));
    let vc = Owned::f32(&[d, hkv, cache], &r.vec((d * hkv * cache) as usize, 1.0));
    Case {
        op: Op::Attention,
        label: format!(
            "d={d} hkv={hkv} group={group} cache={cache} t={t} n_kv={n_kv} window={window} softcap={softcap}"
        ),
        inputs: vec![q, kc, vc, Owned::i32(&pos)],
        outputs: vec![Owned::zeros(DType::F32, &[d, hq, t])],
        params: p,
    }
}

#[test]
fn attention_edge_shapes_match_reference_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    let mut r = Rng::new(7);
    // (d, hkv, group, cache, t, n_kv, window, softcap)
    let shapes: &[(i64, i64, i64, i64, i64, i64, i64, f32)] = &[
        (64, 3, 3, 512, 1, 1, 0, 0.0),        // decode, first token
        (64, 3, 3, 512, 1, 130, 0, 0.0),      // decode: 64-lane vec_dot over n_eff = 256
        (64, 3, 3, 512, 1, 300, 0, 0.0),      // decode past one pad block
        (64, 3, 3, 300, 1, 280, 0, 0.0),      // n_eff = cache = 300: vec_dot leftovers
        (64, 3, 3, 512, 7, 100, 0, 0.0),      // prompt: tinyBLAS p·V (16 lanes)
        (64, 3, 3, 300, 5, 290, 0, 0.0),      // n_eff = 300 (not a multiple of 16): 64 lanes
        (64, 2, 1, 512, 33, 260, 40, 0.0),    // sliding window
        (64, 1, 4, 256, 9, 200, 0, 30.0),     // soft-cap
        (48, 2, 2, 256, 4, 70, 0, 0.0),       // head size with a vec_dot tail (48 < 64)
        (80, 1, 2, 512, 3, 77, 0, 0.0),       // 64 + 16 tail
        (6, 2, 1, 40, 3, 20, 0, 0.0),         // d % 4 != 0: no tile
        (64, 3, 3, 1024, 64, 384, 0, 0.0),    // SmolLM2-like prompt chunk
        (128, 2, 6, 512, 1, 201, 0, 0.0),     // decode, d = 128 (two 64-steps per score)
        (256, 1, 4, 512, 1, 77, 0, 0.0),      // decode, d = 256 (Gemma 3)
        (256, 1, 4, 512, 1, 300, 64, 0.0),    // decode in a sliding window
        (128, 2, 2, 512, 19, 150, 0, 0.0),    // prompt, d = 128: 16-lane p·V, eight 16-blocks
        (256, 1, 4, 2560, 1, 2048, 512, 0.0), // Gemma 3's window deep in the cache
        (64, 3, 3, 1024, 1, 700, 100, 0.0),   // a window starting mid-block (row 600)
        (64, 3, 3, 1024, 20, 700, 100, 0.0),  // a prompt chunk in a window
        (256, 1, 4, 512, 6, 90, 0, 0.0),      // prompt, d = 256: whole-row 16-lane p·V
        (384, 1, 2, 256, 1, 100, 0, 0.0),     // d = 384: a 256 and a 128 piece per row
        (384, 1, 2, 256, 3, 100, 0, 0.0),     // the same for a prompt
        // Heads per KV head in passes of at most six (scores and p·V share K and V loads):
        (64, 2, 7, 512, 1, 300, 0, 0.0), // 7 (Qwen2.5-0.5B): passes of 4 and 3
        (64, 1, 5, 512, 3, 100, 0, 0.0), // 5 in one pass
        (64, 1, 8, 512, 1, 100, 0, 0.0), // 8: two passes of 4
        (128, 1, 12, 512, 2, 150, 0, 0.0), // 12: two passes of 6
        (112, 1, 6, 512, 1, 200, 0, 0.0), // 7 16-blocks: a chunk of 4, then three of 1
    ];
    for &(d, hkv, g, c, t, n, w, sc) in shapes {
        let cs = attention_case(&mut r, d, hkv, g, c, t, n, w, sc);
        let label = cs.label.clone();
        assert!(same(&cs, &host, &label), "{label}: not supported natively");
    }
}

#[test]
fn f16_caches_are_native_and_unimplemented_variants_unsupported() {
    let host = reference::serial_host();
    for (isa, table) in tables() {
        let me = Instance::new(table, &host);
        // f16 caches are computed natively now: supported, and equal to the reference.
        let mut n_f16 = 0;
        for seed in 0..60 {
            let mut c = case(Op::Attention, seed);
            if c.inputs[1].dtype == DType::F16 {
                n_f16 += 1;
                assert_eq!(me.supports(&mut c), Status::Ok, "{isa:?} {}", c.label);
                let label = c.label.clone();
                assert!(
                    same(&c, &host, &label),
                    "{isa:?} {label}: differs from the reference"
                );
            }
        }
        assert!(n_f16 > 0);
        // YaRN
        let mut c = case(Op::Rope, 1);
        abi::RopeAttrs::edit(&mut c.params, |r| r.ext_factor = 1.0);
        assert_eq!(me.supports(&mut c), Status::Unsupported, "{isa:?} yarn");
        // f16 set_rows: computed natively, equal to the reference.
        for seed in 0..40 {
            let mut c = case(Op::SetRows, seed);
            if c.inputs[2].dtype == DType::F16 {
                assert_eq!(me.supports(&mut c), Status::Ok, "{isa:?} {}", c.label);
                let label = c.label.clone();
                assert!(
                    same(&c, &host, &label),
                    "{isa:?} {label}: differs from the reference"
                );
            }
        }
        // non-packed f32 elements
        let mut v = vec![0f32; 16];
        let mut o = vec![0f32; 8];
        let mut xd = TensorDesc::contiguous(v.as_mut_ptr() as *mut u8, DType::F32, &[8, 1]);
        xd.nb[0] = 8;
        let od = TensorDesc::contiguous(o.as_mut_ptr() as *mut u8, DType::F32, &[8, 1]);
        let p = abi::ScaleAttrs { s: 2.0 }.to_params();
        let (ins, outs) = ([xd], [od]);
        let call = OpCall::new(Op::Scale, &ins, &outs, p);
        assert_eq!(
            Status::from_raw((table.supports.unwrap())(me.ctx, &call)),
            Status::Unsupported
        );
    }
}

/// The conformance suite's fixed attention cases (edge lengths, paged caches, several
/// sequences in one call), bit for bit: the gate itself allows a tolerance.
#[test]
fn fixed_attention_cases_match_reference_bit_for_bit() {
    use conformance::cases::{fixed_case, fixed_count};
    let host = reference::scoped_threads_host(2);
    for i in 0..fixed_count(Op::Attention) {
        let c = fixed_case(Op::Attention, i).unwrap();
        let label = c.label.clone();
        assert!(same(&c, &host, &label), "{label}: not supported natively");
    }
}

/// Prompt chunks of 8 queries or more on AVX-512 run on K and V copied into transposed
/// 16-row blocks (`cpu-common/src/ops/attention/tposed.rs`): f32 and f16 caches, head sizes
/// with and without a compile-time kernel, odd head groups, windows, a soft-cap, paged caches
/// and several sequences in one call, bit for bit.
#[test]
fn prompt_chunks_on_transposed_blocks_match_reference_bit_for_bit() {
    use conformance::cases::{attention, attention_seqs, SeqsShape};
    let host = reference::scoped_threads_host(2);
    let mut r = Rng::new(11);
    // (d, hq, hkv, cache, t, n_kv, window, softcap)
    #[rustfmt::skip]
    let shapes: &[(i64, i64, i64, i64, i64, i64, i64, f32)] = &[
        (64, 14, 2, 512, 40, 300, 0, 0.0),     // Qwen2.5-0.5B: 7 heads a KV head (pairs, a single)
        (64, 9, 3, 1024, 8, 8, 0, 0.0),        // the fewest queries, from row 0
        (128, 12, 2, 2048, 24, 1500, 0, 0.0),  // several p·V stretches
        (256, 4, 1, 2560, 24, 2048, 512, 0.0), // Gemma 3's window deep in the cache
        (192, 3, 1, 512, 16, 100, 0, 0.0),     // a head size without a compile-time kernel
        (64, 4, 1, 256, 9, 200, 0, 30.0),      // soft-cap
        (64, 4, 2, 512, 17, 450, 37, 0.0),     // a window starting mid-block
        (64, 4, 2, 600, 17, 550, 0, 0.0),      // n_eff = 600, not whole blocks: row kernels
    ];
    for dt in [DType::F32, DType::F16] {
        for &(d, hq, hkv, c, t, n, w, sc) in shapes {
            let cs = attention(&mut r, d, hq, hkv, c, t, n, w, sc, dt);
            let label = cs.label.clone();
            assert!(same(&cs, &host, &label), "{label}: not supported natively");
        }
    }
    // Several sequences in one call on a paged cache: two prompt chunks and a decode step.
    #[rustfmt::skip]
    let seqs: [SeqsShape; 2] = [
        (64, 8, 2, 6, 256, &[(&[1, 4], 12, 400), (&[3], 1, 100), (&[5, 0], 9, 270)], 0, DType::F32),
        (128, 6, 2, 6, 256, &[(&[2, 5], 20, 300), (&[0], 16, 16)], 64, DType::F16),
    ];
    for s in &seqs {
        let cs = attention_seqs(&mut r, s);
        let label = cs.label.clone();
        assert!(same(&cs, &host, &label), "{label}: not supported natively");
    }
}

/// ssm_conv at every split of its sum (fused taps only, 4 rounded + fused, whole 8-groups,
/// 8 + 4 + fused), at model sizes (rows split across the threads) and on padded rows (windows
/// and output rows apart by more than their length), bit for bit on every ISA.
#[test]
fn ssm_conv_edge_shapes_match_reference_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    let mut r = Rng::new(12);
    // (taps, T, channels, sequences)
    #[rustfmt::skip]
    let shapes: &[(i64, i64, i64, i64)] = &[
        (1, 3, 9, 2), (2, 1, 7, 1), (5, 2, 33, 3), (6, 1, 5, 2), (7, 5, 17, 2), (8, 4, 40, 1),
        (9, 3, 16, 2), (12, 2, 8, 1), (13, 9, 100, 2), (17, 1, 3, 1),
        (3, 1, 2048, 4),  // LFM2-like decode step of four sequences
        (4, 1, 8192, 1),  // Qwen3.5-like decode step
        (4, 64, 1024, 1), // a prompt chunk
    ];
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
        let label = c.label.clone();
        assert!(same(&c, &host, &label), "{label}: not supported natively");
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
    let run = |table: &'static BackendTable| {
        let me = Instance::new(table, &host);
        let mut o = vec![f32::NAN; (out_row * t * s) as usize];
        let outs = [mk(&mut o, [n, t, s], [1, out_row, out_row * t])];
        let call = OpCall::new(Op::SsmConv, &ins, &outs, OpParams::default());
        assert_eq!(Status::from_raw((table.compute)(me.ctx, &call)), Status::Ok);
        o
    };
    let want = run(&reference::TABLE);
    for (isa, table) in tables() {
        let got = run(table);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{isa:?} padded rows, element {i}");
        }
    }
}

/// A gated_delta_net case: head size `n`, `h` v heads over `hq` q/k heads, `t` tokens of
/// `s` sequences, a gate per key (`kda`) or per head; unit-length keys and queries as the
/// models give it, decays <= 1, betas in (0, 1).
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

/// gated_delta_net at model sizes (Qwen3.5's decode step and a prompt chunk: heads split
/// across the threads), head sizes whose dots have every kind of leftover, both gate forms,
/// and on operands laid out as the models have them (q, k and v views into one row per
/// token, g and beta interleaved, state blocks apart, output rows padded), with the state
/// updated in place too: bit for bit on every ISA.
#[test]
fn gated_delta_net_edge_shapes_match_reference_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    let mut r = Rng::new(13);
    // (head size, v heads, q/k heads, tokens, sequences, a gate per key)
    #[rustfmt::skip]
    let shapes: &[(i64, i64, i64, i64, i64, bool)] = &[
        (128, 32, 16, 1, 4, false), // Qwen3.5-like decode step of four sequences
        (128, 4, 2, 64, 1, false),  // a prompt chunk
        (1, 3, 1, 5, 2, false), (3, 2, 2, 4, 1, true), (7, 2, 1, 3, 3, false),
        (36, 2, 2, 2, 2, true), (72, 1, 1, 3, 1, false), (100, 2, 1, 2, 1, true),
        (256, 1, 1, 2, 1, false), (64, 6, 3, 9, 2, true), (5, 2, 1, 0, 2, false),
    ];
    for &(n, h, hq, t, s, kda) in shapes {
        let c = gdn_case(&mut r, n, h, hq, t, s, kda);
        let label = c.label.clone();
        assert!(same(&c, &host, &label), "{label}: not supported natively");
    }
    // Views: a token's row holds q, k, v and 3 floats more; g and beta alternate per token;
    // each sequence's state block is 11 floats after the last; output rows are 2 apart.
    let (n, h, hk, t, s) = (40i64, 4i64, 2i64, 3i64, 2i64);
    let row = 2 * hk * n + h * n + 3;
    let mut qkv = r.vec((row * t * s) as usize, 0.2);
    let mut gb: Vec<f32> = r
        .vec((2 * h * t * s) as usize, 0.5)
        .iter()
        .map(|x| -x.abs())
        .collect();
    for (i, x) in gb.iter_mut().enumerate() {
        if (i as i64 / h) % 2 == 1 {
            *x = -*x / 2.0;
        }
    }
    let st_seq = n * n * h + 11;
    let st0 = r.vec((st_seq * s) as usize, 0.3);
    let o_row = n + 2;
    let mk = |p: *mut f32, off: i64, ne: [i64; 4], nb: [i64; 4]| {
        let mut d =
            TensorDesc::contiguous(p.wrapping_add(off as usize) as *mut u8, DType::F32, &ne);
        d.nb = nb.map(|b| b * 4);
        d
    };
    let (pq, pg) = (qkv.as_mut_ptr(), gb.as_mut_ptr());
    let tok = [1, n, row, row * t];
    let gbs = [1, 1, 2 * h, 2 * h * t];
    let run = |table: &'static BackendTable, in_place: bool| {
        let me = Instance::new(table, &host);
        let mut st = st0.clone();
        let mut o = vec![f32::NAN; (o_row * h * t * s) as usize];
        let mut st2 = vec![f32::NAN; (n * n * h * s) as usize];
        let state = mk(st.as_mut_ptr(), 0, [n, n, h, s], [1, n, n * n, st_seq]);
        let ins = [
            mk(pq, 0, [n, hk, t, s], tok),
            mk(pq, hk * n, [n, hk, t, s], tok),
            mk(pq, 2 * hk * n, [n, h, t, s], tok),
            mk(pg, 0, [1, h, t, s], gbs),
            mk(pg, h, [1, h, t, s], gbs),
            state,
        ];
        let new_state = if in_place {
            state
        } else {
            mk(st2.as_mut_ptr(), 0, [n, n, h, s], [1, n, n * n, n * n * h])
        };
        let outs = [
            mk(
                o.as_mut_ptr(),
                0,
                [n, h, t, s],
                [1, o_row, o_row * h, o_row * h * t],
            ),
            new_state,
        ];
        let call = OpCall::new(Op::GatedDeltaNet, &ins, &outs, OpParams::default());
        assert_eq!(Status::from_raw((table.compute)(me.ctx, &call)), Status::Ok);
        (o, st, st2)
    };
    for in_place in [false, true] {
        let want = run(&reference::TABLE, in_place);
        if in_place {
            // The same output, and the new state where the state was (the gaps kept).
            let apart = run(&reference::TABLE, false);
            assert_eq!(
                want.0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                apart.0.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            for q in 0..s as usize {
                let (a, b) = (q * st_seq as usize, q * (n * n * h) as usize);
                assert_eq!(
                    want.1[a..a + (n * n * h) as usize],
                    apart.2[b..b + (n * n * h) as usize]
                );
                assert_eq!(
                    want.1[a + (n * n * h) as usize..a + st_seq as usize],
                    st0[a + (n * n * h) as usize..a + st_seq as usize]
                );
            }
        } else {
            assert_eq!(want.1, st0, "the state is read only");
        }
        for (isa, table) in tables() {
            let got = run(table, in_place);
            for (k, (g, w)) in [(&got.0, &want.0), (&got.1, &want.1), (&got.2, &want.2)]
                .into_iter()
                .enumerate()
            {
                for (i, (a, b)) in g.iter().zip(w.iter()).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{isa:?} views (in place: {in_place}), buffer {k}, element {i}"
                    );
                }
            }
        }
    }
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
    for row in kk.chunks_mut(n as usize) {
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

/// rwkv_wkv7 at model sizes (RWKV-7 1.5B's 32 heads of 64: a decode step of four sequences,
/// a prompt chunk; heads split across the threads), head sizes with leftovers past the
/// 64-element steps, no tokens, and the state updated in place: bit for bit on every ISA.
#[test]
fn rwkv_wkv7_edge_shapes_match_reference_bit_for_bit() {
    let host = reference::scoped_threads_host(2);
    let mut r = Rng::new(14);
    // (head size, heads, tokens, sequences)
    #[rustfmt::skip]
    let shapes: &[(i64, i64, i64, i64)] = &[
        (64, 32, 1, 4), (64, 8, 64, 1), (128, 2, 5, 2),
        (1, 3, 5, 2), (5, 2, 4, 1), (16, 2, 3, 3), (65, 1, 3, 1), (100, 2, 2, 1),
        (64, 2, 0, 2),
    ];
    for &(n, h, t, s) in shapes {
        let c = wkv7_case(&mut r, n, h, t, s);
        let label = c.label.clone();
        assert!(same(&c, &host, &label), "{label}: not supported natively");
    }
    // In place: new_state is the state operand, on the reference and every ISA.
    let c = wkv7_case(&mut r, 64, 4, 3, 2);
    let run = |table: &'static BackendTable| {
        let me = Instance::new(table, &host);
        let mut c = c.clone();
        let ins: Vec<_> = c.inputs.iter_mut().map(|t| t.desc()).collect();
        let mut outs: Vec<_> = c.outputs.iter_mut().map(|t| t.desc()).collect();
        outs[1] = ins[6];
        let call = OpCall::new(Op::RwkvWkv7, &ins, &outs, OpParams::default());
        assert_eq!(Status::from_raw((table.compute)(me.ctx, &call)), Status::Ok);
        (c.outputs[0].data.clone(), c.inputs[6].data.clone())
    };
    let want = run(&reference::TABLE);
    let mut apart = c.clone();
    let (_, out) = Instance::new(&reference::TABLE, &host).run(&mut apart);
    assert_eq!((&want.0, &want.1), (&out[0], &out[1]));
    for (isa, table) in tables() {
        assert!(run(table) == want, "{isa:?}: in place");
    }
}
