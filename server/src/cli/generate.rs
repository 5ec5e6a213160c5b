//! `spindle generate`: one prompt through the same scheduler, sampler, stop
//! rules and grammar compiler as the server, streamed to stdout; speeds to
//! stderr.

use crate::cli::engine::{self, EngineArgs};
use anyhow::Context;
use clap::Args;
use spindle_engine::sampling::SamplingParams;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{FinishReason, GenerationEvent, GenerationRequest, SchedulerConfig, SchedulerHandle};
use spindle_server::app::ModelInfo;
use std::io::Write;
use std::time::{Duration, Instant};

/// Arguments of `spindle generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// Where and how the model runs.
    #[command(flatten)]
    engine: EngineArgs,
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
    /// End the output before this string (repeatable); the string is not printed.
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// Constrain the output to this JSON Schema (inline JSON, or @path to a
    /// file), compiled as the server compiles `text.format` `json_schema`.
    #[arg(long)]
    json_schema: Option<String>,
}

/// What a generation did.
struct Stats {
    prompt_tokens: usize,
    generated: usize,
    prefill: Duration,
    decode: Duration,
    finish: FinishReason,
}

/// Load the model, generate, stream.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    super::init_threads(args.engine.threads)?;
    let sampling = SamplingParams { temperature: args.temperature, top_p: args.top_p, top_k: args.top_k, seed: args.seed, ..SamplingParams::default() };
    sampling.validate()?;
    let schema = args.json_schema.as_deref().map(read_schema).transpose()?;
    // The prompt first, so the KV cache holds exactly this generation.
    let files = spindle_engine::open::ModelFiles::load(&args.engine.model)?;
    let meta = &files.meta;
    let prompt = if args.raw {
        meta.tokenizer.encode(&args.prompt, true)?
    } else {
        spindle_engine::load::chat_prompt(&meta.template, &meta.tokenizer, &args.prompt)?
    };
    let blocks = (prompt.len() + args.max_tokens).min(meta.config.context_length).div_ceil(engine::BLOCK_SIZE) + 1;
    let spindle_engine::OpenedModel { executor, meta, .. } = args.engine.open_files(files, Some(blocks))?;
    let info = ModelInfo::new(meta.location.name, meta.tokenizer, meta.template, meta.config.context_length, meta.config.vocab_size, 0);
    let constraint = match schema {
        Some(schema) => schema_constraint(&info, schema, &prompt)?,
        None => None,
    };
    let stop = StopConditions { stop_token_ids: info.tokenizer.eos_ids().to_vec(), stop_strings: args.stop.clone(), max_tokens: args.max_tokens, ..StopConditions::default() };
    let request = GenerationRequest { prompt, sampling, stop, cache_salt: None, constraint };
    let config = SchedulerConfig { max_num_seqs: 1, ..SchedulerConfig::default() };
    let scheduler = SchedulerHandle::spawn(config, executor, info.tokenizer.clone());
    let mut stdout = std::io::stdout().lock();
    let stats = stream(&scheduler, request, &mut |text| stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()))?;
    writeln!(stdout)?;
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | finish: {:?}",
        stats.prompt_tokens,
        rate(stats.prompt_tokens, stats.prefill),
        stats.generated,
        rate(stats.generated.saturating_sub(1), stats.decode),
        stats.finish
    );
    Ok(())
}

/// `--json-schema`'s value: inline JSON, or `@path`.
fn read_schema(arg: &str) -> anyhow::Result<serde_json::Value> {
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading --json-schema {path}"))?,
        None => arg.to_string(),
    };
    serde_json::from_str(&text).context("--json-schema is not JSON")
}

/// The grammar the server would compile for a request whose `text.format`
/// is this JSON Schema (strict).
fn schema_constraint(info: &ModelInfo, schema: serde_json::Value, prompt: &[u32]) -> anyhow::Result<Option<spindle_engine::grammar::SharedConstraint>> {
    let body = serde_json::json!({"input": "-", "text": {"format": {"type": "json_schema", "name": "output", "schema": schema, "strict": true}}});
    let req = spindle_server::protocol::validate(body, &spindle_server::protocol::RequestLimits::default()).map_err(|e| anyhow::anyhow!("--json-schema: {}", e.message))?;
    info.constraint_for(&req, prompt).map_err(|e| anyhow::anyhow!("--json-schema: {}", e.message))
}

/// Submits `request` and passes its text to `out` as it comes.
fn stream(scheduler: &SchedulerHandle, request: GenerationRequest, out: &mut dyn FnMut(&str) -> std::io::Result<()>) -> anyhow::Result<Stats> {
    let prompt_tokens = request.prompt.len();
    let start = Instant::now();
    let mut events = scheduler.submit(request)?;
    let mut first_token = None;
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Started { .. } => {}
            GenerationEvent::Delta { text, .. } => {
                first_token.get_or_insert_with(Instant::now);
                out(&text)?;
            }
            GenerationEvent::Finished { reason, text, usage } => {
                out(&text)?;
                let first = first_token.unwrap_or_else(Instant::now);
                return Ok(Stats { prompt_tokens, generated: usage.output_tokens, prefill: first - start, decode: first.elapsed(), finish: reason });
            }
            GenerationEvent::Failed { message } => anyhow::bail!("generation failed: {message}"),
        }
    }
    anyhow::bail!("the scheduler stopped before the generation finished")
}
