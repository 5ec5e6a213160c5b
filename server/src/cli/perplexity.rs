//! `spindle perplexity`: the model's perplexity over a text file, scored as
//! llama.cpp's `llama-perplexity` scores it (same chunking, same scored
//! tokens), so the fast and exact CPU paths and llama.cpp can be compared on
//! the same text. A quality guard for kernel work: faster must not mean worse.

use crate::cli::engine::{self, EngineArgs};
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `spindle perplexity`.
#[derive(Args)]
pub struct PerplexityArgs {
    /// Where and how the model runs.
    #[command(flatten)]
    engine: EngineArgs,
    /// The text to score (UTF-8).
    #[arg(long)]
    file: PathBuf,
    /// Tokens per chunk (llama.cpp's `-c`).
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score at most this many chunks (llama.cpp's `--chunks`).
    #[arg(long)]
    chunks: Option<usize>,
}

/// Load the model, score the file, print the result.
pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    super::init_threads(args.engine.threads)?;
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let files = spindle_engine::open::ModelFiles::load(&args.engine.model)?;
    let tokenizer = &files.meta.tokenizer;
    // As llama.cpp does: each chunk starts with BOS when the model adds one.
    let bos = tokenizer.bos_id().filter(|&b| tokenizer.encode("a", true).is_ok_and(|ids| ids.first() == Some(&b)));
    let tokens = tokenizer.encode(&text, false)?;
    let blocks = args.ctx.div_ceil(engine::BLOCK_SIZE) + 1;
    let mut opened = args.engine.open_files(files, Some(blocks))?;
    let started = Instant::now();
    let p = spindle_engine::perplexity::perplexity(opened.executor.as_mut(), &tokens, args.ctx, bos, args.chunks)?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "perplexity: {:.4} ± {:.4} ({} tokens scored in {} chunks of {}; {} tokens in the file; {:.1} tok/s)",
        p.value,
        p.std_error,
        p.scored,
        p.chunks,
        args.ctx,
        tokens.len(),
        (p.chunks * args.ctx) as f64 / secs.max(1e-9)
    );
    Ok(())
}
