//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), for the
//! `anthropic` client and Claude Code. A request is translated into the chat completion it
//! means (system, text, `tool_use` and `tool_result` blocks, tools, `tool_choice`,
//! `stop_sequences`) and validated and scheduled as one; the answer comes back as a `message`
//! with `text` and `tool_use` blocks and a `stop_reason`, or streamed as Anthropic's events
//! (`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`,
//! `message_stop`). Errors have Anthropic's shape. Fields it does not know (Claude Code sends
//! many: `thinking`, `metadata`, ...) are ignored as the chat endpoint ignores them.

use super::error::ApiError;
use super::routes::{admission, admit, body_bytes, sse, unix_now, Choice, BIG_BODY};
use super::tools::{Choice as ToolChoice, Dialect, Tools};
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

/// An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
fn error(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    let mut r = e.clone().into_response();
    *r.body_mut() = axum::body::Body::from(
        json!({"type": "error", "error": {"type": kind, "message": e.message}}).to_string(),
    );
    r
}

/// Text of a content value: a string, or the text of its `text` blocks.
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut s = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => s.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some(t) => {
                        return Err(ApiError::field(
                            &format!("{at}[{i}].type"),
                            format!("'{t}' blocks are not supported here (text only)"),
                        ))
                    }
                    None => return Err(ApiError::field(&format!("{at}[{i}].type"), "required")),
                }
            }
            Ok(s)
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::field(at, "must be a string or a list of blocks")),
    }
}

/// The chat completion request a Messages request means.
fn to_chat(o: &Map<String, Value>) -> Result<Value, ApiError> {
    let mut out = Map::new();
    let mut msgs = Vec::new();
    if let Some(s) = o.get("system").filter(|s| !s.is_null()) {
        msgs.push(json!({"role": "system", "content": text_of(s, "system")?}));
    }
    let list = o
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::field("messages", "required (a list)"))?;
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(ApiError::field(
                &format!("{at}.role"),
                "must be \"user\" or \"assistant\"",
            ));
        }
        let content = m.get("content").cloned().unwrap_or(Value::Null);
        let blocks = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(a) => a,
            _ => {
                return Err(ApiError::field(
                    &format!("{at}.content"),
                    "must be a string or a list of blocks",
                ))
            }
        };
        let (mut text, mut calls) = (String::new(), Vec::new());
        for (j, b) in blocks.iter().enumerate() {
            let bat = format!("{at}.content[{j}]");
            match b.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("tool_use") if role == "assistant" => {
                    let id = b.get("id").and_then(Value::as_str).unwrap_or("");
                    let name = b.get("name").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::field(&format!("{bat}.name"), "required (a string)")
                    })?;
                    let input = b.get("input").cloned().unwrap_or(json!({}));
                    calls.push(json!({"id": id, "type": "function",
                                      "function": {"name": name, "arguments": input.to_string()}}));
                }
                Some("tool_result") if role == "user" => {
                    let id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            ApiError::field(&format!("{bat}.tool_use_id"), "required (a string)")
                        })?;
                    let mut c = text_of(
                        b.get("content").unwrap_or(&Value::Null),
                        &format!("{bat}.content"),
                    )?;
                    if b.get("is_error") == Some(&Value::Bool(true)) {
                        c = format!("Error: {c}");
                    }
                    msgs.push(json!({"role": "tool", "tool_call_id": id, "content": c}));
                }
                // Claude Code sends earlier thinking back; the model does not see it.
                Some("thinking") | Some("redacted_thinking") => {}
                Some(t) => {
                    return Err(ApiError::field(
                        &format!("{bat}.type"),
                        format!("'{t}' blocks are not supported in {role} messages"),
                    ))
                }
                None => return Err(ApiError::field(&format!("{bat}.type"), "required")),
            }
        }
        if role == "assistant" {
            let mut a = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                a["tool_calls"] = Value::Array(calls);
            }
            msgs.push(a);
        } else if !text.is_empty() || !msgs.last().is_some_and(|m| m["role"] == "tool") {
            msgs.push(json!({"role": "user", "content": text}));
        }
    }
    out.insert("messages".into(), Value::Array(msgs));
    // Anthropic requires max_tokens; count_tokens does not send it.
    if let Some(m) = o.get("max_tokens") {
        out.insert("max_tokens".into(), m.clone());
    }
    for k in ["temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = o.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(s) = o.get("stop_sequences").filter(|s| !s.is_null()) {
        out.insert("stop".into(), s.clone());
    }
    if let Some(t) = o
        .get("tools")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())
    {
        let tools: Vec<Value> = t
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or(Value::Null),
                    "parameters": t.get("input_schema").cloned().unwrap_or(Value::Null),
                }})
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools));
        if let Some(c) = o.get("tool_choice").filter(|c| !c.is_null()) {
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => {
                    json!({"type": "function", "function": {"name": c.get("name").cloned().unwrap_or(Value::Null)}})
                }
                _ => {
                    return Err(ApiError::field(
                        "tool_choice.type",
                        "must be auto, any, tool or none",
                    ))
                }
            };
            out.insert("tool_choice".into(), choice);
            if c.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
                out.insert("parallel_tool_calls".into(), json!(false));
            }
        }
    }
    Ok(Value::Object(out))
}

fn parse_body(
    app: &Arc<App>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Map<String, Value>, Value), ApiError> {
    let raw = body_bytes(app, body)?;
    let o = super::request::json_object(&raw)?;
    let chat = to_chat(&o)?;
    Ok((o, chat))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}` of the prompt the request makes.
pub async fn count_tokens(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = admission(&app, false, move |app| {
        let ready = app.ready.get().ok_or_else(ApiError::loading)?;
        let (_, chat) = parse_body(app, body)?;
        let bytes = serde_json::to_vec(&chat).unwrap_or_default();
        let req = super::request::parse(
            super::request::Endpoint::Chat,
            &bytes,
            &ready.model,
            &app.defaults,
            ready.max_seq - 1,
            false,
        )?;
        Ok(req.prompt.len())
    })
    .await;
    match r {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error(e),
    }
}

/// The `stop_reason` of a finished choice.
fn stop_reason(finish: engine::sched::Finish, stop: &Option<String>, calls: bool) -> &'static str {
    // Cut off by max_tokens is that, even after (or inside) a call, as Anthropic's API says.
    match (calls, stop, finish) {
        (_, _, engine::sched::Finish::Length) => "max_tokens",
        (true, _, _) => "tool_use",
        (_, Some(_), _) => "stop_sequence",
        _ => "end_turn",
    }
}

/// The content blocks of a finished text.
fn blocks(tools: &Option<(Tools, Dialect)>, text: &str, id: &str) -> (Vec<Value>, bool) {
    if let Some((t, d)) = tools.as_ref().filter(|(t, _)| t.choice != ToolChoice::None) {
        if let Some((content, calls)) = t.read(text, *d) {
            let mut out = Vec::new();
            if !content.is_empty() {
                out.push(json!({"type": "text", "text": content}));
            }
            for (k, c) in calls.iter().enumerate() {
                let input: Value = serde_json::from_str(&c.arguments).unwrap_or(json!({}));
                out.push(json!({"type": "tool_use", "id": format!("toolu_{id}_{k}"),
                                "name": c.name, "input": input}));
            }
            return (out, true);
        }
    }
    (vec![json!({"type": "text", "text": text})], false)
}

/// `POST /v1/messages`.
pub async fn messages(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let big = body.as_ref().map_or(0, |b| b.len()) > BIG_BODY;
    let admitted = admission(&app, big, move |app| {
        let (o, chat) = parse_body(app, body)?;
        if !o.contains_key("max_tokens") {
            return Err(ApiError::field("max_tokens", "required"));
        }
        let bytes = Bytes::from(serde_json::to_vec(&chat).unwrap_or_default());
        admit(app, super::request::Endpoint::Chat, Ok(bytes))
    })
    .await;
    let (req, mut choices) = match admitted {
        Ok(x) => x,
        Err(e) => return error(e),
    };
    let id = format!("msg_{:x}{:08x}", choices[0].0.id, unix_now() as u32);
    let model = app
        .ready
        .get()
        .map(|r| r.model_id.clone())
        .unwrap_or_default();
    let rx = choices.swap_remove(0);
    if req.stream {
        stream(id, model, req.tools, req.prompt.len(), rx)
    } else {
        whole(id, model, req.tools, rx).await
    }
}

async fn whole(
    id: String,
    model: String,
    tools: Option<(Tools, Dialect)>,
    (mut ticket, mut rx): Choice,
) -> Response {
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Out::Token { text: t, .. }) => text.push_str(&t),
            Some(Out::Failed(e)) => {
                ticket.finished = true;
                return error(e);
            }
            Some(Out::Done {
                text: t,
                finish,
                stop_sequence,
                usage,
            }) => {
                ticket.finished = true;
                text.push_str(&t);
                let (content, calls) = blocks(&tools, &text, &id);
                return Json(json!({
                    "id": id, "type": "message", "role": "assistant", "model": model,
                    "content": content,
                    "stop_reason": stop_reason(finish, &stop_sequence, calls),
                    "stop_sequence": stop_sequence,
                    "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                              "cache_read_input_tokens": usage.cached_tokens},
                }))
                .into_response();
            }
            None => {
                return error(ApiError::internal(
                    "the engine stopped before the answer was complete",
                ))
            }
        }
    }
}

fn event(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// The events of a streamed message: text as `text_delta`s of block 0 (held back where it may
/// be a tool call), calls as `tool_use` blocks with their input in one `input_json_delta`.
fn stream(
    id: String,
    model: String,
    tools: Option<(Tools, Dialect)>,
    prompt: usize,
    choice: Choice,
) -> Response {
    let (otx, orx) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        // The ticket moves in whole: it lives as long as the stream, and cancels the sequence
        // when the client goes away.
        let (mut ticket, mut rx) = choice;
        let send = |e: Event| {
            let otx = otx.clone();
            async move { otx.send(Ok(e)).await.is_ok() }
        };
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": prompt, "output_tokens": 0}}});
        if !send(event("message_start", start)).await {
            return;
        }
        let active = tools.as_ref().filter(|(t, _)| t.choice != ToolChoice::None);
        let (mut all, mut sent, mut open) = (String::new(), 0usize, false);
        let text_block = |open: &mut bool| {
            let was = *open;
            *open = true;
            (!was).then(|| event("content_block_start", json!({"type": "content_block_start", "index": 0,
                                                                "content_block": {"type": "text", "text": ""}})))
        };
        loop {
            let o = tokio::select! {
                _ = otx.closed() => return,
                o = rx.recv() => o,
            };
            match o {
                Some(Out::Token { text, .. }) => {
                    all.push_str(&text);
                    let upto = match active {
                        Some((t, d)) => t.hold_from(&all, *d).max(sent),
                        None => all.len(),
                    };
                    if upto > sent {
                        if let Some(e) = text_block(&mut open) {
                            if !send(e).await {
                                return;
                            }
                        }
                        let delta = json!({"type": "content_block_delta", "index": 0,
                                           "delta": {"type": "text_delta", "text": &all[sent..upto]}});
                        sent = upto;
                        if !send(event("content_block_delta", delta)).await {
                            return;
                        }
                    }
                }
                Some(Out::Done {
                    text,
                    finish,
                    stop_sequence,
                    usage,
                }) => {
                    ticket.finished = true;
                    all.push_str(&text);
                    let calls = active.and_then(|(t, d)| t.read(&all, *d));
                    let rest = match &calls {
                        Some(_) => {
                            let upto = active
                                .map_or(all.len(), |(t, d)| t.hold_from(&all, *d))
                                .max(sent);
                            all[sent..upto].trim_end().to_string()
                        }
                        None => all[sent..].to_string(),
                    };
                    let mut events = Vec::new();
                    if !rest.is_empty() {
                        events.extend(text_block(&mut open));
                        events.push(event(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": rest}}),
                        ));
                    }
                    let mut index = 0;
                    if open {
                        events.push(event(
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": 0}),
                        ));
                        index = 1;
                    }
                    let n_calls = calls.as_ref().map_or(0, |(_, c)| c.len());
                    for (k, c) in calls.iter().flat_map(|(_, c)| c.iter()).enumerate() {
                        let i = index + k;
                        events.push(event("content_block_start", json!({"type": "content_block_start", "index": i,
                            "content_block": {"type": "tool_use", "id": format!("toolu_{id}_{k}"), "name": c.name, "input": {}}})));
                        events.push(event(
                            "content_block_delta",
                            json!({"type": "content_block_delta", "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": c.arguments}}),
                        ));
                        events.push(event(
                            "content_block_stop",
                            json!({"type": "content_block_stop", "index": i}),
                        ));
                    }
                    events.push(event("message_delta", json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(finish, &stop_sequence, n_calls > 0), "stop_sequence": stop_sequence},
                        "usage": {"output_tokens": usage.completion_tokens}})));
                    events.push(event("message_stop", json!({"type": "message_stop"})));
                    for e in events {
                        if !send(e).await {
                            return;
                        }
                    }
                    return;
                }
                Some(Out::Failed(e)) => {
                    ticket.finished = true;
                    let kind = if e.status.as_u16() == 400 {
                        "invalid_request_error"
                    } else {
                        "api_error"
                    };
                    send(event(
                        "error",
                        json!({"type": "error", "error": {"type": kind, "message": e.message}}),
                    ))
                    .await;
                    return;
                }
                None => {
                    send(event(
                        "error",
                        json!({"type": "error", "error": {"type": "api_error",
                        "message": "the engine stopped before the answer was complete"}}),
                    ))
                    .await;
                    return;
                }
            }
        }
    });
    sse(orx)
}
