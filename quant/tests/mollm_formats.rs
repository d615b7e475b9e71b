//! mollm's W4G32 / W4G128 / W8PC formats: quantization error bounds, layout facts the kernels
//! rely on (symmetric codes, one W8PC scale per row), and the dot product against the
//! dequantized values (and the documented float order).

use abi::DType;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn quantized(dt: DType, x: &[f32]) -> Vec<u8> {
    let mut b = vec![0u8; quant::row_bytes(dt, x.len()).unwrap()];
    quant::quantize_row(dt, x, &mut b).unwrap();
    b
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
}

#[test]
fn round_trip_error_is_within_the_format_s_resolution() {
    let mut rng = Lcg(1);
    for (dt, worst) in [
        (DType::W4G32, 0.09f32),
        (DType::W4G128, 0.11),
        (DType::W8PC, 0.009),
    ] {
        let x: Vec<f32> = (0..1024).map(|_| rng.next() * 0.3).collect();
        let q = quantized(dt, &x);
        let mut y = vec![0f32; x.len()];
        quant::dequantize_row(dt, &q, &mut y).unwrap();
        let err: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a - b).collect();
        let rel = rms(&err) / rms(&x);
        eprintln!("{dt}: relative RMS error {rel:.4}");
        assert!(rel < worst, "{dt}: relative RMS error {rel}");
        assert!(rel > worst / 20.0, "{dt}: suspiciously exact ({rel})");
    }
}

#[test]
fn layouts_hold_what_the_kernels_expect() {
    let mut rng = Lcg(2);
    let x: Vec<f32> = (0..256).map(|_| rng.next()).collect();
    // 4-bit groups: the f16 scale, then element j and j + len/2 in one byte; the search
    // never does worse than plain absmax/7 rounding.
    for dt in [DType::W4G32, DType::W4G128] {
        let (bb, bl) = (dt.info().block_bytes as usize, dt.info().block_len as usize);
        let q = quantized(dt, &x);
        let mut y = vec![0f32; x.len()];
        quant::dequantize_row(dt, &q, &mut y).unwrap();
        for ((b, xs), ys) in q.chunks_exact(bb).zip(x.chunks(bl)).zip(y.chunks(bl)) {
            assert_eq!(b.len() - 2, bl / 2);
            let m = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = m / 7.0;
            let naive: f32 = xs.iter().map(|v| (v - (v / d).round() * d).powi(2)).sum();
            let ours: f32 = xs.iter().zip(ys).map(|(a, b)| (a - b).powi(2)).sum();
            assert!(ours <= naive * 1.001, "{dt}: {ours} > {naive}");
        }
    }
    // W8PC: one scale for the whole row, absmax/127; the largest value maps to ±127.
    let q = quantized(DType::W8PC, &x);
    let scales: Vec<&[u8]> = q.chunks_exact(68).map(|b| &b[..4]).collect();
    assert!(scales.windows(2).all(|w| w[0] == w[1]));
    let m = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    assert_eq!(f32::from_le_bytes(scales[0].try_into().unwrap()), m / 127.0);
    assert!(q
        .chunks_exact(68)
        .any(|b| b[4..].iter().any(|&c| c as i8 == 127 || c as i8 == -127)));
    // Zeros stay zeros.
    for dt in [DType::W4G32, DType::W4G128, DType::W8PC] {
        let z = vec![0f32; 128];
        let mut y = vec![1f32; 128];
        quant::dequantize_row(dt, &quantized(dt, &z), &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{dt}");
    }
}

#[test]
fn vec_dot_follows_the_documented_chain() {
    let mut rng = Lcg(3);
    for dt in [DType::W4G32, DType::W4G128, DType::W8PC] {
        for blocks in [1usize, 3, 10] {
            let n = 128 * blocks;
            let w: Vec<f32> = (0..n).map(|_| rng.next() * 0.5).collect();
            let x: Vec<f32> = (0..n).map(|_| rng.next() * 2.0).collect();
            let wq = quantized(dt, &w);
            let vt = quant::vec_dot_type(dt);
            assert_eq!(
                vt,
                if dt == DType::W4G128 {
                    DType::A8G128
                } else {
                    DType::Q8_0
                }
            );
            let mut a = vec![0u8; quant::row_bytes(vt, n).unwrap()];
            quant::quantize_activations(dt, &x, &mut a).unwrap();
            let got = quant::vec_dot(dt, n, &wq, &a);
            // The same chain written out from the dequantized groups.
            let (mut wd, mut ad) = (vec![0f32; n], vec![0f32; n]);
            quant::dequantize_row(dt, &wq, &mut wd).unwrap();
            quant::dequantize_row(vt, &a, &mut ad).unwrap();
            let g = vt.info().block_len as usize;
            let mut lanes = [0f32; 8];
            for (i, (wg, ag)) in wd.chunks(g).zip(ad.chunks(g)).enumerate() {
                let exact: f64 = wg.iter().zip(ag).map(|(&p, &q)| p as f64 * q as f64).sum();
                lanes[i % 8] += exact as f32;
            }
            let approx = quant::mollm::hsum8(&lanes);
            let tol = 1e-4 * (1.0 + approx.abs());
            assert!((got - approx).abs() < tol, "{dt} n={n}: {got} vs {approx}");
            // And against the unquantized product: W4A8 error stays small.
            let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
            let scale = (n as f32).sqrt() * 0.5;
            assert!(
                (got - exact).abs() < 0.1 * scale,
                "{dt} n={n}: {got} vs exact {exact}"
            );
        }
    }
}
