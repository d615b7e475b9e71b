//! OpenAI's Responses API (`POST /v1/responses`), stateless: nothing is stored, so
//! `previous_response_id` is refused and `store` is taken as false. A request (`input` as text
//! or items: messages, `function_call`, `function_call_output`; `instructions`; function
//! tools; `tool_choice`; `text.format`) is translated into the chat completion it means and
//! scheduled as one; the answer is a `response` with `message` and `function_call` output
//! items, or streamed as its events up to `response.completed`.

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

/// Text of a message's content: a string, or its `input_text` / `output_text` / `text` parts.
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for (i, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        s.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some(t) => {
                        return Err(ApiError::field(
                            &format!("{at}[{i}].type"),
                            format!("'{t}' parts are not supported (text only)"),
                        ))
                    }
                    None => return Err(ApiError::field(&format!("{at}[{i}].type"), "required")),
                }
            }
            Ok(s)
        }
        _ => Err(ApiError::field(at, "must be a string or a list of parts")),
    }
}

/// The chat completion request a Responses request means.
fn to_chat(o: &Map<String, Value>) -> Result<Value, ApiError> {
    if o.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::field(
                "previous_response_id",
                "this server keeps no responses (store: false): send the whole conversation in 'input'",
            )
        });
    }
    let mut msgs = Vec::new();
    if let Some(i) = o.get("instructions").filter(|i| !i.is_null()) {
        msgs.push(json!({"role": "system", "content": text_of(i, "instructions")?}));
    }
    match o.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, it) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                let kind = it.get("type").and_then(Value::as_str).unwrap_or("message");
                match kind {
                    "message" => {
                        let role = it.get("role").and_then(Value::as_str).unwrap_or("");
                        if !["user", "assistant", "system", "developer"].contains(&role) {
                            return Err(ApiError::field(
                                &format!("{at}.role"),
                                "must be user, assistant, system or developer",
                            ));
                        }
                        let content = text_of(
                            it.get("content").unwrap_or(&Value::Null),
                            &format!("{at}.content"),
                        )?;
                        msgs.push(json!({"role": role, "content": content}));
                    }
                    "function_call" => {
                        let call = json!({"id": it.get("call_id").cloned().unwrap_or(Value::Null), "type": "function",
                                          "function": {"name": it.get("name").cloned().unwrap_or(Value::Null),
                                                       "arguments": it.get("arguments").cloned().unwrap_or(json!("{}"))}});
                        // Calls of one turn join the assistant message before them.
                        match msgs.last_mut() {
                            Some(m) if m["role"] == "assistant" => {
                                match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                                    Some(a) => a.push(call),
                                    None => m["tool_calls"] = json!([call]),
                                }
                            }
                            _ => msgs.push(
                                json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                            ),
                        }
                    }
                    "function_call_output" => {
                        let id = it.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::field(&format!("{at}.call_id"), "required (a string)")
                        })?;
                        let out = match it.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v) => v.to_string(),
                            None => String::new(),
                        };
                        msgs.push(json!({"role": "tool", "tool_call_id": id, "content": out}));
                    }
                    "reasoning" => {}
                    t => {
                        return Err(ApiError {
                            code: Some("unsupported_parameter"),
                            ..ApiError::field(
                                &format!("{at}.type"),
                                format!("'{t}' items are not supported"),
                            )
                        })
                    }
                }
            }
        }
        _ => {
            return Err(ApiError::field(
                "input",
                "required (a string or a list of items)",
            ))
        }
    }
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(msgs));
    if let Some(m) = o.get("max_output_tokens").filter(|m| !m.is_null()) {
        out.insert("max_tokens".into(), m.clone());
    }
    for k in ["temperature", "top_p", "stream", "parallel_tool_calls"] {
        if let Some(v) = o.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(t) = o
        .get("tools")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())
    {
        let mut tools = Vec::new();
        for (i, t) in t.iter().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError {
                    code: Some("unsupported_parameter"),
                    ..ApiError::field(
                        &format!("tools[{i}].type"),
                        "only function tools are supported",
                    )
                });
            }
            tools.push(json!({"type": "function", "function": {
                "name": t.get("name").cloned().unwrap_or(Value::Null),
                "description": t.get("description").cloned().unwrap_or(Value::Null),
                "parameters": t.get("parameters").cloned().unwrap_or(Value::Null),
            }}));
        }
        out.insert("tools".into(), Value::Array(tools));
        if let Some(c) = o.get("tool_choice").filter(|c| !c.is_null()) {
            let choice = match c {
                Value::String(_) => c.clone(),
                Value::Object(m) if m.get("type") == Some(&json!("function")) => {
                    json!({"type": "function", "function": {"name": m.get("name").cloned().unwrap_or(Value::Null)}})
                }
                _ => {
                    return Err(ApiError::field(
                        "tool_choice",
                        "must be auto, none, required or a function",
                    ))
                }
            };
            out.insert("tool_choice".into(), choice);
        }
    }
    if let Some(f) = o
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|f| !f.is_null())
    {
        let rf = match f.get("type").and_then(Value::as_str) {
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": f.get("name").cloned().unwrap_or(json!("output")),
                "schema": f.get("schema").cloned().unwrap_or(Value::Null),
                "strict": f.get("strict").cloned().unwrap_or(Value::Null)}}),
            _ => f.clone(),
        };
        out.insert("response_format".into(), rf);
    }
    Ok(Value::Object(out))
}

/// The output items of a finished text: a message, or the function calls it makes.
fn items(tools: &Option<(Tools, Dialect)>, text: &str, id: &str) -> Vec<Value> {
    if let Some((t, d)) = tools.as_ref().filter(|(t, _)| t.choice != ToolChoice::None) {
        if let Some((content, calls)) = t.read(text, *d) {
            let mut out = Vec::new();
            if !content.is_empty() {
                out.push(message(id, &content));
            }
            for (k, c) in calls.iter().enumerate() {
                out.push(
                    json!({"type": "function_call", "id": format!("fc_{id}_{k}"),
                                "call_id": format!("call_{id}_{k}"), "name": c.name,
                                "arguments": c.arguments, "status": "completed"}),
                );
            }
            return out;
        }
    }
    vec![message(id, text)]
}

fn message(id: &str, text: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// The `response` object; `output` empty and `status` in_progress while it streams.
fn response(
    id: &str,
    model: &str,
    created: u64,
    status: &str,
    output: Vec<Value>,
    usage: Value,
    incomplete: bool,
) -> Value {
    json!({
        "id": format!("resp_{id}"), "object": "response", "created_at": created, "status": status,
        "model": model, "output": output, "error": null,
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "store": false,
        "usage": usage,
    })
}

fn usage_json(u: &super::worker::Usage) -> Value {
    json!({"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
           "total_tokens": u.prompt_tokens + u.completion_tokens,
           "input_tokens_details": {"cached_tokens": u.cached_tokens},
           "output_tokens_details": {"reasoning_tokens": 0}})
}

/// `POST /v1/responses`.
pub async fn create(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    let big = body.as_ref().map_or(0, |b| b.len()) > BIG_BODY;
    let admitted = admission(&app, big, move |app| {
        let raw = body_bytes(app, body)?;
        let o = super::request::json_object(&raw)?;
        let chat = to_chat(&o)?;
        let bytes = Bytes::from(serde_json::to_vec(&chat).unwrap_or_default());
        admit(app, super::request::Endpoint::Chat, Ok(bytes))
    })
    .await;
    let (req, mut choices) = match admitted {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let id = format!("{:x}{:08x}", choices[0].0.id, unix_now() as u32);
    let model = app
        .ready
        .get()
        .map(|r| r.model_id.clone())
        .unwrap_or_default();
    let choice = choices.swap_remove(0);
    if req.stream {
        stream(id, model, req.tools, choice)
    } else {
        whole(id, model, req.tools, choice).await
    }
}

async fn whole(
    id: String,
    model: String,
    tools: Option<(Tools, Dialect)>,
    (mut ticket, mut rx): Choice,
) -> Response {
    let created = unix_now();
    let mut text = String::new();
    loop {
        match rx.recv().await {
            Some(Out::Token { text: t, .. }) => text.push_str(&t),
            Some(Out::Failed(e)) => {
                ticket.finished = true;
                return e.into_response();
            }
            Some(Out::Done {
                text: t,
                finish,
                usage,
                ..
            }) => {
                ticket.finished = true;
                text.push_str(&t);
                let length = finish == engine::sched::Finish::Length;
                let status = if length { "incomplete" } else { "completed" };
                let out = items(&tools, &text, &id);
                return Json(response(
                    &id,
                    &model,
                    created,
                    status,
                    out,
                    usage_json(&usage),
                    length,
                ))
                .into_response();
            }
            None => {
                return ApiError::internal("the engine stopped before the answer was complete")
                    .into_response()
            }
        }
    }
}

/// The streamed events: `response.created`, `response.in_progress`, the message item with its
/// text deltas (held back where it may be a call), the function call items, and
/// `response.completed` with the whole response; each with its `sequence_number`.
fn stream(id: String, model: String, tools: Option<(Tools, Dialect)>, choice: Choice) -> Response {
    let (otx, orx) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let (mut ticket, mut rx) = choice;
        let created = unix_now();
        let mut seq = 0u64;
        let mut ev = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(seq);
            seq += 1;
            Event::default().event(kind).data(data.to_string())
        };
        let send = |e: Event| {
            let otx = otx.clone();
            async move { otx.send(Ok(e)).await.is_ok() }
        };
        let empty = response(
            &id,
            &model,
            created,
            "in_progress",
            vec![],
            Value::Null,
            false,
        );
        for kind in ["response.created", "response.in_progress"] {
            if !send(ev(kind, json!({"response": empty}))).await {
                return;
            }
        }
        let active = tools.as_ref().filter(|(t, _)| t.choice != ToolChoice::None);
        let msg_id = format!("msg_{id}");
        let (mut all, mut sent, mut open) = (String::new(), 0usize, false);
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
                        if !open {
                            open = true;
                            let item = json!({"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []});
                            let part =
                                json!({"type": "output_text", "text": "", "annotations": []});
                            for e in [
                                ev(
                                    "response.output_item.added",
                                    json!({"output_index": 0, "item": item}),
                                ),
                                ev(
                                    "response.content_part.added",
                                    json!({"item_id": msg_id, "output_index": 0, "content_index": 0, "part": part}),
                                ),
                            ] {
                                if !send(e).await {
                                    return;
                                }
                            }
                        }
                        let d = ev(
                            "response.output_text.delta",
                            json!({"item_id": msg_id, "output_index": 0, "content_index": 0, "delta": &all[sent..upto]}),
                        );
                        sent = upto;
                        if !send(d).await {
                            return;
                        }
                    }
                }
                Some(Out::Done {
                    text,
                    finish,
                    usage,
                    ..
                }) => {
                    ticket.finished = true;
                    all.push_str(&text);
                    let out = items(&tools, &all, &id);
                    let mut events = Vec::new();
                    for (i, item) in out.iter().enumerate() {
                        if item["type"] == "message" {
                            let text = item["content"][0]["text"]
                                .as_str()
                                .unwrap_or("")
                                .to_string();
                            if !open {
                                open = true;
                                let start = json!({"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []});
                                events.push(ev(
                                    "response.output_item.added",
                                    json!({"output_index": i, "item": start}),
                                ));
                                events.push(ev("response.content_part.added", json!({"item_id": msg_id, "output_index": i, "content_index": 0,
                                    "part": {"type": "output_text", "text": "", "annotations": []}})));
                            }
                            // What was not streamed yet (the message is what was, trimmed, when
                            // calls follow it).
                            let rest = text
                                .get(sent..)
                                .filter(|_| text.get(..sent) == all.get(..sent))
                                .unwrap_or("");
                            if !rest.is_empty() {
                                events.push(ev("response.output_text.delta", json!({"item_id": msg_id, "output_index": i, "content_index": 0, "delta": rest})));
                            }
                            events.push(ev("response.output_text.done", json!({"item_id": msg_id, "output_index": i, "content_index": 0, "text": text})));
                            events.push(ev("response.content_part.done", json!({"item_id": msg_id, "output_index": i, "content_index": 0, "part": item["content"][0]})));
                            events.push(ev(
                                "response.output_item.done",
                                json!({"output_index": i, "item": item}),
                            ));
                        } else {
                            let mut added = item.clone();
                            added["arguments"] = json!("");
                            added["status"] = json!("in_progress");
                            events.push(ev(
                                "response.output_item.added",
                                json!({"output_index": i, "item": added}),
                            ));
                            events.push(ev("response.function_call_arguments.delta", json!({"item_id": item["id"], "output_index": i, "delta": item["arguments"]})));
                            events.push(ev("response.function_call_arguments.done", json!({"item_id": item["id"], "output_index": i, "arguments": item["arguments"]})));
                            events.push(ev(
                                "response.output_item.done",
                                json!({"output_index": i, "item": item}),
                            ));
                        }
                    }
                    let length = finish == engine::sched::Finish::Length;
                    let status = if length { "incomplete" } else { "completed" };
                    let kind = if length {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    let r = response(
                        &id,
                        &model,
                        created,
                        status,
                        out,
                        usage_json(&usage),
                        length,
                    );
                    events.push(ev(kind, json!({"response": r})));
                    for e in events {
                        if !send(e).await {
                            return;
                        }
                    }
                    return;
                }
                Some(Out::Failed(e)) => {
                    ticket.finished = true;
                    send(ev(
                        "error",
                        json!({"code": e.code, "message": e.message, "param": e.param}),
                    ))
                    .await;
                    return;
                }
                None => {
                    send(ev("error", json!({"code": null, "message": "the engine stopped before the answer was complete", "param": null}))).await;
                    return;
                }
            }
        }
    });
    sse(orx)
}
