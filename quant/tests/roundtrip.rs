mod common;
use abi::DType;
use common::Rng;
use quant::*;

const WEIGHTS: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::BF16,
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
];

/// Relative RMS error bound of quantize→dequantize on Gaussian data.
fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F32 => 0.0,
        DType::F16 => 1e-3,
        DType::BF16 => 5e-3,
        DType::Q8_0 | DType::Q8_1 | DType::Q8_K => 0.01,
        DType::Q6_K => 0.03,
        DType::Q5_0 | DType::Q5_1 | DType::Q5_K => 0.06,
        DType::Q4_0 | DType::Q4_1 | DType::Q4_K => 0.12,
        DType::Q3_K => 0.25,
        DType::Q2_K => 0.45,
        _ => unreachable!(),
    }
}

fn quantized(dt: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; row_bytes(dt, x.len()).unwrap()];
    quantize_row(dt, x, &mut q).unwrap();
    q
}

fn dequantized(dt: DType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(dt, q, &mut y).unwrap();
    y
}

fn rel_rms(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| ((x - y) as f64).powi(2))
        .sum();
    let den: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn round_trip_error_is_bounded() {
    let mut rng = Rng::new(1);
    let all: Vec<DType> = WEIGHTS
        .iter()
        .copied()
        .chain([DType::Q8_1, DType::Q8_K])
        .collect();
    for &dt in &all {
        let x = rng.normals(1024, 0.7);
        let y = dequantized(dt, &quantized(dt, &x), x.len());
        let e = rel_rms(&x, &y);
        assert!(e <= tolerance(dt), "{dt}: relative rms error {e}");
        // zeros stay zeros
        let z = vec![0f32; 512];
        let yz = dequantized(dt, &quantized(dt, &z), 512);
        assert!(yz.iter().all(|&v| v == 0.0), "{dt}: zeros do not survive");
    }
}

#[test]
fn sizes_are_checked() {
    let mut out = vec![0u8; 17];
    assert!(matches!(
        quantize_row(DType::Q4_0, &[0.0; 32], &mut out),
        Err(QuantError::Size { .. })
    ));
    assert!(dequantize_row(DType::Q4_K, &[0u8; 144], &mut [0f32; 255]).is_err());
    assert_eq!(row_bytes(DType::Q6_K, 512), Some(420));
    assert_eq!(row_bytes(DType::Q4_0, 33), None);
    assert!(matches!(
        dequantize_row(DType::I32, &[0u8; 4], &mut [0f32; 1]),
        Err(QuantError::Unsupported { .. })
    ));
}

#[test]
fn vec_dot_types_match_ggml_cpu() {
    use DType::*;
    for (w, a) in [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (Q4_0, Q8_0),
        (Q5_0, Q8_0),
        (Q8_0, Q8_0),
        (Q4_1, Q8_1),
        (Q5_1, Q8_1),
        (Q2_K, Q8_K),
        (Q3_K, Q8_K),
        (Q4_K, Q8_K),
        (Q5_K, Q8_K),
        (Q6_K, Q8_K),
    ] {
        assert_eq!(vec_dot_type(w), a, "{w}");
    }
}

/// Block of 32 with max 127 so `id = 127/max = 1` exactly: quants are the inputs rounded.
fn halfway_block() -> Vec<f32> {
    let mut x = vec![0f32; 32];
    let probes = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -3.5, 4.5, 127.0];
    x[..probes.len()].copy_from_slice(&probes);
    x
}

#[test]
fn q8_activations_round_half_to_even_like_x86() {
    let x = halfway_block();
    let even = [0i8, 2, 2, 0, -2, -2, 126, -4, 4, 127];
    let away = [1i8, 2, 3, -1, -2, -3, 127, -4, 5, 127];

    for dt in [DType::Q4_0, DType::Q5_0, DType::Q8_0] {
        let mut a = vec![0u8; 34];
        quantize_activations(dt, &x, &mut a).unwrap();
        let b = BlockQ8_0::read(&a);
        assert_eq!(
            &b.qs[..10],
            &even,
            "{dt}: x86 quantize_row_q8_0 rounds half to even"
        );
        assert_eq!(b.d.to_f32(), 1.0);
    }
    for dt in [DType::Q4_1, DType::Q5_1] {
        let mut a = vec![0u8; 36];
        quantize_activations(dt, &x, &mut a).unwrap();
        let b = BlockQ8_1::read(&a);
        assert_eq!(&b.qs[..10], &even);
        let sum: i32 = even.iter().map(|&q| q as i32).sum();
        assert_eq!(b.s.to_f32(), sum as f32, "s = d * sum(q) with d = 1");
    }
    // The reference quantizer (model files) keeps roundf: half away from zero.
    let r = quantize_q8_0_ref(&x);
    assert_eq!(&r.qs[..10], &away);
    let r1 = quantize_q8_1_ref(&x);
    assert_eq!(&r1.qs[..10], &away);

    // Q8_K (x86 uses the _ref) rounds with nearest_int: ties to even. max = 127 -> iscale = -1.
    let mut xk = vec![0f32; 256];
    xk[..10].copy_from_slice(&x[..10]);
    let k = quantize_q8_k(&xk);
    assert_eq!(k.d, -1.0);
    let negated: Vec<i8> = even.iter().map(|&q| -q).collect();
    assert_eq!(&k.qs[..10], &negated[..]);
    assert_eq!(
        k.bsums[0] as i32,
        negated.iter().map(|&q| q as i32).sum::<i32>()
    );
}

#[test]
fn x86_q8_0_scale_is_127_over_max() {
    // 127/max and 1/(max/127) differ in the last bit for many max; check we use the former.
    let mut rng = Rng::new(7);
    let mut differs = 0;
    for _ in 0..2000 {
        let x = rng.normals(32, 1.0);
        let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let b = quantize_q8_0_x86(&x);
        for (q, &v) in b.qs.iter().zip(&x) {
            assert_eq!(*q, (v * (127.0 / max)).round_ties_even() as i8);
        }
        if 127.0 / max != 1.0 / (max / 127.0) {
            differs += 1;
        }
        assert_eq!(b.d.to_f32(), half::f16::from_f32(max / 127.0).to_f32());
    }
    assert!(differs > 0);
}

#[test]
fn bf16_rounding_and_nan() {
    assert_eq!(f32_to_bf16(1.0), 0x3f80);
    assert_eq!(
        f32_to_bf16(f32::from_bits(0x3f80_8000)),
        0x3f80,
        "tie to even (down)"
    );
    assert_eq!(
        f32_to_bf16(f32::from_bits(0x3f81_8000)),
        0x3f82,
        "tie to even (up)"
    );
    assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert_eq!(
        f32_to_bf16(f32::from_bits(0x7f80_0001)),
        0x7fc0,
        "signalling NaN made quiet"
    );
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    assert_eq!(f32_to_bf16(f32::MAX), 0x7f80, "overflow rounds to inf");
}

fn check_dot(dt: DType, n: usize, rng: &mut Rng) {
    let w = rng.normals(n, 0.5);
    let x = rng.normals(n, 1.0);
    let wq = quantized(dt, &w);
    let vt = vec_dot_type(dt);
    let mut aq = vec![0u8; row_bytes(vt, n).unwrap()];
    quantize_activations(dt, &x, &mut aq).unwrap();
    let got = vec_dot(dt, n, &wq, &aq) as f64;

    // Tight: against the dequantized operands (only float rounding differs).
    let wd = dequantized(dt, &wq, n);
    let ad = dequantized(vt, &aq, n);
    let exact: f64 = wd.iter().zip(&ad).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag: f64 = wd
        .iter()
        .zip(&ad)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    // Q4_1/Q5_1 use the f16-rounded `s`, so allow f16 rounding of the mins term there.
    let tight = match dt {
        DType::Q4_1 | DType::Q5_1 => 2e-3,
        _ => 1e-5,
    };
    assert!(
        (got - exact).abs() <= tight * mag + 1e-6,
        "{dt} n={n}: vec_dot {got} vs dequantized {exact} (mag {mag})"
    );

    // Loose: against the f32 inputs, within the format's error.
    let truth: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
    let loose = 4.0 * (tolerance(dt) + 0.01) * (n as f64).sqrt() * 0.5;
    assert!(
        (got - truth).abs() <= loose,
        "{dt} n={n}: vec_dot {got} vs f32 dot {truth}"
    );
}

#[test]
fn vec_dot_agrees_with_dequantized_dot() {
    let mut rng = Rng::new(3);
    for &dt in WEIGHTS {
        let legacy = dt.info().block_len == 32;
        let ns: &[usize] = if legacy || !dt.info().quantized {
            &[32, 256, 512]
        } else {
            &[256, 512]
        };
        for &n in ns {
            for _ in 0..5 {
                check_dot(dt, n, &mut rng);
            }
        }
    }
}

#[test]
fn block_round_trips_through_bytes() {
    let mut rng = Rng::new(9);
    let x = rng.normals(256, 1.0);
    let b = quantize_q4_k(&x);
    let mut bytes = [0u8; 144];
    b.write(&mut bytes);
    assert_eq!(BlockQ4K::read(&bytes), b);
    let mut via_api = vec![0u8; 144];
    quantize_row(DType::Q4_K, &x, &mut via_api).unwrap();
    assert_eq!(&via_api[..], &bytes[..]);
    let k = quantize_q8_k(&x);
    let mut kb = [0u8; 292];
    k.write(&mut kb);
    assert_eq!(BlockQ8K::read(&kb), k);
}

#[test]
fn fp16_conversion_is_exact_for_all_halves() {
    for b in 0..=u16::MAX {
        let want = half::f16::from_bits(b).to_f32();
        let got = fp16_to_f32(b);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{b:#06x}: {got} vs {want}"
        );
        if got.is_nan() {
            assert_eq!(got.to_bits() >> 22 & 1, want.to_bits() >> 22 & 1);
        }
    }
}
