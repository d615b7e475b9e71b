//! `mollm embed`: sentence embeddings of each input (a `--prompt`, or each line of a file),
//! as llama.cpp's `llama-embedding` computes them: tokens with the model's special tokens
//! (BERT's `[CLS]` .. `[SEP]`, a decoder's BOS), the final hidden states pooled (the model's
//! pooling, else the mean) and L2-normalized.

use crate::common::{CliResult, ModelArgs};
use clap::Args;
use engine::embed::Pooling;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A text to embed (repeat for several).
    #[arg(long, short = 'p')]
    pub prompt: Vec<String>,
    /// A UTF-8 file with one text to embed per line (empty lines skipped).
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// How token states become one vector [default: the model's own (BERT's file says),
    /// else mean].
    #[arg(long, value_parser = Pooling::NAMES)]
    pub pooling: Option<String>,
    /// Print one JSON object, shaped as OpenAI's /v1/embeddings answer (plus each input's
    /// token ids), instead of one line of numbers per input.
    #[arg(long)]
    pub json: bool,
}

/// Inputs longer than this many bytes are refused before tokenizing.
pub const MAX_INPUT_BYTES: usize = 1 << 20;

pub fn embed(a: EmbedArgs) -> CliResult {
    let mut texts = a.prompt.clone();
    if let Some(f) = &a.file {
        let bytes = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let text = String::from_utf8(bytes).map_err(|e| {
            format!(
                "{}: not UTF-8 text (invalid byte at offset {})",
                f.display(),
                e.utf8_error().valid_up_to()
            )
        })?;
        texts.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(String::from),
        );
    }
    if texts.is_empty() {
        return Err("nothing to embed: give --prompt TEXT or --file FILE".into());
    }
    if let Some((i, t)) = texts
        .iter()
        .enumerate()
        .find(|(_, t)| t.len() > MAX_INPUT_BYTES)
    {
        return Err(format!("input {i} has {} bytes (limit {MAX_INPUT_BYTES})", t.len()).into());
    }
    let (_, model) = a.model.load()?;
    let how = match &a.pooling {
        Some(p) => Pooling::parse(p).expect("clap checked the name"),
        None => model.pooling(),
    };
    let n_ctx = a.model.n_ctx(&model, None, 2048)?;
    // Room for several inputs' sequences at once (each holds whole pages while its step runs).
    let pool_rows = n_ctx.max(a.model.batch) + 16 * engine::kv::KV_PAGE;
    let mut session = a.model.session_with_pool(&model, n_ctx, pool_rows)?;
    let tok = &model.tokenizer;
    let inputs: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode(t, true, true))
        .collect::<Result<_, _>>()?;
    if let Some((i, x)) = inputs.iter().enumerate().find(|(_, x)| x.len() > n_ctx) {
        return Err(format!(
            "input {i} has {} tokens, more than the context of {n_ctx}",
            x.len()
        )
        .into());
    }
    let t0 = std::time::Instant::now();
    let vecs = session.embed(&inputs, how)?;
    let secs = t0.elapsed().as_secs_f64();
    if abi::settings::profile_level() > 0 {
        eprintln!("{}", session.exec().stats().report());
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let mut out = std::io::stdout().lock();
    if a.json {
        let data: Vec<serde_json::Value> = (vecs.iter().zip(&inputs).enumerate())
            .map(|(i, (v, x))| {
                serde_json::json!({"object": "embedding", "index": i, "embedding": v, "tokens": x})
            })
            .collect();
        let doc = serde_json::json!({
            "object": "list",
            "data": data,
            "model": model.file_name(),
            "pooling": how.name(),
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "timings": {"ms": secs * 1e3, "inputs_per_s": vecs.len() as f64 / secs.max(1e-9)},
        });
        writeln!(out, "{doc}")?;
    } else {
        for v in &vecs {
            let line: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
            writeln!(out, "{}", line.join(" "))?;
        }
        eprintln!(
            "embed: {} inputs, {n_tokens} tokens, {} values each, {} pooling, {:.1} inputs/s",
            vecs.len(),
            vecs.first().map_or(0, Vec::len),
            how.name(),
            vecs.len() as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}
