//! `mollm`: run local language models.

mod devices;
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
    /// List the backends found (built in and plugins): device, score, available or why not.
    Devices(devices::LibArgs),
    /// What each backend declares: per op, the formats its supports() accepts.
    Backends(devices::LibArgs),
    /// Which backend an op call goes to, and why each other one is rejected.
    Ops(devices::OpsArgs),
    /// Conformance gate child (run by mollm itself on a backend library).
    #[command(name = "__gate", hide = true)]
    Gate(devices::GateArgs),
}

fn main() -> ExitCode {
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
        Command::Devices(a) => devices::devices(a),
        Command::Backends(a) => devices::backends(a),
        Command::Ops(a) => devices::ops(a),
        Command::Gate(a) => devices::gate(a),
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
