//! `spindle generate`: one prompt, streamed to stdout, speeds to stderr.

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use spindle_engine::generate::{generate, GenerateRequest};
use spindle_engine::kv::BlockAllocator;
use spindle_engine::load::{load_model, LoadedModel};
use spindle_engine::model::MatmulPrecision;
use spindle_engine::models::DEFAULT_MODEL;
use spindle_engine::runner::{Executor, ModelRunner};
use crate::cli::device::{self, Device};
use spindle_engine::sampling::SamplingParams;
use spindle_engine::tokenizer::IncrementalDecoder;
use std::io::Write;

const BLOCK_SIZE: usize = 16;

/// Matmul precision on the command line.
#[derive(Clone, Copy, ValueEnum)]
pub enum Precision {
    /// 8-bit activations with integer SIMD kernels.
    Fast,
    /// f32 activations and dequantized weights (slow; for validation).
    Exact,
}

/// Arguments of `spindle generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// Model name in the cache, or a path to a GGUF file or HF directory.
    #[arg(long, env = "SPINDLE_MODEL", default_value = DEFAULT_MODEL)]
    model: String,
    /// The prompt (a user message, unless --raw).
    #[arg(long)]
    prompt: String,
    /// Maximum new tokens.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Random seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Use the prompt as-is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Matmul precision.
    #[arg(long, value_enum, default_value = "fast")]
    precision: Precision,
    /// Worker threads (default: all cores).
    #[arg(long, env = "SPINDLE_THREADS")]
    threads: Option<usize>,
    /// Where the model runs: auto (a GPU when there is one), cpu, cuda or cuda:N.
    #[arg(long, env = "SPINDLE_DEVICE", default_value = "auto")]
    device: Device,
}

/// A backend ready to generate, with what turns text into tokens and back.
struct Ready {
    runner: Box<dyn Executor>,
    blocks: usize,
    tokenizer: spindle_engine::tokenizer::Tokenizer,
    prompt: Vec<u32>,
    stop_tokens: Vec<u32>,
}

/// Load the model, generate, stream.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    super::init_threads(args.threads)?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        ..SamplingParams::default()
    };
    sampling.validate()?;
    let device = match (device::resolve(args.device)?, args.precision) {
        (Device::Cuda(_), Precision::Exact) if args.device == Device::Auto => {
            tracing::info!("--precision exact is a CPU mode; using the CPU");
            Device::Cpu
        }
        (Device::Cuda(_), Precision::Exact) => anyhow::bail!("--precision exact is a CPU mode (the GPU runs bf16)"),
        (d, _) => d,
    };
    let Ready { mut runner, blocks, tokenizer, prompt, stop_tokens } = match device {
        Device::Cuda(ordinal) => {
            // Errors of the model itself are not the GPU's: no fallback for them.
            let meta = spindle_engine::load::load_meta(&args.model)?;
            match ready_on_gpu(&args, ordinal, meta) {
                Ok(ready) => ready,
                Err(e) if args.device == Device::Auto => {
                    tracing::warn!("device auto: the GPU cannot run this model ({e}); using the CPU");
                    ready_on_cpu(&args)?
                }
                Err(e) => return Err(e),
            }
        }
        _ => ready_on_cpu(&args)?,
    };
    let mut alloc = BlockAllocator::new(blocks);
    let req = GenerateRequest { prompt, max_tokens: args.max_tokens, sampling, stop_tokens, prefill_chunk: 512 };
    let mut decoder = IncrementalDecoder::new(tokenizer, true);
    let mut stdout = std::io::stdout().lock();
    let mut failure = None;
    let stats = generate(runner.as_mut(), &mut alloc, &req, &mut |t| match decoder.push(t.token) {
        Ok(text) => stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush()).is_ok(),
        Err(e) => {
            failure = Some(e);
            false
        }
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    writeln!(stdout, "{}", decoder.finish()?)?;
    let rate = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | finish: {:?}",
        stats.prompt_tokens,
        rate(stats.prompt_tokens, stats.prefill_time),
        stats.generated_tokens,
        rate(stats.generated_tokens.saturating_sub(1), stats.decode_time),
        stats.finish
    );
    Ok(())
}

/// The prompt's ids: the chat template around a user message, or `--raw`.
fn prompt_ids(args: &GenerateArgs, template: &spindle_engine::chat_template::ChatTemplate, tokenizer: &spindle_engine::tokenizer::Tokenizer) -> anyhow::Result<Vec<u32>> {
    if args.raw {
        return Ok(tokenizer.encode(&args.prompt, true)?);
    }
    Ok(spindle_engine::load::chat_prompt(template, tokenizer, &args.prompt)?)
}

/// KV blocks for the prompt and the new tokens (within the context).
fn blocks_for(prompt: usize, max_tokens: usize, context: usize) -> usize {
    (prompt + max_tokens).min(context).div_ceil(BLOCK_SIZE) + 1
}

fn ready_on_cpu(args: &GenerateArgs) -> anyhow::Result<Ready> {
    let loaded = load_with_bar(&args.model)?;
    let prompt = prompt_ids(args, &loaded.template, &loaded.tokenizer)?;
    let LoadedModel { mut model, tokenizer, stop_tokens, .. } = loaded;
    if let Precision::Exact = args.precision {
        model.set_precision(MatmulPrecision::Exact);
    }
    let blocks = blocks_for(prompt.len(), args.max_tokens, model.config().context_length);
    Ok(Ready { runner: Box::new(ModelRunner::new(model, blocks, BLOCK_SIZE)), blocks, tokenizer, prompt, stop_tokens })
}

#[cfg(feature = "cuda")]
fn ready_on_gpu(args: &GenerateArgs, ordinal: usize, meta: spindle_engine::load::ModelMeta) -> anyhow::Result<Ready> {
    use spindle_engine::cuda::{CudaModel, CudaRunner, KvSize};
    let prompt = prompt_ids(args, &meta.template, &meta.tokenizer)?;
    let blocks = blocks_for(prompt.len(), args.max_tokens, meta.config.context_length);
    let model = CudaModel::open(&args.model, ordinal, KvSize::Blocks(blocks), BLOCK_SIZE)?;
    eprintln!("{} on cuda:{ordinal} ({}); linear layers: {}", meta.location.name, model.device_name(), model.gemm_backend());
    let stop_tokens = meta.tokenizer.eos_ids().to_vec();
    Ok(Ready { runner: Box::new(CudaRunner::new(model)), blocks, tokenizer: meta.tokenizer, prompt, stop_tokens })
}

#[cfg(not(feature = "cuda"))]
fn ready_on_gpu(_args: &GenerateArgs, _ordinal: usize, _meta: spindle_engine::load::ModelMeta) -> anyhow::Result<Ready> {
    anyhow::bail!("this spindle was built without the CUDA backend")
}

/// Load a model with a progress bar on stderr.
pub fn load_with_bar(model: &str) -> anyhow::Result<LoadedModel> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers")
            .context("progress template")?
            .progress_chars("=> "),
    );
    bar.set_message(model.to_string());
    let loaded = load_model(model, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    Ok(loaded?)
}
