//! `mollm`: run local language models.

mod run;

use clap::{Parser, Subcommand};
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
    /// List the model architectures this build can run.
    Architectures,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Architectures => {
            for (name, desc, _) in engine::model::ARCHITECTURES {
                println!("{name:<10} {desc}");
            }
            Ok(())
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
