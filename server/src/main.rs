//! The `spindle` command line: `serve`, `generate`, `models`.

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
    /// Serve the model over Open Responses (HTTP JSON and SSE).
    Serve(cli::serve::ServeArgs),
    /// Generate text from a prompt, streamed to stdout.
    Generate(cli::generate::GenerateArgs),
    /// List the models in the model cache.
    Models,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => cli::serve::run(args),
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
