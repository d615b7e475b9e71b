//! Flags and set-up shared by the commands that run a model (`run`, `chat`, `bench`, `ppl`):
//! declared once here and flattened into each command so their help reads the same.

use crate::progress;
use clap::Args;
use engine::{BackendChoice, Model, Sampler, SamplerParams, Session, SessionOptions};
use std::path::PathBuf;

/// File name of the default model that `scripts/fetch-models.sh` puts in the model cache.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct-q4_1.gguf";

pub type CliResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// What to load and where to run it: the flags every command that runs a model shares,
/// `bench` included (which sweeps lists of --threads and --batch of its own).
#[derive(Args, Debug, Clone)]
pub struct LoadArgs {
    /// Model: a GGUF file, a .mollm package or a Hugging Face directory (config.json, *.safetensors, tokenizer.json) [default: SmolLM2-135M-Instruct from the model cache]
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Backend: auto (conforming native plugins by score, then reference), reference, or a
    /// backend name (see `mollm devices`).
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Never fall back to the reference: an op no native backend takes is an error.
    #[arg(long)]
    pub require_native: bool,
    #[command(flatten)]
    pub libs: crate::devices::LibArgs,
    /// K/V cache format: f32 computes what llama.cpp does with `-fa off -ctk f32 -ctv f32`,
    /// f16 what it does with `-fa off` and its default F16 cache (half the memory).
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_type: KvType,
    #[command(flatten)]
    pub experts: ExpertArgs,
    /// No progress bars or banners (progress bars are also off when stdout or stderr is not a
    /// terminal).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// [`LoadArgs`] with one thread count and one batch size: `run`, `chat`, `batch`, `serve`,
/// `ppl`.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// Compute threads [default: one per core].
    #[arg(long, short = 't', default_value_t = 0)]
    pub threads: usize,
    /// Prompt tokens processed per step.
    #[arg(long, short = 'b', default_value_t = 512)]
    pub batch: usize,
}

/// The expert cache's flags (MoE models), shared by every command that runs a model.
#[derive(Args, Debug, Clone)]
pub struct ExpertArgs {
    /// MoE models: routed experts read from the model file into a cache of this many MiB
    /// shared by all layers (dense weights stay in memory) [default: all experts in memory
    /// when the file fits in the memory available, otherwise what is left after the dense
    /// weights and the KV cache].
    #[arg(long, value_name = "MB")]
    pub expert_cache: Option<usize>,
    /// Expert cache eviction: next-use (evicts the expert expected to be needed farthest ahead,
    /// from how often its layer uses it and whether its layer's last run did), least-stale
    /// (keeps each layer's last route, evicts by the layer cycle) or lru (for comparisons).
    #[arg(long, default_value = "next-use", value_parser = ["next-use", "least-stale", "lru"])]
    pub cache_policy: String,
    /// Expert cache: threads that read experts from the file (demand reads ahead of
    /// prefetches).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub io_workers: u16,
    /// Expert cache: next-layer prefetch. auto: on, but while decoding it backs off where
    /// passes run faster without it (the demand reads alone keep the disk busy), measured by
    /// turns; on: always; off: each layer reads only what its router chose.
    #[arg(long, value_enum, default_value = "auto")]
    pub prefetch: PrefetchMode,
    /// The same as `--prefetch off`.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Writes a Chrome/Perfetto trace (JSON) of the run to FILE: MoE layers, expert reads on
    /// their I/O worker threads, waits, and a flow from each prediction to its prefetches.
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<std::path::PathBuf>,
}

/// Where `--trace` writes when the command ends (set once a session starts tracing).
pub static TRACE_PATH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Writes the trace `--trace` asked for, if any (said on stderr).
pub fn write_trace() {
    if let Some(path) = TRACE_PATH.get() {
        match engine::trace::write(path) {
            Ok(()) => eprintln!("trace written to {}", path.display()),
            Err(e) => eprintln!("error: cannot write the trace {}: {e}", path.display()),
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefetchMode {
    Auto,
    On,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than M times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for recently seen tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtracted from the logit of every token seen in the last --repeat-last-n (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted once per occurrence in the last --repeat-last-n (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Recent tokens the penalties consider.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed [default: from the clock]. The same seed gives the same text.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// A seed from the clock, for requests that give none.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A JSON list of token ids (`prompt_ids`, a completion prompt, `/detokenize`), each checked
/// against the vocabulary.
pub fn token_ids(list: &[serde_json::Value], model: &Model) -> Result<Vec<u32>, String> {
    let n_vocab = model.hp.n_vocab as u64;
    list.iter()
        .map(|x| match x.as_u64() {
            Some(t) if t < n_vocab => Ok(t as u32),
            _ => Err(format!("{x} is not a token id below {n_vocab}")),
        })
        .collect()
}

impl SamplingArgs {
    /// The flags as sampler parameters, checked as `batch` and `serve` check theirs
    /// ([`SamplerParams::validate`]); an error names the flag.
    pub fn sampler(&self) -> CliResult<Sampler> {
        let p = SamplerParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed.unwrap_or_else(clock_seed),
            logit_bias: Vec::new(),
        };
        p.validate()
            .map_err(|e| format!("--{} {}", e.field.replace('_', "-"), e.msg))?;
        Ok(Sampler::new(p))
    }
}

pub fn models_dir() -> PathBuf {
    abi::settings::models_dir()
}

pub fn resolve_model(arg: &Option<PathBuf>) -> Result<PathBuf, String> {
    match arg {
        Some(p) => Ok(p.clone()),
        None => {
            let p = models_dir().join(DEFAULT_MODEL);
            if p.exists() {
                Ok(p)
            } else {
                Err(format!("no --model given and the default model is missing at {} (run scripts/fetch-models.sh)", p.display()))
            }
        }
    }
}

impl ModelArgs {
    /// Loads the model, with a spinner when that is worth showing.
    pub fn load(&self) -> CliResult<(PathBuf, Model)> {
        let path = resolve_model(&self.load.model)?;
        let spin = progress::spinner(self.load.quiet, format!("loading {}", path.display()));
        let model = Model::load(&path);
        spin.finish_and_clear();
        Ok((path, model?))
    }

    /// The context length: `ctx` if given (refused above the model's training context),
    /// else `default` capped at the training context.
    pub fn n_ctx(&self, model: &Model, ctx: Option<usize>, default: usize) -> CliResult<usize> {
        let train = model.hp.n_ctx_train;
        match ctx {
            Some(0) => Err("--ctx must be at least 1".into()),
            Some(n) if n > train => {
                Err(format!("--ctx {n} exceeds the model's training context of {train}").into())
            }
            Some(n) => Ok(n),
            None => Ok(default.min(train)),
        }
    }

    fn expert_memory(&self) -> engine::experts::ExpertMemory {
        use engine::experts::{ExpertMemory, Policy};
        let policy = Policy::parse(&self.load.experts.cache_policy).unwrap_or(Policy::NextUse);
        match self.load.experts.expert_cache {
            Some(mb) => ExpertMemory::Cache {
                bytes: mb << 20,
                policy,
            },
            None => ExpertMemory::Auto { policy },
        }
    }

    /// A session on `model`: backends chosen and gated, KV cache for `n_ctx` tokens.
    pub fn session<'m>(&self, model: &'m Model, n_ctx: usize) -> CliResult<Session<'m>> {
        self.session_with_pool(model, n_ctx, 0)
    }

    /// [`ModelArgs::session`] whose KV pool holds `pool_rows` positions for all its sequences
    /// (0: `n_ctx`).
    pub fn session_with_pool<'m>(
        &self,
        model: &'m Model,
        n_ctx: usize,
        pool_rows: usize,
    ) -> CliResult<Session<'m>> {
        if self.batch == 0 {
            return Err("--batch must be at least 1".into());
        }
        let opts = SessionOptions {
            n_ctx,
            n_batch: self.batch,
            n_threads: self.threads,
            backend: BackendChoice::parse(&self.load.backend),
            kv_dtype: match self.load.kv_type {
                KvType::F32 => abi::DType::F32,
                KvType::F16 => abi::DType::F16,
            },
            plugins: Some(engine::registry::PluginOptions {
                libs: self.load.libs.backend_lib.clone(),
                gate: engine::registry::GateRunner::self_exec()?,
                require_native: self.load.require_native,
            }),
            kv_pool_rows: pool_rows,
            experts: self.expert_memory(),
            io_workers: self.load.experts.io_workers as usize,
            prefetch: !self.load.experts.no_prefetch
                && self.load.experts.prefetch != PrefetchMode::Off,
            prefetch_auto: self.load.experts.prefetch == PrefetchMode::Auto,
            ..Default::default()
        };
        if let Some(path) = &self.load.experts.trace {
            // Created now, so that a path that cannot be written fails before the run.
            std::fs::File::create(path).map_err(|e| format!("--trace {}: {e}", path.display()))?;
            let _ = TRACE_PATH.set(path.clone());
            engine::trace::start();
        }
        let spin = progress::spinner(self.load.quiet, "preparing backends".to_string());
        let s = Session::new(model, &opts);
        spin.finish_and_clear();
        Ok(s?)
    }
}

/// Model type as llama-bench words it: "llama 135M Q4_1".
pub fn model_type(model: &Model) -> String {
    format!(
        "{} {} {}",
        model.hp.arch,
        human_count(model_n_params(model)),
        model_ftype(model)
    )
}

/// The dominant weight format: the one holding the most bytes among 2-D weights.
pub fn model_ftype(model: &Model) -> String {
    let mut by: std::collections::BTreeMap<String, u64> = Default::default();
    for t in model.gguf.tensors.iter().filter(|t| t.shape.len() >= 2) {
        *by.entry(t.dtype.name().to_uppercase()).or_default() += t.size;
    }
    by.into_iter()
        .max_by_key(|(_, b)| *b)
        .map(|(n, _)| n)
        .unwrap_or_else(|| "?".into())
}

pub fn model_n_params(model: &Model) -> u64 {
    model.gguf.tensors.iter().map(|t| t.n_elements()).sum()
}

pub fn model_size(model: &Model) -> u64 {
    model.gguf.tensors.iter().map(|t| t.size).sum()
}

pub fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{}M", (n as f64 / 1e6).round() as u64),
        n => format!("{n}"),
    }
}

pub fn human_bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n as f64 >= 1024.0 * MIB {
        format!("{:.2} GiB", n as f64 / (1024.0 * MIB))
    } else {
        format!("{:.2} MiB", n as f64 / MIB)
    }
}

/// Peak resident set size of this process so far, in bytes (0 where the OS does not say).
pub fn peak_rss_bytes() -> u64 {
    #[cfg(unix)]
    {
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: getrusage fills the struct we own.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
            // Linux reports kilobytes, macOS bytes.
            let v = ru.ru_maxrss as u64;
            return if cfg!(target_os = "macos") {
                v
            } else {
                v * 1024
            };
        }
    }
    0
}

/// Why a prompt has no token ids: longer than the context allows (found before or while
/// tokenizing, never after a whole oversized text was tokenized), or another error.
#[derive(Debug)]
pub enum PromptError {
    /// More than `limit` tokens. `bytes`: set when the text's bytes alone said so, to the
    /// most that `limit` tokens can hold (the text has more); `rendered`: the text is the
    /// chat template's output.
    TooLong {
        limit: usize,
        bytes: Option<usize>,
        rendered: bool,
    },
    Other(String),
}

impl std::fmt::Display for PromptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PromptError::TooLong {
                limit,
                bytes,
                rendered,
            } => {
                let what = if *rendered {
                    "the prompt the chat template renders"
                } else {
                    "the prompt"
                };
                match bytes {
                    None => write!(f, "{what} has more than {limit} tokens, the most the context takes"),
                    Some(b) => write!(f, "{what} has more than {b} bytes, more than {limit} tokens can hold (the most the context takes)"),
                }
            }
            PromptError::Other(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for PromptError {}

impl From<loader::LoadError> for PromptError {
    fn from(e: loader::LoadError) -> Self {
        PromptError::Other(e.to_string())
    }
}

/// Token ids of a prompt text of at most `limit` tokens: a longer text is refused by its byte
/// length first, or as soon as tokenizing passes `limit` (see `Tokenizer::encode_limited`).
pub fn text_tokens(
    model: &Model,
    text: &str,
    add_special: bool,
    limit: usize,
) -> Result<Vec<u32>, PromptError> {
    let tok = &model.tokenizer;
    tok.encode_limited(text, add_special, true, limit)?
        .ok_or(PromptError::TooLong {
            limit,
            bytes: Some(tok.max_text_bytes(limit)).filter(|&b| text.len() > b),
            rendered: false,
        })
}

/// Token ids for a conversation rendered through the model's chat template, ending with the
/// assistant's turn opened when `add_generation_prompt`; at most `limit` tokens (the
/// rendering itself stops at the bytes that many tokens can hold).
pub fn chat_tokens(
    model: &Model,
    msgs: &[loader::ChatMessage],
    extras: &loader::RenderExtras,
    limit: usize,
) -> Result<Vec<u32>, PromptError> {
    let tmpl = model.chat_template.as_ref().ok_or_else(|| {
        PromptError::Other(format!(
            "{}: the model has no chat template (tokenizer.chat_template)",
            model.gguf.path.display()
        ))
    })?;
    let tok = &model.tokenizer;
    let max_bytes = tok.max_text_bytes(limit);
    // A last assistant message with text is a prefill: the model continues it (the turns
    // before it, the assistant's header, its text so far), as llama-server does.
    let (msgs, prefill) = match msgs.split_last() {
        Some((last, before))
            if last.role == "assistant"
                && !last.content.is_empty()
                && last.tool_calls.is_none() =>
        {
            (before, last.content.as_str())
        }
        _ => (msgs, ""),
    };
    let mut text =
        tmpl.render_with(msgs, true, extras, max_bytes)?
            .ok_or(PromptError::TooLong {
                limit,
                bytes: Some(max_bytes),
                rendered: true,
            })?;
    text.push_str(prefill);
    // A chat template that writes the BOS text itself (Gemma's does) must not get a second BOS.
    let template_has_bos = tok
        .bos()
        .is_some_and(|b| text.starts_with(tok.token_text(b)));
    text_tokens(model, &text, !template_has_bos, limit).map_err(|e| match e {
        PromptError::TooLong { limit, bytes, .. } => PromptError::TooLong {
            limit,
            bytes,
            rendered: true,
        },
        e => e,
    })
}

/// The user pressed Ctrl-C: what was produced stands, the exit status says it was cut short.
#[derive(Debug)]
pub struct Interrupted(pub String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}

/// Runs one token through the model and forgets it, as llama.cpp does at start-up: the weights
/// are paged in and the kernels' first-call costs paid before the user waits on them.
pub fn warm_up(session: &mut Session, model: &Model, quiet: bool) -> CliResult {
    let spin = progress::spinner(quiet, "warming up".to_string());
    let tok = model.tokenizer.bos().unwrap_or(0);
    // An embedding model has no logits: its one step is an embedding's.
    let r = match model.program.has_logits() {
        true => session.eval(&[tok], true).map(drop),
        false => session.embed(&[vec![tok]], model.pooling()).map(drop),
    };
    session.truncate(0);
    spin.finish_and_clear();
    r?;
    Ok(())
}

/// The expert cache's counters between two snapshots, both phases together, for `tokens`
/// tokens (JSON of `bench` rows and `run --json`).
pub fn expert_json(
    before: &engine::experts::ExpertStats,
    now: &engine::experts::ExpertStats,
    tokens: f64,
) -> serde_json::Value {
    let d = |f: fn(&engine::experts::PhaseStats) -> f64| {
        f(&now.prefill) + f(&now.decode) - f(&before.prefill) - f(&before.decode)
    };
    let acquires = d(|p| p.acquires as f64);
    let hits = d(|p| p.hits as f64);
    let bytes = d(|p| p.bytes_read as f64);
    let useful = d(|p| p.prefetch_useful as f64);
    let predicted = d(|p| p.predicted as f64);
    let used = d(|p| p.predicted_used as f64);
    serde_json::json!({
        "slots": now.slots,
        "slot_bytes": now.slot_bytes,
        "policy": now.policy,
        "acquires": acquires as u64,
        "hits": hits as u64,
        "misses": d(|p| p.misses as f64) as u64,
        "hit_rate": if acquires > 0.0 { hits / acquires } else { 0.0 },
        "evictions": d(|p| p.evictions as f64) as u64,
        "bytes_read": bytes as u64,
        "bytes_read_per_token": if tokens > 0.0 { bytes / tokens } else { 0.0 },
        "reads": d(|p| p.reads as f64) as u64,
        "read_ms": d(|p| p.read_ms),
        "wait_ms": d(|p| p.wait_ms),
        "prefetch": now.prefetch,
        "prefetch_auto": now.prefetch && now.prefetch_auto,
        "decode_passes": now.decode_passes - before.decode_passes,
        "backoff_passes": now.backoff_passes - before.backoff_passes,
        "direct": now.direct,
        "prefetches": d(|p| p.prefetches as f64) as u64,
        "prefetch_bytes": d(|p| p.prefetch_bytes as f64) as u64,
        "prefetch_useful": useful as u64,
        "prefetch_unused": d(|p| p.prefetch_unused as f64) as u64,
        "predicted": predicted as u64,
        "predicted_used": used as u64,
        "prediction_accuracy": if predicted > 0.0 { used / predicted } else { 0.0 },
        "ranks": now.ranks.iter().map(|&(n, u, on)| serde_json::json!({
            "predicted": n, "used": u, "prefetched": on
        })).collect::<Vec<_>>(),
    })
}
