//! One scheduler step (schedule + update, with event delivery and incremental
//! detokenization) at 256 running sequences, against a fake runner that
//! returns instantly: the CPU control-plane cost per step.

use criterion::{criterion_group, criterion_main, Criterion};
use spindle_engine::batch::{ForwardBatch, SeqOutput, StepOutput};
use spindle_engine::sampling::{SampledToken, SamplingParams};
use spindle_engine::tokenizer::{SpecialTokens, Tokenizer};
use spindle_scheduler::core::Scheduler;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{GenerationRequest, Metrics, ModelLimits, SchedulerConfig};
use std::sync::Arc;

const SEQS: usize = 256;

fn fake_output(batch: &ForwardBatch, step: u32) -> StepOutput {
    let seqs = batch
        .seqs
        .iter()
        .map(|s| SeqOutput {
            grammar_ended: false,
            logits: Vec::new(),
            sampled: s.sampling.as_ref().map(|_| SampledToken {
                token: 97 + (step % 20),
                logprob: -0.1,
                top_logprobs: Vec::new(),
            }),
        })
        .collect();
    StepOutput { seqs }
}

fn tiny_tokenizer() -> Tokenizer {
    let dir = std::env::temp_dir().join(format!("spindle-bench-tok-{}", std::process::id()));
    let opts = spindle_tools::tiny_model::TinyModelOptions::default();
    spindle_tools::tiny_model::write_tiny_model(&opts, &dir).expect("tiny model");
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json"), SpecialTokens::default()).expect("tokenizer");
    let _ = std::fs::remove_dir_all(&dir);
    tok
}

fn bench_step(c: &mut Criterion) {
    let tokenizer = tiny_tokenizer();
    // Short contexts (the long-standing measurement), then 4k-token ones:
    // a step's cost must not grow with the context.
    let plain = SamplingParams::default();
    bench_context(c, &tokenizer, 32, &plain, "scheduler_step/256_running");
    bench_context(c, &tokenizer, 4096, &plain, "scheduler_step/256_running_4k_context");
    // The penalties need each sequence's history: it must travel as deltas.
    let penalised = SamplingParams { repetition_penalty: 1.1, frequency_penalty: 0.2, ..SamplingParams::default() };
    bench_context(c, &tokenizer, 4096, &penalised, "scheduler_step/256_running_4k_context_penalties");
}

fn bench_context(c: &mut Criterion, tokenizer: &Tokenizer, prompt_len: usize, sampling: &SamplingParams, name: &str) {
    let config = SchedulerConfig { max_num_seqs: SEQS, max_num_batched_tokens: 8192, ..SchedulerConfig::default() };
    let limits = ModelLimits { block_size: 16, num_blocks: 1 << 20, context_length: 1 << 20 };
    let mut scheduler = Scheduler::new(config, limits, Arc::new(Metrics::default()));
    let mut receivers = Vec::new();
    for i in 0..SEQS {
        let prompt: Vec<u32> = (0..prompt_len).map(|t| ((t * 7 + i) % 250) as u32).collect();
        let request = GenerationRequest {
            prompt,
            sampling: sampling.clone(),
            stop: StopConditions { max_tokens: usize::MAX, ..StopConditions::default() },
            cache_salt: None,
            constraint: None,
        };
        receivers.push(scheduler.enqueue(i as u64 + 1, request, tokenizer.clone()));
    }
    let mut step_no = 0u32;
    // Admit and prefill everyone, so the benchmark measures decode steps.
    while let Some(step) = scheduler.schedule() {
        let out = fake_output(&step.batch, step_no);
        let all_decoding = step.batch.seqs.len() == SEQS && step.batch.num_tokens() == SEQS;
        scheduler.update(&step, out);
        step_no += 1;
        if all_decoding {
            break;
        }
    }
    c.bench_function(name, |b| {
        b.iter(|| {
            let Some(step) = scheduler.schedule() else {
                let ev: Vec<_> = receivers[0].try_recv().into_iter().collect();
                panic!("no work at step {step_no}: {ev:?}");
            };
            let out = fake_output(&step.batch, step_no);
            scheduler.update(&step, out);
            step_no += 1;
            for rx in receivers.iter_mut() {
                while let Ok(ev) = rx.try_recv() {
                    if !matches!(ev, spindle_scheduler::GenerationEvent::Delta { .. } | spindle_scheduler::GenerationEvent::Started { .. }) {
                        panic!("step {step_no}: {ev:?}");
                    }
                }
            }
        })
    });
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
