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
    read_cases_from(vocab, "gguf.out")
}

/// The cases with the ids of another `.out` file (`gguf.special.out`: parse_special = true).
fn read_cases_from(vocab: &std::path::Path, out_ext: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(vocab.with_extension(out_ext)).unwrap();
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
    check_vectors_from(name, "gguf.out", false)
}

/// [`check_vectors`] against the ids of `out_ext`, tokenized with `parse_special`.
fn check_vectors_from(name: &str, out_ext: &str, parse_special: bool) -> bool {
    let Some(path) = find_vocab(name) else {
        eprintln!("note: ggml-vocab-{name}.gguf test vectors not found, skipping");
        return false;
    };
    let gguf = ModelFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let mut failures = Vec::new();
    let cases = read_cases_from(&path, out_ext);
    for (text, want) in &cases {
        let got = tok.encode(text, false, parse_special).unwrap();
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
fn vectors_bert_bge() {
    assert!(
        check_vectors("bert-bge"),
        "committed vectors fixtures/tokenizer/ggml-vocab-bert-bge.* missing"
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
    for name in ["qwen2", "llama-spm", "gpt-2", "rwkv-world"] {
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

// ---- BERT WordPiece (ggml-vocab-bert-bge: bge-small-en-v1.5's uncased vocabulary) ----

fn bert_bge() -> Tokenizer {
    let path = find_vocab("bert-bge")
        .expect("committed vectors fixtures/tokenizer/ggml-vocab-bert-bge.* missing");
    Tokenizer::from_gguf(&ModelFile::open(path).unwrap()).unwrap()
}

#[test]
fn bert_specials_wrap_the_text_and_decode_like_llama_cpp() {
    let tok = bert_bge();
    assert_eq!(tok.model(), "bert");
    // The file has cls/sep/unk/pad/mask ids but no bos/eos: BOS is llama.cpp's default 101
    // ([CLS]), EOS none.
    assert_eq!(tok.bos(), Some(101));
    assert_eq!(tok.token_text(101), "[CLS]");
    assert_eq!(tok.eos(), None);
    assert_eq!(
        (tok.sep(), tok.unk(), tok.pad(), tok.mask()),
        (Some(102), Some(100), Some(0), Some(103))
    );
    // add_special: [CLS] ... [SEP] (llama.cpp's WPM branch, whatever add_eos says).
    let ids = tok.encode("Hello, world!", true, false).unwrap();
    assert_eq!(ids, [101, 7592, 1010, 2088, 999, 102]);
    assert_eq!(tok.encode("", true, false).unwrap(), [101, 102]);
    assert_eq!(tok.encode(" \t\n", true, false).unwrap(), [101, 102]);
    // Word-initial pieces read back with their space; clean_spaces joins punctuation.
    assert_eq!(tok.decode(&ids), "[CLS] hello, world![SEP]");
    assert_eq!(tok.detokenize(&ids, true, false), b" hello, world!");
    let pieces: Vec<Vec<u8>> = [7592, 1010, 21211, 2509]
        .iter()
        .map(|&i| tok.token_to_piece(i, false))
        .collect();
    assert_eq!(pieces, [&b" hello"[..], b" ,", b" 333", b"3"]);
    // Special-token text: split out only with parse_special.
    assert_eq!(
        tok.encode("[CLS] a [SEP]", false, true).unwrap(),
        [101, 1037, 102]
    );
    // "[", "cl", "##s", "]", "a", "[", "sep", "]".
    let plain = tok.encode("[CLS] a [SEP]", false, false).unwrap();
    assert_eq!(plain, [1031, 18856, 2015, 1033, 1037, 1031, 19802, 1033]);
    assert_eq!(plain[0], tok.token_id("\u{2581}[").unwrap());
    // Lowercased, accents stripped (NFD's first character): "Café" is "cafe".
    assert_eq!(
        tok.encode("Café", false, false).unwrap(),
        tok.encode("cafe", false, false).unwrap()
    );
    // A word with a character no token covers is one [UNK], however long.
    let long = format!("{}\u{1F999}", "a".repeat(100_000));
    assert_eq!(tok.encode(&long, true, false).unwrap(), [101, 100, 102]);
}

#[test]
fn bert_texts_are_not_bounded_by_bytes_but_tokenizing_stops_at_the_limit() {
    let tok = bert_bge();
    let path = find_vocab("bert-bge").unwrap();
    // No token is the bare phantom space, so every token covers an input character.
    assert_eq!(tok.token_id("\u{2581}"), None);
    for (text, _) in read_cases(&path) {
        let all = tok.encode(&text, true, true).unwrap();
        assert!(all.len() <= text.len() + 2, "{text:?}: {} ids", all.len());
        let exact = tok.encode_limited(&text, true, true, all.len()).unwrap();
        assert_eq!(exact.as_ref(), Some(&all), "{text:?}");
        let short = tok
            .encode_limited(&text, true, true, all.len() - 1)
            .unwrap();
        assert_eq!(short, None, "{text:?}");
    }
    // Whitespace yields nothing: 4 MiB of it fit in two tokens.
    assert_eq!(tok.max_text_bytes(2), usize::MAX);
    let blank = " \n".repeat(1 << 21);
    assert_eq!(
        tok.encode_limited(&blank, true, false, 2).unwrap(),
        Some(vec![101, 102])
    );
    // One long word: past the limit its ids are not kept, but a character nothing covers at
    // its end still makes the whole word one [UNK].
    let word = "a".repeat(1 << 20);
    assert_eq!(tok.encode_limited(&word, true, false, 100).unwrap(), None);
    let unk = format!("{word}\u{1F999}");
    assert_eq!(
        tok.encode_limited(&unk, true, false, 3).unwrap(),
        Some(vec![101, 100, 102])
    );
    // Past the limit, tokenizing stops at once.
    let long = "word ".repeat(1 << 20);
    let t = std::time::Instant::now();
    assert_eq!(tok.encode_limited(&long, true, true, 100).unwrap(), None);
    assert!(t.elapsed().as_millis() < 50, "{:?}", t.elapsed());
}

// ---- RWKV world vocabulary (scripts/make_rwkv_vocab.py) ----

fn rwkv_world() -> Tokenizer {
    let path = find_vocab("rwkv-world")
        .expect("committed vectors fixtures/tokenizer/ggml-vocab-rwkv-world.* missing");
    Tokenizer::from_gguf(&ModelFile::open(path).unwrap()).unwrap()
}

/// A synthetic `rwkv` vocabulary: `tokens` (escaped), optional token types and unknown id.
fn rwkv_synthetic(
    tokens: &[&str],
    types: Option<&[i32]>,
    unk: Option<u32>,
) -> Result<Tokenizer, LoadError> {
    use crate::gguf::writer::Writer;
    use crate::{Array, Value};
    let mut w = Writer::default();
    let n_kv = 2 + types.is_some() as u64 + unk.is_some() as u64;
    w.header(3, 0, n_kv)
        .kv("tokenizer.ggml.model", &Value::String("rwkv".into()))
        .kv(
            "tokenizer.ggml.tokens",
            &Value::Array(Array::String(tokens.iter().collect())),
        );
    if let Some(t) = types {
        w.kv(
            "tokenizer.ggml.token_type",
            &Value::Array(Array::I32(t.to_vec())),
        );
    }
    if let Some(u) = unk {
        w.kv("tokenizer.ggml.unknown_token_id", &Value::U32(u));
    }
    Tokenizer::from_gguf(&ModelFile::from_bytes("syn.gguf", w.buf.clone()).unwrap())
}

#[test]
fn vectors_rwkv_world() {
    assert!(check_vectors("rwkv-world"));
    assert!(check_vectors_from("rwkv-world", "gguf.special.out", true));
    let tok = rwkv_world();
    let path = find_vocab("rwkv-world").unwrap();
    let plain = read_cases(&path);
    let special = read_cases_from(&path, "gguf.special.out");
    // The vectors do tell the two modes apart (" <s> " differs), and decode inverts both.
    assert!(plain.iter().zip(&special).any(|(a, b)| a.1 != b.1));
    for (text, ids) in plain.iter().chain(&special) {
        assert_eq!(&tok.decode(ids), text);
        assert_eq!(tok.detokenize(ids, false, true), text.as_bytes());
        // No BOS/EOS by default: add_special changes nothing.
        assert_eq!(
            &tok.encode(text, true, false).unwrap(),
            &tok.encode(text, false, false).unwrap()
        );
    }
}

#[test]
fn rwkv_world_specials_and_eog() {
    let tok = rwkv_world();
    assert_eq!(tok.vocab_size(), 65536);
    assert_eq!(
        (
            tok.bos(),
            tok.eos(),
            tok.eot(),
            tok.unk(),
            tok.add_bos(),
            tok.add_eos()
        ),
        (Some(0), Some(0), Some(261), None, false, false)
    );
    // llama.cpp's end-of-generation set for this file is exactly {0, 261}.
    assert_eq!(tok.eog_ids().collect::<Vec<_>>(), vec![0, 261]);
    assert!(tok.is_control(0) && !tok.is_control(261));
    assert_eq!(tok.token_attr(65535), ATTR_UNUSED);
    // "<s>" is in the trie too: one id with or without parse_special; the unused padding
    // tokens are matched as text like any other.
    assert_eq!(tok.encode("<s>", false, false).unwrap(), vec![0]);
    assert_eq!(tok.encode("<s>", false, true).unwrap(), vec![0]);
    assert_eq!(tok.encode("[PAD65530]", false, false).unwrap(), vec![65530]);
    // "\n\n", the EOT, is a normal token: the trie matches it in either mode.
    assert_eq!(tok.encode("\n\n", false, true).unwrap(), vec![261]);
    assert_eq!(tok.encode("\n\n", false, false).unwrap(), vec![261]);
}

#[test]
fn rwkv_world_pieces_match_llama_cpp() {
    // FNV-1a 64 over (u32 length, bytes) of every token's piece, as the script computes it from
    // llama_token_to_piece(id, lstrip 0, special).
    let tok = rwkv_world();
    let path = find_vocab("rwkv-world").unwrap();
    let want = std::fs::read_to_string(path.with_extension("gguf.pieces")).unwrap();
    let mut got = String::new();
    for special in [true, false] {
        let mut h = 0xCBF2_9CE4_8422_2325u64;
        for id in 0..tok.vocab_size() as u32 {
            let p = tok.token_to_piece(id, special);
            for &b in (p.len() as u32).to_le_bytes().iter().chain(&p) {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01B3);
            }
        }
        got.push_str(&format!("special={special} fnv1a64={h:016x}\n"));
    }
    assert_eq!(got, want);
}

#[test]
fn rwkv_world_escaped_token_pieces() {
    let tok = rwkv_world();
    let piece = |escaped: &str| {
        let id = tok
            .token_id(escaped)
            .unwrap_or_else(|| panic!("{escaped:?} not a token"));
        tok.token_to_piece(id, false)
    };
    assert_eq!(piece("\\n"), b"\n");
    assert_eq!(piece("\\t"), b"\t");
    assert_eq!(piece("\\r\\n"), b"\r\n");
    assert_eq!(piece("\\x00"), b"\x00");
    assert_eq!(piece("\\xff"), b"\xff");
    assert_eq!(piece("\\x7f"), b"\x7f");
    assert_eq!(piece("\\\\"), b"\\");
    assert_eq!(piece("'"), b"'");
    assert_eq!(piece("\\'\""), b"'\"");
    assert_eq!(piece(" the"), b" the");
    assert_eq!(piece("\\n\\n"), b"\n\n");
    assert_eq!(tok.token_id("\\n\\n"), Some(261));
    // Ids 1..=256 are the 256 single bytes.
    for b in 0..=255u8 {
        assert_eq!(tok.token_to_piece(b as u32 + 1, false), [b]);
        if b.is_ascii() {
            assert_eq!(
                tok.encode(&(b as char).to_string(), false, false).unwrap(),
                vec![b as u32 + 1]
            );
        }
    }
    // "<s>" is a control token: rendered only on request; "[PAD65530]" (unused) always.
    assert_eq!(tok.token_to_piece(0, false), b"");
    assert_eq!(tok.token_to_piece(0, true), b"<s>");
    assert_eq!(tok.token_to_piece(65530, false), b"[PAD65530]");
    assert_eq!(tok.token_to_piece(65536, true), b"");
    // Multi-byte characters split over byte tokens come back whole through the stream decoder.
    let ids = tok.encode("𠜎", false, false).unwrap();
    assert!(ids.len() > 1);
    let mut sd = StreamDecoder::new(&tok, false);
    let text: String = ids.iter().map(|&i| sd.push(i)).collect();
    assert_eq!(text + &sd.finish(), "𠜎");
}

#[test]
fn rwkv_unescape_follows_llama_cpp_and_refuses_misreads() {
    use super::rwkv::unescape;
    assert_eq!(unescape(b"a\\tb\\nc\\rd").unwrap(), b"a\tb\nc\rd");
    assert_eq!(
        unescape(b"\\x00\\x0a\\xff\\xe4").unwrap(),
        [0, 10, 255, 0xe4]
    );
    assert_eq!(unescape(b"\\\\\\'\\\"").unwrap(), b"\\'\"");
    // llama.cpp keeps any other escaped byte as itself.
    assert_eq!(unescape(b"\\q\\\xc3\xa9").unwrap(), "qé".as_bytes());
    assert_eq!(unescape("日本".as_bytes()).unwrap(), "日本".as_bytes());
    for bad in [&b"\\xZZ"[..], b"\\xAB", b"\\xg0", b"\\x4", b"a\\x", b"ab\\"] {
        assert!(unescape(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn rwkv_bad_escape_is_a_load_error_naming_the_token() {
    for (bad, what) in [("b\\xZZ", "\\xZZ"), ("c\\", "lone"), ("\\x4", "cut off")] {
        let e = rwkv_synthetic(&["<s>", "a", bad], None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("syn.gguf") && e.contains("token 2") && e.contains(what),
            "{e}"
        );
    }
}

#[test]
fn rwkv_unmatched_bytes_follow_llama_cpp_or_are_refused() {
    // Greedy longest match: "abc" then "d" (not "ab" + "cd").
    let tok = rwkv_synthetic(
        &["<s>", "a", "ab", "abc", "cd", "d", "\\x61\\x62"],
        None,
        None,
    )
    .unwrap();
    assert_eq!(tok.encode("abcd", false, false).unwrap(), vec![3, 5]);
    // Two tokens that unescape to the same bytes: the later id wins (llama.cpp's trie insert).
    assert_eq!(tok.encode("ab", false, false).unwrap(), vec![6]);
    assert_eq!(tok.token_to_piece(6, false), b"ab");
    // A byte that starts no token, no unknown token: an error naming the byte and its offset.
    let e = tok.encode("abz", false, false).unwrap_err().to_string();
    assert!(e.contains("0x7a") && e.contains("offset 2"), "{e}");
    // "c" alone starts "cd" but no token is a prefix of "cx": treated the same way (llama.cpp
    // would loop forever here).
    let e = tok.encode("cx", false, false).unwrap_err().to_string();
    assert!(e.contains("0x63") && e.contains("offset 0"), "{e}");
    // With an unknown token, such bytes become it, one each, as in llama.cpp.
    let tok = rwkv_synthetic(&["<unk>", "a", "cd"], Some(&[2, 1, 1]), Some(0)).unwrap();
    assert_eq!(
        tok.encode("zzacxcd", false, false).unwrap(),
        vec![0, 0, 1, 0, 0, 2]
    );
    assert_eq!(tok.max_token_bytes(), 5);
}
