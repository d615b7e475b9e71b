//! Bit-exact agreement with the `gguf` Python package (scripts/quant_fixtures.py).
use abi::DType;
use quant::*;
use serde_json::Value;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn f32s(s: &str) -> Vec<u32> {
    (0..s.len())
        .step_by(8)
        .map(|i| u32::from_str_radix(&s[i..i + 8], 16).unwrap())
        .collect()
}

fn fixtures() -> Vec<(DType, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/quant");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).expect("fixtures/quant (run scripts/quant_fixtures.py)") {
        let p = e.unwrap().path();
        if p.extension().and_then(|s| s.to_str()) != Some("json") || p.ends_with("ggml_c.json") {
            continue;
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let dt = DType::from_name(v["dtype"].as_str().unwrap()).unwrap();
        out.push((dt, v));
    }
    out.sort_by_key(|(d, _)| d.id());
    out
}

#[test]
fn dequantize_matches_gguf_bit_exactly() {
    let fx = fixtures();
    assert!(
        fx.len() >= 13,
        "expected fixtures for 13 formats, found {}",
        fx.len()
    );
    for (dt, v) in &fx {
        for row in v["dequantize"].as_array().unwrap() {
            let n = row["n"].as_u64().unwrap() as usize;
            let bytes = hex(row["bytes"].as_str().unwrap());
            let want = f32s(row["values"].as_str().unwrap());
            let mut got = vec![0f32; n];
            dequantize_row(*dt, &bytes, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // NaN payloads aside, demand identical bits.
                let same = g.to_bits() == *w || (g.is_nan() && f32::from_bits(*w).is_nan());
                assert!(
                    same,
                    "{dt} {}: element {i}: got {g} want {}",
                    row["source"],
                    f32::from_bits(*w)
                );
            }
        }
    }
}

#[test]
fn quantize_matches_gguf_bit_exactly() {
    let mut checked = 0;
    for (dt, v) in fixtures() {
        for row in v["quantize"].as_array().unwrap() {
            let input: Vec<f32> = f32s(row["input"].as_str().unwrap())
                .into_iter()
                .map(f32::from_bits)
                .collect();
            let want = hex(row["bytes"].as_str().unwrap());
            let mut got = vec![0u8; want.len()];
            quantize_row(dt, &input, &mut got).unwrap();
            assert_eq!(got, want, "{dt}: quantize_row differs from gguf");
            checked += 1;
        }
    }
    assert!(checked >= 12, "only {checked} quantize fixtures");
}

fn ggml_c() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/quant/ggml_c.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixtures/quant/ggml_c.json")).unwrap()
}

/// K-quant (and Q8_1) reference quantizers against llama.cpp's own C, compiled from source.
#[test]
fn quantize_matches_ggml_c_bit_exactly() {
    let v = ggml_c();
    let rows = v["quantize"].as_array().unwrap();
    assert!(rows.len() >= 14);
    for row in rows {
        let dt = DType::from_name(row["dtype"].as_str().unwrap()).unwrap();
        let input: Vec<f32> = f32s(row["input"].as_str().unwrap())
            .into_iter()
            .map(f32::from_bits)
            .collect();
        let want = hex(row["bytes"].as_str().unwrap());
        let mut got = vec![0u8; want.len()];
        quantize_row(dt, &input, &mut got).unwrap();
        if got != want {
            let bb = dt.info().block_bytes as usize;
            let blk = got
                .chunks(bb)
                .zip(want.chunks(bb))
                .position(|(a, b)| a != b)
                .unwrap();
            let byte = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
            panic!("{dt}: quantize_row differs from ggml C in block {blk}, first byte {byte}");
        }
    }
}

/// K-quant dot products against ggml's generic C kernels: bit-identical f32 results. The
/// 32-element formats' `vec_dot` follows the x86 kernels instead (their sum order differs from
/// the generic one); tests/x86_exact_legacy.rs holds them to llama.cpp's x86 build.
#[test]
fn vec_dot_matches_ggml_c_bit_exactly() {
    let v = ggml_c();
    let rows = v["vec_dot"].as_array().unwrap();
    assert!(rows.len() >= 20);
    for row in rows {
        let dt = DType::from_name(row["dtype"].as_str().unwrap()).unwrap();
        if matches!(
            dt,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0
        ) {
            continue;
        }
        let n = row["n"].as_u64().unwrap() as usize;
        let w = hex(row["w"].as_str().unwrap());
        let a = hex(row["act"].as_str().unwrap());
        let want = f32::from_bits(f32s(row["result"].as_str().unwrap())[0]);
        let got = vec_dot(dt, n, &w, &a);
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{dt}: vec_dot {got} vs ggml {want}"
        );
    }
}
