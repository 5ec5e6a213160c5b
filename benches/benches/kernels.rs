//! Single-threaded quantized kernels: the grouped GEMM (16 tokens per call,
//! and 512 tokens a group or all groups at a time) over one layer's worth
//! of Q4_1 rows, and activation quantization; K-quant
//! (Q4_K, Q6_K) decode over 256 MiB of weights (bytes/s, against the machine's
//! memory read bandwidth measured in the same run by `memory_read`) and the
//! K-quant prefill GEMM on Qwen2.5-1.5B layer shapes (multiply-adds/s); the
//! one-group kernel with its weights in the L2, and one-token decode on two
//! threads; the CPU's integer multiply-add ceiling (`vnni_ceiling`: the
//! instruction alone, and the kernels' inner loop with nothing around it).
//!
//! `cargo bench -p spindle-benches --bench kernels`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use spindle_engine::gguf::types::GgmlType;
use spindle_engine::quant::dot::{quantize_row_q8, Q8Block, QK};
use spindle_engine::quant::gemm::{gemm_kernel, gemm_kernels, interleave, GROUP};
use spindle_engine::quant::kquant::gemm::{groups_in_l2, interleave_k, kgemm_kernels, super_blocks_in_l2};
use spindle_engine::quant::kquant::{kdot_kernels, quantize_row_q8k, Q8KBlock};
use spindle_engine::simd::scaled_dots_many;
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

/// The grouped Q4_1 kernel over 512 tokens (32 groups) of a SmolLM2
/// layer shape: four rows a group at a time (`rows4`, unpacking the rows
/// for every group) against all groups at once (`rows4_groups`). Rows of
/// 18 blocks: one unpacking chunk (of 64).
fn bench_q4_1_prefill(c: &mut Criterion) {
    let kernels = gemm_kernels(GgmlType::Q4_1);
    let Some((rows4, rows4_groups)) = kernels.and_then(|k| k.rows4.zip(k.rows4_groups)) else {
        eprintln!("skipping gemm_q4_1_512tok: no four-row grouped Q4_1 kernels on this CPU");
        return;
    };
    let mut group = c.benchmark_group("gemm_q4_1_512tok");
    group.sample_size(10);
    let (rows, cols, tokens) = (1536usize, 576usize, 512usize);
    let weights = q4_1_rows(rows, cols);
    let nb = cols / QK;
    let x = activations(tokens, cols);
    let mut xq = vec![Q8Block::default(); tokens * nb];
    quantize_row_q8(&x, &mut xq);
    let groups = interleave(&xq, tokens, nb);
    let row_bytes = nb * Q4_1_BLOCK_BYTES;
    group.throughput(Throughput::Elements((rows * cols * tokens) as u64));
    group.bench_function(format!("{rows}x{cols}/rows4"), |b| {
        b.iter(|| {
            let mut acc = 0f32;
            for four in weights.chunks_exact(4 * row_bytes) {
                let r: Vec<&[u8]> = four.chunks_exact(row_bytes).collect();
                for xg in groups.chunks_exact(nb) {
                    acc += rows4([r[0], r[1], r[2], r[3]], black_box(xg))[0][0];
                }
            }
            acc
        })
    });
    let mut out = vec![[[0f32; GROUP]; 4]; tokens / GROUP];
    group.bench_function(format!("{rows}x{cols}/rows4_groups"), |b| {
        b.iter(|| {
            let mut acc = 0f32;
            for four in weights.chunks_exact(4 * row_bytes) {
                let r: Vec<&[u8]> = four.chunks_exact(row_bytes).collect();
                rows4_groups([r[0], r[1], r[2], r[3]], black_box(&groups), nb, &mut out);
                acc += out[0][0][0];
            }
            acc
        })
    });
    group.finish();
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
    bench_q4_1_prefill(c);

    let mut quant = c.benchmark_group("quantize_q8");
    let x = activations(GROUP, 1536);
    let mut xq = vec![Q8Block::default(); GROUP * 1536 / QK];
    quant.throughput(Throughput::Elements(x.len() as u64));
    quant.bench_function("16x1536", |b| b.iter(|| quantize_row_q8(black_box(&x), &mut xq)));
    quant.finish();
}

/// Random K-quant rows (`rows x cols`) with small finite f16 scales.
fn kquant_rows(dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let ts = dtype.type_size();
    let mut bytes = pseudo_random(rows * cols / 256 * ts, 11);
    for block in bytes.chunks_exact_mut(ts) {
        let at = if dtype == GgmlType::Q6K { 208 } else { 0 };
        block[at..at + 2].copy_from_slice(&[0x00, 0x14]);
        if dtype != GgmlType::Q6K {
            block[2..4].copy_from_slice(&[0x00, 0x14]);
        }
    }
    bytes
}

fn quantize_k(tokens: usize, cols: usize) -> Vec<Q8KBlock> {
    let x = activations(tokens, cols);
    let mut xq = vec![Q8KBlock::default(); tokens * cols / 256];
    quantize_row_q8k(&x, &mut xq);
    xq
}

/// Decode: one token through K-quant rows, four rows per call as the model
/// does; throughput in weight bytes. 256 MiB (more than any cache) measures
/// the kernel against memory, 512 KiB (in L2) its compute.
fn bench_kquant_decode(c: &mut Criterion) {
    for (label, total) in [("256MiB", 256usize << 20), ("512KiB", 512 << 10)] {
        let mut group = c.benchmark_group(format!("kquant_decode_1tok_{label}"));
        group.sample_size(10);
        let cols = 1536;
        for dtype in [GgmlType::Q4K, GgmlType::Q6K] {
            let Some(k) = kdot_kernels(dtype) else { continue };
            let row_bytes = cols / 256 * dtype.type_size();
            let rows = total / row_bytes / 4 * 4;
            let weights = kquant_rows(dtype, rows, cols);
            let xq = quantize_k(1, cols);
            group.throughput(Throughput::Bytes(weights.len() as u64));
            group.bench_function(format!("{dtype:?}/{cols}cols"), |b| {
                b.iter(|| {
                    let mut acc = 0f32;
                    for four in weights.chunks_exact(4 * row_bytes) {
                        acc += (k.rows4)(rows_of::<4>(four, row_bytes), black_box(&xq))[0];
                    }
                    acc
                })
            });
        }
        group.finish();
    }
}

/// Batched decode: 4, 8, 16 and 32 tokens (two groups: the engine's AMX
/// expansion kernel) through 256 MiB of K-quant rows, with
/// the kernel that unpacks four rows once for up to 8 tokens, with the
/// one-row four-token kernel (4 tokens) and with the grouped GEMM (16-token
/// lanes, padded for 8); throughput in weight bytes.
fn bench_kquant_decode_batch(c: &mut Criterion) {
    let cols = 1536;
    let nb = cols / 256;
    for tokens in [4usize, 8, 16, 32] {
        let mut group = c.benchmark_group(format!("kquant_decode_{tokens}tok_256MiB"));
        group.sample_size(10);
        for dtype in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let Some(k) = kdot_kernels(dtype) else { continue };
            let row_bytes = nb * dtype.type_size();
            let rows = (256 << 20) / row_bytes / 4 * 4;
            let weights = kquant_rows(dtype, rows, cols);
            let xq = quantize_k(tokens, cols);
            let fours = || weights.chunks_exact(4 * row_bytes).map(|four| rows_of::<4>(four, row_bytes));
            group.throughput(Throughput::Bytes(weights.len() as u64));
            if let Some(many) = k.rows4_tokens.filter(|_| tokens <= 16) {
                group.bench_function(format!("{dtype:?}/rows4_tokens"), |b| {
                    b.iter(|| {
                        let mut out = [[0f32; 4]; 8];
                        let mut acc = 0f32;
                        for w in fours() {
                            for first in (0..tokens).step_by(8) {
                                let count = (tokens - first).min(8);
                                many(w, black_box(&xq[first * nb..(first + count) * nb]), nb, &mut out[..count]);
                                acc += out[0][0];
                            }
                        }
                        acc
                    })
                });
            }
            if tokens == 4 {
                group.bench_function(format!("{dtype:?}/four"), |b| {
                    b.iter(|| weights.chunks_exact(row_bytes).map(|w| (k.four)(w, black_box(&xq), nb)[3]).sum::<f32>())
                });
            }
            if let Some(g) = kgemm_kernels(dtype).filter(|_| tokens >= 8) {
                let groups = interleave_k(&xq, tokens, nb);
                let mut out = vec![[[0f32; GROUP]; 4]; tokens.div_ceil(GROUP)];
                group.bench_function(format!("{dtype:?}/grouped"), |b| {
                    b.iter(|| {
                        for w in fours() {
                            (g.rows4)(w, black_box(&groups), nb, &mut out);
                        }
                        out[0][0][0]
                    })
                });
                // The same weights on AMX tiles, 32 rows at a time (where the CPU has them).
                #[cfg(target_arch = "x86_64")]
                if let Some(amx) = g.amx {
                    let mut out32 = vec![[[[0f32; GROUP]; 16]; 2]; tokens.div_ceil(GROUP)];
                    let blocks: Vec<&[u8]> = weights.chunks_exact(32 * row_bytes).collect();
                    group.bench_function(format!("{dtype:?}/amx"), |b| b.iter(|| amx_blocks(amx, &blocks, row_bytes, black_box(&groups), nb, &mut out32)));
                }
            }
        }
        group.finish();
    }
}

/// The `N` rows of `row_bytes` each that make up `block` (a kernel call's rows).
fn rows_of<const N: usize>(block: &[u8], row_bytes: usize) -> [&[u8]; N] {
    std::array::from_fn(|r| &block[r * row_bytes..(r + 1) * row_bytes])
}

/// Every block of 32 rows through the AMX kernel, each call told the next
/// block (as the engine does); returns one result to keep the work alive.
#[cfg(target_arch = "x86_64")]
fn amx_blocks(
    amx: spindle_engine::quant::kquant::amx::KGemmAmxFn,
    blocks: &[&[u8]],
    row_bytes: usize,
    groups: &[spindle_engine::quant::kquant::gemm::Q8KGroup],
    nb: usize,
    out: &mut [spindle_engine::quant::kquant::amx::AmxOut],
) -> f32 {
    for (i, block) in blocks.iter().enumerate() {
        let next = blocks.get(i + 1).map(|b| rows_of::<32>(b, row_bytes));
        amx(&rows_of::<32>(block, row_bytes), next.as_ref(), groups, nb, out);
    }
    out[0][0][0][0]
}

/// Prefill and batched decode: 16 to 512 tokens (1 to 32 groups of 16) through Qwen2.5-1.5B-shaped layers;
/// the VNNI kernel gets the groups a few at a time (`groups_in_l2`) and AMX all of them, as the engine does.
fn bench_kquant_prefill(c: &mut Criterion) {
    let mut group = c.benchmark_group("kquant_gemm");
    group.sample_size(10);
    let shapes = [(GgmlType::Q4K, 1536usize, 1536usize), (GgmlType::Q4K, 8960, 1536), (GgmlType::Q6K, 1536, 8960)];
    for (tokens, (dtype, rows, cols)) in [16usize, 32, 64, 512].into_iter().flat_map(|t| shapes.map(|s| (t, s))) {
        let Some(k) = kgemm_kernels(dtype) else {
            eprintln!("no grouped K-quant kernel (AVX-512 VNNI) on this CPU");
            return;
        };
        let nb = cols / 256;
        let row_bytes = nb * dtype.type_size();
        let weights = kquant_rows(dtype, rows, cols);
        let groups = interleave_k(&quantize_k(tokens, cols), tokens, nb);
        let mut out = vec![[[0f32; GROUP]; 4]; tokens / GROUP];
        group.throughput(Throughput::Elements((rows * cols * tokens) as u64));
        // As the engine gives them: as many groups at a time as stay in the L2.
        let per_chunk = groups_in_l2(nb) * nb;
        group.bench_function(format!("{dtype:?}/{rows}x{cols}/{tokens}tok"), |b| {
            b.iter(|| {
                for chunk in black_box(&groups).chunks(per_chunk) {
                    let out = &mut out[..chunk.len() / nb];
                    for four in weights.chunks_exact(4 * row_bytes) {
                        (k.rows4)(rows_of::<4>(four, row_bytes), chunk, nb, out);
                    }
                }
                out[0][0][0]
            })
        });
        // Long rows (activations of fewer than 8 groups fit the L2): as the
        // engine takes them, 8 groups at a time over ranges of super-blocks.
        if groups_in_l2(nb) < 8 && tokens / GROUP > groups_in_l2(nb) {
            let per_chunk = 8.min(tokens / GROUP);
            let per_range = super_blocks_in_l2(per_chunk).min(nb);
            let mut sums = vec![[[0f32; GROUP]; 4]; rows / 4 * per_chunk];
            group.bench_function(format!("{dtype:?}/{rows}x{cols}/{tokens}tok/ranges"), |b| {
                b.iter(|| {
                    for chunk in black_box(&groups).chunks(per_chunk * nb) {
                        let out = &mut out[..chunk.len() / nb];
                        let sums = &mut sums[..rows / 4 * out.len()];
                        sums.fill([[0.0; GROUP]; 4]);
                        for from in (0..nb).step_by(per_range) {
                            let len = per_range.min(nb - from);
                            for (four, block) in weights.chunks_exact(4 * row_bytes).zip(sums.chunks_exact_mut(out.len())) {
                                let w: [&[u8]; 4] = std::array::from_fn(|j| &four[j * row_bytes + from * dtype.type_size()..]);
                                (k.rows4_acc)(w, &chunk[from..], nb, len, block);
                            }
                        }
                        out[0] = sums[0];
                    }
                    out[0][0][0]
                })
            });
        }
        // The same rows on AMX tiles, 32 at a time (where the CPU has them).
        #[cfg(target_arch = "x86_64")]
        if let Some(amx) = k.amx {
            let mut out32 = vec![[[[0f32; GROUP]; 16]; 2]; tokens / GROUP];
            let blocks: Vec<&[u8]> = weights.chunks_exact(32 * row_bytes).collect();
            group.bench_function(format!("{dtype:?}/{rows}x{cols}/{tokens}tok/amx"), |b| {
                b.iter(|| amx_blocks(amx, &blocks, row_bytes, black_box(&groups), nb, &mut out32))
            });
        }
    }
    group.finish();
}

/// The machine's memory read bandwidth: summing 256 MiB of u64 on 1 and on 2
/// threads (the ceiling that decode approaches).
fn bench_memory_read(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_read_256MiB");
    group.sample_size(10);
    let words: Vec<u64> = (0..(256usize << 20) / 8).map(|i| i as u64).collect();
    group.throughput(Throughput::Bytes((words.len() * 8) as u64));
    let sum = |w: &[u64]| w.chunks_exact(8).fold([0u64; 8], |mut a, c| {
        for (x, y) in a.iter_mut().zip(c) {
            *x = x.wrapping_add(*y);
        }
        a
    });
    group.bench_function("1thread", |b| b.iter(|| sum(black_box(&words))));
    group.bench_function("2threads", |b| {
        b.iter(|| {
            let (lo, hi) = words.split_at(words.len() / 2);
            std::thread::scope(|s| {
                let h = s.spawn(|| sum(black_box(hi)));
                let a = sum(black_box(lo));
                (a, h.join().ok())
            })
        })
    });
    group.finish();
}

/// The grouped kernel for one group (batched decode of 16 sequences) with
/// its weights in the L2 (512 KiB, 512 passes: 256 MiB read, as
/// `kquant_decode_16tok_256MiB` reads from memory): the kernel's own speed.
fn bench_kquant_decode_l2(c: &mut Criterion) {
    let cols = 1536;
    let nb = cols / 256;
    let tokens = 16;
    let mut group = c.benchmark_group("kquant_decode_16tok_l2");
    group.sample_size(10);
    for dtype in [GgmlType::Q4K, GgmlType::Q6K] {
        let Some(g) = kgemm_kernels(dtype) else { continue };
        let row_bytes = nb * dtype.type_size();
        let rows = (512 << 10) / row_bytes / 4 * 4;
        let weights = kquant_rows(dtype, rows, cols);
        let xq = quantize_k(tokens, cols);
        let groups = interleave_k(&xq, tokens, nb);
        let mut out = vec![[[0f32; GROUP]; 4]; 1];
        group.throughput(Throughput::Bytes(weights.len() as u64 * 512));
        group.bench_function(format!("{dtype:?}/grouped"), |b| {
            b.iter(|| {
                for _ in 0..512 {
                    for four in weights.chunks_exact(4 * row_bytes) {
                        (g.rows4)(rows_of::<4>(four, row_bytes), black_box(&groups), nb, &mut out);
                    }
                }
                out[0][0][0]
            })
        });
    }
    group.finish();
}

/// One-token decode over 256 MiB on two threads, each half the rows (as the
/// engine splits a matrix): against `memory_read_256MiB/2threads` in the
/// same run, whether single-sequence decode is at the memory limit.
fn bench_kquant_decode_2t(c: &mut Criterion) {
    let mut group = c.benchmark_group("kquant_decode_1tok_2threads");
    group.sample_size(10);
    let cols = 1536;
    for dtype in [GgmlType::Q4K, GgmlType::Q6K] {
        let Some(k) = kdot_kernels(dtype) else { continue };
        let row_bytes = cols / 256 * dtype.type_size();
        let rows = (256usize << 20) / row_bytes / 8 * 8;
        let weights = kquant_rows(dtype, rows, cols);
        let xq = quantize_k(1, cols);
        group.throughput(Throughput::Bytes(weights.len() as u64));
        let run = |w: &[u8]| {
            let mut acc = 0f32;
            for four in w.chunks_exact(4 * row_bytes) {
                acc += (k.rows4)(rows_of::<4>(four, row_bytes), black_box(&xq))[0];
            }
            acc
        };
        group.bench_function(format!("{dtype:?}/{cols}cols"), |b| {
            b.iter(|| {
                let (lo, hi) = weights.split_at(weights.len() / 2);
                std::thread::scope(|s| {
                    let h = s.spawn(|| run(hi));
                    run(lo) + h.join().expect("the second thread of the bench panicked")
                })
            })
        });
    }
    group.finish();
}

/// Attention scores of the three query heads that share a KV head
/// (SmolLM2's shape: 64 values, an f16 KV cache) against a sequence's key
/// rows, as batched decode computes them: in one call (three at a time
/// where the CPU has AVX-512VL) against two calls of two and one (each key
/// row read twice, as before the three-vector kernel).
fn bench_attention_scores(c: &mut Criterion) {
    let mut group = c.benchmark_group("attention_scores_3heads");
    let d = 64;
    for rows in [128usize, 512] {
        let keys: Vec<half::f16> = (0..rows * d).map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 64.0)).collect();
        let starts: Vec<usize> = (0..rows).map(|r| r * d).collect();
        let qs: Vec<Vec<f32>> = (0..3).map(|v| (0..d).map(|i| ((i * 7 + v * 13) % 29) as f32 / 29.0 - 0.5).collect()).collect();
        let q: Vec<&[f32]> = qs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0f32; 3 * rows];
        group.throughput(Throughput::Elements((3 * rows) as u64));
        group.bench_function(format!("{rows}rows/together"), |b| {
            b.iter(|| {
                scaled_dots_many(&mut out, rows, black_box(&q), 0.125, &keys, &starts);
                out[0]
            })
        });
        group.bench_function(format!("{rows}rows/two_then_one"), |b| {
            b.iter(|| {
                let (two, one) = out.split_at_mut(2 * rows);
                scaled_dots_many(two, rows, black_box(&q[..2]), 0.125, &keys, &starts);
                scaled_dots_many(one, rows, black_box(&q[2..]), 0.125, &keys, &starts);
                out[0]
            })
        });
    }
    group.finish();
}

/// The integer multiply-add ceiling of one thread (multiply-adds/s, as
/// `kquant_gemm`): `vpdpbusd` alone, then the grouped kernels' run loop
/// (4 rows × 1 group as batched decode, 4 × 2 as prefill; runs of 32 values
/// as Q4_K's, 16 as Q6_K's) with everything else taken away.
fn bench_vnni_ceiling(c: &mut Criterion) {
    use spindle_benches::ceiling::{self, RunData, CHAINS, MACS_PER_DPBUSD};
    if !ceiling::available() {
        eprintln!("skipped vnni_ceiling: no AVX-512 VNNI on this CPU");
        return;
    }
    let mut group = c.benchmark_group("vnni_ceiling");
    let iters = 1 << 16;
    let words: [i32; 64] = std::array::from_fn(|i| (i as i32).wrapping_mul(0x0105_0301));
    group.throughput(Throughput::Elements((iters * CHAINS) as u64 * MACS_PER_DPBUSD));
    group.bench_function("dpbusd_only", |b| b.iter(|| ceiling::dpbusd_only(iters, black_box(&words))));
    let data = RunData::new();
    let passes = 1 << 10;
    let macs = |rows: usize, groups: usize| Throughput::Elements((passes * 64 * rows * groups) as u64 * MACS_PER_DPBUSD);
    group.throughput(macs(4, 1));
    group.bench_function("q4k_runs_4rows_1group", |b| b.iter(|| ceiling::runs::<4, 1, 8>(passes, black_box(&data))));
    group.bench_function("q6k_runs_4rows_1group", |b| b.iter(|| ceiling::runs::<4, 1, 4>(passes, black_box(&data))));
    group.throughput(macs(4, 2));
    group.bench_function("q4k_runs_4rows_2groups", |b| b.iter(|| ceiling::runs::<4, 2, 8>(passes, black_box(&data))));
    group.bench_function("q6k_runs_4rows_2groups", |b| b.iter(|| ceiling::runs::<4, 2, 4>(passes, black_box(&data))));
    group.finish();
}

criterion_group!(
    benches,
    bench_vnni_ceiling,
    bench_attention_scores,
    bench_kernels,
    bench_kquant_decode,
    bench_kquant_decode_batch,
    bench_kquant_prefill,
    bench_memory_read,
    bench_kquant_decode_l2,
    bench_kquant_decode_2t
);
criterion_main!(benches);
