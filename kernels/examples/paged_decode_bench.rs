//! Achieved memory bandwidth of the paged decode attention kernel on the GPU:
//! `cargo run --release -p spindle-kernels --features cuda --example paged_decode_bench`
//! (or the prebuilt binary, as `tools/gpu-check.sh` runs it).
//!
//! For each context length, a batch of sequences with Llama-3.1-8B's
//! attention geometry (32 query heads, 8 KV heads, head_dim 128, blocks of
//! 16) attends over scattered cache blocks; the time per call (median of 50
//! after 5 warm-ups, synchronized) gives bytes of K and V read per second.
//! Prints one line per configuration; without a GPU it says so and exits 0.

use half::bf16;
use spindle_kernels::device::{driver_present, DecodeShape, Gpu};
use std::time::Instant;

fn main() {
    if !driver_present() {
        println!("paged_decode_bench: skipped, no CUDA driver on this machine");
        return;
    }
    let g = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            println!("paged_decode_bench: skipped, {e}");
            return;
        }
    };
    println!("device: {}", g.name().unwrap_or_default());
    println!("{:>8} {:>5} {:>10} {:>10} {:>8}", "context", "seqs", "median_us", "GB/s", "parts");
    for (context, seqs) in [(4096, 1), (4096, 32), (32768, 1), (32768, 8)] {
        if let Err(e) = run(&g, context, seqs) {
            println!("{context:>8} {seqs:>5} failed: {e}");
        }
    }
}

fn run(g: &Gpu, context: usize, seqs: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (heads, kv_heads, head_dim, block_size) = (32, 8, 128, 16);
    let max_blocks = context / block_size;
    let num_blocks = seqs * max_blocks;
    let kv_dim = kv_heads * head_dim;
    let cache = g.stream.alloc_zeros::<bf16>(num_blocks * block_size * kv_dim)?;
    let values = g.stream.alloc_zeros::<bf16>(num_blocks * block_size * kv_dim)?;
    let q = g.stream.clone_htod(&vec![bf16::from_f32(0.01); seqs * heads * head_dim])?;
    let tables: Vec<i32> = (0..num_blocks).map(|i| ((i * 7919) % num_blocks) as i32).collect();
    let tables = g.stream.clone_htod(&tables)?;
    let lens = g.stream.clone_htod(&vec![context as i32; seqs])?;
    let mut out = g.stream.alloc_zeros::<bf16>(seqs * heads * head_dim)?;
    let shape = DecodeShape { seqs, heads, kv_heads, head_dim, block_size, max_blocks, max_context: context };
    let mut times = Vec::new();
    for i in 0..55 {
        g.stream.synchronize()?;
        let start = Instant::now();
        g.paged_decode(&mut out, &q, &cache, &values, &tables, &lens, shape, 0.088, None)?;
        g.stream.synchronize()?;
        if i >= 5 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let bytes = 2.0 * (seqs * context * kv_dim * 2) as f64;
    println!("{context:>8} {seqs:>5} {:>10.1} {:>10.1} {:>8}", median * 1e6, bytes / median / 1e9, shape.partitions());
    Ok(())
}
