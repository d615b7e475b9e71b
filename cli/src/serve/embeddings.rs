//! `/v1/embeddings` (OpenAI's shape; llama-server's `--embeddings`): each input's normalized
//! sentence embedding. Inputs are validated and tokenized on admission, then computed by the
//! engine thread between generation steps, the inputs of every request waiting there batched
//! into shared steps ([`engine::Session::embed`]).

use super::error::ApiError;
use super::routes::{admission, body_bytes, unix_now, BIG_BODY};
use super::worker::{Cmd, EmbedJob};
use super::App;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

const FIELDS: &[&str] = &["input", "model", "encoding_format", "dimensions", "user"];

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Float,
    Base64,
}

struct EmbedRequest {
    inputs: Vec<Vec<u32>>,
    encoding: Encoding,
    ignored: Vec<String>,
}

pub async fn embeddings(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let big = body.as_ref().map_or(0, |b| b.len()) > BIG_BODY;
    let req = match admission(&app, big, move |a| parse(a, body)).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let n_tokens: usize = req.inputs.iter().map(Vec::len).sum();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let Some(ready) = app.ready.get() else {
        return ApiError::loading().into_response();
    };
    let sent = ready.send(Cmd::Embed(EmbedJob {
        inputs: req.inputs,
        tx,
    }));
    if sent.is_err() {
        return ApiError::shutting_down().into_response();
    }
    let vecs = match rx.await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return e.into_response(),
        Err(_) => return ApiError::shutting_down().into_response(),
    };
    let data: Vec<Value> = vecs
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let e = match req.encoding {
                Encoding::Float => json!(v),
                Encoding::Base64 => json!(base64_f32(v)),
            };
            json!({"object": "embedding", "index": i, "embedding": e})
        })
        .collect();
    let mut resp = Json(json!({
        "object": "list",
        "data": data,
        "model": ready.model_id,
        "created": unix_now(),
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response();
    if !req.ignored.is_empty() {
        if let Ok(v) = axum::http::HeaderValue::from_str(&req.ignored.join(",")) {
            resp.headers_mut().insert("x-mollm-ignored-fields", v);
        }
    }
    resp
}

/// Little-endian f32 bytes in standard base64 (what the `openai` client asks for by default).
fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Validates the body and tokenizes its inputs (a string, strings, token ids, or lists of
/// token ids), each at most the longest input the model takes.
fn parse(app: &Arc<App>, body: Result<Bytes, BytesRejection>) -> Result<EmbedRequest, ApiError> {
    let ready = app.ready.get().ok_or_else(ApiError::loading)?;
    if app.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::shutting_down());
    }
    let o: Map<String, Value> = super::request::json_object(&body_bytes(app, body)?)?;
    let mut ignored = Vec::new();
    for k in o.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
        if app.strict {
            return Err(ApiError::field(
                k,
                format!("unknown field (fields: {})", FIELDS.join(", ")),
            ));
        }
        ignored.push(k.clone());
    }
    let encoding = match o.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(_) => {
            return Err(ApiError::field(
                "encoding_format",
                "must be \"float\" or \"base64\"",
            ))
        }
    };
    let n_embd = ready.model.hp.n_embd;
    match o.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_u64() == Some(n_embd as u64) => {}
        Some(_) => {
            return Err(ApiError::field(
                "dimensions",
                format!(
                "this model's embeddings have {n_embd} values; shortening them is not supported"
            ),
            ))
        }
    }
    let limit = ready.embed_max;
    let model = &ready.model;
    let n_vocab = model.hp.n_vocab as u64;
    let too_long = |i: usize| {
        ApiError::context_length(
            format!("input {i} has more than {limit} tokens, the longest input this server embeds"),
            "input",
        )
    };
    let text = |i: usize, s: &str| -> Result<Vec<u32>, ApiError> {
        if s.is_empty() {
            return Err(ApiError::field(
                "input",
                format!("input {i} is an empty string"),
            ));
        }
        model
            .tokenizer
            .encode_limited(s, true, true, limit)
            .map_err(|e| ApiError::field("input", e))?
            .ok_or_else(|| too_long(i))
    };
    let ids = |i: usize, list: &[Value]| -> Result<Vec<u32>, ApiError> {
        if list.is_empty() {
            return Err(ApiError::field("input", format!("input {i} has no tokens")));
        }
        if list.len() > limit {
            return Err(too_long(i));
        }
        list.iter()
            .map(|t| match t.as_u64() {
                Some(id) if id < n_vocab => Ok(id as u32),
                _ => Err(ApiError::field(
                    "input",
                    format!("input {i}: {t} is not a token id below {n_vocab}"),
                )),
            })
            .collect()
    };
    let inputs = match o.get("input") {
        Some(Value::String(s)) => vec![text(0, s)?],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::field("input", "is an empty list"))
        }
        Some(Value::Array(a)) if a.len() > MAX_INPUTS => {
            return Err(ApiError::field(
                "input",
                format!("{} inputs (limit {MAX_INPUTS})", a.len()),
            ))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![ids(0, a)?],
        Some(Value::Array(a)) => (a.iter().enumerate())
            .map(|(i, x)| match x {
                Value::String(s) => text(i, s),
                Value::Array(l) => ids(i, l),
                _ => Err(ApiError::field(
                    "input",
                    format!("input {i} must be a string or a list of token ids"),
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::field(
                "input",
                "required: a string, a list of strings, or token ids",
            ))
        }
    };
    Ok(EmbedRequest {
        inputs,
        encoding,
        ignored,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_of_floats_matches_the_standard_alphabet() {
        // 1.0f32 = 00 00 80 3f; 1.0, 2.0 = 00 00 80 3f 00 00 00 40.
        assert_eq!(super::base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(super::base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(super::base64_f32(&[]), "");
    }
}
