//! The step loop has the runner set aside the largest step's workspace
//! before the first step, and no step is larger than what it reserved.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "output_toy.rs"]
mod toy;

use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqOutput, StepOutput};
use spindle_engine::runner::{Executor, KvGeometry};
use spindle_engine::sampling::{SampledToken, SamplingParams};
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{GenerationEvent, GenerationRequest, SchedulerConfig, SchedulerHandle};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

/// What the runner saw, in order.
#[derive(Debug, PartialEq)]
enum Call {
    Reserve { rows: usize, logit_rows: usize },
    Step { tokens: usize, logit_rows: usize },
}

/// Samples token 104 for every sequence and reports each call.
struct Recording(Sender<Call>);

impl Executor for Recording {
    fn reserve(&mut self, rows: usize, logit_rows: usize) -> spindle_engine::Result<()> {
        let _ = self.0.send(Call::Reserve { rows, logit_rows });
        Ok(())
    }

    fn execute(&mut self, batch: &ForwardBatch) -> spindle_engine::Result<StepOutput> {
        let logit_rows = batch
            .seqs
            .iter()
            .map(|s| match s.logits {
                // A sampling sequence gets its last row's logits whatever it asks.
                LogitsRequest::None if s.sampling.is_none() => 0,
                LogitsRequest::All => s.tokens.len(),
                _ => 1,
            })
            .sum();
        let _ = self.0.send(Call::Step { tokens: batch.num_tokens(), logit_rows });
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
        KvGeometry { block_size: 16, num_blocks: 256, bytes_per_block: 0 }
    }
}

#[test]
fn the_largest_step_is_reserved_before_the_first_and_bounds_every_step() {
    let config = SchedulerConfig { max_num_seqs: 4, max_num_batched_tokens: 32, ..SchedulerConfig::default() };
    let (tx, calls) = std::sync::mpsc::channel();
    let handle = SchedulerHandle::spawn(config, Recording(tx), toy::toy());
    let first = calls.recv_timeout(Duration::from_secs(10)).expect("a call before any request");
    assert_eq!(first, Call::Reserve { rows: 32, logit_rows: 4 });
    // Six 40-token prompts: more sequences and more prompt than one step takes.
    let streams: Vec<_> = (0..6)
        .map(|_| {
            let request = GenerationRequest {
                prompt: vec![104; 40],
                sampling: SamplingParams::default(),
                stop: StopConditions { max_tokens: 3, ..StopConditions::default() },
                cache_salt: None,
                constraint: None,
            };
            handle.submit(request).unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    for mut stream in streams {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "every request ends within 20 s");
            match stream.blocking_recv() {
                Some(GenerationEvent::Finished { .. }) => break,
                Some(GenerationEvent::Failed { message }) => panic!("failed: {message}"),
                Some(_) => {}
                None => panic!("the stream closed before it finished"),
            }
        }
    }
    drop(handle);
    let steps: Vec<Call> = calls.try_iter().collect();
    assert!(steps.len() >= 6, "prefill in chunks, then decode: {steps:?}");
    for call in &steps {
        match call {
            Call::Step { tokens, logit_rows } => assert!(*tokens <= 32 && *logit_rows <= 4, "a step over the reservation: {call:?}"),
            Call::Reserve { .. } => panic!("reserved again: {steps:?}"),
        }
    }
}
