//! Block tables travel as deltas: a running sequence's step carries only
//! the blocks appended since its previous step, and the whole table when it
//! is new, resumed after preemption, or rewritten (a committed block
//! switched to a registered duplicate). An executor that keeps tables by
//! sequence id and applies the steps rebuilds exactly the scheduler's table
//! at every step, under preemption and prefix sharing, and every table it
//! keeps is released by the end. Penalty histories travel the same way:
//! the generated tokens since the sequence's previous sample, whole when new
//! or resumed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "output_toy.rs"]
mod toy;

use spindle_engine::batch::{BlockTable, ForwardBatch, PenaltyHistory, SeqOutput, StepOutput};
use spindle_engine::sampling::{PenaltyBook, PenaltyCounts, SampledToken, SamplingParams};
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

/// 14 requests in pairs sharing their first 12 tokens (prefix cache hits
/// and duplicate blocks committed in the same step), over a pool small
/// enough to preempt; `sampling(i)` for request `i`.
type Receivers = Vec<tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>>;

fn workload(sampling: impl Fn(u64) -> SamplingParams) -> (Scheduler, Arc<Metrics>, HashMap<u64, Vec<u32>>, Receivers) {
    let limits = ModelLimits { block_size: 4, num_blocks: 48, context_length: 4096 };
    let config = SchedulerConfig { max_num_seqs: 8, max_num_batched_tokens: 40, ..SchedulerConfig::default() };
    let metrics = Arc::new(Metrics::default());
    let mut scheduler = Scheduler::new(config, limits, metrics.clone());
    let mut receivers = Vec::new();
    let mut prompts = HashMap::new();
    for i in 0..14u64 {
        let mut prompt: Vec<u32> = (0..12).map(|t| 104 + ((t + i / 2) % 20) as u32).collect();
        prompt.extend((0..(i % 5) * 3).map(|t| 130 + (t as u32 + i as u32) % 30));
        prompts.insert(i + 1, prompt.clone());
        let request = GenerationRequest {
            prompt,
            sampling: sampling(i),
            stop: StopConditions { max_tokens: 10 + (i as usize % 4) * 9, ..StopConditions::default() },
            cache_salt: None,
            constraint: None,
        };
        receivers.push(scheduler.enqueue(i + 1, request, toy::toy()));
    }
    (scheduler, metrics, prompts, receivers)
}

fn assert_all_finished(receivers: Receivers) {
    for mut rx in receivers {
        let mut finished = false;
        while let Ok(ev) = rx.try_recv() {
            finished |= matches!(ev, GenerationEvent::Finished { .. });
        }
        assert!(finished, "every request finished");
    }
}

#[test]
fn an_executor_rebuilds_every_table_from_the_deltas_and_releases_them_all() {
    let (mut scheduler, metrics, _, receivers) = workload(|_| SamplingParams::default());
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
    assert_all_finished(receivers);
}

#[test]
fn an_executor_rebuilds_every_penalty_history_from_the_deltas_and_releases_them_all() {
    let sampling = |i: u64| match i % 3 {
        0 => SamplingParams { repetition_penalty: 1.3, ..SamplingParams::default() },
        1 => SamplingParams { frequency_penalty: 0.5, presence_penalty: 0.1, ..SamplingParams::default() },
        _ => SamplingParams::default(),
    };
    let (mut scheduler, metrics, prompts, receivers) = workload(sampling);
    let mut book = PenaltyBook::default();
    let mut generated: HashMap<u64, Vec<u32>> = HashMap::new();
    let (mut appends, mut wholes) = (0, 0);
    let mut step_no = 0u32;
    while scheduler.has_work() {
        step_no += 1;
        assert!(step_no < 5000, "the workload finishes");
        let Some(step) = scheduler.schedule() else { continue };
        book.release(&scheduler.take_released());
        book.update(&step.batch).unwrap_or_else(|e| panic!("step {step_no}: {e}"));
        let counts = book.for_batch(&step.batch);
        for (seq, counts) in step.batch.seqs.iter().zip(counts) {
            let Some(s) = &seq.sampling else { continue };
            match &s.history {
                Some(PenaltyHistory::Full { .. }) => wholes += 1,
                Some(PenaltyHistory::Append(_)) => appends += 1,
                None => {
                    assert_eq!(seq.id % 3, 0, "step {step_no}: sequence {} has a penalty on but sent no history", seq.id);
                    continue;
                }
            }
            let prompt: &[u32] = if s.params.repetition_penalty != 1.0 { &prompts[&seq.id] } else { &[] };
            let truth = PenaltyCounts::new(prompt, generated.get(&seq.id).map_or(&[][..], Vec::as_slice));
            assert_eq!(counts, Some(&truth), "step {step_no}: sequence {}'s rebuilt history", seq.id);
        }
        let out = outputs(&step.batch, step_no);
        for (seq, o) in step.batch.seqs.iter().zip(&out.seqs) {
            if let Some(t) = &o.sampled {
                generated.entry(seq.id).or_default().push(t.token);
            }
        }
        scheduler.update(&step, out);
        book.release(&scheduler.take_released());
    }
    assert!(book.is_empty(), "every kept history was released ({} left)", book.len());
    assert!(appends > 5 * wholes, "running sequences send deltas ({appends} appends, {wholes} whole histories)");
    assert!(metrics.snapshot().preemptions > 0, "the pool is small enough to preempt");
    assert_all_finished(receivers);
}
