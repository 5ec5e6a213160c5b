//! The `spindle` command line: `generate` and `models` (the daemon's `serve`
//! arrives with the server issue).

mod cli;

use clap::{Parser, Subcommand};

/// Spindle: an LLM inference daemon.
#[derive(Parser)]
#[command(name = "spindle", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Generate(cli::generate::GenerateArgs),
    /// List the models in the model cache.
    Models,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => cli::generate::run(args),
        Command::Models => cli::models::run(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
