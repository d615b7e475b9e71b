//! A request body, checked once into a typed [`GenRequest`]: every field the server reads is
//! validated here with an error naming it; a field the server does not implement is refused
//! (400 naming it) unless it holds its no-op default (`"tools": []`, `"echo": false`, ...), and an
//! unknown field is refused too, never silently ignored.

use super::error::ApiError;
use crate::common::{chat_tokens, clock_seed, text_tokens, token_ids, PromptError, SamplingArgs};
use engine::{Model, SamplerParams};
use loader::ChatMessage;
use serde_json::{Map, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

#[derive(Debug)]
pub struct GenRequest {
    pub prompt: Vec<u32>,
    /// What the client asked for, and under which name (for errors).
    pub max_tokens: Option<(usize, &'static str)>,
    pub params: SamplerParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// Choices: `n` sequences of the same prompt, sampled with seeds `seed`, `seed + 1`, ...
    pub n: usize,
    /// Generate past end-of-generation tokens (vLLM's and llama-server's extension, for
    /// benchmarks with fixed output lengths).
    pub ignore_eos: bool,
    /// What the output must be (`response_format`, `grammar`, or a forced tool call), and the
    /// field that said so.
    pub format: Option<(grammar::Spec, &'static str)>,
    /// The request's tools and how the model's template writes calls.
    pub tools: Option<(super::tools::Tools, super::tools::Dialect)>,
    /// Fields this server does not know, ignored (without `--strict`), for the response's
    /// `x-mollm-ignored-fields` header.
    pub ignored: Vec<String>,
}

/// Fields both endpoints read.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "n",
    "user",
    "ignore_eos",
    "response_format",
    "grammar",
    // llama-server's names: n_predict for max_tokens, repetition_penalty for repeat_penalty.
    "n_predict",
    "repetition_penalty",
    "logit_bias",
    "typical_p",
    // Accepted, with nothing to do: request tags, and llama-server's cache switch (this
    // server always reuses cached prefixes, with the same results).
    "metadata",
    "cache_prompt",
];
const CHAT: &[&str] = &[
    "messages",
    // Given to the template (gpt-oss's reads it), as chat_template_kwargs are.
    "reasoning_effort",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
];
const COMPLETION: &[&str] = &["prompt"];

/// OpenAI fields this server does not implement, with the value that means "not used".
fn unsupported_default(k: &str, v: &Value) -> Option<bool> {
    let empty = match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    Some(match k {
        "functions" | "modalities" => empty,
        "function_call" => empty || v == "none",
        "store" | "echo" => empty || v == false,
        "best_of" => empty || v == 1,
        "suffix"
        | "audio"
        | "prediction"
        | "service_tier"
        | "web_search_options"
        | "stream_options.continuous_usage_stats" => empty,
        _ => return None,
    })
}

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn num(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let f = v
            .as_f64()
            .ok_or_else(|| ApiError::field(k, "must be a number"))?;
        if !(lo..=hi).contains(&f) {
            return Err(ApiError::field(k, format!("{f} is outside {lo}..={hi}")));
        }
        Ok(Some(f))
    }

    fn int(&self, k: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let i = v
            .as_i64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            })
            .ok_or_else(|| ApiError::field(k, "must be an integer"))?;
        if !(lo..=hi).contains(&i) {
            return Err(ApiError::field(k, format!("{i} is outside {lo}..={hi}")));
        }
        Ok(Some(i))
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::field(k, "must be true or false")),
        }
    }
}

/// The most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// The most choices per request.
pub const MAX_N: usize = 16;
/// The longest stop string: every generated token searches the text's last this many bytes.
pub const MAX_STOP_BYTES: usize = 1024;
/// The most alternatives per token in `top_logprobs` / completions' `logprobs`.
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// The request's error for a prompt that has no ids: longer than `limit` tokens (400
/// `context_length_exceeded`, found before tokenizing it whole), or another reason.
fn prompt_error(e: PromptError, param: &str) -> ApiError {
    match e {
        PromptError::TooLong { .. } => ApiError::context_length(e.to_string(), param),
        PromptError::Other(msg) => ApiError::field(param, msg),
    }
}

/// Validates a generation request; its prompt may have at most `limit` tokens. Fields it does
/// not know are ignored and listed, or refused with `strict`.
pub fn parse(
    endpoint: Endpoint,
    body: &[u8],
    model: &Model,
    defaults: &SamplingArgs,
    limit: usize,
    strict: bool,
) -> Result<GenRequest, ApiError> {
    let o = &json_object(body)?;
    let own = match endpoint {
        Endpoint::Chat => CHAT,
        Endpoint::Completion => COMPLETION,
    };
    let mut ignored = Vec::new();
    for (k, v) in o {
        if COMMON.contains(&k.as_str()) || own.contains(&k.as_str()) {
            continue;
        }
        match unsupported_default(k, v) {
            Some(true) => {}
            Some(false) => return Err(ApiError::unsupported(k)),
            None if strict => return Err(ApiError::field(k, "unknown field (--strict)")),
            None => ignored.push(k.clone()),
        }
    }
    let f = Fields(o);
    if let Some(m) = f.get("model") {
        if !m.is_string() {
            return Err(ApiError::field("model", "must be a string"));
        }
    }
    if let Some(u) = f.get("user") {
        if !u.is_string() {
            return Err(ApiError::field("user", "must be a string"));
        }
    }
    let n = f.int("n", 1, MAX_N as i64)?.unwrap_or(1) as usize;

    let mut tools = None;
    let prompt = match endpoint {
        Endpoint::Chat => {
            let (msgs, extras, t) = chat_input(&f, model, strict, &mut ignored)?;
            tools = t;
            chat_tokens(model, &msgs, &extras, limit).map_err(|e| prompt_error(e, "messages"))?
        }
        Endpoint::Completion => completion_prompt(f.get("prompt"), model, limit)?,
    };
    if prompt.is_empty() {
        let k = if endpoint == Endpoint::Chat {
            "messages"
        } else {
            "prompt"
        };
        return Err(ApiError::field(k, "empty after tokenization"));
    }

    let max_tokens = match (
        f.int("max_completion_tokens", 1, 1 << 30)?,
        f.int("max_tokens", 1, 1 << 30)?,
        // llama-server's -1 is "until the context is full": the default here.
        f.int("n_predict", -1, 1 << 30)?.filter(|&n| n != -1),
    ) {
        (Some(n), _, _) => Some((n as usize, "max_completion_tokens")),
        (None, Some(n), _) => Some((n as usize, "max_tokens")),
        (None, None, Some(0)) => {
            return Err(ApiError::field("n_predict", "must be -1 or at least 1"))
        }
        (None, None, Some(n)) => Some((n as usize, "n_predict")),
        (None, None, None) => None,
    };
    match f.num("typical_p", -f64::MAX, f64::MAX)? {
        None => {}
        Some(t) if t == 1.0 => {}
        Some(_) => {
            return Err(ApiError {
                code: Some("unsupported_parameter"),
                ..ApiError::field(
                    "typical_p",
                    "locally typical sampling is not implemented (only 1, off)",
                )
            })
        }
    }
    if let Some(c) = f.get("cache_prompt") {
        if !c.is_boolean() {
            return Err(ApiError::field("cache_prompt", "must be true or false"));
        }
    }
    if let Some(m) = f.get("metadata") {
        if !m.is_object() {
            return Err(ApiError::field("metadata", "must be an object"));
        }
    }

    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > MAX_STOP {
                return Err(ApiError::field(
                    "stop",
                    format!("at most {MAX_STOP} strings, {} given", a.len()),
                ));
            }
            a.iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::field("stop", "must be a string or a list of strings"))?
        }
        Some(_) => {
            return Err(ApiError::field(
                "stop",
                "must be a string or a list of strings",
            ))
        }
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::field("stop", "a stop string must not be empty"));
    }
    if let Some(s) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::field(
            "stop",
            format!(
                "a stop string may have at most {MAX_STOP_BYTES} bytes, one has {}",
                s.len()
            ),
        ));
    }

    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(so)) => {
            if !stream {
                return Err(ApiError::field(
                    "stream_options",
                    "only allowed when 'stream' is true",
                ));
            }
            for (k, v) in so {
                if k == "include_usage" {
                    continue;
                }
                let key = format!("stream_options.{k}");
                match unsupported_default(&key, v) {
                    Some(true) => {}
                    Some(false) => return Err(ApiError::unsupported(&key)),
                    None => return Err(ApiError::field(&key, "unknown field")),
                }
            }
            Fields(so)
                .bool("include_usage")
                .map_err(|_| {
                    ApiError::field("stream_options.include_usage", "must be true or false")
                })?
                .unwrap_or(false)
        }
        Some(_) => return Err(ApiError::field("stream_options", "must be an object")),
    };

    let logprobs = match endpoint {
        Endpoint::Chat => {
            let on = f.bool("logprobs")?.unwrap_or(false);
            let top = f.int("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
            if top.is_some() && !on {
                return Err(ApiError::field("top_logprobs", "needs 'logprobs': true"));
            }
            on.then_some(top.unwrap_or(0) as usize)
        }
        Endpoint::Completion => f.int("logprobs", 0, MAX_TOP_LOGPROBS)?.map(|n| n as usize),
    };

    let seed = match f.get("seed") {
        None => defaults.seed.unwrap_or_else(clock_seed),
        Some(v) => v
            .as_i64()
            .map(|i| i as u64)
            .or_else(|| v.as_u64())
            .ok_or_else(|| ApiError::field("seed", "must be an integer"))?,
    };
    let top_k = match f.int("top_k", -1, 1 << 30)? {
        None => defaults.top_k,
        Some(-1) | Some(0) => 0,
        Some(k) => k as usize,
    };
    // Any finite number here; the ranges are the sampler's own ([`SamplerParams::validate`]),
    // the same for `run`, `batch` and this server.
    let num = |k| f.num(k, -f64::MAX, f64::MAX);
    let params = SamplerParams {
        temperature: num("temperature")?.map_or(defaults.temperature, |x| x as f32),
        top_k,
        top_p: num("top_p")?.map_or(defaults.top_p, |x| x as f32),
        min_p: num("min_p")?.map_or(defaults.min_p, |x| x as f32),
        repeat_penalty: num("repeat_penalty")?
            .or(num("repetition_penalty")?)
            .map_or(defaults.repeat_penalty, |x| x as f32),
        presence_penalty: num("presence_penalty")?.map_or(defaults.presence_penalty, |x| x as f32),
        frequency_penalty: num("frequency_penalty")?
            .map_or(defaults.frequency_penalty, |x| x as f32),
        repeat_last_n: defaults.repeat_last_n,
        seed,
        logit_bias: logit_bias(f.get("logit_bias"), model.hp.n_vocab)?,
    };
    params
        .validate()
        .map_err(|e| ApiError::field(e.field, e.msg))?;
    let mut format = output_format(&f)?;
    // A required or named tool choice: the output is a call, by constrained decoding.
    if let Some((t, d)) = &tools {
        let tok = &model.tokenizer;
        let special = |s: &str| match tok.token_id(s) {
            // A control token is written by id (llguidance's `<[id]>`): its text is not
            // what the model emits.
            Some(id) if tok.is_control(id) => format!("<[{id}]>"),
            _ => serde_json::to_string(s).unwrap_or_default(),
        };
        if let Some(g) = t.forced(*d, special) {
            if format.is_some() {
                return Err(ApiError::field(
                    "tool_choice",
                    "a required or named tool call and an output format cannot be combined",
                ));
            }
            format = Some((grammar::Spec::Lark(g), "tool_choice"));
        }
    }
    Ok(GenRequest {
        ignored,
        tools,
        format,
        n,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        prompt,
        max_tokens,
        params,
        stop,
        stream,
        include_usage,
        logprobs,
    })
}

/// A chat request's messages, what its template is given besides them (tools,
/// `chat_template_kwargs`, `reasoning_effort`), and its tools with the template's dialect.
type ChatInput = (
    Vec<ChatMessage>,
    loader::RenderExtras,
    Option<(super::tools::Tools, super::tools::Dialect)>,
);

fn chat_input(
    f: &Fields,
    model: &Model,
    strict: bool,
    ignored: &mut Vec<String>,
) -> Result<ChatInput, ApiError> {
    let msgs = messages(f.get("messages"), strict, ignored)?;
    let Some(tmpl) = model.chat_template.as_ref() else {
        return Err(ApiError::field(
            "messages",
            "this model has no chat template: use /v1/completions",
        ));
    };
    let t = super::tools::parse(
        f.get("tools"),
        f.get("tool_choice"),
        f.get("parallel_tool_calls"),
    )?;
    let mut kwargs = match f.get("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::field("chat_template_kwargs", "must be an object")),
    };
    if let Some(r) = f.get("reasoning_effort") {
        if !r.is_string() {
            return Err(ApiError::field("reasoning_effort", "must be a string"));
        }
        kwargs.entry("reasoning_effort").or_insert(r.clone());
    }
    let extras = loader::RenderExtras {
        tools: t.as_ref().and_then(|t| t.for_template()),
        kwargs,
    };
    let tools = t.map(|t| (t, super::tools::Dialect::of_template(tmpl.source())));
    Ok((msgs, extras, tools))
}

/// llama-server's `/apply-template`: the prompt text a chat request's messages render to
/// (at most what `limit` tokens can hold).
pub fn render_chat(
    o: &Map<String, Value>,
    model: &Model,
    limit: usize,
    strict: bool,
) -> Result<String, ApiError> {
    let (msgs, extras, _) = chat_input(&Fields(o), model, strict, &mut Vec::new())?;
    let tmpl = model.chat_template.as_ref().expect("chat_input checked it");
    let max = model.tokenizer.max_text_bytes(limit);
    tmpl.render_with(&msgs, true, &extras, max)
        .map_err(|e| ApiError::field("messages", e))?
        .ok_or_else(|| {
            ApiError::context_length(
                format!("the rendered prompt is longer than {limit} tokens can be"),
                "messages",
            )
        })
}

/// The most entries of a `logit_bias` (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;

/// `logit_bias`: token id (a string key, or llama-server's list of [id, bias] pairs) to a bias
/// in -100..=100.
fn logit_bias(v: Option<&Value>, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let pairs: Vec<(String, &Value)> = match v {
        None => return Ok(Vec::new()),
        Some(Value::Object(o)) => o.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([id, b]) => Ok((id.to_string(), b)),
                _ => Err(ApiError::field(
                    "logit_bias",
                    "a list must hold [token id, bias] pairs",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::field(
                "logit_bias",
                "must map token ids to biases",
            ))
        }
    };
    if pairs.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::field(
            "logit_bias",
            format!("at most {MAX_LOGIT_BIAS} entries, {} given", pairs.len()),
        ));
    }
    pairs
        .into_iter()
        .map(|(k, b)| {
            let at = format!("logit_bias.{k}");
            let id: u32 = k
                .parse()
                .ok()
                .filter(|&i: &u32| (i as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::field(&at, format!("not a token id of this model (0..{n_vocab})"))
                })?;
            let b = b
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| ApiError::field(&at, "the bias must be a number in -100..=100"))?;
            Ok((id, b as f32))
        })
        .collect()
}

/// `response_format` (`text`, `json_object`, `json_schema`; llama-server's `json_object` with a
/// `schema` too) or `grammar` (Lark, llguidance's syntax), not both.
fn output_format(f: &Fields) -> Result<Option<(grammar::Spec, &'static str)>, ApiError> {
    use grammar::Spec;
    let rf = match f.get("response_format") {
        None => None,
        Some(Value::Object(o)) => {
            let schema_of = |v: Option<&Value>, at: &'static str| match v {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => Ok(Spec::JsonSchema(s.clone())),
                Some(_) => Err(ApiError::field(at, "must be a JSON schema (an object)")),
                None => Err(ApiError::field(at, "required")),
            };
            match o.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => match o.get("schema") {
                    None => Some((Spec::JsonObject, "response_format")),
                    s => Some((
                        schema_of(s, "response_format.schema")?,
                        "response_format.schema",
                    )),
                },
                Some("json_schema") => {
                    let js = o
                        .get("json_schema")
                        .and_then(Value::as_object)
                        .ok_or_else(|| {
                            ApiError::field("response_format.json_schema", "required (an object)")
                        })?;
                    // `strict` is how OpenAI asks for what this server always does: output
                    // that validates.
                    if js
                        .get("strict")
                        .is_some_and(|s| !s.is_boolean() && !s.is_null())
                    {
                        return Err(ApiError::field(
                            "response_format.json_schema.strict",
                            "must be true or false",
                        ));
                    }
                    Some((
                        schema_of(js.get("schema"), "response_format.json_schema.schema")?,
                        "response_format.json_schema.schema",
                    ))
                }
                Some(t) => {
                    return Err(ApiError::field(
                        "response_format.type",
                        format!("'{t}' is not one of text, json_object, json_schema"),
                    ))
                }
                None => return Err(ApiError::field("response_format.type", "required")),
            }
        }
        Some(_) => return Err(ApiError::field("response_format", "must be an object")),
    };
    let gr = match f.get("grammar") {
        None => None,
        // llama.cpp's GBNF (`root ::= ...`), else Lark.
        Some(Value::String(g)) if g.contains("::=") => Some((Spec::Gbnf(g.clone()), "grammar")),
        Some(Value::String(g)) => Some((Spec::Lark(g.clone()), "grammar")),
        Some(_) => return Err(ApiError::field("grammar", "must be a string")),
    };
    match (rf, gr) {
        (Some(_), Some(_)) => Err(ApiError::field(
            "grammar",
            "give either 'grammar' or a JSON 'response_format', not both",
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// `messages`: roles system (or developer), user, assistant (its content may be null, with
/// `tool_calls`), tool (a result: `tool_call_id`, content); content a string or a list of
/// text parts; `name` kept for the template.
fn messages(
    v: Option<&Value>,
    strict: bool,
    ignored: &mut Vec<String>,
) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match v {
        None => return Err(ApiError::field("messages", "required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::field("messages", "must not be empty"))
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::field("messages", "must be a list")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = |k: &str| format!("messages[{i}].{k}");
        let o = m
            .as_object()
            .ok_or_else(|| ApiError::field(&format!("messages[{i}]"), "must be an object"))?;
        let role =
            match o.get("role").and_then(Value::as_str) {
                Some("system") | Some("developer") => "system",
                Some("user") => "user",
                Some("assistant") => "assistant",
                Some("tool") => "tool",
                Some("function") => return Err(ApiError {
                    code: Some("unsupported_parameter"),
                    ..ApiError::field(
                        &at("role"),
                        "'function' messages (the deprecated API) are not supported: use 'tool'",
                    )
                }),
                Some(r) => {
                    return Err(ApiError::field(
                        &at("role"),
                        format!("'{r}' is not one of system, developer, user, assistant, tool"),
                    ))
                }
                None => return Err(ApiError::field(&at("role"), "required (a string)")),
            };
        for k in o.keys() {
            let known = [
                "role",
                "content",
                "name",
                "tool_calls",
                "tool_call_id",
                "refusal",
            ];
            if !known.contains(&k.as_str()) {
                let v = &o[k];
                let harmless = v.is_null() || v.as_array().is_some_and(|a| a.is_empty());
                if ["function_call", "audio"].contains(&k.as_str()) && !harmless {
                    return Err(ApiError::unsupported(&at(k)));
                }
                if strict && !harmless {
                    return Err(ApiError::field(&at(k), "unknown field (--strict)"));
                }
                if !ignored.contains(k) {
                    ignored.push(k.clone());
                }
            }
        }
        let mut msg = ChatMessage::new(role, String::new());
        if let Some(n) = o.get("name").filter(|n| !n.is_null()) {
            msg.name = Some(
                n.as_str()
                    .ok_or_else(|| ApiError::field(&at("name"), "must be a string"))?
                    .to_string(),
            );
        }
        if let Some(calls) = o.get("tool_calls").filter(|c| !c.is_null()) {
            if role != "assistant" {
                return Err(ApiError::field(
                    &at("tool_calls"),
                    "only assistant messages make calls",
                ));
            }
            msg.tool_calls = Some(super::tools::message_calls(calls, &at("tool_calls"))?);
        }
        if role == "tool" {
            let id = o
                .get("tool_call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::field(&at("tool_call_id"), "required (a string) in a tool message")
                })?;
            msg.tool_call_id = Some(id.to_string());
        }
        msg.content = match o.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None if role == "assistant" => String::new(),
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for (j, p) in parts.iter().enumerate() {
                    let pk = format!("messages[{i}].content[{j}]");
                    match p.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            s.push_str(p.get("text").and_then(Value::as_str).ok_or_else(|| {
                                ApiError::field(&format!("{pk}.text"), "must be a string")
                            })?)
                        }
                        Some(t) => {
                            return Err(ApiError {
                                code: Some("unsupported_parameter"),
                                ..ApiError::field(
                                    &format!("{pk}.type"),
                                    format!("'{t}' parts are not supported (text only)"),
                                )
                            })
                        }
                        None => return Err(ApiError::field(&format!("{pk}.type"), "required")),
                    }
                }
                s
            }
            _ => {
                return Err(ApiError::field(
                    &at("content"),
                    "must be a string or a list of text parts",
                ))
            }
        };
        out.push(msg);
    }
    Ok(out)
}

/// `prompt`: a string, a list of one string, or a list of token ids (taken as they are).
/// A request body that must be one JSON object.
pub fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("the body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!(
            "the body is not valid JSON: {e}"
        ))),
    }
}

fn completion_prompt(v: Option<&Value>, model: &Model, limit: usize) -> Result<Vec<u32>, ApiError> {
    let text = |s: &str| text_tokens(model, s, true, limit).map_err(|e| prompt_error(e, "prompt"));
    match v {
        None => Err(ApiError::field("prompt", "required")),
        Some(Value::String(s)) => text(s),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            text(a[0].as_str().unwrap_or(""))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_number) => {
            token_ids(a, model).map_err(|e| ApiError::field("prompt", e))
        }
        Some(Value::Array(a)) if a.len() > 1 && a.iter().all(|x| x.is_string() || x.is_array()) => {
            Err(ApiError {
                code: Some("unsupported_parameter"),
                ..ApiError::field(
                    "prompt",
                    "several prompts in one request are not supported: send one request each",
                )
            })
        }
        Some(_) => Err(ApiError::field(
            "prompt",
            "must be a string or a list of token ids",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_of_unsupported_fields_pass_and_others_are_named() {
        assert_eq!(
            unsupported_default("functions", &serde_json::json!([])),
            Some(true)
        );
        assert_eq!(
            unsupported_default("functions", &serde_json::json!([{"name": "f"}])),
            Some(false)
        );
        assert_eq!(
            unsupported_default("audio", &serde_json::json!({"voice": "x"})),
            Some(false)
        );
        assert_eq!(
            unsupported_default("frobnicate", &serde_json::json!(1)),
            None
        );
    }

    #[test]
    fn logit_biases_are_token_ids_with_bounded_values() {
        let ok = logit_bias(Some(&serde_json::json!({"5": 10, "7": -100})), 100).unwrap();
        assert_eq!(ok, [(5, 10.0), (7, -100.0)]);
        let pairs = logit_bias(Some(&serde_json::json!([[3, 1.5]])), 100).unwrap();
        assert_eq!(pairs, [(3, 1.5)]);
        let e = logit_bias(Some(&serde_json::json!({"100": 1})), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias.100"));
        let e = logit_bias(Some(&serde_json::json!({"5": 101})), 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias.5"));
    }

    #[test]
    fn messages_are_checked_by_index() {
        let mut ig = Vec::new();
        let e = messages(
            Some(&serde_json::json!([{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}])),
            false,
            &mut ig,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[1].tool_call_id"));
        let e = messages(
            Some(&serde_json::json!([{"role": "user", "content": [{"type": "image_url"}]}])),
            false,
            &mut ig,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let m = messages(Some(&serde_json::json!([
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "annotations": [1]}
        ])), false, &mut ig)
        .unwrap();
        assert_eq!(ig, ["annotations"]);
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content, "ab");
        assert_eq!(m[2].content, "");
    }
}
