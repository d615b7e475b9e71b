//! The HTTP routes: OpenAI's `/v1/models`, `/v1/chat/completions`, `/v1/completions` (JSON
//! and SSE), and `/health`, `/metrics`, `/tokenize`, `/detokenize`. A generation request is
//! validated once (`request::parse`), checked against the context and the queue, handed to the
//! engine thread, and answered from its channel. The ticket it holds cancels the sequence when
//! the answer is dropped: a client that disconnects frees its slot and KV pages.

use super::error::ApiError;
use super::request::{self, Endpoint, GenRequest};
use super::worker::{Cmd, Job, Out, TokenInfo, Usage};
use super::App;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// A request's place in the engine: cancels the sequence unless it finished, and frees the
/// place in the queue bound, when dropped.
struct Ticket {
    app: Arc<App>,
    id: usize,
    finished: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.finished {
            if let Some(r) = self.app.ready.get() {
                let _ = r.send(Cmd::Cancel(self.id));
            }
        }
        self.app.inflight.fetch_sub(1, SeqCst);
    }
}

fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status,
                code: Some("payload_too_large"),
                ..ApiError::bad_request(format!(
                    "the body is larger than the limit of {} bytes (--max-body)",
                    super::MAX_BODY.load(Relaxed)
                ))
            }
        } else {
            ApiError {
                status,
                ..ApiError::bad_request(format!("could not read the body: {e}"))
            }
        }
    })
}

pub async fn chat(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(app, Endpoint::Chat, body).await
}

pub async fn completions(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(app, Endpoint::Completion, body).await
}

async fn generate(app: Arc<App>, ep: Endpoint, body: Result<Bytes, BytesRejection>) -> Response {
    let (req, ticket, rx) = match admit(&app, ep, body) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let meta = Meta {
        id: format!(
            "{}-{:x}{:08x}",
            if ep == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            ticket.id,
            app.created as u32 ^ (ticket.id as u32).wrapping_mul(2_654_435_761)
        ),
        created: unix_now(),
        model: app
            .ready
            .get()
            .map(|r| r.model_id.clone())
            .unwrap_or_default(),
        ep,
        logprobs: req.logprobs.is_some(),
    };
    if req.stream {
        stream(meta, req.include_usage, ticket, rx)
    } else {
        whole(meta, ticket, rx).await
    }
}

/// Validates, checks the context and the queue bound, and submits.
fn admit(
    app: &Arc<App>,
    ep: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<(GenRequest, Ticket, mpsc::UnboundedReceiver<Out>), ApiError> {
    let ready = app.ready.get().ok_or_else(ApiError::loading)?;
    if app.stopping.load(SeqCst) {
        return Err(ApiError::shutting_down());
    }
    let body = body_bytes(body)?;
    let req = request::parse(ep, &body, &ready.model, &app.defaults)?;
    let n = req.prompt.len();
    let ctx = ready.max_seq;
    if n >= ctx {
        return Err(ApiError::context_length(
            format!("this model's context holds {ctx} tokens, the prompt has {n}"),
            if ep == Endpoint::Chat {
                "messages"
            } else {
                "prompt"
            },
        ));
    }
    let max_tokens = match req.max_tokens {
        Some((m, name)) if n + m > ctx => {
            return Err(ApiError::context_length(
                format!("this model's context holds {ctx} tokens, the request wants {} ({n} in the prompt, {m} to generate): lower '{name}'", n + m),
                name,
            ))
        }
        Some((m, _)) => m,
        None => app.max_tokens.min(ctx - n),
    };
    // Bounded admission: at most --parallel running and --queue waiting.
    let limit = app.parallel + app.queue;
    if app.inflight.fetch_add(1, SeqCst) >= limit {
        app.inflight.fetch_sub(1, SeqCst);
        return Err(ApiError::overloaded(
            app.metrics.running.load(Relaxed) as usize,
            app.metrics.queued.load(Relaxed) as usize,
        ));
    }
    let id = app.next_id.fetch_add(1, SeqCst);
    let ticket = Ticket {
        app: app.clone(),
        id,
        finished: false,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt: req.prompt.clone(),
        max_tokens,
        params: req.params.clone(),
        logprobs: req.logprobs,
        stop: req.stop.clone(),
        ignore_eos: req.ignore_eos,
        arrived: Instant::now(),
        tx,
    };
    ready
        .send(Cmd::Submit(id, job))
        .map_err(|_| ApiError::shutting_down())?;
    Ok((req, ticket, rx))
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    ep: Endpoint,
    logprobs: bool,
}

impl Meta {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.ep, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(chunk)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert(
            "system_fingerprint".into(),
            json!(concat!("mollm-", env!("CARGO_PKG_VERSION"))),
        );
        m.insert("choices".into(), choices);
        m
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Log-probabilities gathered for one choice, in the endpoint's shape.
#[derive(Default)]
struct Lp {
    chat: Vec<Value>,
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top: Vec<Value>,
    offsets: Vec<usize>,
    offset: usize,
}

impl Lp {
    fn push(&mut self, ep: Endpoint, t: TokenInfo) {
        match ep {
            Endpoint::Chat => self.chat.push(json!({
                "token": t.chosen.text,
                "logprob": t.chosen.logprob,
                "bytes": t.chosen.bytes,
                "top_logprobs": t.top.iter().map(|p| json!({"token": p.text, "logprob": p.logprob, "bytes": p.bytes})).collect::<Vec<_>>(),
            })),
            Endpoint::Completion => {
                self.offsets.push(self.offset);
                self.offset += t.chosen.text.len();
                self.tokens.push(t.chosen.text);
                self.token_logprobs.push(t.chosen.logprob);
                let mut m = Map::new();
                for p in t.top {
                    m.entry(p.text).or_insert(json!(p.logprob));
                }
                self.top.push(Value::Object(m));
            }
        }
    }

    fn take(&mut self, ep: Endpoint) -> Value {
        match ep {
            Endpoint::Chat => json!({"content": std::mem::take(&mut self.chat), "refusal": null}),
            Endpoint::Completion => json!({
                "tokens": std::mem::take(&mut self.tokens),
                "token_logprobs": std::mem::take(&mut self.token_logprobs),
                "top_logprobs": std::mem::take(&mut self.top),
                "text_offset": std::mem::take(&mut self.offsets),
            }),
        }
    }
}

async fn whole(meta: Meta, mut ticket: Ticket, mut rx: mpsc::UnboundedReceiver<Out>) -> Response {
    let mut text = String::new();
    let mut lp = Lp::default();
    while let Some(o) = rx.recv().await {
        match o {
            Out::Token { text: t, logprobs } => {
                text.push_str(&t);
                if let Some(i) = logprobs {
                    lp.push(meta.ep, i);
                }
            }
            Out::Failed(e) => {
                ticket.finished = true;
                return e.into_response();
            }
            Out::Done {
                text: t,
                finish,
                usage,
            } => {
                ticket.finished = true;
                text.push_str(&t);
                let logprobs = if meta.logprobs {
                    lp.take(meta.ep)
                } else {
                    Value::Null
                };
                let choice = match meta.ep {
                    Endpoint::Chat => json!({
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": null},
                        "logprobs": logprobs,
                        "finish_reason": finish.as_str(),
                    }),
                    Endpoint::Completion => json!({
                        "index": 0,
                        "text": text,
                        "logprobs": logprobs,
                        "finish_reason": finish.as_str(),
                    }),
                };
                let mut m = meta.envelope(false, json!([choice]));
                m.insert("usage".into(), usage_json(&usage));
                return Json(Value::Object(m)).into_response();
            }
        }
    }
    ApiError::internal("the engine stopped before the answer was complete").into_response()
}

fn stream(
    meta: Meta,
    include_usage: bool,
    ticket: Ticket,
    mut rx: mpsc::UnboundedReceiver<Out>,
) -> Response {
    let (otx, orx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let chunk = move |meta: &Meta,
                      text: Option<&str>,
                      role: bool,
                      lp: Option<Value>,
                      finish: Option<&str>| {
        let choice = match meta.ep {
            Endpoint::Chat => {
                let mut delta = Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish})
            }
        };
        let mut m = meta.envelope(true, json!([choice]));
        if include_usage {
            m.insert("usage".into(), Value::Null);
        }
        Event::default().data(Value::Object(m).to_string())
    };
    tokio::spawn(async move {
        // The whole ticket moves in (not just the field written below): it lives as long as
        // the stream, and cancels the sequence when the client goes away.
        let mut ticket = ticket;
        let send = |e: Event| {
            let otx = otx.clone();
            async move { otx.send(Ok(e)).await.is_ok() }
        };
        if meta.ep == Endpoint::Chat && !send(chunk(&meta, Some(""), true, None, None)).await {
            return;
        }
        let mut lp = Lp::default();
        loop {
            let o = tokio::select! {
                _ = otx.closed() => return, // the client went away: the ticket cancels
                o = rx.recv() => o,
            };
            match o {
                Some(Out::Token { text, logprobs }) => {
                    let l = logprobs.map(|i| {
                        lp.push(meta.ep, i);
                        lp.take(meta.ep)
                    });
                    if text.is_empty() && l.is_none() {
                        continue;
                    }
                    if !send(chunk(&meta, Some(&text), false, l, None)).await {
                        return;
                    }
                }
                Some(Out::Done {
                    text,
                    finish,
                    usage,
                }) => {
                    ticket.finished = true;
                    if !text.is_empty() && !send(chunk(&meta, Some(&text), false, None, None)).await
                    {
                        return;
                    }
                    let last = match meta.ep {
                        Endpoint::Chat => chunk(&meta, None, false, None, Some(finish.as_str())),
                        Endpoint::Completion => {
                            chunk(&meta, Some(""), false, None, Some(finish.as_str()))
                        }
                    };
                    if !send(last).await {
                        return;
                    }
                    if include_usage {
                        let mut m = meta.envelope(true, json!([]));
                        m.insert("usage".into(), usage_json(&usage));
                        if !send(Event::default().data(Value::Object(m).to_string())).await {
                            return;
                        }
                    }
                    send(Event::default().data("[DONE]")).await;
                    return;
                }
                Some(Out::Failed(e)) => {
                    ticket.finished = true;
                    send(Event::default().data(e.body().to_string())).await;
                    return;
                }
                None => {
                    send(
                        Event::default().data(
                            ApiError::internal("the engine stopped before the answer was complete")
                                .body()
                                .to_string(),
                        ),
                    )
                    .await;
                    return;
                }
            }
        }
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(orx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(1)))
        .into_response()
}

pub async fn models(State(app): State<Arc<App>>) -> Response {
    let Some(r) = app.ready.get() else {
        return ApiError::loading().into_response();
    };
    Json(json!({"object": "list", "data": [{
        "id": r.model_id,
        "object": "model",
        "created": app.created,
        "owned_by": "mollm",
        "meta": {"n_ctx": r.max_seq, "n_vocab": r.model.hp.n_vocab, "architecture": r.model.hp.arch},
    }]}))
    .into_response()
}

pub async fn health(State(app): State<Arc<App>>) -> Response {
    if app.ready.get().is_none() {
        return ApiError::loading().into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        app.metrics.render(),
    )
        .into_response()
}

fn object_body(
    body: Result<Bytes, BytesRejection>,
    fields: &[&str],
) -> Result<Map<String, Value>, ApiError> {
    let b = body_bytes(body)?;
    let v: Value = serde_json::from_slice(&b)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    if let Some(k) = o.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(ApiError::field(
            k,
            format!("unknown field (fields: {})", fields.join(", ")),
        ));
    }
    Ok(o)
}

/// llama-server's `/tokenize`: `{"content", "add_special" (default false), "with_pieces"}`.
pub async fn tokenize(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let ready = app.ready.get().ok_or_else(ApiError::loading)?;
        let o = object_body(
            body,
            &["content", "add_special", "with_pieces", "parse_special"],
        )?;
        let flag = |k: &str, d: bool| match o.get(k) {
            None | Some(Value::Null) => Ok(d),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::field(k, "must be true or false")),
        };
        let content = o
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::field("content", "required (a string)"))?;
        let tok = &ready.model.tokenizer;
        let ids = tok
            .encode(
                content,
                flag("add_special", false)?,
                flag("parse_special", true)?,
            )
            .map_err(|e| ApiError::field("content", e))?;
        let tokens: Vec<Value> = if flag("with_pieces", false)? {
            ids.iter()
                .map(|&t| {
                    let b = tok.token_to_piece(t, true);
                    match String::from_utf8(b.clone()) {
                        Ok(s) => json!({"id": t, "piece": s}),
                        Err(_) => json!({"id": t, "piece": b}),
                    }
                })
                .collect()
        } else {
            ids.iter().map(|&t| json!(t)).collect()
        };
        Ok::<_, ApiError>(json!({"tokens": tokens}))
    })();
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// llama-server's `/detokenize`: `{"tokens": [ids]}` -> `{"content"}`.
pub async fn detokenize(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let ready = app.ready.get().ok_or_else(ApiError::loading)?;
        let o = object_body(body, &["tokens"])?;
        let n_vocab = ready.model.hp.n_vocab as u64;
        let ids = o
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| ApiError::field("tokens", "required (a list of token ids)"))?
            .iter()
            .map(|x| match x.as_u64() {
                Some(t) if t < n_vocab => Ok(t as u32),
                _ => Err(ApiError::field(
                    "tokens",
                    format!("{x} is not a token id below {n_vocab}"),
                )),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Ok::<_, ApiError>(json!({"content": ready.model.tokenizer.decode(&ids)}))
    })();
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::not_found(format!("no route {}", uri.path())).into_response()
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
