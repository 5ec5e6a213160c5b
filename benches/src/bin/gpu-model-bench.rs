//! Whole-model throughput of the CUDA backend with Llama-3.1-8B's shapes and
//! random bf16 weights (made on the host, nothing read from disk):
//! `gpu-model-bench [--layers N] [--profile-batch B]` (feature `cuda`; `tools/gpu-check.sh run`
//! runs the prebuilt binary). Prints one line per measurement:
//!
//! - decode: one step for B sequences at position 512 each (and at 4096) (their cache
//!   blocks hold zeros: with random weights the cost does not depend on the
//!   cache's contents), for B in 1, 8, 32, 64, 128, 256; tokens/s = B / step
//!   time, median of 10 steps. Every sequence is greedy-sampled, three ways:
//!   from CUDA graphs and on the GPU (the default), without graphs, and
//!   with the logits copied to the host instead (the host sampler's own time
//!   not counted). Batch 1 also
//!   as a fraction of the memory-bandwidth roofline: the weights a step
//!   streams (every layer and the head, not the embedding lookup) at
//!   4.8 TB/s, the H200's HBM3e;
//! - prefill: one sequence of 512 and of 4096 tokens in one step
//!   (tokens/s, and the fraction of 989 dense bf16 TFLOP/s that the linear
//!   layers' 2 × parameters FLOPs per token, plus one head row, reach).
//!
//! Without a GPU it says so and exits 0.

use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput, SeqSampling};
use spindle_engine::config::{ArchFamily, Llama3RopeScaling, ModelConfig, RopeStyle};
use spindle_engine::backend::cuda::{device_count, CudaBackend, CudaSwitches};
use spindle_engine::backend::KvSize;
use spindle_engine::model::{Decoder, LlamaWeights};
use spindle_engine::sampling::SamplingParams;

type CudaModel = Decoder<CudaBackend>;
use std::time::Instant;

const BLOCK_SIZE: usize = 16;
const HBM_BYTES_PER_S: f64 = 4.8e12;
const BF16_FLOPS: f64 = 989e12;

fn llama_8b(layers: usize) -> ModelConfig {
    ModelConfig {
        family: ArchFamily::Llama,
        vocab_size: 128_256,
        hidden_size: 4096,
        intermediate_size: 14_336,
        num_layers: layers,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: Some(Llama3RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 }),
        rope_style: RopeStyle::Neox,
        context_length: 131_072,
        tie_word_embeddings: false,
        sliding_window: None,
        query_pre_attn_scalar: None,
    }
}

fn main() -> anyhow::Result<()> {
    if device_count() == 0 {
        println!("gpu-model-bench: skipped, no CUDA device on this machine");
        return Ok(());
    }
    let args: Vec<String> = std::env::args().collect();
    let layers = flag(&args, "--layers").unwrap_or(32);
    let config = llama_8b(layers);
    let started = Instant::now();
    let backend = CudaBackend::open(0, &config, CudaSwitches::default())?;
    let weights = LlamaWeights::random(&backend, config.clone(), 7)?;
    let mut model = Decoder::with_backend(weights, backend, KvSize::MemoryFraction(0.9), BLOCK_SIZE)?;
    println!(
        "device {}; Llama-3.1-8B shapes, {layers} layers, {:.2} GB bf16 weights, {} KV blocks; loaded in {:.0} s\nlinear layers: {}",
        model.backend().device_name(),
        model.weight_bytes() as f64 / 1e9,
        model.kv_geometry().num_blocks,
        started.elapsed().as_secs_f64(),
        model.backend().gemm_backend()
    );
    if let Some(batch) = flag(&args, "--profile-batch") {
        return profile_steps(&mut model, batch);
    }
    decode(&mut model)?;
    for tokens in [512, 4096] {
        prefill(&mut model, tokens)?;
    }
    Ok(())
}

/// The number after `name` on the command line, if any.
fn flag(args: &[String], name: &str) -> Option<usize> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// `--profile-batch B`: three decode steps of B sequences at position 512,
/// without CUDA graphs (so a profiler such as `ncu` sees each kernel), then
/// exit.
fn profile_steps(model: &mut CudaModel, batch: usize) -> anyhow::Result<()> {
    model.backend_mut().set_cuda_graphs(false);
    model.set_device_sampling(true);
    let tables = tables(batch, 512 + 16);
    for step in 0..3 {
        let seqs = tables
            .iter()
            .map(|t| SeqInput { id: 0, tokens: vec![2], start_pos: 512 + step, block_table: t.clone().into(), logits: LogitsRequest::None, sampling: greedy() })
            .collect();
        let start = Instant::now();
        model.forward_step(&ForwardBatch { seqs })?;
        println!("profile step {step}, batch {batch}: {:.2} ms", start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(())
}

/// Block tables for `seqs` sequences of `len` positions each, from block 0 on.
fn tables(seqs: usize, len: usize) -> Vec<Vec<u32>> {
    let per = len.div_ceil(BLOCK_SIZE);
    (0..seqs).map(|s| ((s * per) as u32..((s + 1) * per) as u32).collect()).collect()
}

/// Decode steps at each batch size: every sequence greedy-sampled, on the
/// GPU (8 bytes back per sequence) and then with its logits copied to the
/// host instead (the host sampler's input; its own time not counted).
fn decode(model: &mut CudaModel) -> anyhow::Result<()> {
    for (graphs, on_device) in [(true, true), (false, true), (true, false)] {
        model.backend_mut().set_cuda_graphs(graphs);
        model.set_device_sampling(on_device);
        let sampling = if on_device { "sampled on the GPU" } else { "logits copied to the host" };
        println!("decode, {}, {sampling}:", if graphs { "CUDA graphs" } else { "no graphs" });
        decode_batches(model)?;
    }
    model.backend_mut().set_cuda_graphs(true);
    model.set_device_sampling(true);
    // Small batches with Spindle's skinny kernel instead of cuBLAS for the
    // linear layers of up to 1 and up to 8 rows.
    let default_rows = model.backend().gemv_rows();
    for rows in [1, 8] {
        model.backend_mut().set_gemv_rows(rows);
        println!("decode, CUDA graphs, sampled on the GPU, Spindle's skinny GEMM up to {rows} rows:");
        decode_batches_of(model, &[1, 2, 4, 8])?;
    }
    model.backend_mut().set_gemv_rows(default_rows);
    println!("decode at position 4096, CUDA graphs, sampled on the GPU:");
    decode_batches_at(model, &[1, 8, 32, 64], 4096)?;
    Ok(())
}

fn decode_batches(model: &mut CudaModel) -> anyhow::Result<()> {
    decode_batches_of(model, &[1, 8, 32, 64, 128, 256])
}

fn decode_batches_of(model: &mut CudaModel, batches: &[usize]) -> anyhow::Result<()> {
    decode_batches_at(model, batches, 512)
}

/// Decode steps of each batch size at position `context` (then the next 11).
fn decode_batches_at(model: &mut CudaModel, batches: &[usize], context: usize) -> anyhow::Result<()> {
    let weight_bytes = model.streamed_weight_bytes() as f64;
    for &batch in batches {
        if batch * (context + 16).div_ceil(BLOCK_SIZE) > model.kv_geometry().num_blocks {
            println!("decode batch {batch}: skipped, the KV cache is too small");
            continue;
        }
        let tables = tables(batch, context + 16);
        let mut times = Vec::new();
        for step in 0..12 {
            let seqs = tables
                .iter()
                .map(|t| SeqInput { id: 0, tokens: vec![2], start_pos: context + step, block_table: t.clone().into(), logits: LogitsRequest::None, sampling: greedy() })
                .collect();
            let start = Instant::now();
            model.forward_step(&ForwardBatch { seqs })?;
            if step >= 2 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let (median, lo, hi) = (times[times.len() / 2], times[0], times[times.len() - 1]);
        let tok_s = batch as f64 / median;
        let roofline = if batch == 1 { format!(", {:.0}% of the {:.0} tok/s bandwidth roofline", 100.0 * tok_s / (HBM_BYTES_PER_S / weight_bytes), HBM_BYTES_PER_S / weight_bytes) } else { String::new() };
        println!("decode batch {batch:>3}: {tok_s:>8.1} tok/s (step {:.2} ms, min {:.2}, max {:.2}){roofline}", median * 1e3, lo * 1e3, hi * 1e3);
    }
    Ok(())
}

fn greedy() -> Option<SeqSampling> {
    Some(SeqSampling { params: SamplingParams::default(), ..SeqSampling::default() })
}

fn prefill(model: &mut CudaModel, tokens: usize) -> anyhow::Result<()> {
    let table = tables(1, tokens).remove(0);
    let vocab_row = (model.config().vocab_size * model.config().hidden_size) as f64;
    let flops_per_token = model.layer_weight_bytes() as f64 + 2.0 * vocab_row / tokens as f64;
    let mut times = Vec::new();
    for _ in 0..3 {
        let seqs = vec![SeqInput { id: 0, tokens: vec![3; tokens], start_pos: 0, block_table: table.clone().into(), logits: LogitsRequest::Last, sampling: None }];
        let start = Instant::now();
        model.forward(&ForwardBatch { seqs })?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let t = times[1];
    let tok_s = tokens as f64 / t;
    println!(
        "prefill {tokens:>5} tokens: {tok_s:>9.0} tok/s ({:.1} ms; {:.1}% of {:.0} TFLOP/s for the linear layers)",
        t * 1e3,
        100.0 * tok_s * flops_per_token / BF16_FLOPS,
        BF16_FLOPS / 1e12
    );
    Ok(())
}
