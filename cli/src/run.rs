use crate::common::{
    chat_tokens, text_tokens, CliResult, Interrupted, ModelArgs, PromptError, SamplingArgs,
};
use crate::signals;
use clap::Args;
use loader::{ChatMessage, StreamDecoder};
use std::io::Write;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Context length in tokens [default: 4096, at most the model's training context].
    #[arg(long, short = 'c')]
    pub ctx: Option<usize>,
    /// Keep generating past end-of-generation tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (ids, text, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: RunArgs) -> CliResult {
    let mut sampler = a.sampling.sampler()?;
    let (_path, model) = a.model.load()?;
    let n_ctx = a.model.n_ctx(&model, a.ctx, 4096)?;
    let mut session = a.model.session(&model, n_ctx)?;
    session.stop_at_eog = !a.ignore_eos;

    let tok = &model.tokenizer;
    // At most n_ctx - 1 prompt tokens (one position is left to generate); a longer prompt is
    // refused before it is tokenized whole.
    let limit = n_ctx - 1;
    let prompt = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        msgs.push(ChatMessage::new("user", a.prompt.clone()));
        chat_tokens(&model, &msgs, &Default::default(), limit)
    } else {
        text_tokens(&model, &a.prompt, true, limit)
    }
    .map_err(|e| match e {
        PromptError::TooLong { .. } => format!("{e}: the context holds {n_ctx} (raise --ctx)"),
        e => e.to_string(),
    })?;
    if prompt.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }

    let mut stream = StreamDecoder::new(tok, false);
    let mut stdout = std::io::stdout().lock();
    let json = a.json;
    signals::catch_interrupt();
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
        !signals::interrupted()
    })?;
    let interrupted = signals::interrupted();
    let rest = stream.finish();
    if abi::settings::profile_level() > 0 {
        eprintln!("{}", session.exec().stats().report());
        eprintln!("{}", session.exec().arena_report());
    }
    text_out.push_str(&rest);

    if json {
        let mut v = serde_json::json!({
            "model": model.file_name(),
            "architecture": model.hp.arch,
            "backend": session.backend_names().join(","),
            "prompt_tokens": prompt,
            "tokens": tokens,
            "text": text_out,
            "interrupted": interrupted,
            "timings": {
                "load_ms": model.load_ms,
                "prefill_ms": timings.prefill_ms,
                "decode_ms": timings.decode_ms,
                "prefill_tokens_per_s": timings.prefill_tps(),
                "decode_tokens_per_s": timings.decode_tps(),
            }
        });
        if let Some(st) = session.expert_stats() {
            // Per phase: the prompt's steps, then the generated tokens'.
            let zero = engine::experts::ExpertStats::default();
            let mut pre = st.clone();
            pre.decode = Default::default();
            let n = (prompt.len() + tokens.len()) as f64;
            v["experts"] = crate::common::expert_json(&zero, &st, n);
            v["experts"]["prefill"] = crate::common::expert_json(&zero, &pre, prompt.len() as f64);
            let mut dec = st.clone();
            dec.prefill = Default::default();
            v["experts"]["decode"] = crate::common::expert_json(&zero, &dec, tokens.len() as f64);
            v["experts"]["per_layer"] = serde_json::json!(st.per_layer);
        }
        writeln!(stdout, "{v}")?;
    } else {
        writeln!(stdout, "{rest}")?;
    }
    if interrupted {
        return Err(Interrupted(format!(
            "interrupted after {} generated tokens",
            tokens.len()
        ))
        .into());
    }
    Ok(())
}
