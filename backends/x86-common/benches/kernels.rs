//! Kernel micro-benchmarks (criterion): GEMV (one activation column) and GEMM (several) of
//! the x86 SIMD kernels for every format and kernel kind, and the activation conversion.
//! `cargo bench -p mollm-x86-common --bench kernels [-- FILTER]`

use abi::DType;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mollm_x86_common::{actq, dot_rows, dot_tile, Isa};
use quant::Kernel;

fn rand_f32(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

struct Case {
    dt: DType,
    kernel: Kernel,
    k: usize,
    n: usize,
    w: Vec<u8>,
    act: Vec<u8>,
    ab: usize,
    x: Vec<f32>,
}

fn case(seed: &mut u64, dt: DType, kernel: Kernel, k: usize, n: usize, cols: usize) -> Case {
    let rb = quant::row_bytes(dt, k).unwrap();
    let mut w = vec![0u8; rb * n];
    let src = rand_f32(seed, k * n);
    for (r, row) in w.chunks_exact_mut(rb).enumerate() {
        quant::quantize_row(dt, &src[r * k..(r + 1) * k], row).unwrap();
    }
    let ab = quant::row_bytes(quant::vec_dot_type(dt), k).unwrap();
    let x = rand_f32(seed, k * cols);
    let mut act = vec![0u8; ab * cols];
    for c in 0..cols {
        quant::quantize_activations_for(
            kernel,
            dt,
            &x[c * k..(c + 1) * k],
            &mut act[c * ab..(c + 1) * ab],
        )
        .unwrap();
    }
    Case {
        dt,
        kernel,
        k,
        n,
        w,
        act,
        ab,
        x,
    }
}

fn isas() -> Vec<Isa> {
    [Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|i| i.detected())
        .collect()
}

/// Shapes of SmolLM2-135M (Q4_1/Q8_0), Qwen2.5-0.5B (Q5_0/Q6_K) and Qwen2.5-1.5B (Q4_K/Q6_K).
const SHAPES: &[(DType, Kernel, Kernel, usize, usize)] = &[
    (DType::Q4_1, Kernel::VecDot, Kernel::VecDot, 576, 1536),
    (DType::Q8_0, Kernel::VecDot, Kernel::TinyBlas, 576, 1536),
    (DType::Q5_0, Kernel::VecDot, Kernel::TinyBlas, 896, 4864),
    (DType::Q6_K, Kernel::VecDot, Kernel::Tiled, 4864, 896),
    (
        DType::Q4_K,
        Kernel::RepackGemv,
        Kernel::RepackGemm,
        1536,
        1536,
    ),
    (DType::Q4_K, Kernel::VecDot, Kernel::Tiled, 1536, 1536),
];

fn gemv(c: &mut Criterion) {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut g = c.benchmark_group("gemv");
    g.sample_size(20);
    for &(dt, kv, _, k, n) in SHAPES {
        let cs = case(&mut seed, dt, kv, k, n, 1);
        g.throughput(Throughput::Bytes(cs.w.len() as u64));
        for isa in isas() {
            let id = BenchmarkId::new(
                format!("{isa:?}/{}/{:?}", cs.dt, cs.kernel),
                format!("{k}x{n}"),
            );
            let mut out = vec![0f32; cs.n];
            g.bench_function(id, |b| {
                b.iter(|| dot_rows(isa, cs.kernel, cs.dt, cs.k, &cs.w, &cs.act, &mut out))
            });
        }
    }
    g.finish();
}

fn gemm(c: &mut Criterion) {
    let mut seed = 0x0bad_5eed_1234_5678u64;
    let mut g = c.benchmark_group("gemm");
    g.sample_size(10);
    let cols = 64;
    for &(dt, _, km, k, n) in SHAPES {
        let n = n.min(1536);
        let cs = case(&mut seed, dt, km, k, n, cols);
        g.throughput(Throughput::Elements((k * n * cols) as u64));
        let kernels = vec![km; cols];
        for isa in isas() {
            let id = BenchmarkId::new(
                format!("{isa:?}/{}/{:?}", cs.dt, km),
                format!("{k}x{n}x{cols}"),
            );
            let mut out = vec![0f32; n * cols];
            g.bench_function(id, |b| {
                b.iter(|| dot_tile(isa, &kernels, cs.dt, cs.k, &cs.w, &cs.act, &mut out))
            });
        }
    }
    g.finish();
}

fn activations(c: &mut Criterion) {
    let mut seed = 0x5eed_0000_0000_0001u64;
    let mut g = c.benchmark_group("activations");
    let k = 1536;
    for (dt, kernel) in [
        (DType::Q4_1, Kernel::VecDot),
        (DType::Q8_0, Kernel::TinyBlas),
        (DType::Q4_K, Kernel::Tiled),
    ] {
        let cs = case(&mut seed, dt, kernel, k, 1, 1);
        let mut dst = vec![0u8; cs.ab];
        g.throughput(Throughput::Elements(k as u64));
        g.bench_function(BenchmarkId::new("scalar", format!("{dt}")), |b| {
            b.iter(|| quant::quantize_activations_for(kernel, dt, &cs.x, &mut dst).unwrap())
        });
        if Isa::Avx2.detected() {
            g.bench_function(BenchmarkId::new("simd", format!("{dt}")), |b| {
                // SAFETY: AVX2/FMA/F16C detected; dst sized for the row.
                b.iter(|| assert!(unsafe { actq::quantize_row(kernel, dt, &cs.x, &mut dst) }))
            });
        }
    }
    g.finish();
}

/// Rows `0..n` of a Q6_K weight by `C` columns, `R` rows at a time, or with `R == 0` through
/// `vecdot_q6k_pair_cols` (compiled for AVX-512 as the backend's own callers are).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_rows<const R: usize, const C: usize>(
    w: &[u8],
    rb: usize,
    n: usize,
    a: *const u8,
    as_: usize,
    nb: usize,
) -> f32 {
    let mut s = 0f32;
    if R == 0 {
        // the two-row kernel
        for r in (0..n).step_by(2) {
            let v = mollm_x86_common::kq512::vecdot_q6k_pair_cols::<C>(
                w[r * rb..].as_ptr(),
                rb,
                a,
                as_,
                nb,
            );
            s += v.iter().flatten().sum::<f32>();
        }
        return s;
    }
    for r in (0..n).step_by(R) {
        let v =
            mollm_x86_common::kq512::vecdot_q6k_cols::<R, C>(w[r * rb..].as_ptr(), rb, a, as_, nb);
        // Every output is used, so no column's chain is optimised away.
        s += v.iter().flatten().sum::<f32>();
    }
    s
}

/// Decode steps of several sequences on a Q4_K weight repacked into 16-row groups (the
/// 1.5B's layout), larger than the caches: `cols` one-column GEMV chains, in runs of `run`
/// columns sharing each unpacked weight line. Time per call; ideal is flat in `cols`.
fn decode_cols(c: &mut Criterion) {
    if !Isa::Avx512.detected() {
        return;
    }
    let mut seed = 0xdec0_de00_0000_0001u64;
    let mut g = c.benchmark_group("decode_cols");
    g.sample_size(10);
    let (k, n) = (1536, 65536);
    let cs = case(&mut seed, DType::Q4_K, Kernel::RepackGemv, k, n, 8);
    let rb = quant::row_bytes(DType::Q4_K, k).unwrap();
    let mut rp = vec![
        mollm_x86_common::q4k16::Line([0; 64]);
        mollm_x86_common::q4k16::repacked_bytes(k, n) / 64
    ];
    // SAFETY: `Line` is plain bytes.
    let dst = unsafe { std::slice::from_raw_parts_mut(rp.as_mut_ptr() as *mut u8, rp.len() * 64) };
    mollm_x86_common::q4k16::repack(&cs.w, rb, k, n, dst);
    let mut out = vec![0f32; n * 8];
    for (cols, run) in [(1usize, 1usize), (4, 4), (8, 4), (8, 8)] {
        let id = BenchmarkId::new(
            format!("Q4_K repacked, runs of {run}"),
            format!("{k}x{n}x{cols}"),
        );
        g.bench_function(id, |b| {
            b.iter(|| {
                for c0 in (0..cols).step_by(run) {
                    let a = cs.act[c0 * cs.ab..].as_ptr();
                    let o = out[c0 * n..].as_mut_ptr();
                    // SAFETY: AVX-512 detected; the weight is repacked and aligned; `a`
                    // holds `run` Q8_K columns and `o` has room for their outputs.
                    unsafe {
                        use mollm_x86_common::q4k16::columns_avx512 as f;
                        let w = dst.as_ptr();
                        match run {
                            1 => f::<1>(false, w, n / 16, k / 256, a, cs.ab, o, n),
                            4 => f::<4>(false, w, n / 16, k / 256, a, cs.ab, o, n),
                            _ => f::<8>(false, w, n / 16, k / 256, a, cs.ab, o, n),
                        }
                    }
                }
            })
        });
    }
    // Q6_K's one-column chain (the output matrix and some ffn_down), `r` rows by `run`
    // columns sharing each decoded weight block.
    let (k, n) = (1536, 32768);
    let cs = case(&mut seed, DType::Q6_K, Kernel::VecDot, k, n, 8);
    let rb = quant::row_bytes(DType::Q6_K, k).unwrap();
    macro_rules! q6 {
        ($r:literal, $run:literal, $cols:literal) => {
            let rows = match $r {
                0 => "the two-row kernel".to_string(),
                r => format!("{r} rows"),
            };
            let id = BenchmarkId::new(
                format!("Q6_K {rows} x runs of {}", $run),
                format!("{k}x{n}x{}", $cols),
            );
            g.bench_function(id, |b| {
                b.iter(|| {
                    let mut s = 0f32;
                    for c0 in (0..$cols).step_by($run) {
                        let a = cs.act[c0 * cs.ab..].as_ptr();
                        // SAFETY: AVX-512 VNNI detected; the rows and columns exist.
                        s += unsafe { q6_rows::<$r, $run>(&cs.w, rb, n, a, cs.ab, k / 256) };
                    }
                    s
                })
            });
        };
    }
    q6!(2, 1, 1);
    q6!(0, 1, 1);
    q6!(2, 4, 8);
    q6!(0, 4, 8);
    q6!(0, 8, 8);
    g.finish();
}

/// Q4_1 (SmolLM2's FFN shape) in its 16-row groups against the row layout: `cols` columns
/// in runs of `run` sharing each block's unpacked codes (the row layout: `dot_tile`'s column
/// pairs).
fn q4_1_r16(c: &mut Criterion) {
    if !Isa::Avx512.detected() {
        return;
    }
    use mollm_x86_common::legacy16;
    let mut seed = 0x0041_0016_0000_0001u64;
    let mut g = c.benchmark_group("q4_1_r16");
    g.sample_size(20);
    let (k, n) = (576, 1536);
    let cs = case(&mut seed, DType::Q4_1, Kernel::VecDot, k, n, 16);
    let rb = quant::row_bytes(DType::Q4_1, k).unwrap();
    let mut rp = vec![[0u8; 64]; legacy16::repacked_bytes(DType::Q4_1, k, n) / 64];
    // SAFETY: plain bytes, 64-byte lines.
    let dst = unsafe { std::slice::from_raw_parts_mut(rp.as_mut_ptr() as *mut u8, rp.len() * 64) };
    legacy16::repack(DType::Q4_1, &cs.w, rb, k, n, dst);
    let mut out = vec![0f32; n * 16];
    for cols in [1usize, 16] {
        g.throughput(Throughput::Elements((k * n * cols) as u64));
        let kernels = vec![Kernel::VecDot; cols];
        g.bench_function(BenchmarkId::new("rows", format!("{k}x{n}x{cols}")), |b| {
            b.iter(|| {
                dot_tile(
                    Isa::Avx512,
                    &kernels,
                    cs.dt,
                    k,
                    &cs.w,
                    &cs.act[..cs.ab * cols],
                    &mut out[..n * cols],
                )
            })
        });
        for run in [1usize, 2, 4, 8, 16] {
            if run > cols {
                continue;
            }
            let id = BenchmarkId::new(format!("r16, runs of {run}"), format!("{k}x{n}x{cols}"));
            g.bench_function(id, |b| {
                b.iter(|| {
                    for gi in 0..n / 16 {
                        for c0 in (0..cols).step_by(run) {
                            let w =
                                dst[gi * (k / 32) * legacy16::block_bytes(DType::Q4_1)..].as_ptr();
                            let a = cs.act[c0 * cs.ab..].as_ptr();
                            let o = out[c0 * n + gi * 16..].as_mut_ptr();
                            // SAFETY: AVX-512 VNNI detected; the group and columns exist.
                            unsafe {
                                use legacy16::x86::group as f;
                                match run {
                                    1 => f::<1, 1>(w, k / 32, a, cs.ab, o, n, c0 == 0),
                                    2 => f::<1, 2>(w, k / 32, a, cs.ab, o, n, c0 == 0),
                                    4 => f::<1, 4>(w, k / 32, a, cs.ab, o, n, c0 == 0),
                                    8 => f::<1, 8>(w, k / 32, a, cs.ab, o, n, c0 == 0),
                                    _ => f::<1, 16>(w, k / 32, a, cs.ab, o, n, c0 == 0),
                                }
                            }
                        }
                    }
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, gemv, gemm, activations, decode_cols, q4_1_r16);
criterion_main!(benches);
