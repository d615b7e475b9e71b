//! `mollm batch`: offline generation for a JSONL file of requests, all scheduled together on
//! one loaded model (at most `--parallel` in flight, continuous batching), one result line per
//! request in input order. A bad line gets an error result naming the line and the field; the
//! others still run.

use crate::common::{chat_tokens, text_tokens, token_ids, CliResult, ModelArgs, SamplingArgs};
use clap::Args;
use engine::sched::{Event, Request, SchedOptions, Scheduler};
use engine::{Model, Sampler, SamplerParams};
use loader::ChatMessage;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct BatchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Requests, one JSON object per line: `prompt` (text), `messages` ([{role, content}]) or
    /// `prompt_ids` (token ids, as they are: no BOS added),
    /// optional `id`, `max_tokens`, `temperature`, `top_k`, `top_p`, `min_p`, `seed`,
    /// `repeat_penalty`, `presence_penalty`, `frequency_penalty`, `repeat_last_n`, `ignore_eos`.
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Where the result lines go [default: standard output].
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// Most sequences in flight at once.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Default for requests without `max_tokens`.
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    /// KV cache budget in tokens, shared by all sequences in flight [default: 4096 x --parallel,
    /// at most 65536].
    #[arg(long, short = 'c')]
    pub ctx: Option<usize>,
    /// Compute every prompt in full instead of reusing the cached keys and values of whole
    /// prompt chunks that earlier requests computed (the results are the same either way).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Defaults for requests that do not set them.
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// A request line, checked once into a typed value.
struct Parsed {
    id: Value,
    prompt: Vec<u32>,
    max_tokens: usize,
    sampler: Sampler,
    ignore_eos: bool,
}

const FIELDS: &[&str] = &[
    "id",
    "prompt",
    "messages",
    "prompt_ids",
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "repeat_last_n",
    "ignore_eos",
];

fn parse_line(line: &str, model: &Model, a: &BatchArgs) -> Result<Parsed, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    let o = v.as_object().ok_or("not a JSON object")?;
    if let Some(k) = o.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "field '{k}': unknown (fields: {})",
            FIELDS.join(", ")
        ));
    }
    let range = |k: &str, lo: f64, hi: f64| -> Result<Option<f64>, String> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => {
                let f = x
                    .as_f64()
                    .ok_or_else(|| format!("field '{k}': must be a number"))?;
                if !(lo..=hi).contains(&f) {
                    return Err(format!("field '{k}': {f} is outside {lo}..={hi}"));
                }
                Ok(Some(f))
            }
        }
    };
    // Sampling values: any number here, the ranges are the sampler's own (one validation for
    // `run`, `batch` and `serve`).
    let num = |k: &str| range(k, -f64::MAX, f64::MAX);
    let int = |k: &str, hi: f64| -> Result<Option<u64>, String> {
        match range(k, 0.0, hi)? {
            Some(f) if f.fract() != 0.0 => Err(format!("field '{k}': must be an integer")),
            x => Ok(x.map(|f| f as u64)),
        }
    };
    let given = ["prompt", "messages", "prompt_ids"]
        .iter()
        .filter(|k| o.contains_key(**k))
        .count();
    if given > 1 {
        return Err("fields 'prompt', 'messages' and 'prompt_ids': give one".into());
    }
    // A sequence is at most the training context (the scheduler's longest sequence): a longer
    // prompt is refused before it is tokenized whole.
    let limit = model.hp.n_ctx_train;
    let prompt = match (o.get("prompt"), o.get("messages")) {
        _ if o.contains_key("prompt_ids") => {
            let ids = o["prompt_ids"]
                .as_array()
                .ok_or("field 'prompt_ids': must be a list of token ids")?;
            token_ids(ids, model).map_err(|e| format!("field 'prompt_ids': {e}"))?
        }
        (Some(_), Some(_)) => unreachable!("checked above"),
        (Some(Value::String(p)), None) => {
            text_tokens(model, p, true, limit).map_err(|e| format!("field 'prompt': {e}"))?
        }
        (Some(_), None) => return Err("field 'prompt': must be a string".into()),
        (None, Some(Value::Array(m))) => {
            let mut msgs = Vec::with_capacity(m.len());
            for (i, x) in m.iter().enumerate() {
                let get = |k: &str| {
                    x.get(k)
                        .and_then(|s| s.as_str())
                        .map(str::to_string)
                        .ok_or_else(|| format!("field 'messages[{i}].{k}': must be a string"))
                };
                msgs.push(ChatMessage::new(get("role")?, get("content")?));
            }
            chat_tokens(model, &msgs, &Default::default(), limit)
                .map_err(|e| format!("field 'messages': {e}"))?
        }
        (None, Some(_)) => return Err("field 'messages': must be a list".into()),
        (None, None) => return Err("field 'prompt' or 'messages' is required".into()),
    };
    if prompt.is_empty() {
        return Err("field 'prompt': empty after tokenization".into());
    }
    let d = &a.sampling;
    let seed = int("seed", u64::MAX as f64)?.or(d.seed).unwrap_or(0);
    let params = SamplerParams {
        temperature: num("temperature")?.map_or(d.temperature, |f| f as f32),
        top_k: int("top_k", 1e9)?.map_or(d.top_k, |x| x as usize),
        top_p: num("top_p")?.map_or(d.top_p, |f| f as f32),
        min_p: num("min_p")?.map_or(d.min_p, |f| f as f32),
        repeat_penalty: num("repeat_penalty")?.map_or(d.repeat_penalty, |f| f as f32),
        presence_penalty: num("presence_penalty")?.map_or(d.presence_penalty, |f| f as f32),
        frequency_penalty: num("frequency_penalty")?.map_or(d.frequency_penalty, |f| f as f32),
        repeat_last_n: int("repeat_last_n", 1e9)?.map_or(d.repeat_last_n, |x| x as usize),
        seed,
        logit_bias: Vec::new(),
    };
    params
        .validate()
        .map_err(|e| format!("field '{}': {}", e.field, e.msg))?;
    let ignore_eos = match o.get("ignore_eos") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("field 'ignore_eos': must be true or false".into()),
    };
    Ok(Parsed {
        id: o.get("id").cloned().unwrap_or(Value::Null),
        prompt,
        max_tokens: int("max_tokens", 1e9)?.map_or(a.max_tokens, |x| x as usize),
        sampler: Sampler::new(params),
        ignore_eos,
    })
}

pub fn batch(a: BatchArgs) -> CliResult {
    if a.parallel == 0 {
        return Err("--parallel must be at least 1".into());
    }
    a.sampling.sampler()?; // the defaults every line gets, checked once
    let (_path, model) = a.model.load()?;
    let bytes = std::fs::read(&a.input).map_err(|e| format!("{}: {e}", a.input.display()))?;
    let budget = a.ctx.unwrap_or((4096 * a.parallel).min(65536));
    if budget == 0 {
        return Err("--ctx must be at least 1".into());
    }
    let mut session = a.model.session_with_pool(&model, 1, budget)?;
    let nb = a.model.batch.max(1);
    session.reserve_step(nb + a.parallel, a.parallel);
    let mut sched = Scheduler::new(SchedOptions {
        parallel: a.parallel,
        n_batch: nb,
        max_seq: model.hp.n_ctx_train,
        prefix_cache: !a.no_prefix_cache,
    });

    // Every line gets a result slot; bad lines are filled at once.
    let mut results: Vec<Option<Value>> = Vec::new();
    let mut ids: Vec<Value> = Vec::new();
    // Line by line, so that a line that is not UTF-8 is one error result, not the file's end.
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let (line, parsed) = match std::str::from_utf8(raw) {
            Ok(l) if l.trim().is_empty() => continue,
            Ok(l) => (l, parse_line(l, &model, &a)),
            Err(e) => ("", Err(format!("not valid UTF-8: {e}"))),
        };
        let k = results.len();
        match parsed {
            Ok(p) => {
                ids.push(p.id);
                results.push(None);
                sched.submit(Request {
                    id: k,
                    prompt: p.prompt,
                    max_tokens: p.max_tokens,
                    sampler: p.sampler,
                    stop_at_eog: !p.ignore_eos,
                    logprobs: None,
                    constraint: None,
                });
            }
            Err(e) => {
                let msg = format!("{}: line {}: {e}", a.input.display(), i + 1);
                // The error result carries the line's id where the line has one.
                let id = serde_json::from_str::<Value>(line)
                    .ok()
                    .and_then(|v| v.get("id").cloned())
                    .unwrap_or(Value::Null);
                ids.push(id);
                results.push(Some(json!({"line": i + 1, "error": msg})));
            }
        }
    }
    let mut out: Box<dyn Write> = match &a.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let t0 = Instant::now();
    let (mut written, mut gen_tokens, mut steps, mut cached) = (0usize, 0usize, 0usize, 0usize);
    let mut events = Vec::new();
    loop {
        // Results go out in input order as soon as the ones before them are done.
        while written < results.len() && results[written].is_some() {
            let mut v = results[written].take().expect("checked");
            if let Value::Object(m) = &mut v {
                m.insert("id".into(), ids[written].clone());
            }
            writeln!(out, "{v}")?;
            results[written] = Some(Value::Null);
            written += 1;
        }
        if sched.is_idle() {
            break;
        }
        events.clear();
        sched.step(&mut session, &mut events)?;
        steps += 1;
        for e in events.drain(..) {
            match e {
                Event::Token { .. } => gen_tokens += 1,
                Event::Done {
                    id,
                    finish,
                    prompt_tokens,
                    cached_tokens,
                    tokens,
                    timings,
                } => {
                    let text = model.tokenizer.decode(
                        tokens
                            .iter()
                            .copied()
                            .filter(|&t| !model.tokenizer.is_eog(t))
                            .collect::<Vec<_>>()
                            .as_slice(),
                    );
                    let dec = tokens.len().saturating_sub(1);
                    let mut m = Map::new();
                    m.insert("prompt_tokens".into(), json!(prompt_tokens));
                    m.insert("cached_tokens".into(), json!(cached_tokens));
                    cached += cached_tokens;
                    m.insert("completion_tokens".into(), json!(tokens.len()));
                    m.insert("tokens".into(), json!(tokens));
                    m.insert("text".into(), json!(text));
                    m.insert("finish_reason".into(), json!(finish.as_str()));
                    m.insert("timings".into(), json!({
                        "queue_ms": timings.queue_ms,
                        "prefill_ms": timings.prefill_ms,
                        "decode_ms": timings.decode_ms,
                        "decode_tps": if timings.decode_ms > 0.0 { dec as f64 * 1e3 / timings.decode_ms } else { 0.0 },
                    }));
                    results[id] = Some(Value::Object(m));
                }
                Event::Failed { id, msg } => {
                    results[id] = Some(json!({"error": msg}));
                }
            }
        }
    }
    out.flush()?;
    if abi::settings::profile_level() > 0 {
        eprintln!("{}", session.exec().stats().report());
        eprintln!("{}", session.exec().arena_report());
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "batch: {} requests in {secs:.2} s ({:.2} requests/s), {gen_tokens} tokens generated ({:.1} tokens/s), {cached} prompt tokens from the prefix cache, {steps} steps, --parallel {}",
        results.len(),
        results.len() as f64 / secs.max(1e-9),
        gen_tokens as f64 / secs.max(1e-9),
        a.parallel
    );
    Ok(())
}
