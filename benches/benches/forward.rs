//! Decode-step time at batch 1/4/16 (context 128) and batch 1 at contexts
//! 512 and 2048, and prefill throughput at 128/512 tokens
//! on SmolLM2-135M-Instruct (Q4_1), on as many threads as
//! `RAYON_NUM_THREADS` says (default: all cores; the engine's pool is sized
//! from rayon's count, as the server's `--threads` sizes both).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput, SeqSampling};
use spindle_engine::kv::BlockAllocator;
use spindle_engine::runner::ModelRunner;
use std::time::Duration;

const BLOCK: usize = 16;
/// (sequences, tokens already in each one's cache) of every decode case.
const DECODE_CASES: [(usize, usize); 5] = [(1, 128), (4, 128), (16, 128), (1, 512), (1, 2048)];

fn seq(tokens: Vec<u32>, start: usize, table: &[u32]) -> SeqInput {
    SeqInput {
        id: 0,
        tokens,
        start_pos: start,
        block_table: table.to_vec().into(),
        logits: LogitsRequest::None,
        sampling: Some(SeqSampling::default()),
    }
}

fn bench_forward(c: &mut Criterion) {
    // The forward pass runs on the engine's pool: size it as the server's
    // `--threads` would, from rayon's count (`RAYON_NUM_THREADS`).
    spindle_engine::pool::set_threads(rayon::current_num_threads());
    let Some(model) = spindle_benches::load_smollm2() else { return };
    let mut runner = ModelRunner::new(model, 1024, BLOCK);
    let mut alloc = BlockAllocator::new(1024);

    let mut decode = c.benchmark_group("decode_step");
    decode.sample_size(20).measurement_time(Duration::from_secs(8));
    for (batch, context) in DECODE_CASES {
        let mut tables = vec![Vec::new(); batch];
        for (i, t) in tables.iter_mut().enumerate() {
            alloc.ensure(t, context + 1, BLOCK).expect("pool sized for the benchmark");
            let prompt: Vec<u32> = (0..context as u32).map(|p| 100 + (p * 7 + i as u32) % 4000).collect();
            runner.execute(&ForwardBatch { seqs: vec![seq(prompt, 0, t)] }).expect("prefill");
        }
        let step = ForwardBatch { seqs: tables.iter().map(|t| seq(vec![42], context, t)).collect() };
        decode.throughput(Throughput::Elements(batch as u64));
        let id = if context == 128 { batch.to_string() } else { format!("{batch}@{context}") };
        decode.bench_with_input(BenchmarkId::from_parameter(id), &step, |b, step| {
            b.iter(|| runner.execute(step).expect("decode"))
        });
        for t in tables.iter_mut() {
            alloc.release(t);
        }
    }
    decode.finish();

    let mut prefill = c.benchmark_group("prefill");
    prefill.sample_size(10).measurement_time(Duration::from_secs(10));
    for len in [128usize, 512] {
        let mut table = Vec::new();
        alloc.ensure(&mut table, len, BLOCK).expect("pool sized for the benchmark");
        let prompt: Vec<u32> = (0..len as u32).map(|p| 100 + (p * 13) % 4000).collect();
        let batch = ForwardBatch { seqs: vec![seq(prompt, 0, &table)] };
        prefill.throughput(Throughput::Elements(len as u64));
        prefill.bench_with_input(BenchmarkId::from_parameter(len), &batch, |b, batch| {
            b.iter(|| runner.execute(batch).expect("prefill"))
        });
        alloc.release(&mut table);
    }
    prefill.finish();
}

criterion_group!(benches, bench_forward);
criterion_main!(benches);
