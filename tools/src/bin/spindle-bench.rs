//! `spindle-bench`: benchmark any Open Responses or chat-completions server
//! under load. See `docs/spindle-bench.md` and `spindle-bench --help`.

use anyhow::{Context, Result};
use clap::Parser;
use std::process::ExitCode;
use spindle_tools::bench::args::Args;
use spindle_tools::bench::client::{discover_model, Client};
use spindle_tools::bench::diagnose::all_failed;
use spindle_tools::bench::report::{html, table, RunResult, SCHEMA_VERSION};
use spindle_tools::bench::run::{levels, run_level, LoadLevel};
use spindle_tools::bench::vllm;

/// Runs, and on failure prints the error chain (no backtrace) and exits 1.
fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(anyhow::Error::from).and_then(|rt| rt.block_on(run(args)));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spindle-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(mut args: Args) -> Result<()> {
    if args.replot {
        return write_report(&args, Vec::new());
    }
    if args.model.is_empty() {
        args.model = discover_model(&args).await?;
        eprintln!("spindle-bench: no --model given; using `{}`, the first model listed at {}/models", args.model, args.base_url.trim_end_matches('/'));
    }
    let client = Client::from_args(&args)?;
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut result = RunResult { schema_version: SCHEMA_VERSION, label: args.label(), started_at, args: args.clone(), levels: Vec::new() };
    for (index, level) in levels(&args)?.into_iter().enumerate() {
        let progress = progress_bar(&args, level);
        let level_result = run_level(&args, &client, level, index, &progress).await?;
        progress.finish_and_clear();
        result.levels.push(level_result);
    }
    println!("{}", table(&result));
    write_results(&args, &result)?;
    let failure = all_failed(&result);
    write_report(&args, vec![result])?;
    match failure {
        Some(message) => anyhow::bail!(message),
        None => Ok(()),
    }
}

fn progress_bar(args: &Args, level: LoadLevel) -> indicatif::ProgressBar {
    let progress = if args.quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(args.requests as u64) };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{msg:>18} [{bar:40}] {pos}/{len} {elapsed}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress.set_message(match level.rate {
        Some(r) => format!("rate {r}/s"),
        None => format!("concurrency {}", level.concurrency),
    });
    progress
}

/// Writes `--json` and `--save-result` (if asked).
fn write_results(args: &Args, result: &RunResult) -> Result<()> {
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string(result)?).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.save_result {
        for written in vllm::save(result, path)? {
            eprintln!("spindle-bench: wrote {}", written.display());
        }
    }
    Ok(())
}

/// Writes `--report` (if asked) for `runs` plus every `--compare` file.
fn write_report(args: &Args, mut runs: Vec<RunResult>) -> Result<()> {
    if let Some(path) = &args.report {
        for other in &args.compare {
            let text = std::fs::read_to_string(other).with_context(|| format!("reading {}", other.display()))?;
            runs.push(serde_json::from_str(&text).with_context(|| format!("{}: not a spindle-bench JSON", other.display()))?);
        }
        std::fs::write(path, html(&runs).map_err(anyhow::Error::msg)?).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
