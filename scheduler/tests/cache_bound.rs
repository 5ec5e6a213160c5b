//! A KV cache smaller than the model's context bounds the sequences: one
//! that would outgrow the whole cache ends with `ContextLength` when it
//! fills it, instead of being preempted and never readmitted (a hang).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "output_toy.rs"]
mod toy;

use spindle_engine::batch::{ForwardBatch, SeqOutput, StepOutput};
use spindle_engine::runner::{Executor, KvGeometry};
use spindle_engine::sampling::{SampledToken, SamplingParams};
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{FinishReason, GenerationEvent, GenerationRequest, SchedulerConfig, SchedulerHandle};
use std::time::{Duration, Instant};

/// Samples token 104 for every sequence; a cache of 4 blocks of 4 tokens
/// under a model context of 4096.
struct TinyCache;

impl Executor for TinyCache {
    fn execute(&mut self, batch: &ForwardBatch) -> spindle_engine::Result<StepOutput> {
        let seqs = batch
            .seqs
            .iter()
            .map(|s| SeqOutput { logits: Vec::new(), sampled: s.sampling.as_ref().map(|_| SampledToken { token: 104, logprob: 0.0, top_logprobs: Vec::new() }), grammar_ended: false })
            .collect();
        Ok(StepOutput { seqs })
    }

    fn context_length(&self) -> usize {
        4096
    }

    fn kv_geometry(&self) -> KvGeometry {
        KvGeometry { block_size: 4, num_blocks: 4, bytes_per_block: 0 }
    }
}

#[test]
fn a_sequence_longer_than_the_cache_ends_at_the_cache_instead_of_hanging() {
    let handle = SchedulerHandle::spawn(SchedulerConfig::default(), TinyCache, toy::toy());
    assert_eq!(handle.limits().context_length, 16, "the context window is what the cache holds");
    let request = GenerationRequest {
        prompt: vec![104, 105, 106, 107, 108],
        sampling: SamplingParams::default(),
        stop: StopConditions { max_tokens: 100, ..StopConditions::default() },
        cache_salt: None,
        constraint: None,
    };
    let mut stream = handle.submit(request).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        while let Some(event) = stream.blocking_recv() {
            if let GenerationEvent::Finished { reason, usage, .. } = event {
                let _ = tx.send(Some((reason, usage.output_tokens)));
                return;
            }
            if let GenerationEvent::Failed { .. } = event {
                break;
            }
        }
        let _ = tx.send(None);
    });
    let finished = rx.recv_timeout(deadline - Instant::now()).expect("the request ends within 10 s");
    let (reason, output_tokens) = finished.expect("finished, not failed or closed");
    assert_eq!(reason, FinishReason::ContextLength);
    assert_eq!(output_tokens, 16 - 5, "it filled the cache");
}
