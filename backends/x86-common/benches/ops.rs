//! Op micro-benchmarks (criterion) for the non-matmul kernel families, through each native
//! backend's function table as the engine calls it: attention (decode against a deep cache,
//! a prompt chunk, a sliding window), rms_norm, rope, glu (SiLU and GELU), softmax, on the
//! shapes of SmolLM2-135M / Qwen2.5-1.5B, 2 threads of the engine's pool. The reference backend runs beside them
//! on the small shapes (it is the spec, not a contender).
//! `cargo bench -p mollm-x86-common --bench ops [-- FILTER]`

use abi::{BackendTable, DType, Op, OpParams, GLU_GELU_TANH, GLU_SILU, ROPE_NEOX};
use conformance::cases::{attention, Case, Owned, Rng};
use conformance::Instance;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mollm_x86_common::{Isa, HEADER_AVX2, HEADER_AVX512};

/// The backends measured: every native ISA this CPU runs, then the reference.
fn tables() -> Vec<(&'static str, &'static BackendTable)> {
    let mut v = Vec::new();
    for (name, isa, h) in [
        ("avx2", Isa::Avx2, &HEADER_AVX2),
        ("avx512", Isa::Avx512, &HEADER_AVX512),
    ] {
        if isa.detected() {
            // SAFETY: the headers' tables are statics.
            v.push((name, unsafe { &*h.table }));
        }
    }
    v.push(("reference", &reference::TABLE));
    v
}

fn unary(op: Op, x: Owned, extra: Vec<Owned>, p: OpParams, label: String) -> Case {
    let shape = x.shape.clone();
    let mut inputs = vec![x];
    inputs.extend(extra);
    Case {
        op,
        label,
        inputs,
        outputs: vec![Owned::zeros(DType::F32, &shape)],
        params: p,
    }
}

/// The cases: (group, case, elements for the throughput line, whether the reference runs it).
fn cases() -> Vec<(&'static str, Case, u64, bool)> {
    let mut r = Rng::new(17);
    let mut v = Vec::new();
    // Attention, SmolLM2's heads (d 64, 9 query heads on 3 KV heads), the 1.5B's (d 128, 12
    // on 2) and Gemma 3 270M's (d 256, 4 on 1): one decode row at 512 and 2048 cached rows, a
    // 64-token prompt chunk, a 512-row sliding window deep in the cache. Elements: cached rows
    // x query heads.
    for (d, hq, hkv, cache, t, n_kv, window, refr) in [
        (64, 9, 3, 512, 1, 512, 0, true),
        (64, 9, 3, 2048, 1, 2048, 0, false),
        (128, 12, 2, 2048, 1, 2048, 0, false),
        (128, 12, 2, 256, 1, 256, 0, false),
        (128, 12, 2, 512, 1, 512, 0, false),
        (128, 12, 2, 2048, 64, 2048, 0, false),
        (64, 9, 3, 512, 64, 512, 0, false),
        (64, 14, 2, 512, 512, 512, 0, false),
        (64, 9, 3, 2048, 1, 2048, 512, false),
        (256, 4, 1, 2048, 1, 2048, 0, false),
        (256, 4, 1, 2048, 1, 2048, 512, false),
    ] {
        let c = attention(&mut r, d, hq, hkv, cache, t, n_kv, window, 0.0, DType::F32);
        v.push(("attention", c, (n_kv * hq * t) as u64, refr));
    }
    let p = abi::RmsNormAttrs { eps: 1e-5 }.to_params();
    for (k, rows) in [(576i64, 1i64), (1536, 64)] {
        let x = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 2.0));
        let w = Owned::f32(&[k], &r.vec(k as usize, 1.0));
        let label = format!("k={k} rows={rows}");
        v.push((
            "rms_norm",
            unary(Op::RmsNorm, x, vec![w], p, label),
            (k * rows) as u64,
            rows == 1,
        ));
    }
    let p = abi::RopeAttrs::new(ROPE_NEOX, 64, 10000.0, 4096).to_params();
    for rows in [1i64, 64] {
        let (d, h) = (64i64, 9i64);
        let x = Owned::f32(&[d, h, rows], &r.vec((d * h * rows) as usize, 1.0));
        let pos: Vec<i32> = (0..rows as i32).map(|i| 100 + i).collect();
        let label = format!("d={d} h={h} t={rows}");
        let c = unary(Op::Rope, x, vec![Owned::i32(&pos)], p, label);
        v.push(("rope", c, (d * h * rows) as u64, rows == 1));
    }
    for (act, name) in [(GLU_SILU, "silu"), (GLU_GELU_TANH, "gelu")] {
        let p = abi::GluAttrs { act }.to_params();
        let (k, rows) = (8960i64, 4i64);
        let g = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 3.0));
        let u = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 1.0));
        let c = unary(Op::Glu, g, vec![u], p, format!("{name} k={k} rows={rows}"));
        v.push(("glu", c, (k * rows) as u64, true));
    }
    let p = abi::ScaleAttrs { s: 1.0 }.to_params();
    let (k, rows) = (49152i64, 1i64);
    let x = Owned::f32(&[k, rows], &r.vec((k * rows) as usize, 4.0));
    let c = unary(Op::Softmax, x, vec![], p, format!("k={k} rows={rows}"));
    v.push(("softmax", c, k as u64, true));
    v
}

fn ops(c: &mut Criterion) {
    // The engine's pool, as a model runs: its workers and their per-thread scratch persist
    // between calls (scoped threads would spawn two threads and fault in fresh scratch pages
    // per call, more than a decode step's attention takes).
    let pool = engine::pool::Pool::new(2).unwrap();
    let host = pool.host_api();
    let backends: Vec<_> = tables()
        .into_iter()
        .map(|(n, t)| (n, Instance::open(t, &host).expect("init")))
        .collect();
    for (group, mut case, elems, refr) in cases() {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(elems));
        for (name, inst) in &backends {
            if *name == "reference" && !refr {
                continue;
            }
            g.bench_function(BenchmarkId::new(*name, &case.label), |b| {
                b.iter(|| inst.run(&mut case).expect("computed"))
            });
        }
        g.finish();
    }
    kv_layouts(c, &backends);
}

/// The 1.5B's decode attention 2048 deep on the same K and V values stored two ways: by
/// position (`[d, heads, rows]` contiguous, the engine's pool before it went by head: one
/// task's rows are 512-byte pieces 1 KiB apart) and by KV head (the engine's pool,
/// `CacheTensor::desc`: each head's rows contiguous).
fn kv_layouts(c: &mut Criterion, backends: &[(&'static str, Instance)]) {
    let mut r = Rng::new(5);
    let (d, hq, hkv, rows) = (128i64, 12i64, 2i64, 2048i64);
    let mut case = attention(&mut r, d, hq, hkv, rows, 1, rows, 0, 0.0, DType::F32);
    // The same K and V values stored by head: element (i, h, j) at (h * rows + j) * d + i.
    let by_head = |t: &Owned| {
        let (d, hkv, rows) = (d as usize, hkv as usize, rows as usize);
        let mut out = t.data.clone();
        for h in 0..hkv {
            for j in 0..rows {
                let (from, to) = ((j * hkv + h) * d * 4, (h * rows + j) * d * 4);
                out[to..to + d * 4].copy_from_slice(&t.data[from..from + d * 4]);
            }
        }
        out
    };
    let (k_pos, v_pos) = (case.inputs[1].data.clone(), case.inputs[2].data.clone());
    let (k_head, v_head) = (by_head(&case.inputs[1]), by_head(&case.inputs[2]));
    let mut g = c.benchmark_group("attention_kv_layout");
    g.throughput(Throughput::Elements((rows * hq) as u64));
    for (name, inst) in backends.iter().filter(|(n, _)| *n != "reference") {
        let mut results = Vec::new();
        for head_major in [false, true] {
            let (k, v) = match head_major {
                false => (&k_pos, &v_pos),
                true => (&k_head, &v_head),
            };
            case.inputs[1].data.copy_from_slice(k);
            case.inputs[2].data.copy_from_slice(v);
            let mut ins: Vec<_> = case.inputs.iter_mut().map(|t| t.desc()).collect();
            if head_major {
                for kv in &mut ins[1..3] {
                    kv.nb[1] = rows * d * 4;
                    kv.nb[2] = d * 4;
                }
            }
            let outs: Vec<_> = case.outputs.iter_mut().map(|t| t.desc()).collect();
            let call = abi::OpCall::new(case.op, &ins, &outs, case.params);
            let label = if head_major {
                "by KV head"
            } else {
                "by position"
            };
            g.bench_function(BenchmarkId::new(*name, label), |b| {
                b.iter(|| {
                    let st = (inst.table.compute)(inst.ctx, &call);
                    assert_eq!(abi::Status::from_raw(st), abi::Status::Ok);
                })
            });
            results.push(case.outputs[0].data.clone());
        }
        // The same values whichever way they are laid out: the same bits out.
        assert_eq!(results[0], results[1], "{name}: the two layouts differ");
    }
    g.finish();
}

criterion_group!(benches, ops);
criterion_main!(benches);
