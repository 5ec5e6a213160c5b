//! Achieved memory bandwidth of the paged decode attention kernels on the GPU:
//! `cargo run --release -p spindle-kernels --features cuda --example paged_decode_bench`
//! (or the prebuilt binary, as `tools/gpu-check.sh` runs it).
//!
//! For each context length, a batch of sequences with Llama-3.1-8B's
//! attention geometry (32 query heads, 8 KV heads, head_dim 128, blocks of
//! 16) attends over scattered cache blocks, on each kernel (per query head;
//! grouped per KV head; parts is the grouped kernel's number of context
//! splits). Each line: the median over 5 rounds of 20
//! back-to-back calls (per call) after a warm-up round, and the bytes of K
//! and V read per second (each row counted once, though the per-head kernel
//! reads it once per query head). The calls rotate over disjoint regions of
//! the cache that together exceed the L2, as layers do. Without a GPU it
//! says so and exits 0.

mod common;

use common::{pattern, time_calls, Result, ROTATE_BYTES};
use half::bf16;
use spindle_kernels::device::{driver_present, DecodeKernel, DecodeShape, Gpu};

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
    println!("{:>8} {:>5} {:>10} {:>10} {:>10} {:>10} {:>8}", "context", "seqs", "kernel", "median_us", "spread_us", "GB/s", "parts");
    for (context, seqs) in [(512, 1), (512, 8), (512, 64), (512, 256), (4096, 1), (4096, 8), (4096, 32), (32768, 1), (32768, 8)] {
        if let Err(e) = run(&g, context, seqs) {
            println!("{context:>8} {seqs:>5} failed: {e}");
        }
    }
}

fn run(g: &Gpu, context: usize, seqs: usize) -> Result<()> {
    let (heads, kv_heads, head_dim, block_size) = (32, 8, 128, 16);
    let max_blocks = context / block_size;
    let per_call = seqs * max_blocks;
    let kv_dim = kv_heads * head_dim;
    let call_bytes = 2 * per_call * block_size * kv_dim * 2;
    let regions = ROTATE_BYTES.div_ceil(call_bytes).max(1);
    let pool = regions * per_call;
    let cache = g.stream.clone_htod(&pattern(pool * block_size * kv_dim, 1))?;
    let values = g.stream.clone_htod(&pattern(pool * block_size * kv_dim, 2))?;
    let q = g.stream.clone_htod(&pattern(seqs * heads * head_dim, 3))?;
    // Region r's tables: a fixed permutation of its own blocks.
    let tables = (0..regions)
        .map(|r| {
            let t: Vec<i32> = (0..per_call).map(|i| (r * per_call + (i * 7919) % per_call) as i32).collect();
            g.stream.clone_htod(&t)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let lens = g.stream.clone_htod(&vec![context as i32; seqs])?;
    let mut out = g.stream.alloc_zeros::<bf16>(seqs * heads * head_dim)?;
    let shape = DecodeShape { seqs, heads, kv_heads, head_dim, block_size, max_blocks, max_context: context };
    let scratch = g.decode_scratch(&shape)?;
    for kernel in [DecodeKernel::PerHead, DecodeKernel::Grouped] {
        let (median, spread) = time_calls(g, |i| {
            let table = &tables[i % regions];
            Ok(g.paged_decode_in(kernel, &mut out, &q, &cache, &values, table, &lens, shape, 0.088, None, scratch.as_ref())?)
        })?;
        let name = format!("{kernel:?}");
        println!(
            "{context:>8} {seqs:>5} {name:>10} {:>10.1} {:>10.1} {:>10.1} {:>8}",
            median * 1e6,
            spread * 1e6,
            call_bytes as f64 / median / 1e9,
            shape.max_context.div_ceil(shape.grouped_partition())
        );
    }
    Ok(())
}
