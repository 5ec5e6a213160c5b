//! Sampling over SmolLM2's 49,152-token vocabulary (greedy, and the server's
//! default filters), and incremental detokenization per token.
//!
//! `cargo bench -p spindle-benches --bench sampling`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use spindle_engine::sampling::{PenaltyCounts, Sampler, SamplingParams};
use spindle_engine::tokenizer::IncrementalDecoder;
use std::hint::black_box;

const VOCAB: usize = 49_152;

fn logits() -> Vec<f32> {
    let mut s = 9u64;
    (0..VOCAB)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 12.0 - 6.0
        })
        .collect()
}

fn bench_sampling(c: &mut Criterion) {
    let base = logits();
    let history: Vec<u32> = (0..256).map(|i| (i * 37) % VOCAB as u32).collect();
    let mut group = c.benchmark_group("sample_49k");
    let cases = [
        ("greedy", SamplingParams { temperature: 0.0, ..SamplingParams::default() }),
        (
            "t0.8_topk40_topp0.95_minp0.05",
            SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed: Some(1), ..SamplingParams::default() },
        ),
        ("t1.0_topp0.9_no_topk", SamplingParams { temperature: 1.0, top_p: 0.9, seed: Some(1), ..SamplingParams::default() }),
        (
            "penalties",
            SamplingParams { temperature: 0.7, repetition_penalty: 1.1, presence_penalty: 0.5, seed: Some(1), ..SamplingParams::default() },
        ),
    ];
    // The history's counts, as the executor keeps them across steps.
    let counts = PenaltyCounts::new(&history[..128], &history[128..]);
    for (name, params) in cases {
        let penalties = params.has_penalties().then_some(&counts);
        let mut sampler = Sampler::new(params).expect("valid params");
        let mut work = base.clone();
        group.bench_function(name, |b| {
            b.iter(|| {
                work.copy_from_slice(&base);
                black_box(sampler.sample_counted(&mut work, penalties))
            })
        });
    }
    group.finish();

    let Some(path) = spindle_benches::smollm2_path() else {
        eprintln!("skipping detokenization: SmolLM2 not installed");
        return;
    };
    let loaded = spindle_engine::load::load_model(&path.to_string_lossy(), &mut |_, _| {}).expect("model");
    let text = "The lighthouse keeper climbed the stairs at dusk, counting the steps as he always did: 114. Über café — naïve 😀 résumé.";
    let ids = loaded.tokenizer.encode(&text.repeat(4), false).expect("encode");
    let mut group = c.benchmark_group("detokenize");
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("incremental_per_token", |b| {
        b.iter(|| {
            let mut decoder = IncrementalDecoder::new(loaded.tokenizer.clone(), true);
            let mut n = 0;
            for &id in &ids {
                n += decoder.push(id).expect("decode").len();
            }
            n + decoder.finish().expect("finish").len()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_sampling);
criterion_main!(benches);
