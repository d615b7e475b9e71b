//! The HTTP routes: OpenAI's `/v1/models`, `/v1/chat/completions`, `/v1/completions` (JSON
//! and SSE), and `/health`, `/metrics`, `/tokenize`, `/detokenize`. A generation request is
//! validated once (`request::parse`), checked against the context and the queue, handed to the
//! engine thread, and answered from its channel. The ticket it holds cancels the sequence when
//! the answer is dropped: a client that disconnects frees its slot and KV pages.

use super::error::ApiError;
use super::request::{self, Endpoint, GenRequest};
use super::worker::{Cmd, Job, Out, TokenInfo, Usage};
use super::App;
use crate::common::token_ids;
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
pub(super) struct Ticket {
    app: Arc<App>,
    pub(super) id: usize,
    pub(super) finished: bool,
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

pub(super) fn body_bytes(
    app: &App,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(app.max_body)
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
    // Tokenizing a long prompt (and rendering a chat template) takes milliseconds: off the
    // runtime's threads, which serve every connection.
    let big = body_len(&body) > BIG_BODY;
    let admitted = admission(&app, big, move |a| admit(a, ep, body)).await;
    let (req, choices) = match admitted {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let first = choices[0].0.id;
    let meta = Meta {
        id: format!(
            "{}-{:x}{:08x}",
            if ep == Endpoint::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            first,
            app.created as u32 ^ (first as u32).wrapping_mul(2_654_435_761)
        ),
        created: unix_now(),
        model: app
            .ready
            .get()
            .map(|r| r.model_id.clone())
            .unwrap_or_default(),
        ep,
        logprobs: req.logprobs.is_some(),
        tools: req
            .tools
            .filter(|(t, _)| t.choice != super::tools::Choice::None),
    };
    let mut resp = if req.stream {
        stream(meta, req.include_usage, choices)
    } else {
        whole(meta, choices).await
    };
    if !req.ignored.is_empty() {
        if let Ok(v) = axum::http::HeaderValue::from_str(&req.ignored.join(",")) {
            resp.headers_mut().insert("x-mollm-ignored-fields", v);
        }
    }
    resp
}

/// Runs `f` (validation, template rendering, tokenizing: milliseconds to a second of CPU and
/// memory in proportion to the prompt) off the runtime's threads, which serve every
/// connection, and at most `App::admissions` at once: the rest wait their turn, so a burst of
/// long prompts costs the memory of a few, not of all.
pub(super) async fn admission<T: Send + 'static>(
    app: &Arc<App>,
    big: bool,
    f: impl FnOnce(&Arc<App>) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let _permit = app
        .admissions
        .acquire()
        .await
        .map_err(|_| ApiError::shutting_down())?;
    let a = app.clone();
    tokio::task::spawn_blocking(move || {
        let r = f(&a);
        if big {
            trim_heap();
        }
        r
    })
    .await
    .unwrap_or_else(|e| {
        Err(ApiError::internal(format!(
            "request validation failed: {e}"
        )))
    })
}

/// A body past this many bytes gets the heap trimmed after its admission ([`trim_heap`]).
pub(super) const BIG_BODY: usize = 64 << 10;

fn body_len(body: &Result<Bytes, BytesRejection>) -> usize {
    body.as_ref().map_or(0, |b| b.len())
}

/// Gives freed heap back to the system. Tokenizing a long prompt takes its memory on a
/// blocking thread's own malloc arena, which glibc keeps after the request ends: without
/// this, eight 1 MB prompts left ~400 MB resident.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// One choice of a request: its place in the engine and its answer's channel.
pub(super) type Choice = (Ticket, mpsc::UnboundedReceiver<Out>);

/// Validates, checks the context and the queue bound, and submits the request's `n` choices.
pub(super) fn admit(
    app: &Arc<App>,
    ep: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<(GenRequest, Vec<Choice>), ApiError> {
    let ready = app.ready.get().ok_or_else(ApiError::loading)?;
    if app.stopping.load(SeqCst) {
        return Err(ApiError::shutting_down());
    }
    (ready.model.check_logits()).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let body = body_bytes(app, body)?;
    let ctx = ready.max_seq;
    let req = request::parse(ep, &body, &ready.model, &app.defaults, ctx - 1, app.strict)?;
    if !req.ignored.is_empty() {
        let mut seen = app.ignored_logged.lock().unwrap_or_else(|e| e.into_inner());
        for k in &req.ignored {
            // Bounded: a client inventing names cannot grow this without end.
            if seen.len() < 256 && seen.insert(k.clone()) {
                eprintln!("mollm serve: ignoring the unknown request field '{k}' (--strict refuses such fields)");
            }
        }
    }
    // The output format, compiled once for every choice: a schema it cannot take is this
    // request's 400, naming the field.
    let grammar = match &req.format {
        None => None,
        Some((spec, param)) => {
            let vocab = ready.vocab().map_err(|e| {
                ApiError::field(
                    param,
                    format!("constrained decoding is not available for this model: {e}"),
                )
            })?;
            Some(Arc::new(
                vocab.compile(spec).map_err(|e| ApiError::field(param, e))?,
            ))
        }
    };
    let n = req.prompt.len();
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
    // Bounded admission: at most --parallel running and --queue waiting (each choice is a
    // sequence).
    let limit = app.parallel + app.queue;
    if req.n > limit {
        return Err(ApiError::field(
            "n",
            format!(
                "{} choices can never be admitted: this server holds {limit} sequences at once (--parallel {} + --queue {})",
                req.n, app.parallel, app.queue
            ),
        ));
    }
    if app.inflight.fetch_add(req.n, SeqCst) + req.n > limit {
        app.inflight.fetch_sub(req.n, SeqCst);
        return Err(ApiError::overloaded(
            app.metrics.running.load(Relaxed) as usize,
            app.metrics.queued.load(Relaxed) as usize,
        ));
    }
    // Every choice's ticket first: each gives its place back when dropped, also when a
    // submission below fails.
    let tickets: Vec<Ticket> = (0..req.n)
        .map(|_| Ticket {
            app: app.clone(),
            id: app.next_id.fetch_add(1, SeqCst),
            finished: false,
        })
        .collect();
    let mut choices = Vec::with_capacity(req.n);
    for (i, ticket) in tickets.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut params = req.params.clone();
        params.seed = params.seed.wrapping_add(i as u64);
        let job = Job {
            prompt: req.prompt.clone(),
            max_tokens,
            params,
            logprobs: req.logprobs,
            stop: req.stop.clone(),
            ignore_eos: req.ignore_eos,
            grammar: grammar.clone(),
            arrived: Instant::now(),
            tx,
        };
        ready
            .send(Cmd::Submit(ticket.id, job))
            .map_err(|_| ApiError::shutting_down())?;
        choices.push((ticket, rx));
    }
    Ok((req, choices))
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    ep: Endpoint,
    logprobs: bool,
    /// Tools the output may call (not with `tool_choice: none`), and the template's dialect.
    tools: Option<(super::tools::Tools, super::tools::Dialect)>,
}

impl Meta {
    /// The calls in choice `index`'s text: the content before them and the `tool_calls`
    /// entries (ids unique in the response), or None.
    fn calls(&self, index: usize, text: &str) -> Option<(String, Vec<Value>)> {
        let (t, d) = self.tools.as_ref()?;
        let (content, mut calls) = t.read(text, *d)?;
        // Arguments as the model wrote them (whitespace between tokens left out), as a stream
        // sends them, where the call is where the stream reads it.
        let h = self.hold_from(text);
        for (c, p) in calls
            .iter_mut()
            .zip(super::callstream::scan(&text[h..], *d))
        {
            if let (Some(name), Some((s, Some(e)))) = (p.name, p.args) {
                if name == c.name {
                    c.arguments = super::callstream::compact(&text[h + s..h + e]);
                }
            }
        }
        let calls = calls
            .iter()
            .enumerate()
            .map(|(k, c)| super::tools::call_json(c, &self.call_id(index, k)))
            .collect();
        Some((content, calls))
    }

    /// Call `k` of choice `index`'s id (unique in the response).
    fn call_id(&self, index: usize, k: usize) -> String {
        let id = self.id.rsplit('-').next().unwrap_or("0");
        format!("call_{id}_{index}_{k}")
    }

    /// The `delta.tool_calls` entries for what choice `index`'s text `all` adds to its calls:
    /// a call's id, type and name once its arguments begin, then each new fragment of them.
    /// `sent` holds, per call begun, how much of its (compacted) arguments was sent.
    fn call_deltas(&self, index: usize, all: &str, sent: &mut Vec<usize>) -> Vec<Value> {
        let Some((t, d)) = &self.tools else {
            return Vec::new();
        };
        let h = self.hold_from(all);
        let mut out = Vec::new();
        for (k, p) in super::callstream::scan(&all[h..], *d)
            .into_iter()
            .enumerate()
        {
            let (Some(name), Some((start, end))) = (p.name, p.args) else {
                break;
            };
            if !t.names().contains(&name.as_str()) || k > sent.len() {
                break;
            }
            if k == sent.len() {
                out.push(
                    json!({"index": k, "id": self.call_id(index, k), "type": "function",
                                "function": {"name": name, "arguments": ""}}),
                );
                sent.push(0);
            }
            let end = end.map_or(all.len(), |e| h + e);
            let args = super::callstream::compact(&all[h + start..end]);
            if args.len() > sent[k] {
                out.push(json!({"index": k, "function": {"arguments": &args[sent[k]..]}}));
                sent[k] = args.len();
            }
        }
        out
    }

    /// Where choice text may have begun a call (a stream holds it back from there).
    fn hold_from(&self, text: &str) -> usize {
        match &self.tools {
            Some((t, d)) => t.hold_from(text, *d),
            None => text.len(),
        }
    }

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

/// The request's usage: the prompt once (its choices share it), the completions summed.
fn usage_json(u: &[Usage]) -> Value {
    let prompt = u.first().map_or(0, |u| u.prompt_tokens);
    let cached = u.iter().map(|u| u.cached_tokens).max().unwrap_or(0);
    let completion: usize = u.iter().map(|u| u.completion_tokens).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
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
            Endpoint::Chat => {
                json!({"content": std::mem::take(&mut self.chat), "refusal": null})
            }
            Endpoint::Completion => json!({
                "tokens": std::mem::take(&mut self.tokens),
                "token_logprobs": std::mem::take(&mut self.token_logprobs),
                "top_logprobs": std::mem::take(&mut self.top),
                "text_offset": std::mem::take(&mut self.offsets),
            }),
        }
    }
}

/// The JSON answer: every choice's text, in index order (they are computed together).
async fn whole(meta: Meta, mut choices: Vec<Choice>) -> Response {
    let mut out = Vec::with_capacity(choices.len());
    let mut usage = Vec::with_capacity(choices.len());
    for (index, (ticket, rx)) in choices.iter_mut().enumerate() {
        let mut text = String::new();
        let mut lp = Lp::default();
        let done = loop {
            match rx.recv().await {
                Some(Out::Token { text: t, logprobs }) => {
                    text.push_str(&t);
                    if let Some(i) = logprobs {
                        lp.push(meta.ep, i);
                    }
                }
                Some(Out::Failed(e)) => {
                    ticket.finished = true;
                    return e.into_response();
                }
                Some(Out::Done {
                    text: t,
                    finish,
                    usage: u,
                    ..
                }) => {
                    ticket.finished = true;
                    text.push_str(&t);
                    usage.push(u);
                    break finish;
                }
                None => {
                    return ApiError::internal("the engine stopped before the answer was complete")
                        .into_response()
                }
            }
        };
        let logprobs = if meta.logprobs {
            lp.take(meta.ep)
        } else {
            Value::Null
        };
        out.push(match meta.ep {
            Endpoint::Chat => match meta.calls(index, &text) {
                Some((content, calls)) => json!({
                    "index": index,
                    "message": {"role": "assistant",
                                "content": if content.is_empty() { Value::Null } else { json!(content) },
                                "tool_calls": calls, "refusal": null},
                    "logprobs": logprobs,
                    // Cut off by max_tokens is "length", as OpenAI's API says, calls or not.
                    "finish_reason": match done {
                        engine::sched::Finish::Length => "length",
                        _ => "tool_calls",
                    },
                }),
                None => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": text, "refusal": null},
                    "logprobs": logprobs,
                    "finish_reason": done.as_str(),
                }),
            },
            Endpoint::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": done.as_str(),
            }),
        });
    }
    let mut m = meta.envelope(false, Value::Array(out));
    m.insert("usage".into(), usage_json(&usage));
    Json(Value::Object(m)).into_response()
}

/// The SSE answer: chunks of all choices as they come (each with its `index`), a last chunk
/// per choice with its `finish_reason`, the usage chunk if asked, then `[DONE]`.
fn stream(meta: Meta, include_usage: bool, choices: Vec<Choice>) -> Response {
    let (otx, orx) = mpsc::channel::<Result<Event, Infallible>>(64);
    let chunk = move |meta: &Meta,
                      index: usize,
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
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
            Endpoint::Completion => {
                json!({"index": index, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish})
            }
        };
        let mut m = meta.envelope(true, json!([choice]));
        if include_usage {
            m.insert("usage".into(), Value::Null);
        }
        Event::default().data(Value::Object(m).to_string())
    };
    tokio::spawn(async move {
        // The tickets move in whole: they live as long as the stream, and cancel the
        // sequences when the client goes away.
        let (mut tickets, rxs): (Vec<Ticket>, Vec<_>) = choices.into_iter().unzip();
        let mut streams = tokio_stream::StreamMap::new();
        for (i, rx) in rxs.into_iter().enumerate() {
            streams.insert(i, tokio_stream::wrappers::UnboundedReceiverStream::new(rx));
        }
        let send = |e: Event| {
            let otx = otx.clone();
            async move { otx.send(Ok(e)).await.is_ok() }
        };
        if meta.ep == Endpoint::Chat {
            for i in 0..tickets.len() {
                if !send(chunk(&meta, i, Some(""), true, None, None)).await {
                    return;
                }
            }
        }
        let mut lp: Vec<Lp> = (0..tickets.len()).map(|_| Lp::default()).collect();
        // With tools: each choice's text so far and how much of it was sent (what may be a
        // call is held back until the choice ends).
        let mut acc: Vec<(String, usize)> = vec![(String::new(), 0); tickets.len()];
        // Per choice, per call streamed: how much of its arguments was sent.
        let mut streamed: Vec<Vec<usize>> = vec![Vec::new(); tickets.len()];
        let tool_chunk = |meta: &Meta, i: usize, deltas: Vec<Value>| {
            let mut m = meta.envelope(
                true,
                json!([{"index": i, "delta": {"tool_calls": deltas},
                        "logprobs": null, "finish_reason": null}]),
            );
            if include_usage {
                m.insert("usage".into(), Value::Null);
            }
            Event::default().data(Value::Object(m).to_string())
        };
        let mut usage = Vec::with_capacity(tickets.len());
        let mut open = tickets.len();
        while open > 0 {
            let next = tokio::select! {
                _ = otx.closed() => return, // the client went away: the tickets cancel
                o = tokio_stream::StreamExt::next(&mut streams) => o,
            };
            let Some((i, o)) = next else {
                break;
            };
            match o {
                Out::Token { mut text, logprobs } => {
                    let l = logprobs.map(|t| {
                        lp[i].push(meta.ep, t);
                        lp[i].take(meta.ep)
                    });
                    let mut deltas = Vec::new();
                    if meta.tools.is_some() {
                        let (all, sent) = &mut acc[i];
                        all.push_str(&text);
                        let upto = meta.hold_from(all).max(*sent);
                        text = all[*sent..upto].to_string();
                        *sent = upto;
                        deltas = meta.call_deltas(i, all, &mut streamed[i]);
                    }
                    if (!text.is_empty() || l.is_some())
                        && !send(chunk(&meta, i, Some(&text), false, l, None)).await
                    {
                        return;
                    }
                    if !deltas.is_empty() && !send(tool_chunk(&meta, i, deltas)).await {
                        return;
                    }
                }
                Out::Done {
                    text,
                    finish,
                    usage: u,
                    ..
                } => {
                    tickets[i].finished = true;
                    open -= 1;
                    usage.push(u);
                    let mut text = text;
                    let mut finish = finish.as_str();
                    if meta.tools.is_some() {
                        let (all, sent) = &mut acc[i];
                        all.push_str(&text);
                        text = all[*sent..].to_string();
                        // What the arguments streamed so far lack, then the calls that could
                        // not stream (arguments as a string) whole.
                        let mut deltas = meta.call_deltas(i, all, &mut streamed[i]);
                        let begun = streamed[i].len();
                        if let Some((_, calls)) = meta.calls(i, all) {
                            // The content before the calls, then the calls.
                            let upto = meta.hold_from(all).max(*sent);
                            let before = all[*sent..upto].trim_end().to_string();
                            if !before.is_empty()
                                && !send(chunk(&meta, i, Some(&before), false, None, None)).await
                            {
                                return;
                            }
                            deltas.extend(calls.into_iter().enumerate().skip(begun).map(
                                |(k, mut c)| {
                                    c["index"] = json!(k);
                                    c
                                },
                            ));
                        }
                        if begun > 0 || !deltas.is_empty() {
                            if !deltas.is_empty() && !send(tool_chunk(&meta, i, deltas)).await {
                                return;
                            }
                            text.clear();
                            if finish != engine::sched::Finish::Length.as_str() {
                                finish = "tool_calls";
                            }
                        }
                    }
                    if !text.is_empty()
                        && !send(chunk(&meta, i, Some(&text), false, None, None)).await
                    {
                        return;
                    }
                    let last = match meta.ep {
                        Endpoint::Chat => chunk(&meta, i, None, false, None, Some(finish)),
                        Endpoint::Completion => {
                            chunk(&meta, i, Some(""), false, None, Some(finish))
                        }
                    };
                    if !send(last).await {
                        return;
                    }
                }
                Out::Failed(e) => {
                    send(Event::default().data(e.body().to_string())).await;
                    return; // the others are cancelled as their tickets drop
                }
            }
        }
        if open > 0 {
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
        if include_usage {
            let mut m = meta.envelope(true, json!([]));
            m.insert("usage".into(), usage_json(&usage));
            if !send(Event::default().data(Value::Object(m).to_string())).await {
                return;
            }
        }
        send(Event::default().data("[DONE]")).await;
    });
    sse(orx)
}

/// An SSE answer from the events of `orx`, with a keep-alive comment every second.
pub(super) fn sse(orx: mpsc::Receiver<Result<Event, Infallible>>) -> Response {
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

/// A JSON object body with only `fields`.
fn object_body(
    app: &App,
    body: Result<Bytes, BytesRejection>,
    fields: &[&str],
) -> Result<Map<String, Value>, ApiError> {
    let o = request::json_object(&body_bytes(app, body)?)?;
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
    let big = body_len(&body) > BIG_BODY;
    answer(admission(&app, big, move |a| tokenize_json(a, body)).await)
}

/// At most the server's longest sequence: a longer text could never be a prompt here.
fn tokenize_json(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let ready = app.ready.get().ok_or_else(ApiError::loading)?;
    let o = object_body(
        app,
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
    let limit = ready.max_seq;
    let ids = tok
        .encode_limited(
            content,
            flag("add_special", false)?,
            flag("parse_special", true)?,
            limit,
        )
        .map_err(|e| ApiError::field("content", e))?
        .ok_or_else(|| {
            ApiError::context_length(
                format!("the content has more than {limit} tokens, this server's longest sequence"),
                "content",
            )
        })?;
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
    Ok(json!({"tokens": tokens}))
}

/// llama-server's `/detokenize`: `{"tokens": [ids]}` -> `{"content"}`.
pub async fn detokenize(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(detokenize_json(&app, body))
}

fn detokenize_json(app: &App, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let ready = app.ready.get().ok_or_else(ApiError::loading)?;
    let o = object_body(app, body, &["tokens"])?;
    let list = o
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::field("tokens", "required (a list of token ids)"))?;
    let ids = token_ids(list, &ready.model).map_err(|e| ApiError::field("tokens", e))?;
    Ok(json!({"content": ready.model.tokenizer.decode(&ids)}))
}

fn answer(r: Result<Value, ApiError>) -> Response {
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
