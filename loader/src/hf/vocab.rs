//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json` → GGUF tokenizer keys.
//!
//! The vocabulary becomes llama.cpp's arrays (tokens by id, token types, merges), so special
//! tokens, EOG detection, decoding and the chat template work exactly as for a GGUF file; the
//! whole `tokenizer.json` is kept as `tokenizer.huggingface.json`, and the tokenizer encodes
//! text with its own pipeline (normalizer, pre-tokenizer, BPE) through the `tokenizers` crate.
//! Two kinds of BPE vocabularies are read: byte-level (Llama 3, Qwen, SmolLM, GPT-2 style;
//! llama.cpp's `gpt2` model) and SentencePiece-style with `▁` for spaces and `<0xXX>` byte
//! fallback (Gemma, Llama 2; llama.cpp's `llama` model, whose decoding rules then apply).

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
    if model.get("type").and_then(|t| t.as_str()) != Some("BPE") {
        return Err(err(
            "model.type",
            "only BPE tokenizers are supported".into(),
        ));
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
        let is_byte = text.len() == 6
            && text.starts_with("<0x")
            && text.ends_with('>')
            && u8::from_str_radix(&text[3..5], 16).is_ok();
        let ty = match () {
            _ if spm && is_byte => TOKEN_BYTE,
            _ if spm && Some(text.as_str()) == unk_token => TOKEN_UNKNOWN,
            _ => TOKEN_NORMAL,
        };
        put(id, text, ty)?;
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
        put(
            id,
            content,
            if special {
                TOKEN_CONTROL
            } else {
                TOKEN_USER_DEFINED
            },
        )?;
    }
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
    let template = match tc.get("chat_template") {
        Some(Json::String(s)) => Some(s.clone()),
        // A list of named templates: the default one.
        Some(Json::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    };
    let template =
        template.or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
    if let Some(t) = template {
        kv("chat_template", Value::String(t));
    }
    let json = String::from_utf8(bytes).map_err(|_| err("(file)", "not UTF-8".into()))?;
    kv("huggingface.json", Value::String(json));
    Ok(())
}
