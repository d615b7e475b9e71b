//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json` → GGUF tokenizer keys.
//!
//! The vocabulary becomes llama.cpp's arrays (tokens by id, token types, merges), so special
//! tokens, EOG detection, decoding and the chat template work exactly as for a GGUF file; the
//! whole `tokenizer.json` is kept as `tokenizer.huggingface.json`, and the tokenizer encodes
//! text with its own pipeline (normalizer, pre-tokenizer, BPE) through the `tokenizers` crate.
//! Two kinds of BPE vocabularies are read: byte-level (Llama 3, Qwen, SmolLM, GPT-2 style;
//! llama.cpp's `gpt2` model) and SentencePiece-style with `▁` for spaces and `<0xXX>` byte
//! fallback (Gemma, Llama 2; llama.cpp's `llama` model, whose decoding rules then apply).
//!
//! A WordPiece vocabulary (BERT) is the exception ([`wordpiece`]): it becomes llama.cpp's
//! `bert` vocabulary exactly as its converter writes it, and mollm tokenizes it with
//! llama.cpp's algorithm, not the `tokenizers` pipeline (so no `tokenizer.huggingface.json`).

use std::path::Path;

use serde_json::Value as Json;

use super::config::Config;
use super::{label, read_json};
use crate::gguf::{Array, StrArray, Value};
use crate::tokenizer::bpe_pre_name;
use crate::LoadError;

const TOKEN_NORMAL: i32 = 1;
const TOKEN_UNKNOWN: i32 = 2;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;
const TOKEN_BYTE: i32 = 6;

pub fn metadata(
    dir: &Path,
    cfg: &Config,
    meta: &mut Vec<(String, Value)>,
) -> Result<(), LoadError> {
    const TJ: &str = "tokenizer.json";
    let file = label(dir, TJ);
    let err = |key: &str, msg: String| LoadError::Metadata {
        file: file.clone(),
        key: key.to_string(),
        msg,
    };
    let bytes = std::fs::read(dir.join(TJ)).map_err(|source| LoadError::Io {
        file: file.clone(),
        source,
    })?;
    // The crate's own parser validates the whole file (and is what encodes text later).
    tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| LoadError::Tokenizer {
        file: file.clone(),
        msg: format!("not a tokenizer the tokenizers crate reads: {e}"),
    })?;
    let tj: Json = serde_json::from_slice(&bytes).map_err(|e| LoadError::Format {
        file: file.clone(),
        msg: format!("not valid JSON: {e}"),
    })?;
    let model = tj
        .get("model")
        .ok_or_else(|| err("model", "missing".into()))?;
    match model.get("type").and_then(|t| t.as_str()) {
        Some("BPE") => {}
        Some("WordPiece") => return wordpiece(dir, cfg, &tj, &file, meta),
        _ => {
            return Err(err(
                "model.type",
                "only BPE and WordPiece tokenizers are supported".into(),
            ))
        }
    }
    let mentions = |v: Option<&Json>, what: &str| v.is_some_and(|v| v.to_string().contains(what));
    let byte_level = mentions(tj.get("pre_tokenizer"), "\"ByteLevel\"")
        || mentions(tj.get("decoder"), "\"ByteLevel\"");
    // SentencePiece-style: spaces become U+2581 and unknown characters fall back to bytes.
    let spm = !byte_level
        && model.get("byte_fallback").and_then(|b| b.as_bool()) == Some(true)
        && (mentions(tj.get("normalizer"), "\u{2581}")
            || mentions(tj.get("pre_tokenizer"), "Metaspace"));
    if !byte_level && !spm {
        return Err(err(
            "pre_tokenizer",
            "only byte-level BPE (a ByteLevel pre-tokenizer or decoder) or SentencePiece-style \
             BPE (spaces as \u{2581}, byte_fallback) is supported"
                .into(),
        ));
    }
    // Whether the pipeline puts a space before the text (Llama 2 does, Gemma does not):
    // llama.cpp's add_space_prefix, which decoding undoes.
    let pre = tj.get("pre_tokenizer");
    let space_prefix = mentions(tj.get("normalizer"), "\"Prepend\"")
        || (mentions(pre, "Metaspace") && !mentions(pre, "\"never\""));
    let unk_token = model.get("unk_token").and_then(|u| u.as_str());
    let by_id = tokens_by_id(
        &tj,
        model,
        file.as_str(),
        |text| {
            let is_byte = text.len() == 6
                && text.starts_with("<0x")
                && text.ends_with('>')
                && u8::from_str_radix(&text[3..5], 16).is_ok();
            match () {
                _ if spm && is_byte => TOKEN_BYTE,
                _ if spm && Some(text) == unk_token => TOKEN_UNKNOWN,
                _ => TOKEN_NORMAL,
            }
        },
        |_, special| {
            if special {
                TOKEN_CONTROL
            } else {
                TOKEN_USER_DEFINED
            }
        },
    )?;
    let n = by_id.len().max(cfg.vocab_size as usize);
    let mut tokens = StrArray::default();
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        match by_id.get(i).cloned().flatten() {
            Some((t, ty)) => {
                tokens.push(t.as_bytes());
                types.push(ty);
            }
            None => {
                tokens.push(format!("[PAD{i}]").as_bytes());
                types.push(TOKEN_UNUSED);
            }
        }
    }
    let lookup = |text: &str| -> Option<u32> {
        (0..tokens.len())
            .find(|&i| tokens.get_bytes(i) == Some(text.as_bytes()))
            .map(|i| i as u32)
    };
    // llama.cpp's SentencePiece model has no merges (tokenizer.json still encodes).
    let merges: StrArray = match model.get("merges").and_then(|m| m.as_array()) {
        _ if spm => StrArray::default(),
        None => StrArray::default(),
        Some(list) => {
            list.iter()
                .enumerate()
                .map(|(i, m)| match m {
                    Json::String(s) => Ok(s.clone()),
                    Json::Array(p) if p.len() == 2 && p.iter().all(|x| x.is_string()) => Ok(
                        format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
                    ),
                    _ => Err(err(
                        &format!("model.merges[{i}]"),
                        "expected \"a b\" or [a, b]".into(),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .collect()
        }
    };

    let tc = read_json(dir, "tokenizer_config.json")?.unwrap_or(Json::Null);
    let gc = read_json(dir, "generation_config.json")?.unwrap_or(Json::Null);
    let token_text = |v: Option<&Json>| -> Option<String> {
        match v? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
            _ => None,
        }
    };
    let first_id = |v: Option<&Json>| -> Option<u32> {
        match v? {
            Json::Number(n) => n.as_u64().map(|x| x as u32),
            Json::Array(a) => a.first()?.as_u64().map(|x| x as u32),
            _ => None,
        }
    };
    let special_id = |name: &str| -> Option<u32> {
        token_text(tc.get(format!("{name}_token").as_str()))
            .and_then(|t| lookup(&t))
            .or_else(|| first_id(gc.get(format!("{name}_token_id").as_str())))
            .or_else(|| first_id(cfg.json.get(format!("{name}_token_id").as_str())))
            .filter(|&id| (id as usize) < n)
    };

    let mut kv = |k: &str, v: Value| meta.push((format!("tokenizer.{k}"), v));
    if spm {
        kv("ggml.model", Value::String("llama".into()));
        kv("ggml.add_space_prefix", Value::Bool(space_prefix));
    } else {
        kv("ggml.model", Value::String("gpt2".into()));
        if let Some(pre) = bpe_pre_name(tj.get("pre_tokenizer").unwrap_or(&Json::Null)) {
            kv("ggml.pre", Value::String(pre.into()));
        }
    }
    kv("ggml.tokens", Value::Array(Array::String(tokens.clone())));
    kv("ggml.token_type", Value::Array(Array::I32(types)));
    if !spm {
        kv("ggml.merges", Value::Array(Array::String(merges)));
    }
    for (name, key) in [
        ("bos", "bos"),
        ("eos", "eos"),
        ("pad", "padding"),
        ("unk", "unknown"),
    ] {
        if let Some(id) = special_id(name) {
            kv(&format!("ggml.{key}_token_id"), Value::U32(id));
        }
    }
    for flag in ["add_bos_token", "add_eos_token"] {
        if let Some(b) = tc.get(flag).and_then(|v| v.as_bool()) {
            kv(&format!("ggml.{flag}"), Value::Bool(b));
        }
    }
    if let Some(t) = chat_template(dir, &tc) {
        kv("chat_template", Value::String(t));
    }
    let json = String::from_utf8(bytes).map_err(|_| err("(file)", "not UTF-8".into()))?;
    kv("huggingface.json", Value::String(json));
    Ok(())
}

/// The chat template: `tokenizer_config.json`'s (a list of named ones: the default one), else
/// `chat_template.jinja`.
fn chat_template(dir: &Path, tc: &Json) -> Option<String> {
    let template = match tc.get("chat_template") {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    };
    template.or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok())
}

/// The special token kinds gguf-py's `SpecialVocab` looks for, in its order.
const SPECIAL_KINDS: [&str; 7] = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

/// A WordPiece `tokenizer.json` (BERT) → llama.cpp's `bert` vocabulary, as its converter
/// writes it (`BertModel.set_vocab`, `get_vocab_base`, gguf-py's `SpecialVocab`):
///
/// - `tokenizer.ggml.model` "bert", `tokenizer.ggml.pre` "default" (what llama.cpp uses for
///   every WordPiece vocabulary; the converter writes the name of a hash of its check text's
///   ids, "bert-bge" for the uncased BERT vocabulary, which llama.cpp then ignores);
///   `tokenizer.ggml.token_type_count` from config.json's `type_vocab_size` (Hugging Face's
///   default 2 when absent; the converter's 1 would not fit the checkpoint's table);
/// - the tokens by id, padded to config.json's `vocab_size` with `[PAD<i>]` (UNUSED), in
///   phantom-space form: CONTROL tokens as they are, `##x` → `x`, any other `t` → `▁t`; types:
///   added tokens CONTROL when special (or looking special, like `<|x|>`), else
///   USER_DEFINED, the rest NORMAL;
/// - special ids as `SpecialVocab` finds them: `tokenizer_config.json`'s `*_token` texts
///   (bos falling back to cls_token, eos to sep_token, then the post-processor's template)
///   looked up among `added_tokens`, else config.json's `*_token_id`; written as
///   `bos`/`eos`/`unknown`/`seperator`/`padding`/`mask_token_id` (none for cls: the writer has
///   no key for it, and llama.cpp's [CLS] is the BOS id);
/// - `add_bos_token` / `add_eos_token` / `add_sep_token` from a `TemplateProcessing`
///   post-processor ("[CLS] $A [SEP]": bos and eos true, sep false) or tokenizer_config.json;
/// - `tokenizer.ggml.normalizer.lowercase` / `strip_accents` from the normalizer
///   (`BertNormalizer`'s fields, `Lowercase`, `StripAccents`, in a `Sequence` too), each only
///   when set (a null `strip_accents` writes none: llama.cpp then strips accents iff it
///   lowercases, as Hugging Face does).
fn wordpiece(
    dir: &Path,
    cfg: &Config,
    tj: &Json,
    file: &str,
    meta: &mut Vec<(String, Value)>,
) -> Result<(), LoadError> {
    let err = |key: &str, msg: String| LoadError::Metadata {
        file: file.to_string(),
        key: key.to_string(),
        msg,
    };
    let model = &tj["model"];
    // The converter's phantom-space mapping knows "##" only.
    match model.get("continuing_subword_prefix") {
        None | Some(Json::Null) => {}
        Some(p) if p.as_str() == Some("##") => {}
        Some(p) => {
            return Err(err(
                "model.continuing_subword_prefix",
                format!("{p} is not supported (only \"##\", as llama.cpp's converter reads it)"),
            ))
        }
    }
    let by_id = tokens_by_id(
        tj,
        model,
        file,
        |_| TOKEN_NORMAL,
        |content, special| match special || looks_special(content) {
            true => TOKEN_CONTROL,
            false => TOKEN_USER_DEFINED,
        },
    )?;
    let n = by_id.len().max(cfg.vocab_size as usize);
    let mut tokens = StrArray::default();
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        let (text, ty) = by_id
            .get(i)
            .cloned()
            .flatten()
            .unwrap_or_else(|| (format!("[PAD{i}]"), TOKEN_UNUSED));
        // The phantom space: a word-initial piece gets "▁", a continuation loses "##".
        let phantom = match (ty, text.strip_prefix("##")) {
            (TOKEN_CONTROL, _) => text,
            (_, Some(rest)) => rest.to_string(),
            (_, None) => format!("\u{2581}{text}"),
        };
        tokens.push(phantom.as_bytes());
        types.push(ty);
    }

    let tc = read_json(dir, "tokenizer_config.json")?.unwrap_or(Json::Null);
    let specials = special_vocab(tj, &tc, &cfg.json, n);

    let mut kv = |k: &str, v: Value| meta.push((format!("tokenizer.{k}"), v));
    // Hugging Face's default when the config has no type_vocab_size (see above).
    let type_count = cfg
        .json
        .get("type_vocab_size")
        .and_then(|v| v.as_u64())
        .unwrap_or(2);
    if type_count == 0 || type_count > 1 << 16 {
        return Err(LoadError::Metadata {
            file: label(dir, "config.json"),
            key: "type_vocab_size".into(),
            msg: format!("{type_count}: expected 1 to 65536"),
        });
    }
    kv("ggml.token_type_count", Value::U32(type_count as u32));
    kv("ggml.model", Value::String("bert".into()));
    kv("ggml.pre", Value::String("default".into()));
    kv("ggml.tokens", Value::Array(Array::String(tokens)));
    kv("ggml.token_type", Value::Array(Array::I32(types)));
    for (kind, key) in [
        ("bos", "bos"),
        ("eos", "eos"),
        ("unk", "unknown"),
        ("sep", "seperator"),
        ("pad", "padding"),
        ("mask", "mask"),
        ("eot", "eot"),
    ] {
        if let Some(&id) = specials.ids.get(kind) {
            kv(&format!("ggml.{key}_token_id"), Value::U32(id));
        }
    }
    for kind in ["bos", "eos", "sep"] {
        if let Some(&b) = specials.add.get(kind) {
            kv(&format!("ggml.add_{kind}_token"), Value::Bool(b));
        }
    }
    let (mut lowercase, mut strip_accents) = (None, None);
    if let Some(n) = tj.get("normalizer") {
        normalizer_flags(n, &mut lowercase, &mut strip_accents);
    }
    if let Some(b) = lowercase {
        kv("ggml.normalizer.lowercase", Value::Bool(b));
    }
    if let Some(b) = strip_accents {
        kv("ggml.normalizer.strip_accents", Value::Bool(b));
    }
    if let Some(t) = chat_template(dir, &tc) {
        kv("chat_template", Value::String(t));
    }
    Ok(())
}

/// Added tokens the converter makes CONTROL although not marked special
/// (`does_token_look_special`).
/// `model.vocab` and `added_tokens` of a `tokenizer.json` by id, each with its llama.cpp token
/// type: `vocab_type(text)` for the vocabulary's, `added_type(content, special)` for added ones.
fn tokens_by_id(
    tj: &Json,
    model: &Json,
    file: &str,
    vocab_type: impl Fn(&str) -> i32,
    added_type: impl Fn(&str, bool) -> i32,
) -> Result<Vec<Option<(String, i32)>>, LoadError> {
    let err = |key: &str, msg: String| LoadError::Metadata {
        file: file.to_string(),
        key: key.to_string(),
        msg,
    };
    let vocab = model
        .get("vocab")
        .and_then(|v| v.as_object())
        .ok_or_else(|| err("model.vocab", "missing or not an object".into()))?;
    let mut by_id: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: u64, text: &str, ty: i32| -> Result<(), LoadError> {
        if id >= 1 << 24 {
            return Err(err("model.vocab", format!("token id {id} is too large")));
        }
        let id = id as usize;
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
        }
        by_id[id] = Some((text.to_string(), ty));
        Ok(())
    };
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| err(&format!("model.vocab.{text}"), "expected a token id".into()))?;
        put(id, text, vocab_type(text))?;
    }
    let added = tj.get("added_tokens").and_then(|a| a.as_array());
    for (i, t) in added.into_iter().flatten().enumerate() {
        let id = t.get("id").and_then(|v| v.as_u64());
        let content = t.get("content").and_then(|v| v.as_str());
        let (Some(id), Some(content)) = (id, content) else {
            return Err(err(
                &format!("added_tokens[{i}]"),
                "needs an id and a content".into(),
            ));
        };
        let special = t.get("special").and_then(|v| v.as_bool()).unwrap_or(false);
        put(id, content, added_type(content, special))?;
    }
    Ok(by_id)
}

fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// gguf-py's `SpecialVocab._parse_normalizer`: `Lowercase`, `StripAccents`, the fields of
/// `BertNormalizer` (a null one leaves the flag unset), recursively in a `Sequence`.
fn normalizer_flags(n: &Json, lowercase: &mut Option<bool>, strip_accents: &mut Option<bool>) {
    match n.get("type").and_then(|t| t.as_str()) {
        Some("Lowercase") => *lowercase = Some(true),
        Some("StripAccents") => *strip_accents = Some(true),
        Some("BertNormalizer") => {
            if let Some(v) = n.get("lowercase") {
                *lowercase = v.as_bool();
            }
            if let Some(v) = n.get("strip_accents") {
                *strip_accents = v.as_bool();
            }
        }
        Some("Sequence") => {
            for m in n
                .get("normalizers")
                .and_then(|l| l.as_array())
                .into_iter()
                .flatten()
            {
                normalizer_flags(m, lowercase, strip_accents);
            }
        }
        _ => {}
    }
}

/// What gguf-py's `SpecialVocab` finds.
struct Specials {
    /// Kind ("bos", "eos", "unk", "sep", "pad", "cls", "mask", "eot") → id.
    ids: std::collections::BTreeMap<&'static str, u32>,
    /// "bos" / "eos" / "sep" → whether the model adds it.
    add: std::collections::BTreeMap<&'static str, bool>,
}

/// gguf-py's `SpecialVocab` (`_try_load_from_tokenizer_json`, `_try_load_from_config_json`)
/// for the post-processors a WordPiece tokenizer has: the special token texts of
/// `tokenizer_config.json` (`tc`; bos falling back to cls, eos to sep), completed and flagged
/// by a `TemplateProcessing` post-processor (its first special token is added as bos when it
/// is the bos or cls text, its last as eos, taking eos's place when it differs, the old eos
/// becoming eot; a separator between `$A` and `$B` is added only when the single template
/// has no last special token), the texts' ids among `added_tokens`, then config.json's
/// `*_token_id`; ids at or above `n` are ignored.
fn special_vocab(tj: &Json, tc: &Json, config: &Json, n: usize) -> Specials {
    let has_tc = tc.as_object().is_some_and(|o| !o.is_empty());
    let text = |v: Option<&Json>| -> Option<String> {
        match v? {
            Json::String(s) => Some(s.clone()),
            Json::Object(o) => o.get("content")?.as_str().map(str::to_string),
            _ => None,
        }
        .filter(|s| !s.is_empty())
    };
    let mut texts: std::collections::BTreeMap<&'static str, Option<String>> = SPECIAL_KINDS
        .iter()
        .map(|&k| (k, text(tc.get(format!("{k}_token").as_str()))))
        .collect();
    if has_tc {
        if texts["bos"].is_none() {
            texts.insert("bos", texts["cls"].clone());
        }
        if texts["eos"].is_none() {
            texts.insert("eos", texts["sep"].clone());
        }
    }
    let mut eot: Option<String> = None;
    let mut add = std::collections::BTreeMap::new();
    let special_of = |item: &Json| -> Option<String> {
        item.get("SpecialToken")?
            .get("id")?
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let sequence_of = |item: &Json| -> Option<String> {
        item.get("Sequence")?
            .get("id")?
            .as_str()
            .map(str::to_string)
    };
    let pp = tj.get("post_processor").filter(|p| !p.is_null());
    let processors: Vec<&Json> = match pp
        .and_then(|p| p.get("processors"))
        .and_then(|l| l.as_array())
    {
        Some(list) => list.iter().collect(),
        None => pp.into_iter().collect(),
    };
    for p in processors {
        if p.get("type").and_then(|t| t.as_str()) != Some("TemplateProcessing") {
            continue;
        }
        let list = |k: &str| {
            p.get(k)
                .and_then(|l| l.as_array())
                .map_or(&[][..], Vec::as_slice)
        };
        let (single, pair) = (list("single"), list("pair"));
        let (mut first, mut last) = (None, None);
        if single.len() > 1 {
            first = special_of(&single[0]);
            if let Some(f) = &first {
                let known = |t: &BTreeMapTexts, k: &str| t[k].as_ref() == Some(f);
                if !has_tc {
                    texts.insert("bos", Some(f.clone()));
                } else if !known(&texts, "bos") && !known(&texts, "cls") {
                    if texts["bos"].is_none() {
                        texts.insert("bos", Some(f.clone()));
                    }
                    if texts["cls"].is_none() {
                        texts.insert("cls", Some(f.clone()));
                    }
                }
                add.insert("bos", known(&texts, "bos") || known(&texts, "cls"));
            }
            last = special_of(&single[single.len() - 1]);
            if let Some(l) = &last {
                if !has_tc {
                    texts.insert("eos", Some(l.clone()));
                } else if texts["eos"].as_ref() != Some(l) {
                    eot = texts["eos"].clone();
                    texts.insert("eos", Some(l.clone()));
                }
                add.insert("eos", true);
            }
        }
        if !pair.is_empty() {
            let start = usize::from(first.is_some() && special_of(&pair[0]) == first);
            let stop = usize::from(last.is_some() && special_of(&pair[pair.len() - 1]) == last);
            let mid = match start + stop < pair.len() {
                true => &pair[start..pair.len() - stop],
                false => &[][..],
            };
            let (a, b) = match mid {
                [] => (None, None),
                [x, .., y] => (sequence_of(x), sequence_of(y)),
                [x] => (sequence_of(x), sequence_of(x)),
            };
            if a.as_deref() == Some("A") && b.as_deref() == Some("B") && mid.len() > 2 {
                let between = &mid[1..mid.len() - 1];
                let is_sep =
                    |e: &Option<String>| e.is_some() && (*e == texts["sep"] || *e == texts["eos"]);
                let mut add_sep = is_sep(&special_of(&between[0])) && last.is_none();
                if between.len() == 2 && is_sep(&special_of(&between[1])) {
                    add_sep = true;
                }
                add.insert("sep", add_sep);
                if add_sep && texts["sep"].is_none() && has_tc {
                    texts.insert("sep", texts["eos"].clone());
                }
            }
        }
    }
    let mut ids = std::collections::BTreeMap::new();
    if has_tc {
        for kind in ["bos", "eos", "sep"] {
            if let Some(b) = tc
                .get(format!("add_{kind}_token").as_str())
                .and_then(|v| v.as_bool())
            {
                add.entry(kind).or_insert(b);
            }
        }
        let added = tj.get("added_tokens").and_then(|a| a.as_array());
        let kinds = SPECIAL_KINDS.iter().map(|&k| (k, texts[k].clone()));
        for (kind, t) in kinds.chain([("eot", eot)]) {
            let id = t.and_then(|t| {
                added?
                    .iter()
                    .find(|a| a.get("content").and_then(|c| c.as_str()) == Some(t.as_str()))?
                    .get("id")?
                    .as_u64()
            });
            if let Some(id) = id.filter(|&i| (i as usize) < n) {
                ids.entry(kind).or_insert(id as u32);
            }
        }
    }
    for kind in SPECIAL_KINDS {
        let id = config
            .get(format!("{kind}_token_id").as_str())
            .and_then(|v| v.as_u64());
        if let Some(id) = id.filter(|&i| (i as usize) < n) {
            ids.entry(kind).or_insert(id as u32);
        }
    }
    Specials { ids, add }
}

type BTreeMapTexts = std::collections::BTreeMap<&'static str, Option<String>>;
