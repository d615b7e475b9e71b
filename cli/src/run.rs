use clap::Args;
use engine::{BackendChoice, Model, Sampler, SamplerParams, Session, SessionOptions};
use loader::{ChatMessage, StreamDecoder};
use std::io::Write;
use std::path::PathBuf;

/// File name of the default model that `scripts/fetch-models.sh` puts in the model cache.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct-q4_1.gguf";

#[derive(Args, Debug)]
pub struct RunArgs {
    /// GGUF model file [default: SmolLM2-135M-Instruct from the model cache]
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Prompt text. Special-token text such as <|im_start|> is read as special tokens.
    #[arg(long, short = 'p')]
    pub prompt: String,
    /// Send the prompt as one user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
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
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Recent tokens the penalties consider.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed [default: from the clock]. The same seed gives the same text.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Backend: auto (conforming native plugins by score, then reference), reference, or a
    /// backend name (see `mollm devices`).
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Never fall back to the reference: an op no native backend takes is an error.
    #[arg(long)]
    pub require_native: bool,
    #[command(flatten)]
    pub libs: crate::devices::LibArgs,
    /// Compute threads [default: one per core].
    #[arg(long, short = 't', default_value_t = 0)]
    pub threads: usize,
    /// Context length in tokens [default: 4096, at most the model's training context].
    #[arg(long, short = 'c')]
    pub ctx: Option<usize>,
    /// Prompt tokens processed per step.
    #[arg(long, short = 'b', default_value_t = 512)]
    pub batch: usize,
    /// Keep generating past end-of-generation tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (ids, text, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MOLLM_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/mollm/models")
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

pub fn run(a: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    let path = resolve_model(&a.model)?;
    let model = Model::load(&path)?;
    let n_ctx = a.ctx.unwrap_or_else(|| 4096.min(model.hp.n_ctx_train));
    if n_ctx > model.hp.n_ctx_train {
        return Err(format!(
            "--ctx {n_ctx} exceeds the model's training context of {}",
            model.hp.n_ctx_train
        )
        .into());
    }
    let opts = SessionOptions {
        n_ctx,
        n_batch: a.batch,
        n_threads: a.threads,
        backend: BackendChoice::parse(&a.backend),
        plugins: Some(engine::registry::PluginOptions {
            libs: a.libs.backend_lib.clone(),
            gate: engine::registry::GateRunner::self_exec()?,
            require_native: a.require_native,
        }),
        ..Default::default()
    };
    let mut session = Session::new(&model, &opts)?;
    session.stop_at_eog = !a.ignore_eos;

    let text = if a.chat {
        let tmpl = model.chat_template.as_ref().ok_or_else(|| {
            format!(
                "{}: the model has no chat template (tokenizer.chat_template)",
                path.display()
            )
        })?;
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage {
                role: "system".into(),
                content: s.clone(),
            });
        }
        msgs.push(ChatMessage {
            role: "user".into(),
            content: a.prompt.clone(),
        });
        tmpl.render(&msgs, true)?
    } else {
        a.prompt.clone()
    };
    // A chat template that writes the BOS text itself (Gemma's does) must not get a second BOS.
    let tok = &model.tokenizer;
    let template_has_bos = a.chat
        && tok
            .bos()
            .is_some_and(|b| text.starts_with(tok.token_text(b)));
    let prompt = tok.encode(&text, !template_has_bos, true)?;
    if prompt.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }
    if prompt.len() >= n_ctx {
        return Err(format!(
            "the prompt has {} tokens but the context holds {n_ctx} (raise --ctx)",
            prompt.len()
        )
        .into());
    }

    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let mut sampler = Sampler::new(SamplerParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        repeat_last_n: a.repeat_last_n,
        seed,
    });

    let mut stream = StreamDecoder::new(tok, false);
    let mut stdout = std::io::stdout().lock();
    let json = a.json;
    let mut text_out = String::new();
    let (tokens, timings) = session.generate(&prompt, a.max_tokens, &mut sampler, |t| {
        if tok.is_eog(t) {
            return true;
        }
        let piece = stream.push(t);
        text_out.push_str(&piece);
        if !json {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
        true
    })?;
    let rest = stream.finish();
    if std::env::var("MOLLM_PROFILE").is_ok_and(|v| v == "1") {
        eprintln!("{}", session.exec().stats().report());
    }
    text_out.push_str(&rest);

    if json {
        let v = serde_json::json!({
            "model": model.file_name(),
            "architecture": model.hp.arch,
            "backend": session.backend_names().join(","),
            "prompt_tokens": prompt,
            "tokens": tokens,
            "text": text_out,
            "timings": {
                "load_ms": model.load_ms,
                "prefill_ms": timings.prefill_ms,
                "decode_ms": timings.decode_ms,
                "prefill_tokens_per_s": timings.prefill_tps(),
                "decode_tokens_per_s": timings.decode_tps(),
            }
        });
        writeln!(stdout, "{v}")?;
    } else {
        writeln!(stdout, "{rest}")?;
    }
    Ok(())
}
