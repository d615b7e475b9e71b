//! llama-server's own routes that editors and front-ends use: `GET /props` (the model, its
//! template and the server's settings), `POST /apply-template` (the prompt a chat request
//! makes, not run) and `POST /infill` (fill-in-the-middle code completion with the model's FIM
//! tokens, answered in llama-server's shape: `content`, `stop`, token counts).

use super::error::ApiError;
use super::routes::{admission, admit, body_bytes, sse, Choice, BIG_BODY};
use super::worker::Out;
use super::App;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::mpsc;

/// `GET /props`.
pub async fn props(State(app): State<Arc<App>>) -> Response {
    let Some(r) = app.ready.get() else {
        return ApiError::loading().into_response();
    };
    let tok = &r.model.tokenizer;
    let text = |id: Option<u32>| id.map_or(String::new(), |i| tok.token_text(i).to_string());
    Json(json!({
        "model_path": r.model_id,
        "total_slots": app.parallel,
        "n_ctx": r.max_seq,
        "chat_template": r.model.chat_template.as_ref().map(|t| t.source()),
        "bos_token": text(tok.bos()),
        "eos_token": text(tok.eos()),
        "default_generation_settings": {
            "n_ctx": r.max_seq,
            "params": {
                "temperature": app.defaults.temperature,
                "top_k": app.defaults.top_k,
                "top_p": app.defaults.top_p,
                "min_p": app.defaults.min_p,
                "repeat_penalty": app.defaults.repeat_penalty,
                "n_predict": app.max_tokens,
            },
        },
        "infill": fim_tokens(tok).is_some(),
        "build_info": concat!("mollm ", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

/// `POST /apply-template`: `{"prompt"}`, the text the chat request's messages render to.
pub async fn apply_template(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let big = body.as_ref().map_or(0, |b| b.len()) > BIG_BODY;
    let r = admission(&app, big, move |app| {
        let ready = app.ready.get().ok_or_else(ApiError::loading)?;
        let o = super::request::json_object(&body_bytes(app, body)?)?;
        let prompt = super::request::render_chat(&o, &ready.model, ready.max_seq, app.strict)?;
        Ok(json!({"prompt": prompt}))
    })
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The model's FIM tokens (prefix, suffix, middle), by their usual spellings: Qwen2.5-Coder's
/// and StarCoder's.
fn fim_tokens(tok: &loader::Tokenizer) -> Option<[u32; 3]> {
    let spellings = [
        ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
        ["<fim-prefix>", "<fim-suffix>", "<fim-middle>"],
    ];
    spellings.iter().find_map(|s| {
        Some([
            tok.token_id(s[0])?,
            tok.token_id(s[1])?,
            tok.token_id(s[2])?,
        ])
    })
}

/// The completion request an infill request means: the FIM prompt as token ids
/// (prefix-suffix-middle: prefix, `input_prefix` + `prompt`, suffix, `input_suffix`, middle),
/// the sampling fields as they are.
fn to_completion(
    o: &Map<String, Value>,
    tok: &loader::Tokenizer,
    limit: usize,
) -> Result<Value, ApiError> {
    let [pre, suf, mid] = fim_tokens(tok).ok_or_else(|| ApiError {
        code: Some("unsupported_parameter"),
        ..ApiError::bad_request("this model has no fill-in-the-middle tokens (<|fim_prefix|>, ...): /infill needs a code model that has them")
    })?;
    let text = |k: &str| -> Result<&str, ApiError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(""),
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(ApiError::field(k, "must be a string")),
        }
    };
    let enc = |s: &str, k: &str| -> Result<Vec<u32>, ApiError> {
        tok.encode_limited(s, false, false, limit)
            .map_err(|e| ApiError::field(k, e))?
            .ok_or_else(|| {
                ApiError::context_length(format!("'{k}' has more than {limit} tokens"), k)
            })
    };
    let mut ids = vec![pre];
    ids.extend(enc(
        &format!("{}{}", text("input_prefix")?, text("prompt")?),
        "input_prefix",
    )?);
    ids.push(suf);
    ids.extend(enc(text("input_suffix")?, "input_suffix")?);
    ids.push(mid);
    let mut out = Map::new();
    out.insert("prompt".into(), json!(ids));
    for k in [
        "max_tokens",
        "n_predict",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "seed",
        "stop",
        "stream",
        "repeat_penalty",
    ] {
        if let Some(v) = o.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    Ok(Value::Object(out))
}

/// `POST /infill`.
pub async fn infill(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let big = body.as_ref().map_or(0, |b| b.len()) > BIG_BODY;
    let admitted = admission(&app, big, move |app| {
        let ready = app.ready.get().ok_or_else(ApiError::loading)?;
        let o = super::request::json_object(&body_bytes(app, body)?)?;
        let req = to_completion(&o, &ready.model.tokenizer, ready.max_seq)?;
        let bytes = Bytes::from(serde_json::to_vec(&req).unwrap_or_default());
        admit(app, super::request::Endpoint::Completion, Ok(bytes))
    })
    .await;
    let (req, mut choices) = match admitted {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let evaluated = req.prompt.len();
    let choice = choices.swap_remove(0);
    if req.stream {
        stream(evaluated, choice)
    } else {
        whole(evaluated, choice).await
    }
}

async fn whole(evaluated: usize, (mut ticket, mut rx): Choice) -> Response {
    let mut content = String::new();
    loop {
        match rx.recv().await {
            Some(Out::Token { text, .. }) => content.push_str(&text),
            Some(Out::Failed(e)) => {
                ticket.finished = true;
                return e.into_response();
            }
            Some(Out::Done {
                text,
                finish,
                usage,
                ..
            }) => {
                ticket.finished = true;
                content.push_str(&text);
                return Json(json!({
                    "content": content, "stop": true,
                    "stop_type": if finish == engine::sched::Finish::Length { "limit" } else { "eos" },
                    "tokens_predicted": usage.completion_tokens, "tokens_evaluated": evaluated,
                    "tokens_cached": usage.cached_tokens, "truncated": false,
                }))
                .into_response();
            }
            None => {
                return ApiError::internal("the engine stopped before the answer was complete")
                    .into_response()
            }
        }
    }
}

/// llama-server's stream: `data: {"content", "stop": false}` per piece, then one with
/// `"stop": true` and the counts.
fn stream(evaluated: usize, choice: Choice) -> Response {
    let (otx, orx) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let (mut ticket, mut rx) = choice;
        let send = |v: Value| {
            let otx = otx.clone();
            async move {
                otx.send(Ok(Event::default().data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        loop {
            let o = tokio::select! {
                _ = otx.closed() => return,
                o = rx.recv() => o,
            };
            match o {
                Some(Out::Token { text, .. }) => {
                    if !text.is_empty() && !send(json!({"content": text, "stop": false})).await {
                        return;
                    }
                }
                Some(Out::Done { text, usage, .. }) => {
                    ticket.finished = true;
                    send(json!({"content": text, "stop": true, "tokens_predicted": usage.completion_tokens,
                                "tokens_evaluated": evaluated})).await;
                    return;
                }
                Some(Out::Failed(e)) => {
                    ticket.finished = true;
                    send(e.body()).await;
                    return;
                }
                None => return,
            }
        }
    });
    sse(orx)
}
