//! `mollm`: run local language models.

mod batch;
mod bench;
mod chat;
mod common;
mod convert;
mod devices;
mod docs;
mod embed;
mod env;
mod ops;
mod ppl;
mod probe;
mod progress;
mod run;
mod serve;
mod signals;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mollm",
    version,
    about = "Run large language models locally, on the CPU you have."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (plain completion, or one chat turn with --chat).
    Run(run::RunArgs),
    /// Talk with a model through its chat template (interactive; piped lines are turns).
    Chat(chat::ChatArgs),
    /// Generate for every request of a JSONL file, batched on one loaded model.
    Batch(batch::BatchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (continuous batching).
    Serve(serve::ServeArgs),
    /// Sentence embeddings of texts (pooled final hidden states, normalized).
    Embed(embed::EmbedArgs),
    /// Measure prompt processing and generation speed (llama-bench style rows).
    Bench(bench::BenchArgs),
    /// Perplexity of a model over a text file, computed as llama-perplexity does.
    Ppl(ppl::PplArgs),
    /// Convert a Hugging Face directory or a GGUF file into one .mollm package.
    Convert(convert::ConvertArgs),
    /// Print the graph a model runs (JSON: what a .mollm package carries).
    Graph {
        /// A GGUF file, a .mollm package or a Hugging Face directory.
        #[arg(long, short = 'm')]
        model: Option<std::path::PathBuf>,
    },
    /// List the model architectures this build can run.
    Architectures,
    /// List the backends found (built in and plugins): device, score, available or why not.
    Devices(devices::DevicesArgs),
    /// What each backend declares: per op, the formats its supports() accepts.
    Backends(devices::LibArgs),
    /// Which backend an op call goes to, and why each other one is rejected.
    Ops(ops::OpsArgs),
    /// List the MOLLM_* environment variables, their values and what they do.
    Env(env::EnvArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// A generated page of the docs (scripts/gen-docs.sh writes them all).
    #[command(name = "__docs", hide = true)]
    Docs {
        #[arg(value_enum)]
        page: docs::Page,
    },
}

fn main() -> ExitCode {
    // Started by the registry as the conformance gate's child: answer and exit.
    engine::registry::serve_gate_child();
    // `mollm devices | head` must end quietly when the reader goes away, as other command-line
    // tools do, instead of panicking inside println!: restore the default SIGPIPE action that
    // Rust's runtime replaces.
    #[cfg(unix)]
    // SAFETY: called first thing, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::chat(args),
        Command::Batch(args) => batch::batch(args),
        Command::Serve(args) => serve::serve(args),
        Command::Bench(args) => bench::bench(args),
        Command::Embed(args) => embed::embed(args),
        Command::Ppl(args) => ppl::ppl(args),
        Command::Convert(args) => convert::convert(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "mollm", &mut std::io::stdout());
            Ok(())
        }
        Command::Graph { model } => (|| -> common::CliResult {
            let path = common::resolve_model(&model)?;
            let m = engine::Model::load(&path).map_err(|e| e.to_string())?;
            println!("{}", m.program.file.to_json());
            Ok(())
        })(),
        Command::Devices(a) => devices::devices(a),
        Command::Backends(a) => devices::backends(a),
        Command::Ops(a) => ops::ops(a),
        Command::Env(a) => env::env(a),
        Command::Docs { page } => {
            print!("{}", docs::page(page, &Cli::command()));
            Ok(())
        }
        Command::Architectures => {
            for (name, desc, _) in engine::model::ARCHITECTURES {
                println!("{name:<10} {desc}");
            }
            Ok(())
        }
    };
    common::write_trace();
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<common::Interrupted>() => {
            eprintln!("{e}");
            ExitCode::from(signals::EXIT_INTERRUPTED)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
