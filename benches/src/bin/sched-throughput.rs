//! Aggregate output tok/s of the scheduler with the real model at several
//! concurrency levels (closed loop: each of C clients submits its next request
//! when the previous one finishes). In-process, no HTTP.
//!
//! `cargo run --release -p spindle-benches --bin sched-throughput -- [levels] [requests-per-level] [output-len] [--device auto|cpu|cuda[:N]]`
//!
//! `--device` (default `auto`: the first GPU when built with `--features
//! cuda` and one is present, else the CPU) picks the backend through
//! `spindle_engine::open`; the first line printed says which.
//!
//! `SPINDLE_BENCH_GRAMMAR=tools-auto` (five tools, `tool_choice: auto`: free
//! text under the tool grammar) or `=json` (an unbounded JSON array of
//! strings) decodes every request under that grammar, to measure constrained
//! decoding's cost on the same load.

use spindle_engine::load::chat_prompt;
use spindle_engine::sampling::SamplingParams;
use spindle_engine::{Device, EngineOptions};
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{GenerationEvent, GenerationRequest, SchedulerConfig, SchedulerHandle};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().collect();
    let device: Device = match args.iter().position(|a| a == "--device") {
        Some(i) if i + 1 < args.len() => {
            let d = args.remove(i + 1);
            args.remove(i);
            d.parse().map_err(anyhow::Error::msg)?
        }
        Some(_) => anyhow::bail!("--device needs a value: auto, cpu, cuda or cuda:N"),
        None => Device::Auto,
    };
    let levels: Vec<usize> =
        args.get(1).map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or(vec![1, 4, 16, 64]);
    let per_level: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let output_len: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let model = spindle_benches::smollm2_path().ok_or_else(|| anyhow::anyhow!("SmolLM2 not installed"))?;
    // The CPU's pool is 2048 blocks; a GPU's is what 90% of its memory leaves.
    let device = spindle_engine::open::resolve_device(device)?;
    let options = EngineOptions { kv_blocks: (device == Device::Cpu).then_some(2048), ..EngineOptions::default() };
    let opened = spindle_engine::open(&model.to_string_lossy(), device, &options, &mut |_, _| {})?;
    let m = &opened.meta;
    println!("device: {}", opened.executor.info().device);
    let prompts: Vec<Vec<u32>> = (0..per_level * levels.len())
        .map(|i| chat_prompt(&m.template, &m.tokenizer, &format!("Request {i}: write a short story about a lighthouse keeper.")))
        .collect::<Result<_, _>>()?;
    if let Some(path) = std::env::var_os("SPINDLE_DUMP_PROMPTS") {
        // The same prompts, as token ids, for driving another server side by side.
        std::fs::write(path, serde_json::to_string(&prompts)?)?;
    }
    let model_config = m.config.clone();
    let on_gpu = opened.device != Device::Cpu;
    let config = SchedulerConfig {
        // A GPU batches wider and prefills in larger chunks than the CPU.
        max_num_seqs: if on_gpu { 256 } else { 64 },
        max_num_batched_tokens: if on_gpu { 4096 } else { 512 },
        ..SchedulerConfig::default()
    };
    let grammar = grammar_fields()?;
    let compiler = match &grammar {
        Some(_) => Some(spindle_engine::grammar::GrammarCompiler::new(&m.tokenizer, model_config.vocab_size)?),
        None => None,
    };
    let make_constraint = || match (&compiler, &grammar) {
        (Some(c), Some(fields)) => spindle_benches::request_constraint(c, fields),
        _ => None,
    };
    let handle = SchedulerHandle::spawn(config, opened.executor, m.tokenizer.clone());
    println!("| concurrency | requests | output tok/s | mean tok/s per stream | wall s |");
    println!("| --- | --- | --- | --- | --- |");
    for (li, &c) in levels.iter().enumerate() {
        let work: Vec<Vec<u32>> = prompts[li * per_level..(li + 1) * per_level].to_vec();
        let queue = std::sync::Mutex::new(work);
        let start = Instant::now();
        let totals: Vec<(usize, f64)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..c)
                .map(|_| {
                    s.spawn(|| {
                        let mut tokens = 0;
                        let mut rates = 0.0;
                        while let Some(p) = queue.lock().ok().and_then(|mut q| q.pop()) {
                            let (n, rate) = run_one(&handle, p, output_len, make_constraint());
                            tokens += n;
                            rates += rate;
                        }
                        (tokens, rates)
                    })
                })
                .collect();
            workers.into_iter().filter_map(|w| w.join().ok()).collect()
        });
        let wall = start.elapsed().as_secs_f64();
        let tokens: usize = totals.iter().map(|t| t.0).sum();
        let per_stream = totals.iter().map(|t| t.1).sum::<f64>() / per_level as f64;
        println!("| {c} | {per_level} | {:.1} | {per_stream:.1} | {wall:.1} |", tokens as f64 / wall);
    }
    Ok(())
}

/// The request fields of `SPINDLE_BENCH_GRAMMAR` (see the module docs).
fn grammar_fields() -> anyhow::Result<Option<serde_json::Value>> {
    match std::env::var("SPINDLE_BENCH_GRAMMAR").ok().as_deref() {
        None | Some("") | Some("none") => Ok(None),
        Some("tools-auto") => Ok(Some(serde_json::json!({"tools": spindle_benches::five_tools(), "tool_choice": "auto"}))),
        Some("json") => Ok(Some(serde_json::json!({"text": {"format": {"type": "json_schema", "name": "list",
            "schema": {"type": "array", "items": {"type": "string"}}, "strict": true}}}))),
        Some(other) => anyhow::bail!("SPINDLE_BENCH_GRAMMAR={other}: expected none, tools-auto or json"),
    }
}

/// Run one request to the end: (output tokens, its own decode tok/s).
fn run_one(
    handle: &SchedulerHandle,
    prompt: Vec<u32>,
    output_len: usize,
    constraint: Option<spindle_engine::grammar::SharedConstraint>,
) -> (usize, f64) {
    let request = GenerationRequest {
        prompt,
        sampling: SamplingParams::default(),
        stop: StopConditions { max_tokens: output_len, ..StopConditions::default() },
        cache_salt: None,
        constraint,
    };
    let Ok(mut stream) = handle.submit(request) else { return (0, 0.0) };
    let mut first = None;
    let mut n: usize = 0;
    while let Some(ev) = stream.blocking_recv() {
        match ev {
            GenerationEvent::Delta { .. } => {
                n += 1;
                first.get_or_insert_with(Instant::now);
            }
            GenerationEvent::Finished { .. } | GenerationEvent::Failed { .. } => break,
            GenerationEvent::Started { .. } => {}
        }
    }
    let rate = first.map_or(0.0, |f| (n.saturating_sub(1)) as f64 / f.elapsed().as_secs_f64().max(1e-9));
    (n, rate)
}
