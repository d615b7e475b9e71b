//! `mollm chat`: a conversation through the model's chat template. The session's KV cache
//! persists across turns: each turn re-renders the whole conversation, keeps the cached prefix
//! it shares with the tokens already processed, and evaluates only the rest.

use crate::common::{
    chat_tokens, model_ftype, warm_up, CliResult, ModelArgs, PromptError, SamplingArgs,
};
use crate::signals;
use clap::Args;
use engine::{Model, Sampler, Session};
use loader::{ChatMessage, StreamDecoder};
use std::io::{BufRead, IsTerminal, Write};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System message that opens the conversation (kept by /reset).
    #[arg(long)]
    pub system: Option<String>,
    /// Context length in tokens [default: 4096, at most the model's training context].
    #[arg(long, short = 'c')]
    pub ctx: Option<usize>,
    /// Most tokens per reply [default: until the model ends its turn or the context is full].
    #[arg(long, short = 'n')]
    pub max_tokens: Option<usize>,
    /// After each reply, print on stderr how many prompt tokens were processed and how many
    /// came from the cache, and the speed.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

const HELP: &str = "\
/help    this list
/reset   forget the conversation (the --system message stays)
/quit    leave (also /exit, or Ctrl-D)
Ctrl-C stops the reply being written.";

/// Where turns come from: a line editor with history on a terminal, plain lines otherwise.
enum Input {
    Editor(Box<rustyline::DefaultEditor>, Option<std::path::PathBuf>),
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

enum Line {
    Text(String),
    /// Ctrl-C at the prompt: nothing to stop, say how to leave.
    Cancelled,
    End,
}

impl Input {
    fn open() -> CliResult<Input> {
        if !std::io::stdin().is_terminal() {
            return Ok(Input::Lines(std::io::stdin().lock().lines()));
        }
        let mut ed = rustyline::DefaultEditor::new()?;
        let hist = std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(".cache/mollm/chat_history"));
        if let Some(h) = &hist {
            let _ = ed.load_history(h);
        }
        Ok(Input::Editor(Box::new(ed), hist))
    }

    fn read(&mut self) -> CliResult<Line> {
        match self {
            Input::Lines(lines) => match lines.next() {
                None => Ok(Line::End),
                Some(Ok(l)) => Ok(Line::Text(l)),
                Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                    Err("standard input is not UTF-8 text".into())
                }
                Some(Err(e)) => Err(format!("reading standard input: {e}").into()),
            },
            Input::Editor(ed, _) => match ed.readline(">>> ") {
                Ok(l) => {
                    if !l.trim().is_empty() {
                        let _ = ed.add_history_entry(l.as_str());
                    }
                    Ok(Line::Text(l))
                }
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Line::Cancelled),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Line::End),
                Err(e) => Err(e.into()),
            },
        }
    }

    fn save(&mut self) {
        if let Input::Editor(ed, Some(h)) = self {
            if let Some(dir) = h.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = ed.save_history(h);
        }
    }
}

struct Chat<'m> {
    model: &'m Model,
    session: Session<'m>,
    sampler: Sampler,
    messages: Vec<ChatMessage>,
    system: Option<String>,
    max_tokens: Option<usize>,
    verbose: bool,
    turn: usize,
}

/// Room a turn needs beyond its prompt before older turns are dropped to make space.
const MIN_REPLY_ROOM: usize = 16;

impl<'m> Chat<'m> {
    fn reset(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.system {
            self.messages.push(ChatMessage::new("system", s.clone()));
        }
        self.session.truncate(0);
    }

    /// The conversation's tokens, dropping the oldest exchanges while it does not fit.
    fn fitted_prompt(&mut self) -> CliResult<Vec<u32>> {
        let n_ctx = self.session.n_ctx();
        let first = usize::from(self.system.is_some());
        let limit = n_ctx.saturating_sub(MIN_REPLY_ROOM);
        loop {
            match chat_tokens(self.model, &self.messages, &Default::default(), limit) {
                Ok(t) => return Ok(t),
                Err(PromptError::TooLong { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            // Keep the system message and the new user message; drop the oldest exchange.
            if self.messages.len() - first > 1 {
                let n = (self.messages.len() - first - 1).min(2);
                self.messages.drain(first..first + n);
                eprintln!("[context full: the oldest exchange was dropped]");
                continue;
            }
            self.messages.pop();
            return Err(format!(
                "this message needs more than {limit} tokens with the template, but the context holds {n_ctx} and {MIN_REPLY_ROOM} are kept for the reply (raise --ctx)"
            )
            .into());
        }
    }

    fn turn(&mut self, text: String, out: &mut impl Write) -> CliResult {
        self.messages.push(ChatMessage::new("user", text));
        let prompt = self.fitted_prompt()?;
        // Reuse the cached prefix; at least one token is evaluated to get logits.
        let hist = self.session.history();
        let mut reused = hist.iter().zip(&prompt).take_while(|(a, b)| a == b).count();
        reused = reused.min(prompt.len() - 1);
        // A model with recurrent state keeps all of its history or none of it.
        let reused = self.session.truncate(reused);
        let new = &prompt[reused..];
        let room = self.session.n_ctx() - prompt.len();
        let max = self.max_tokens.unwrap_or(room).min(room);

        let tok = &self.model.tokenizer;
        let mut stream = StreamDecoder::new(tok, false);
        let mut reply = String::new();
        signals::clear();
        signals::catch_interrupt();
        let res = self.session.generate(new, max, &mut self.sampler, |t| {
            if tok.is_eog(t) {
                return true;
            }
            let piece = stream.push(t);
            reply.push_str(&piece);
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
            !signals::interrupted()
        });
        signals::default_interrupt();
        let (generated, timings) = res?;
        let rest = stream.finish();
        reply.push_str(&rest);
        writeln!(out, "{rest}")?;
        if signals::interrupted() {
            eprintln!("[stopped]");
        }
        self.turn += 1;
        if self.verbose {
            eprintln!(
                "[turn {}: {} prompt tokens processed, {} reused from the cache, {} generated; prompt {:.1} t/s, generation {:.1} t/s]",
                self.turn,
                new.len(),
                reused,
                generated.len(),
                timings.prefill_tps(),
                timings.decode_tps()
            );
        }
        self.messages.push(ChatMessage::new("assistant", reply));
        Ok(())
    }
}

pub fn chat(a: ChatArgs) -> CliResult {
    let sampler = a.sampling.sampler()?;
    let (path, model) = a.model.load()?;
    if model.chat_template.is_none() {
        return Err(format!(
            "{}: the model has no chat template (tokenizer.chat_template); use `mollm run` for plain completion",
            path.display()
        )
        .into());
    }
    let n_ctx = a.model.n_ctx(&model, a.ctx, 4096)?;
    let mut session = a.model.session(&model, n_ctx)?;
    warm_up(&mut session, &model, a.model.load.quiet)?;
    if !a.model.load.quiet {
        eprintln!(
            "mollm chat · model {} · architecture {} · quant {} · context {} · threads {} · backend {}",
            model.file_name(),
            model.hp.arch,
            model_ftype(&model),
            session.n_ctx(),
            session.n_threads(),
            session.backend_names().join(",")
        );
        eprintln!("/help lists commands; /quit or Ctrl-D leaves.");
    }
    let mut chat = Chat {
        model: &model,
        session,
        sampler,
        messages: Vec::new(),
        system: a.system.clone(),
        max_tokens: a.max_tokens,
        verbose: a.verbose,
        turn: 0,
    };
    chat.reset();

    let mut input = Input::open()?;
    let interactive = matches!(input, Input::Editor(..));
    let mut failed = 0usize;
    let mut stdout = std::io::stdout().lock();
    loop {
        let line = match input.read()? {
            Line::End => break,
            Line::Cancelled => {
                eprintln!("(/quit or Ctrl-D leaves)");
                continue;
            }
            Line::Text(l) => l,
        };
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" | "/bye" => break,
            "/help" | "/?" => eprintln!("{HELP}"),
            "/reset" | "/clear" => {
                chat.reset();
                eprintln!("[conversation cleared]");
            }
            cmd if cmd.starts_with('/') && !cmd.contains(char::is_whitespace) => {
                eprintln!("unknown command {cmd}; /help lists the commands");
            }
            text => {
                if let Err(e) = chat.turn(text.to_string(), &mut stdout) {
                    // A turn that cannot run leaves the conversation as it was.
                    if chat.messages.last().is_some_and(|m| m.role == "user") {
                        chat.messages.pop();
                    }
                    eprintln!("error: {e}");
                    failed += 1;
                }
            }
        }
    }
    input.save();
    // A script feeding turns through a pipe learns from the exit status that one failed.
    if failed > 0 && !interactive {
        return Err(format!("{failed} turn(s) failed (see above)").into());
    }
    Ok(())
}
