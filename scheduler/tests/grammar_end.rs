//! A sequence whose grammar allows no further token (a finished grammar on a
//! tokenizer without EOS) ends with `Finished` and returns its blocks, where
//! a step that merely sampled nothing (a prefill chunk) does not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "output_toy.rs"]
mod toy;

use spindle_engine::batch::{ForwardBatch, SeqOutput, StepOutput};
use spindle_engine::sampling::{SampledToken, SamplingParams};
use spindle_scheduler::core::Scheduler;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{FinishReason, GenerationEvent, GenerationRequest, Metrics, ModelLimits, SchedulerConfig};
use std::sync::Arc;

fn outputs(batch: &ForwardBatch, ended: bool) -> StepOutput {
    let seqs = batch
        .seqs
        .iter()
        .map(|s| SeqOutput {
            logits: Vec::new(),
            sampled: (!ended && s.sampling.is_some()).then(|| SampledToken { token: 104, logprob: -0.1, top_logprobs: Vec::new() }),
            grammar_ended: ended && s.sampling.is_some(),
        })
        .collect();
    StepOutput { seqs }
}

#[test]
fn a_grammar_that_allows_nothing_finishes_the_sequence_and_frees_its_blocks() {
    let limits = ModelLimits { block_size: 16, num_blocks: 64, context_length: 8192 };
    let mut scheduler = Scheduler::new(SchedulerConfig::default(), limits, Arc::new(Metrics::default()));
    let free_before = scheduler.kv().num_free_blocks();
    let request = GenerationRequest {
        prompt: vec![104, 105, 106],
        sampling: SamplingParams::default(),
        stop: StopConditions { max_tokens: 100, ..StopConditions::default() },
        cache_salt: None,
        constraint: None,
    };
    let mut events = scheduler.enqueue(1, request, toy::toy());
    let step = scheduler.schedule().unwrap();
    scheduler.update(&step, outputs(&step.batch, false));
    let step = scheduler.schedule().unwrap();
    scheduler.update(&step, outputs(&step.batch, true));
    assert!(!scheduler.has_work(), "the sequence ended");
    assert_eq!(scheduler.kv().num_free_blocks(), free_before, "its blocks came back");
    let mut last = None;
    while let Ok(e) = events.try_recv() {
        last = Some(e);
    }
    match last {
        Some(GenerationEvent::Finished { reason, usage, .. }) => {
            assert_eq!(reason, FinishReason::Eos);
            assert_eq!(usage.output_tokens, 1, "the one token sampled before the grammar ended");
        }
        other => panic!("expected Finished, got {other:?}"),
    }
}
