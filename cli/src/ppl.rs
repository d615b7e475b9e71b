//! `mollm ppl`: perplexity over a text file, computed as llama-perplexity computes it, so the
//! two numbers compare: the whole text tokenized once (BOS as the model asks, special-token
//! text not parsed), cut into non-overlapping windows of --ctx tokens, each evaluated from an
//! empty cache with its first token replaced by BOS when the model adds one; only the second
//! half of each window is scored (every scored token sees at least ctx/2 tokens of context).
//! The negative log-likelihood is accumulated in f64 from a log-softmax whose sum of
//! exponentials is taken in f64 over f32 terms, as llama-perplexity does.

use crate::common::{CliResult, ModelArgs};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct PplArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// UTF-8 text file to score.
    #[arg(long, short = 'f')]
    pub file: PathBuf,
    /// Window length in tokens (llama-perplexity's -c).
    #[arg(long, short = 'c', default_value_t = 512)]
    pub ctx: usize,
    /// Score only the first N windows [default: all that fit in the text].
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Print one JSON object (final and running estimates, counts, timings) at the end.
    #[arg(long)]
    pub json: bool,
}

/// `-log p(tok)` from one row of logits, in llama-perplexity's arithmetic.
pub fn nll(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    -(f64::from(logits[tok] - max) - sum_exp.ln())
}

/// The index of the largest logit (the first of equals).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

pub fn ppl(a: PplArgs) -> CliResult {
    let bytes = std::fs::read(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            a.file.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    if a.ctx < 4 {
        return Err("--ctx must be at least 4 for perplexity".into());
    }
    let (_, model) = a.model.load()?;
    let n_ctx = a.model.n_ctx(&model, Some(a.ctx), a.ctx)?;
    let tok = &model.tokenizer;
    let tokens = tok.encode(&text, true, false)?;
    if tokens.len() < 2 * n_ctx {
        return Err(format!(
            "{}: {} tokens; perplexity with --ctx {n_ctx} needs at least {} (a longer text or a smaller --ctx)",
            a.file.display(),
            tokens.len(),
            2 * n_ctx
        )
        .into());
    }
    let n_chunk_max = tokens.len() / n_ctx;
    let n_chunk = match a.chunks {
        Some(0) => return Err("--chunks must be at least 1".into()),
        Some(n) => n.min(n_chunk_max),
        None => n_chunk_max,
    };
    let mut session = a.model.session(&model, n_ctx)?;
    let bos = tok.add_bos().then(|| tok.bos()).flatten();
    let n_vocab = model.hp.n_vocab;
    let first = n_ctx / 2;

    if !a.json {
        eprintln!(
            "perplexity: {} tokens, {n_chunk} windows of {n_ctx}, batch {}, backend {}",
            tokens.len(),
            a.model.batch,
            session.backend_names().join(",")
        );
    }
    let bar = crate::progress::bar(a.model.load.quiet, n_chunk as u64, "windows");
    let show_bar = crate::progress::enabled(a.model.load.quiet);
    let t0 = Instant::now();
    let (mut sum, mut sum2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunk);
    // The most likely next token at each scored position (teacher forcing: two backends
    // agree on it at nearly every position, even where free-running text would drift apart).
    let mut top1 = Vec::with_capacity(n_chunk * (n_ctx - 1 - first));
    let mut stdout = std::io::stdout().lock();
    for i in 0..n_chunk {
        let start = i * n_ctx;
        let mut window = tokens[start..start + n_ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        session.truncate(0);
        let logits = session.eval_from(&window, first)?;
        // Row r holds the logits after position first + r, which predict the next token.
        for j in first..n_ctx - 1 {
            let row = &logits[(j - first) * n_vocab..(j - first + 1) * n_vocab];
            let v = nll(row, tokens[start + j + 1] as usize);
            top1.push(argmax(row));
            sum += v;
            sum2 += v * v;
        }
        count += n_ctx - 1 - first;
        let est = (sum / count as f64).exp();
        running.push(est);
        // With a bar on the terminal the estimates wait for the end (the bar shows the latest);
        // otherwise they stream as llama-perplexity prints them.
        if !a.json && !show_bar {
            write!(stdout, "[{}]{est:.4},", i + 1)?;
            stdout.flush()?;
        }
        bar.set_message(format!("PPL {est:.4}"));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let err = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        let v = serde_json::json!({
            "model": model.file_name(),
            "file": a.file.display().to_string(),
            "n_tokens": tokens.len(),
            "n_ctx": n_ctx,
            "n_batch": a.model.batch,
            "chunks": n_chunk,
            "scored_tokens": count,
            "ppl": ppl,
            "ppl_stderr": err,
            "running": running,
            "top1": top1,
            "backend": session.backend_names().join(","),
            "seconds": secs,
        });
        writeln!(stdout, "{v}")?;
    } else {
        if show_bar {
            for (i, est) in running.iter().enumerate() {
                write!(stdout, "[{}]{est:.4},", i + 1)?;
            }
        }
        writeln!(stdout)?;
        writeln!(stdout, "Final estimate: PPL = {ppl:.4} +/- {err:.5}")?;
        eprintln!(
            "{count} tokens scored in {secs:.1} s ({:.1} tokens/s evaluated)",
            (n_chunk * n_ctx) as f64 / secs
        );
    }
    Ok(())
}
