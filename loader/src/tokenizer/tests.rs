//! llama.cpp's tokenizer test vectors (models/ggml-vocab-*.gguf + .inp/.out), read the way
//! tests/test-tokenizer-0.cpp reads them: cases separated by "\n__ggml_vocab_test__\n",
//! expected ids one line per case, tokenized with add_special = false, parse_special = false.

use std::path::PathBuf;

use super::*;

fn vector_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer")];
    if let Ok(d) = std::env::var("LLAMA_CPP_DIR") {
        dirs.push(PathBuf::from(d).join("models"));
    }
    dirs.push(PathBuf::from(
        "/root/.cache/mollm/llama.cpp-src/vendor/llama.cpp/models",
    ));
    dirs
}

fn find_vocab(name: &str) -> Option<PathBuf> {
    let file = format!("ggml-vocab-{name}.gguf");
    vector_dirs().into_iter().map(|d| d.join(&file)).find(|p| {
        p.exists() && p.with_extension("gguf.inp").exists() && p.with_extension("gguf.out").exists()
    })
}

fn read_cases(vocab: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(vocab.with_extension("gguf.out")).unwrap();
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // test-tokenizer-0.cpp stops when the separator ends the file: no trailing empty case.
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let outputs: Vec<&str> = out.lines().collect();
    assert_eq!(inputs.len(), outputs.len(), "{}", vocab.display());
    inputs
        .into_iter()
        .zip(outputs)
        .map(|(i, o)| {
            (
                i.to_string(),
                o.split_whitespace().map(|t| t.parse().unwrap()).collect(),
            )
        })
        .collect()
}

/// Runs one vector file; returns false (with a note) when it is not available.
fn check_vectors(name: &str) -> bool {
    let Some(path) = find_vocab(name) else {
        eprintln!("note: ggml-vocab-{name}.gguf test vectors not found, skipping");
        return false;
    };
    let gguf = ModelFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let mut failures = Vec::new();
    let cases = read_cases(&path);
    for (text, want) in &cases {
        let got = tok.encode(text, false, false).unwrap();
        if &got != want {
            failures.push(format!("{text:?}\n   want {want:?}\n   got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    true
}

#[test]
fn vectors_llama_spm() {
    assert!(
        check_vectors("llama-spm"),
        "committed vectors fixtures/tokenizer/ggml-vocab-llama-spm.* missing"
    );
}

#[test]
fn vectors_gpt2() {
    assert!(
        check_vectors("gpt-2"),
        "committed vectors fixtures/tokenizer/ggml-vocab-gpt-2.* missing"
    );
}

#[test]
fn vectors_qwen2() {
    assert!(
        check_vectors("qwen2"),
        "committed vectors fixtures/tokenizer/ggml-vocab-qwen2.* missing"
    );
}

#[test]
fn vectors_qwen35() {
    assert!(
        check_vectors("qwen35"),
        "committed vectors fixtures/tokenizer/ggml-vocab-qwen35.* missing"
    );
}

#[test]
fn vectors_llama_bpe() {
    check_vectors("llama-bpe");
}

#[test]
fn vectors_other_bpe_pre_tokenizers() {
    // Same regex families as smollm (starcoder/refact: digits split, then GPT-2), plus the
    // other pre-tokenizers the table supports.
    // starcoder's vectors are committed (SmolLM2's pre-tokenizer); the others are optional.
    assert!(
        check_vectors("starcoder"),
        "committed vectors fixtures/tokenizer/ggml-vocab-starcoder.* missing"
    );
    for name in ["refact", "command-r", "mpt", "falcon", "qwen35"] {
        check_vectors(name);
    }
}

#[test]
fn spm_specials_bos_and_detokenize() {
    let Some(path) = find_vocab("llama-spm") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&ModelFile::open(&path).unwrap()).unwrap();
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos(), tok.add_eos()),
        (Some(1), Some(2), true, false)
    );
    assert!(tok.is_eog(2) && !tok.is_eog(1));
    let ids = tok.encode("Hello world", true, false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(tok.decode(&ids), "<s> Hello world");
    // llama.cpp strips the SPM prefix space only when no BOS was removed first (its quirk).
    assert_eq!(
        String::from_utf8(tok.detokenize(&ids, true, false)).unwrap(),
        " Hello world"
    );
    assert_eq!(
        String::from_utf8(tok.detokenize(&ids[1..], false, false)).unwrap(),
        "Hello world"
    );
    // "</s>" is a control token: text without parse_special, one id with it.
    assert_eq!(tok.encode("a</s>", false, true).unwrap().last(), Some(&2));
    assert!(tok.encode("a</s>", false, false).unwrap().len() > 2);
    // byte fallback for a character outside the vocabulary, reassembled by the stream decoder
    let ids = tok.encode("🦙", false, false).unwrap();
    let mut sd = StreamDecoder::new(&tok, false);
    let text: String = ids.iter().map(|&i| sd.push(i)).collect();
    assert_eq!(text + &sd.finish(), " 🦙");
}

#[test]
fn bpe_special_partition_and_eog() {
    let Some(path) = find_vocab("qwen2") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&ModelFile::open(&path).unwrap()).unwrap();
    let im_start = tok.token_id("<|im_start|>").unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>", false, true)
        .unwrap();
    assert_eq!(ids.first(), Some(&im_start));
    assert_eq!(ids.last(), Some(&im_end));
    let plain = tok.encode("<|im_start|>user", false, false).unwrap();
    assert!(!plain.contains(&im_start) && plain.len() > 2);
    assert!(tok.is_eog(im_end));
    assert!(tok.is_eog(tok.token_id("<|endoftext|>").unwrap()));
    assert!(!tok.is_eog(im_start));
    assert_eq!(tok.token_to_piece(im_end, false), b"");
    assert_eq!(tok.token_to_piece(im_end, true), b"<|im_end|>");
    assert_eq!(
        tok.decode(&tok.encode("Hello, world! ½", false, false).unwrap()),
        "Hello, world! ½"
    );
}

#[test]
fn unknown_pre_tokenizer_is_refused() {
    use crate::gguf::writer::Writer;
    use crate::{Array, Value};
    let mut w = Writer::default();
    w.header(3, 0, 4)
        .kv("tokenizer.ggml.model", &Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", &Value::String("no-such-pre".into()))
        .kv(
            "tokenizer.ggml.tokens",
            &Value::Array(Array::String(["a", "b"].into_iter().collect())),
        )
        .kv(
            "tokenizer.ggml.merges",
            &Value::Array(Array::String(["a b"].into_iter().collect())),
        );
    let f = ModelFile::from_bytes("syn.gguf", w.buf.clone()).unwrap();
    let e = Tokenizer::from_gguf(&f).unwrap_err().to_string();
    assert!(e.contains("syn.gguf") && e.contains("no-such-pre"), "{e}");
}

#[test]
fn stream_decoder_holds_partial_utf8() {
    use crate::gguf::writer::Writer;
    use crate::{Array, Value};
    let mut w = Writer::default();
    w.header(3, 0, 2)
        .kv("tokenizer.ggml.model", &Value::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            &Value::Array(Array::String(
                ["<unk>", "<s>", "</s>"].into_iter().collect(),
            )),
        );
    let f = ModelFile::from_bytes("syn.gguf", w.buf.clone()).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let mut sd = StreamDecoder::new(&tok, false);
    let e = "é".as_bytes();
    assert_eq!(sd.push_bytes(&e[..1]), "");
    assert_eq!(sd.push_bytes(&e[1..]), "é");
    assert_eq!(sd.push_bytes(b"\xffa"), "\u{FFFD}a");
    assert_eq!(sd.push_bytes(&"€".as_bytes()[..2]), "");
    assert_eq!(sd.finish(), "\u{FFFD}");
}

#[test]
fn clean_spaces_matches_llama_cpp_passes() {
    let mut t = b"Hello , world ! It 's a ' b ' c".to_vec();
    clean_up_spaces(&mut t);
    assert_eq!(String::from_utf8(t).unwrap(), "Hello, world! It's a'b'c");
}

#[test]
fn random_text_round_trips_through_qwen2_and_spm() {
    // Byte-level BPE without clean_spaces is lossless; SPM is lossless up to the prefix space.
    let pool: Vec<char> = "aZ09 \n\t'sé½🦙日本語ñ<|>_\u{200d}\u{fe0f}!?.,-"
        .chars()
        .collect();
    let mut state = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let texts: Vec<String> = (0..300)
        .map(|_| {
            let n = (next() % 40) as usize;
            (0..n)
                .map(|_| pool[(next() % pool.len() as u64) as usize])
                .collect()
        })
        .collect();
    if let Some(path) = find_vocab("qwen2") {
        let tok = Tokenizer::from_gguf(&ModelFile::open(&path).unwrap()).unwrap();
        for t in &texts {
            let ids = tok.encode(t, false, false).unwrap();
            assert_eq!(&tok.decode(&ids), t);
        }
    }
    if let Some(path) = find_vocab("llama-spm") {
        let tok = Tokenizer::from_gguf(&ModelFile::open(&path).unwrap()).unwrap();
        for t in &texts {
            // (With parse_special, a control token mid-text makes llama.cpp add a prefix space to
            // the next fragment, which detokenize keeps: not a round trip by design.)
            let ids = tok.encode(t, false, false).unwrap();
            assert_eq!(&tok.decode(&ids), t);
        }
    }
}

#[test]
fn encode_limited_agrees_below_the_limit_and_gives_up_above_it() {
    let mut n = 0;
    for name in ["qwen2", "llama-spm", "gpt-2"] {
        let Some(path) = find_vocab(name) else {
            continue;
        };
        n += 1;
        let tok = Tokenizer::from_gguf(&ModelFile::open(&path).unwrap()).unwrap();
        assert!(tok.max_token_bytes() > 0, "{name}");
        for (text, _) in read_cases(&path) {
            let all = tok.encode(&text, true, true).unwrap();
            let exact = tok.encode_limited(&text, true, true, all.len()).unwrap();
            assert_eq!(exact.as_ref(), Some(&all), "{name}: {text:?}");
            if !all.is_empty() {
                let short = tok
                    .encode_limited(&text, true, true, all.len() - 1)
                    .unwrap();
                assert_eq!(short, None, "{name}: {text:?}");
            }
            // No text has more bytes than its tokens can hold.
            assert!(
                text.len() <= tok.max_text_bytes(all.len()),
                "{name}: {text:?}"
            );
        }
        // A text past the byte bound is refused before tokenizing: a long one returns at once.
        let long = "word ".repeat(1 << 20);
        let t = std::time::Instant::now();
        assert_eq!(tok.encode_limited(&long, true, true, 100).unwrap(), None);
        assert!(t.elapsed().as_millis() < 50, "{name}: {:?}", t.elapsed());
        // Under the byte bound but over the limit: tokenizing stops, and the answer is None.
        let words = "a ".repeat(tok.max_text_bytes(100) / 2);
        assert_eq!(tok.encode_limited(&words, true, true, 100).unwrap(), None);
    }
    assert!(n > 0, "no committed vocabulary found");
}
