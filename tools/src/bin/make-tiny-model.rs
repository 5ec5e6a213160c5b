//! Write a tiny random model in Hugging Face layout.
//!
//! `make-tiny-model --arch qwen3 --out /tmp/tiny --seed 1 [--dtype bf16] [--layers N ...]`

use std::path::PathBuf;

use clap::Parser;
use spindle_tools::tiny_model::{write_tiny_model, TinyArch, TinyDtype, TinyModelOptions};

/// Command-line options; unset sizes keep the small defaults.
#[derive(Debug, Parser)]
#[command(about = "Write a tiny random Llama/Qwen2/Qwen3/Gemma 3 model (config, safetensors, tokenizer)")]
struct Args {
    /// Architecture.
    #[arg(long, value_enum)]
    arch: TinyArch,
    /// Output directory (created if needed).
    #[arg(long)]
    out: PathBuf,
    /// Seed for the weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Weight element type.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: TinyDtype,
    /// Transformer blocks [default: 2].
    #[arg(long)]
    layers: Option<usize>,
    /// Model width [default: 64].
    #[arg(long)]
    hidden: Option<usize>,
    /// Query heads [default: 4].
    #[arg(long)]
    heads: Option<usize>,
    /// Key/value heads [default: 2].
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Per-head width [default: hidden / heads].
    #[arg(long)]
    head_dim: Option<usize>,
    /// MLP width [default: 128].
    #[arg(long)]
    intermediate: Option<usize>,
    /// Vocabulary size [default: 320].
    #[arg(long)]
    vocab: Option<usize>,
    /// max_position_embeddings [default: 256].
    #[arg(long)]
    max_position: Option<usize>,
    /// Tie the output head to the embeddings (no lm_head.weight; always so for Gemma 3).
    #[arg(long)]
    tie_embeddings: bool,
    /// Split the weights into this many safetensors shards [default: 1].
    #[arg(long)]
    shards: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let mut o = TinyModelOptions::new(a.arch);
    o.seed = a.seed;
    o.dtype = a.dtype;
    o.head_dim = a.head_dim;
    o.tie_word_embeddings |= a.tie_embeddings;
    let sizes = [
        (a.layers, &mut o.layers),
        (a.hidden, &mut o.hidden),
        (a.heads, &mut o.heads),
        (a.kv_heads, &mut o.kv_heads),
        (a.intermediate, &mut o.intermediate),
        (a.vocab, &mut o.vocab),
        (a.max_position, &mut o.max_position),
        (a.shards, &mut o.shards),
    ];
    for (given, field) in sizes {
        if let Some(v) = given {
            *field = v;
        }
    }
    write_tiny_model(&o, &a.out)?;
    println!(
        "wrote {:?} tiny model (seed {}) to {}",
        o.arch,
        o.seed,
        a.out.display()
    );
    Ok(())
}
