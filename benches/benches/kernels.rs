//! Single-threaded quantized kernels: the grouped GEMM (16 tokens per call)
//! over one layer's worth of Q4_1 rows, and activation quantization.
//!
//! `cargo bench -p spindle-benches --bench kernels`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use spindle_engine::gguf::types::GgmlType;
use spindle_engine::quant::dot::{quantize_row_q8, Q8Block, QK};
use spindle_engine::quant::gemm::{gemm_kernel, gemm_kernels, interleave, GROUP};
use std::hint::black_box;

const Q4_1_BLOCK_BYTES: usize = 20;

fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}

/// Q4_1 rows with small, finite f16 scales (0x2000 ≈ 0.0078).
fn q4_1_rows(rows: usize, cols: usize) -> Vec<u8> {
    let mut bytes = pseudo_random(rows * cols / QK * Q4_1_BLOCK_BYTES, 7);
    for block in bytes.chunks_exact_mut(Q4_1_BLOCK_BYTES) {
        block[..4].copy_from_slice(&[0x00, 0x20, 0x00, 0xa0]);
    }
    bytes
}

fn activations(tokens: usize, cols: usize) -> Vec<f32> {
    pseudo_random(tokens * cols, 3).into_iter().map(|b| (b as f32 - 128.0) / 37.0).collect()
}

fn bench_kernels(c: &mut Criterion) {
    let Some(gemm) = gemm_kernel(GgmlType::Q4_1) else {
        eprintln!("skipping: no grouped Q4_1 kernel on this CPU");
        return;
    };
    let mut group = c.benchmark_group("gemm_q4_1_16tok");
    group.sample_size(30);
    for (rows, cols) in [(1536usize, 576usize), (576, 1536)] {
        let weights = q4_1_rows(rows, cols);
        let nb = cols / QK;
        let x = activations(GROUP, cols);
        let mut xq = vec![Q8Block::default(); GROUP * nb];
        for t in 0..GROUP {
            quantize_row_q8(&x[t * cols..(t + 1) * cols], &mut xq[t * nb..(t + 1) * nb]);
        }
        let groups = interleave(&xq, GROUP, nb);
        let row_bytes = nb * Q4_1_BLOCK_BYTES;
        group.throughput(Throughput::Elements((rows * cols * GROUP) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(format!("{rows}x{cols}")), &weights, |b, w| {
            b.iter(|| {
                let mut acc = 0f32;
                for row in w.chunks_exact(row_bytes) {
                    acc += gemm(row, black_box(&groups))[0];
                }
                acc
            })
        });
        if let Some(rows4) = gemm_kernels(GgmlType::Q4_1).and_then(|k| k.rows4) {
            let id = BenchmarkId::from_parameter(format!("{rows}x{cols}/rows4"));
            group.bench_with_input(id, &weights, |b, w| {
                b.iter(|| {
                    let mut acc = 0f32;
                    for four in w.chunks_exact(4 * row_bytes) {
                        let r: Vec<&[u8]> = four.chunks_exact(row_bytes).collect();
                        acc += rows4([r[0], r[1], r[2], r[3]], black_box(&groups))[0][0];
                    }
                    acc
                })
            });
        }
    }
    group.finish();

    let mut quant = c.benchmark_group("quantize_q8");
    let x = activations(GROUP, 1536);
    let mut xq = vec![Q8Block::default(); GROUP * 1536 / QK];
    quant.throughput(Throughput::Elements(x.len() as u64));
    quant.bench_function("16x1536", |b| b.iter(|| quantize_row_q8(black_box(&x), &mut xq)));
    quant.finish();
}

criterion_group!(benches, bench_kernels);
criterion_main!(benches);
