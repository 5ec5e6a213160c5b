//! The `spindle` command line: `serve`, `generate`, `perplexity`, `models`.

mod cli;

use clap::{Parser, Subcommand};

/// Spindle: an LLM inference daemon.
#[derive(Parser)]
#[command(name = "spindle", version, about, args_override_self = true)]
struct Cli {
    /// Log lines as human-readable text or as one JSON object per line
    /// (fields: timestamp, level, target, message, request_id, route, status, ms, ...).
    #[arg(long, global = true, value_enum, default_value = "text", env = "SPINDLE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve the model over Open Responses (HTTP JSON and SSE).
    Serve(Box<cli::serve::ServeArgs>),
    /// Generate text from a prompt, streamed to stdout.
    Generate(cli::generate::GenerateArgs),
    /// The model's perplexity over a text file (llama-perplexity's scoring).
    Perplexity(cli::perplexity::PerplexityArgs),
    /// List the models in the model cache.
    Models,
}

/// Has glibc's allocator keep freed blocks of up to 32 MiB in the heap
/// (instead of mapping each one fresh and unmapping it when freed) and up
/// to 128 MiB of freed heap per arena: the per-matmul activation buffers
/// of a prefill step (MBs each) are then reused pages, not page faults.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator tunables; called before
        // the threads that allocate are started.
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20) == 1 };
        if !set {
            tracing::debug!("glibc refused the allocator tunables; freed buffers may be unmapped and faulted in again");
        }
    }
}

fn main() -> std::process::ExitCode {
    let args = match cli::config::expand(std::env::args().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let cli = Cli::parse_from(args);
    init_logging(cli.log_format);
    keep_freed_memory();
    let result = match cli.command {
        Command::Serve(args) => cli::serve::run(*args),
        Command::Generate(args) => cli::generate::run(args),
        Command::Perplexity(args) => cli::perplexity::run(args),
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
