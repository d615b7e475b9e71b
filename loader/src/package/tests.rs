//! `.mollm` packages: a written package reads back exactly (metadata of every type, sections,
//! tensors, expert ranges), and every kind of damage is refused with an error naming it, never
//! a panic (including random corruption of the header and metadata).

use super::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mollm-pkg-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn sample_metadata() -> Vec<(String, Value)> {
    vec![
        (
            "general.architecture".into(),
            Value::String("qwen3moe".into()),
        ),
        ("qwen3moe.block_count".into(), Value::U32(1)),
        (
            "qwen3moe.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-6),
        ),
        ("qwen3moe.expert_weights_norm".into(), Value::Bool(true)),
        ("general.alignment".into(), Value::U32(32)),
        ("x.i64".into(), Value::I64(-5)),
        ("x.f64".into(), Value::F64(0.1)),
        (
            "x.f32s".into(),
            Value::Array(Array::F32(vec![0.1, -2.5, 3e-8])),
        ),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(
                ["a", "b", "<|end|>", "é"].into_iter().collect(),
            )),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(vec![1, 1, 3, 1])),
        ),
        (
            "tokenizer.chat_template".into(),
            Value::String("{{ messages }}".into()),
        ),
    ]
}

fn sample_tensors() -> (Vec<PackTensor>, Vec<Vec<u8>>) {
    let t = vec![
        PackTensor {
            name: "a.weight".into(),
            dtype: DType::F32,
            shape: vec![3],
        },
        PackTensor {
            name: "blk.0.ffn_up_exps.weight".into(),
            dtype: DType::F16,
            shape: vec![4, 2, 3],
        },
        PackTensor {
            name: "b.weight".into(),
            dtype: DType::Q8_0,
            shape: vec![32, 2],
        },
        // With the up stack above, a layer's three expert stacks: interleaved per expert.
        PackTensor {
            name: "blk.0.ffn_gate_exps.weight".into(),
            dtype: DType::F16,
            shape: vec![4, 2, 3],
        },
        PackTensor {
            name: "blk.0.ffn_down_exps.weight".into(),
            dtype: DType::F32,
            shape: vec![2, 4, 3],
        },
    ];
    let data = t
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let n = tensor_bytes(p.dtype, &p.shape).unwrap() as usize;
            (0..n).map(|j| (j * 7 + i) as u8).collect()
        })
        .collect();
    (t, data)
}

fn write_sample(path: &Path) -> Vec<u8> {
    let (t, data) = sample_tensors();
    let mut w =
        Writer::create(path, "qwen3moe", "keep", "src.gguf", &sample_metadata(), &t).unwrap();
    let len = w.file_len();
    for (i, d) in data.iter().enumerate() {
        w.tensor(i, d).unwrap();
    }
    w.finish().unwrap();
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len() as u64, len);
    assert_eq!(
        package_len("qwen3moe", "keep", "src.gguf", &sample_metadata(), &t).unwrap(),
        len
    );
    bytes
}

#[test]
fn a_written_package_reads_back_exactly() {
    let path = scratch("ok.mollm");
    write_sample(&path);
    assert!(is_package(&path));
    assert!(
        !path.with_extension("mollm.partial").exists(),
        "the partial file is renamed away"
    );
    let g = crate::open_model(&path).unwrap();
    let want = sample_metadata();
    for (k, v) in &want {
        if k == "general.alignment" {
            assert!(g.get(k).is_none(), "the GGUF alignment key is not carried");
            continue;
        }
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    let (t, data) = sample_tensors();
    for (p, d) in t.iter().zip(&data) {
        let info = g.tensor(&p.name).unwrap();
        assert_eq!((info.dtype, &info.shape), (p.dtype, &p.shape));
        assert_eq!(&g.tensor_packed(info)[..], &d[..], "{}", p.name);
        assert_eq!(info.offset % TENSOR_ALIGN, 0);
    }
    // Interleaved: expert e's gate, up and down next to each other in a 4096-aligned block.
    assert_eq!(
        u32::from_le_bytes(std::fs::read(&path).unwrap()[8..12].try_into().unwrap()),
        2
    );
    let part = |n: &str| {
        g.tensor(&format!("blk.0.ffn_{n}_exps.weight"))
            .unwrap()
            .clone()
    };
    let (gate, up, down) = (part("gate"), part("up"), part("down"));
    for t in [&gate, &up, &down] {
        assert_eq!(t.expert_stride, 4096, "{}", t.name);
    }
    assert_eq!(gate.offset % 4096, 0);
    assert_eq!(
        (up.offset - gate.offset, down.offset - gate.offset),
        (64, 128)
    );
    // The strided stack runs as a 3-D weight whose matrices are 4096 apart.
    assert_eq!(g.tensor_data(&down).len() as u64, 2 * 4096 + 32);
    assert_eq!(&g.tensor_data(&down)[4096..4096 + 32], &data[4][32..64]);
    assert!(g.is_file_mapped());
    // One expert alone: its range is a third of the stack.
    let doc = {
        let b = std::fs::read(&path).unwrap();
        let off = u64::from_le_bytes(b[16..24].try_into().unwrap()) as usize;
        let len = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
        serde_json::from_slice::<Json>(&b[off..off + len]).unwrap()
    };
    let ex = &doc["tensors"][1]["experts"];
    assert_eq!(ex.as_array().unwrap().len(), 3);
    assert_eq!(ex[1][1].as_u64(), Some(16));
}

/// The package with `f` applied to its bytes must be refused with an error mentioning each
/// needle.
fn refused(name: &str, f: impl Fn(&mut Vec<u8>), needles: &[&str]) {
    let path = scratch(name);
    let mut b = write_sample(&path);
    f(&mut b);
    std::fs::write(&path, &b).unwrap();
    let msg = open(&path).unwrap_err().to_string();
    for n in needles {
        assert!(msg.contains(n), "{name}: {msg:?} does not mention {n:?}");
    }
    assert!(msg.contains(name), "{msg:?} does not name the file");
}

/// Rewrites the metadata JSON (same length budget: the data section is moved as needed).
fn with_meta(b: &mut Vec<u8>, f: impl Fn(&mut Json)) {
    let off = u64::from_le_bytes(b[16..24].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(b[24..32].try_into().unwrap()) as usize;
    let mut doc: Json = serde_json::from_slice(&b[off..off + len]).unwrap();
    f(&mut doc);
    let mut s = doc.to_string().into_bytes();
    assert!(
        s.len() <= len,
        "edit grew the metadata: {} > {len}",
        s.len()
    );
    s.resize(len, b' ');
    b[off..off + len].copy_from_slice(&s);
}

#[test]
fn damaged_packages_are_refused_with_clear_errors() {
    refused("magic.mollm", |b| b[0] = b'X', &["not a mollm package"]);
    refused(
        "version.mollm",
        |b| b[8] = 3,
        &["version 3", "reads versions 1 to 2"],
    );
    refused(
        "truncated.mollm",
        |b| b.truncate(b.len() - 5),
        &["truncated"],
    );
    refused(
        "appended.mollm",
        |b| b.extend_from_slice(b"junk"),
        &["truncated or appended"],
    );
    refused(
        "metaoff.mollm",
        |b| b[16..24].copy_from_slice(&u64::MAX.to_le_bytes()),
        &["metadata", "outside"],
    );
    refused(
        "json.mollm",
        |b| with_meta(b, |d| *d = Json::String("x".into())),
        &["missing"],
    );
    refused(
        "notjson.mollm",
        |b| {
            let off = u64::from_le_bytes(b[16..24].try_into().unwrap()) as usize;
            b[off] = b'!';
        },
        &["not valid JSON"],
    );
    refused(
        "dtype.mollm",
        |b| with_meta(b, |d| d["tensors"][0]["dtype"] = json!("q9")),
        &["tensor 'a.weight'", "unknown format 'q9'"],
    );
    refused(
        "size.mollm",
        |b| with_meta(b, |d| d["tensors"][0]["shape"] = json!([4])),
        &["tensor 'a.weight'", "takes 16"],
    );
    refused(
        "offset.mollm",
        |b| with_meta(b, |d| d["tensors"][2]["offset"] = json!(999)),
        &["tensor 'b.weight'", "do not fit"],
    );
    refused(
        "dup.mollm",
        |b| with_meta(b, |d| d["tensors"][2]["name"] = json!("a.weight")),
        &["appears twice"],
    );
    refused(
        "shape.mollm",
        |b| with_meta(b, |d| d["tensors"][0]["shape"] = json!([0])),
        &["shape must be"],
    );
    refused(
        "experts.mollm",
        |b| with_meta(b, |d| d["tensors"][1]["experts"][1][0] = json!(0)),
        &["expert ranges"],
    );
    refused(
        "metatype.mollm",
        |b| with_meta(b, |d| d["metadata"][1]["type"] = json!("u99")),
        &["qwen3moe.block_count", "unknown type"],
    );
    refused(
        "section.mollm",
        |b| with_meta(b, |d| d["tokenizer"]["offset"] = json!(0)),
        &["tokenizer", "outside"],
    );
}

#[test]
fn random_corruption_never_panics() {
    let path = scratch("fuzz.mollm");
    let good = write_sample(&path);
    let meta_end = {
        let off = u64::from_le_bytes(good[16..24].try_into().unwrap());
        let len = u64::from_le_bytes(good[24..32].try_into().unwrap());
        (off + len) as usize
    };
    let mut seed = 0x9E3779B97F4A7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..2000 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % meta_end;
            b[i] = next() as u8;
        }
        if next() % 8 == 0 {
            let n = (next() as usize) % b.len();
            b.truncate(n);
        }
        // Ok or Err, but never a panic; an Ok image must describe in-bounds tensors.
        if let Ok((_, tensors)) = parse(&b, "fuzz") {
            for t in tensors {
                assert!(t.offset + t.span().unwrap() <= b.len() as u64);
                assert!(t.expert_stride == 0 || t.expert_stride >= t.matrix_bytes());
            }
        }
    }
}

#[test]
fn a_package_without_expert_stacks_is_version_1() {
    let path = scratch("v1.mollm");
    let (t, data) = sample_tensors();
    let keep = [0, 2];
    let t: Vec<PackTensor> = keep.iter().map(|&i| t[i].clone()).collect();
    let mut w = Writer::create(&path, "llama", "keep", "src.gguf", &sample_metadata(), &t).unwrap();
    for (j, &i) in keep.iter().enumerate() {
        w.tensor(j, &data[i]).unwrap();
    }
    w.finish().unwrap();
    let b = std::fs::read(&path).unwrap();
    assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 1);
    let g = open(&path).unwrap();
    assert_eq!(g.tensor_data(g.tensor("b.weight").unwrap()), &data[2][..]);
}
