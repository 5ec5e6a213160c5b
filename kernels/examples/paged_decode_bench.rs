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

use half::bf16;
use spindle_kernels::device::{driver_present, DecodeKernel, DecodeShape, Gpu};
use std::time::Instant;

/// Bytes of cache the calls rotate over (well past a 60 MB L2).
const ROTATE_BYTES: usize = 256 << 20;
const ROUNDS: usize = 5;
const CALLS: usize = 20;

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

/// Values of ±0.5 in a fixed hash pattern (not zeros).
fn pattern(n: usize, salt: usize) -> Vec<bf16> {
    (0..n).map(|i| bf16::from_f32((((i ^ salt).wrapping_mul(2_654_435_761) >> 12) & 0xff) as f32 / 256.0 - 0.5)).collect()
}

fn run(g: &Gpu, context: usize, seqs: usize) -> Result<(), Box<dyn std::error::Error>> {
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
        .collect::<Result<Vec<_>, _>>()?;
    let lens = g.stream.clone_htod(&vec![context as i32; seqs])?;
    let mut out = g.stream.alloc_zeros::<bf16>(seqs * heads * head_dim)?;
    let shape = DecodeShape { seqs, heads, kv_heads, head_dim, block_size, max_blocks, max_context: context };
    let scratch = g.decode_scratch(&shape)?;
    for kernel in [DecodeKernel::PerHead, DecodeKernel::Grouped] {
        let mut rounds = Vec::new();
        for round in 0..=ROUNDS {
            g.stream.synchronize()?;
            let start = Instant::now();
            for i in 0..CALLS {
                let table = &tables[(round * CALLS + i) % regions];
                g.paged_decode_in(kernel, &mut out, &q, &cache, &values, table, &lens, shape, 0.088, None, scratch.as_ref())?;
            }
            g.stream.synchronize()?;
            if round > 0 {
                rounds.push(start.elapsed().as_secs_f64() / CALLS as f64);
            }
        }
        rounds.sort_by(f64::total_cmp);
        let (median, spread) = (rounds[rounds.len() / 2], rounds[rounds.len() - 1] - rounds[0]);
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
