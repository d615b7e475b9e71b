//! K-quant matmul results bit-identical to this machine's llama.cpp x86 build.
//!
//! fixtures/quant/x86_kquants/kquants.json comes from quant/tools/x86_oracle_kquants.c (run by
//! scripts/quant_x86_fixtures_kquants.py), which calls the real compiled ggml kernels
//! (AVX2/AVX-512 `ggml_vec_dot_*_q8_K`, repacked `ggml_gemv/gemm_q{2,4}_K_8x8_q8_K`) and
//! replays ggml's column grouping. Here each output goes through the public API the reference
//! backend uses: `matmul_kernel` → `quantize_activations_for` → `dot_with`, per element.
use abi::DType;
use quant::{dot_with, matmul_kernel, quantize_activations_for, row_bytes, Kernel};

fn b64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("bad base64"),
    } as u32;
    let mut out = Vec::new();
    for ch in s.as_bytes().chunks(4) {
        let pad = ch.iter().filter(|&&c| c == b'=').count();
        let v = ch
            .iter()
            .fold(0u32, |a, &c| (a << 6) | if c == b'=' { 0 } else { val(c) });
        out.extend_from_slice(&[(v >> 16) as u8, (v >> 8) as u8, v as u8][..3 - pad]);
    }
    out
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn kquant_matmuls_match_llama_cpp_x86_bit_exactly() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/quant/x86_kquants/kquants.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let acts: Vec<Vec<f32>> = v["acts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| f32s(&b64(a["x"].as_str().unwrap())))
        .collect();
    let only = std::env::var("KQ_ONLY").ok();
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in v["cases"].as_array().unwrap() {
        let name = case["dtype"].as_str().unwrap();
        // Q3_K (`ggml_vec_dot_q3_K_q8_K`, AVX2) is not emulated yet; `KQ_ONLY=q3_K` runs it.
        let selected = match only.as_deref() {
            Some(o) => o.split(',').any(|x| x == name),
            None => name != "q3_K",
        };
        if !selected {
            continue;
        }
        let dt = DType::from_name(name).unwrap();
        let (k, rows, cols) = (
            case["k"].as_u64().unwrap() as usize,
            case["rows"].as_u64().unwrap() as usize,
            case["cols"].as_u64().unwrap() as usize,
        );
        let x = &acts[case["acts"].as_u64().unwrap() as usize];
        assert_eq!(x.len(), k * cols);
        let w = b64(case["w"].as_str().unwrap());
        let want = f32s(&b64(case["out"].as_str().unwrap()));
        let rb = row_bytes(dt, k).unwrap();
        let mut act = vec![0u8; row_bytes(DType::Q8_K, k).unwrap()];
        let repacked = case["kernel"].as_str().unwrap() == "repack";
        for c in 0..cols {
            let kernel = matmul_kernel(dt, k, rows, cols, c);
            assert_eq!(
                matches!(kernel, Kernel::RepackGemm | Kernel::RepackGemv),
                repacked,
                "{name} k={k} rows={rows}: kernel {kernel:?}"
            );
            // The oracle calls `ggml_vec_dot_*_q8_K` directly for non-repacked cases; in a real
            // graph >= 8 columns go to the tiled matmul (tested in x86_exact_tiled.rs).
            let kernel = if kernel == Kernel::Tiled {
                Kernel::VecDot
            } else {
                kernel
            };
            quantize_activations_for(kernel, dt, &x[c * k..(c + 1) * k], &mut act).unwrap();
            for r in 0..rows {
                let got = dot_with(kernel, dt, k, &w[r * rb..(r + 1) * rb], &act);
                let exp = want[c * rows + r];
                checked += 1;
                if got.to_bits() != exp.to_bits() {
                    failures.push(format!("{name} k={k} rows={rows} cols={cols} col={c} row={r} {kernel:?}: {got:e} vs ggml {exp:e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n{}",
        failures.len(),
        failures[..failures.len().min(40)].join("\n")
    );
}
