//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json` → GGUF tokenizer keys.
//!
//! The vocabulary becomes llama.cpp's arrays (tokens by id, token types, merges), so special
//! tokens, EOG detection, decoding and the chat template work exactly as for a GGUF file; the
//! whole `tokenizer.json` is kept as `tokenizer.huggingface.json`, and the tokenizer encodes
//! text with its own pipeline (normalizer, pre-tokenizer, BPE) through the `tokenizers` crate.
//! Only byte-level BPE vocabularies are read (Llama 3, Qwen, SmolLM, GPT-2 style).

use std::path::Path;

use serde_json::Value as Json;

use super::config::Config;
use super::{label, read_json};
use crate::gguf::{Array, StrArray, Value};
use crate::tokenizer::bpe_pre_name;
use crate::LoadError;

const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;

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
    let byte_level = |v: Option<&Json>| v.is_some_and(|v| v.to_string().contains("\"ByteLevel\""));
    if !byte_level(tj.get("pre_tokenizer")) && !byte_level(tj.get("decoder")) {
        return Err(err(
            "pre_tokenizer",
            "only byte-level BPE (a ByteLevel pre-tokenizer or decoder) is supported".into(),
        ));
    }
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
        put(id, text, TOKEN_NORMAL)?;
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
    let merges: StrArray = match model.get("merges").and_then(|m| m.as_array()) {
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
    kv("ggml.model", Value::String("gpt2".into()));
    if let Some(pre) = bpe_pre_name(tj.get("pre_tokenizer").unwrap_or(&Json::Null)) {
        kv("ggml.pre", Value::String(pre.into()));
    }
    kv("ggml.tokens", Value::Array(Array::String(tokens.clone())));
    kv("ggml.token_type", Value::Array(Array::I32(types)));
    kv("ggml.merges", Value::Array(Array::String(merges)));
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
