//! Bit-exact agreement with the REAL x86 kernels of this machine's llama.cpp build (AVX-512
//! VNNI, -O3 -march=native) for the legacy formats: `ggml_vec_dot_*` (Q4_0, Q5_0, Q5_1, Q8_0),
//! llamafile tinyBLAS (`llamafile_sgemm`) and the Q4_0 8x8 repack GEMV/GEMM.
//! Fixtures: fixtures/quant/x86_legacy/cases.json, from scripts/quant_x86_fixtures_legacy.py.
use abi::DType;
use quant::*;
use serde_json::Value;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn cases() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/quant/x86_legacy/cases.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixtures/quant/x86_legacy/cases.json"))
        .unwrap()
}

fn bits(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn dtype(v: &Value) -> DType {
    DType::from_name(v["type"].as_str().unwrap()).unwrap()
}

#[test]
fn vec_dot_matches_x86_ggml_bit_exactly() {
    let v = cases();
    let rows = v["vec_dot"].as_array().unwrap();
    assert_eq!(rows.len(), 32);
    for row in rows {
        let (dt, n) = (dtype(row), row["n"].as_u64().unwrap() as usize);
        let (w, a) = (
            hex(row["w"].as_str().unwrap()),
            hex(row["act"].as_str().unwrap()),
        );
        let want = bits(&row["out"])[0];
        let got = vec_dot(dt, n, &w, &a);
        assert_eq!(
            got.to_bits(),
            want,
            "{dt} n={n}: vec_dot {got} vs ggml {}",
            f32::from_bits(want)
        );
        assert_eq!(dot_with(Kernel::VecDot, dt, n, &w, &a).to_bits(), want);
    }
}

#[test]
fn tinyblas_matches_llamafile_sgemm_bit_exactly() {
    let v = cases();
    let mut taken = 0;
    for c in v["tinyblas"].as_array().unwrap() {
        let dt = dtype(c);
        let (m, n, k) = (
            c["m"].as_u64().unwrap() as usize,
            c["n"].as_u64().unwrap() as usize,
            c["k"].as_u64().unwrap() as usize,
        );
        let is_taken = c["taken"].as_bool().unwrap();
        // llamafile_sgemm takes Q4_0/Q5_0/Q8_0 (n >= 2 here), declines Q5_1.
        assert_eq!(
            is_taken,
            dt != DType::Q5_1,
            "{dt}: llamafile_sgemm taken={is_taken}"
        );
        for col in 0..n {
            let want_kernel = if is_taken {
                Kernel::TinyBlas
            } else {
                Kernel::VecDot
            };
            // rows % 8 != 0 keeps Q4_0 out of the repack buffer in every shape but one
            if dt != DType::Q4_0 || m % 8 != 0 {
                assert_eq!(
                    matmul_kernel(dt, k, m, n, col),
                    want_kernel,
                    "{dt} {m}x{n}x{k}"
                );
            }
        }
        if !is_taken {
            continue;
        }
        taken += 1;
        let (w, a, out) = (
            hex(c["w"].as_str().unwrap()),
            hex(c["act"].as_str().unwrap()),
            bits(&c["out"]),
        );
        let (wr, ar) = (
            row_bytes(dt, k).unwrap(),
            row_bytes(DType::Q8_0, k).unwrap(),
        );
        for j in 0..n {
            for i in 0..m {
                let got = dot_with(
                    Kernel::TinyBlas,
                    dt,
                    k,
                    &w[i * wr..(i + 1) * wr],
                    &a[j * ar..(j + 1) * ar],
                );
                let want = out[j * m + i];
                assert_eq!(
                    got.to_bits(),
                    want,
                    "{dt} {m}x{n}x{k} C[{j}][{i}]: {got} vs {}",
                    f32::from_bits(want)
                );
            }
        }
    }
    assert_eq!(taken, 21);
}

#[test]
fn repack_q4_0_matches_ggml_gemv_gemm_bit_exactly() {
    let v = cases();
    for c in v["repack_q4_0"].as_array().unwrap() {
        let (rows, cols, k) = (
            c["rows"].as_u64().unwrap() as usize,
            c["cols"].as_u64().unwrap() as usize,
            c["k"].as_u64().unwrap() as usize,
        );
        assert!(
            c["mat_q8_0_4x8_equals_rows"].as_bool().unwrap(),
            "ggml_quantize_mat_q8_0_4x8 differs from quantize_row_q8_0"
        );
        let (w, a) = (
            hex(c["w"].as_str().unwrap()),
            hex(c["act"].as_str().unwrap()),
        );
        let (wr, ar) = (
            row_bytes(DType::Q4_0, k).unwrap(),
            row_bytes(DType::Q8_0, k).unwrap(),
        );
        for (name, kernel) in [("gemv", Kernel::RepackGemv), ("gemm", Kernel::RepackGemm)] {
            let out = bits(&c[name]);
            for j in 0..cols {
                for i in 0..rows {
                    let got = dot_with(
                        kernel,
                        DType::Q4_0,
                        k,
                        &w[i * wr..(i + 1) * wr],
                        &a[j * ar..(j + 1) * ar],
                    );
                    let want = out[j * rows + i];
                    assert_eq!(
                        got.to_bits(),
                        want,
                        "{name} {rows}x{cols}x{k} [{j}][{i}]: {got} vs {}",
                        f32::from_bits(want)
                    );
                }
            }
        }
        for col in 0..cols {
            assert_eq!(
                matmul_kernel(DType::Q4_0, k, rows, cols, col),
                Kernel::RepackGemm
            );
            assert_eq!(
                matmul_kernel(DType::Q4_0, k, rows, cols + 1, cols),
                Kernel::RepackGemv
            );
        }
        assert_eq!(
            matmul_kernel(DType::Q4_0, k, rows, 1, 0),
            Kernel::RepackGemv
        );
        assert_eq!(
            matmul_kernel(DType::Q4_0, k, rows, 3, 2),
            Kernel::RepackGemv
        );
    }
}

#[test]
fn single_column_and_q5_1_use_vec_dot() {
    for dt in [DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::Q8_0] {
        assert_eq!(matmul_kernel(dt, 64, 12, 1, 0), Kernel::VecDot);
    }
    assert_eq!(matmul_kernel(DType::Q5_1, 64, 16, 9, 3), Kernel::VecDot);
    assert_eq!(matmul_kernel(DType::Q8_0, 64, 16, 9, 3), Kernel::TinyBlas);
}
