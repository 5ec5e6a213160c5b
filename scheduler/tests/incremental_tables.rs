//! Block tables travel as deltas: a running sequence's step carries only
//! the blocks appended since its previous step, and the whole table when it
//! is new, resumed after preemption, or rewritten (a committed block
//! switched to a registered duplicate). An executor that keeps tables by
//! sequence id and applies the steps rebuilds exactly the scheduler's table
//! at every step, under preemption and prefix sharing, and every table it
//! keeps is released by the end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "output_toy.rs"]
mod toy;

use spindle_engine::batch::{BlockTable, ForwardBatch, SeqOutput, StepOutput};
use spindle_engine::sampling::{SampledToken, SamplingParams};
use spindle_scheduler::core::Scheduler;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{GenerationEvent, GenerationRequest, Metrics, ModelLimits, SchedulerConfig};
use std::collections::HashMap;
use std::sync::Arc;

fn outputs(batch: &ForwardBatch, step: u32) -> StepOutput {
    let seqs = batch
        .seqs
        .iter()
        .map(|s| SeqOutput {
            logits: Vec::new(),
            sampled: s.sampling.as_ref().map(|_| SampledToken { token: 104 + step % 7, logprob: -0.1, top_logprobs: Vec::new() }),
            grammar_ended: false,
        })
        .collect();
    StepOutput { seqs }
}

#[test]
fn an_executor_rebuilds_every_table_from_the_deltas_and_releases_them_all() {
    let limits = ModelLimits { block_size: 4, num_blocks: 48, context_length: 4096 };
    let config = SchedulerConfig { max_num_seqs: 8, max_num_batched_tokens: 40, ..SchedulerConfig::default() };
    let metrics = Arc::new(Metrics::default());
    let mut scheduler = Scheduler::new(config, limits, metrics.clone());
    let mut receivers = Vec::new();
    for i in 0..14u64 {
        // Pairs of requests share their first 12 tokens (prefix cache hits and
        // duplicate blocks committed in the same step).
        let mut prompt: Vec<u32> = (0..12).map(|t| 104 + ((t + i / 2) % 20) as u32).collect();
        prompt.extend((0..(i % 5) * 3).map(|t| 130 + (t as u32 + i as u32) % 30));
        let request = GenerationRequest {
            prompt,
            sampling: SamplingParams::default(),
            stop: StopConditions { max_tokens: 10 + (i as usize % 4) * 9, ..StopConditions::default() },
            cache_salt: None,
            constraint: None,
        };
        receivers.push(scheduler.enqueue(i + 1, request, toy::toy()));
    }
    let mut kept: HashMap<u64, Vec<u32>> = HashMap::new();
    let (mut appends, mut wholes) = (0, 0);
    let mut step_no = 0u32;
    while scheduler.has_work() {
        step_no += 1;
        assert!(step_no < 5000, "the workload finishes");
        let Some(step) = scheduler.schedule() else { continue };
        for id in scheduler.take_released() {
            kept.remove(&id);
        }
        let truth: HashMap<u64, Vec<u32>> = scheduler.running_tables().into_iter().collect();
        for seq in &step.batch.seqs {
            match &seq.block_table {
                BlockTable::Full(t) => {
                    wholes += 1;
                    kept.insert(seq.id, t.clone());
                }
                BlockTable::Append(new) => {
                    appends += 1;
                    kept.get_mut(&seq.id).unwrap_or_else(|| panic!("step {step_no}: sequence {} appends to a table never sent", seq.id)).extend_from_slice(new);
                }
            }
            assert_eq!(kept[&seq.id], truth[&seq.id], "step {step_no}: sequence {}'s rebuilt table", seq.id);
        }
        scheduler.update(&step, outputs(&step.batch, step_no));
        for id in scheduler.take_released() {
            kept.remove(&id);
        }
    }
    assert!(kept.is_empty(), "every kept table was released: {:?}", kept.keys().collect::<Vec<_>>());
    assert!(appends > 10 * wholes, "running sequences send deltas ({appends} appends, {wholes} whole tables)");
    assert!(metrics.snapshot().preemptions > 0, "the pool is small enough to preempt");
    for mut rx in receivers {
        let mut finished = false;
        while let Ok(ev) = rx.try_recv() {
            finished |= matches!(ev, GenerationEvent::Finished { .. });
        }
        assert!(finished, "every request finished");
    }
}
