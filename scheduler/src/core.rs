//! The scheduling state machine: `schedule()` builds a `ForwardBatch`,
//! `update()` consumes the `StepOutput`. Owned by one step-loop thread.
//!
//! Policy (vLLM v1-like): running sequences first, in admission order, each
//! taking `min(remaining, budget)` tokens (1 when decoding, a chunk of its
//! prompt while prefilling — chunked prefill, so a long prompt never stalls
//! running streams); then waiting sequences FCFS while budget, sequence cap
//! and KV blocks allow. When a running sequence cannot grow, the newest
//! running sequences are preempted (blocks freed, recomputed later through
//! the prefix cache) and no new sequence is admitted in that step.

use crate::config::{ModelLimits, SchedulerConfig};
use crate::kv_cache::{KvCacheConfig, KvCacheManager};
use crate::metrics::Metrics;
use crate::output::StopReason;
use crate::request::{FinishReason, GenerationEvent, GenerationRequest, GeneratedToken};
use crate::sequence::{RequestId, Sequence};
use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput, SeqSampling, StepOutput, TokenMask};
use spindle_engine::grammar::{Constraint, SharedConstraint};
use std::collections::VecDeque;
use spindle_engine::tokenizer::Tokenizer;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// What one step scheduled: the batch and, per entry, (request, new tokens).
pub struct Step {
    /// The batch for the engine.
    pub batch: ForwardBatch,
    pub(crate) plan: Vec<(RequestId, usize)>,
    /// Entries that sample under a grammar: (batch index, its constraint),
    /// whose masks [`Step::fill_masks`] computes.
    grammars: Vec<(usize, SharedConstraint)>,
}

impl Step {
    /// Computes each constrained entry's mask for this step, in parallel.
    fn fill_masks(&mut self) {
        // On the engine's pool (pool::run runs a single task inline), not
        // rayon's: waking rayon's workers put a third busy thread on the cores.
        let mut masks: Vec<Option<TokenMask>> = self.grammars.iter().map(|_| None).collect();
        let grammars = &self.grammars;
        spindle_engine::pool::for_each_mut(&mut masks, |i, mask| *mask = Some(lock(&grammars[i].1).next_mask()));
        for ((i, _), mask) in self.grammars.iter().zip(masks) {
            if let Some(s) = self.batch.seqs.get_mut(*i).and_then(|s| s.sampling.as_mut()) {
                s.mask = mask;
            }
        }
    }
}

fn lock(c: &SharedConstraint) -> std::sync::MutexGuard<'_, Constraint> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Scheduling state: the queues and the KV cache manager. The step loop in
/// [`crate::handle`] drives it; it is public for benchmarks and tests.
pub struct Scheduler {
    config: SchedulerConfig,
    limits: ModelLimits,
    kv: KvCacheManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    metrics: Arc<Metrics>,
    /// Sequences whose executor state (block tables, penalty histories) is
    /// to be dropped.
    released: Vec<RequestId>,
}

impl Scheduler {
    /// An empty scheduler over a cache of `limits`' shape.
    pub fn new(config: SchedulerConfig, limits: ModelLimits, metrics: Arc<Metrics>) -> Self {
        let kv = KvCacheManager::new(KvCacheConfig {
            num_blocks: limits.num_blocks,
            block_size: limits.block_size,
            enable_prefix_caching: config.enable_prefix_caching,
        });
        let scheduler = Self { config, limits, kv, waiting: VecDeque::new(), running: Vec::new(), metrics, released: Vec::new() };
        // The gauges describe the empty pool from the start, not from the first request.
        scheduler.publish_gauges();
        scheduler
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub(crate) fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
        self.publish_gauges();
    }

    /// Queue a request directly (no admission limits; the handle checks those).
    pub fn enqueue(
        &mut self,
        id: RequestId,
        request: GenerationRequest,
        tokenizer: Tokenizer,
    ) -> UnboundedReceiver<GenerationEvent> {
        let (tx, rx) = unbounded_channel();
        let seq = Sequence::new(id, request, tokenizer, self.config.model_salt, tx);
        self.metrics.try_enqueue(usize::MAX);
        self.add(seq);
        rx
    }

    /// Sequences that left the running set (finished, failed, aborted,
    /// preempted) since the last call: the executor forgets their tables
    /// and penalty histories.
    pub fn take_released(&mut self) -> Vec<RequestId> {
        std::mem::take(&mut self.released)
    }

    /// Each running sequence's block table, as the scheduler holds it (for
    /// tests that rebuild tables from the steps' deltas).
    pub fn running_tables(&self) -> Vec<(RequestId, Vec<u32>)> {
        self.running.iter().map(|s| (s.id, s.kv.blocks.clone())).collect()
    }

    /// The KV cache manager (for inspection).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// Plan the next step; `None` when nothing can run.
    pub fn schedule(&mut self) -> Option<Step> {
        let mut budget = self.config.max_num_batched_tokens;
        let mut step = Step { batch: ForwardBatch::default(), plan: Vec::new(), grammars: Vec::new() };
        let preempted = self.schedule_running(&mut budget, &mut step);
        // After a preemption only the requests just preempted may come back
        // (they are at the front of the queue), and only if nothing else ran.
        if !preempted || step.plan.is_empty() {
            self.admit_waiting(&mut budget, &mut step);
        }
        step.fill_masks();
        self.publish_gauges();
        (!step.plan.is_empty()).then_some(step)
    }

    fn schedule_running(&mut self, budget: &mut usize, step: &mut Step) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let n = self.running[i].remaining().min(*budget);
            let target = self.running[i].num_computed + n;
            while !self.kv.can_allocate(&self.running[i].kv, target) && self.running.len() > i + 1 {
                if let Some(victim) = self.running.pop() {
                    self.preempt(victim);
                    preempted = true;
                }
            }
            if self.kv.allocate(&mut self.running[i].kv, target).is_err() {
                let victim = self.running.remove(i);
                self.preempt(victim);
                preempted = true;
                continue;
            }
            push_entry(step, &mut self.running[i], n);
            *budget -= n;
            i += 1;
        }
        preempted
    }

    fn admit_waiting(&mut self, budget: &mut usize, step: &mut Step) {
        while *budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(seq) = self.waiting.front_mut() else { break };
            if seq.kv.blocks.is_empty() && seq.num_computed == 0 {
                let hit = self.kv.lookup_prefix(&mut seq.kv, &seq.tokens, seq.salt);
                seq.num_computed = hit.cached_tokens;
                if !seq.started {
                    seq.usage.cached_tokens = hit.cached_tokens;
                }
            }
            let n = seq.remaining().min(*budget);
            if self.kv.allocate(&mut seq.kv, seq.num_computed + n).is_err() {
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else { break };
            self.metrics.admitted();
            if !seq.started {
                seq.started = true;
                seq.send(GenerationEvent::Started { cached_tokens: seq.usage.cached_tokens });
            }
            push_entry(step, &mut seq, n);
            *budget -= n;
            self.running.push(seq);
        }
    }

    fn preempt(&mut self, mut seq: Sequence) {
        self.kv.free(&mut seq.kv);
        self.release(&mut seq);
        seq.num_computed = 0;
        self.metrics.preempted();
        self.waiting.push_front(seq);
    }

    /// Apply a step's results: advance computed positions, register full
    /// blocks, append sampled tokens, emit events, retire finished sequences.
    pub fn update(&mut self, step: &Step, output: StepOutput) {
        let mut retired: Vec<usize> = Vec::new();
        let mut cursor = 0;
        for ((id, n), out) in step.plan.iter().zip(output.seqs) {
            let Some(offset) = self.running[cursor..].iter().position(|s| s.id == *id) else { continue };
            let idx = cursor + offset;
            cursor = idx + 1;
            let seq = &mut self.running[idx];
            seq.num_computed += n;
            self.kv.commit(&mut seq.kv, &seq.tokens, seq.num_computed, seq.salt);
            let done = match out.sampled {
                Some(sampled) => {
                    accept_in_grammar(seq, sampled.token);
                    !advance(seq, sampled, self.limits.context_length)
                }
                None if out.grammar_ended => {
                    finish(seq, FinishReason::Eos);
                    true
                }
                None => false,
            };
            if done {
                if seq.events.is_closed() {
                    self.metrics.aborted(); // the caller dropped its stream
                }
                retired.push(idx);
            }
        }
        for idx in retired.into_iter().rev() {
            let mut seq = self.running.remove(idx);
            self.kv.free(&mut seq.kv);
            self.release(&mut seq);
        }
        self.publish_gauges();
    }

    /// Fail every sequence of a step whose forward pass failed.
    pub fn fail(&mut self, step: &Step, message: &str) {
        for (id, _) in &step.plan {
            if let Some(idx) = self.running.iter().position(|s| s.id == *id) {
                let mut seq = self.running.remove(idx);
                seq.send(GenerationEvent::Failed { message: message.to_string() });
                self.kv.free(&mut seq.kv);
                self.release(&mut seq);
            }
        }
        self.publish_gauges();
    }

    /// Remove a request wherever it is, returning its blocks.
    pub fn abort(&mut self, id: RequestId) {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            Some(self.running.remove(i))
        } else {
            self.waiting.iter().position(|s| s.id == id).and_then(|i| self.waiting.remove(i))
        };
        if let Some(mut seq) = seq {
            if !seq.started {
                self.metrics.admitted();
            }
            seq.send(GenerationEvent::Failed { message: "aborted".into() });
            self.kv.free(&mut seq.kv);
            self.release(&mut seq);
            self.metrics.aborted();
        }
        self.publish_gauges();
    }

    /// The executor is to forget `seq`'s table and penalty history (if it
    /// was ever sent them: both go only with a step, which sends a table).
    fn release(&mut self, seq: &mut Sequence) {
        seq.sent_history = None;
        if seq.sent_table.take().is_some() {
            self.released.push(seq.id);
        }
    }

    fn publish_gauges(&self) {
        self.metrics.set_gauges(self.running.len(), self.waiting.len(), self.kv.usage());
        self.metrics.set_prefix_stats(self.kv.stats());
    }
}

fn push_entry(step: &mut Step, seq: &mut Sequence, n: usize) {
    let start = seq.num_computed;
    let samples = start + n == seq.tokens.len();
    if let (true, Some(c)) = (samples, &seq.constraint) {
        step.grammars.push((step.batch.seqs.len(), c.clone()));
    }
    let sampling = samples.then(|| SeqSampling {
        params: seq.sampling.clone(),
        mask: None, // filled by `Step::fill_masks` once the step is planned
        generated: seq.output_tokens().len(),
        history: seq.history_for_step(),
    });
    let block_table = seq.table_for_step();
    step.batch.seqs.push(SeqInput {
        id: seq.id,
        tokens: seq.tokens[start..start + n].to_vec(),
        start_pos: start,
        block_table,
        logits: LogitsRequest::None,
        sampling,
    });
    step.plan.push((seq.id, n));
}

/// Advances the sequence's grammar past the token sampled under its mask.
fn accept_in_grammar(seq: &Sequence, token: u32) {
    if let Some(c) = &seq.constraint {
        if let Err(e) = lock(c).accept(token) {
            tracing::warn!("the grammar refused sampled token {token}: {e}");
        }
    }
}

/// Append a sampled token and emit its events; false when the sequence is done.
fn advance(seq: &mut Sequence, sampled: spindle_engine::sampling::SampledToken, context_length: usize) -> bool {
    let token = GeneratedToken { id: sampled.token, logprob: sampled.logprob, top_logprobs: sampled.top_logprobs };
    seq.tokens.push(token.id);
    let processed = match seq.output.push(token.id) {
        Ok(p) => p,
        Err(e) => {
            seq.send(GenerationEvent::Failed { message: e.to_string() });
            return false;
        }
    };
    seq.usage.output_tokens = seq.output.output_token_count();
    let is_eos = matches!(processed.finished, Some(StopReason::Eos));
    if !is_eos && !seq.send(GenerationEvent::Delta { text: processed.text_delta, token }) {
        return false;
    }
    let reason = match processed.finished {
        Some(StopReason::Eos) => FinishReason::Eos,
        Some(StopReason::StopString(s)) => FinishReason::StopString(s),
        Some(StopReason::MaxTokens) => FinishReason::MaxTokens,
        None if seq.tokens.len() >= context_length => FinishReason::ContextLength,
        None => return true,
    };
    finish(seq, reason);
    false
}

/// Flush held text and send the final event.
fn finish(seq: &mut Sequence, reason: FinishReason) {
    let text = seq.output.finish().unwrap_or_default();
    seq.send(GenerationEvent::Finished { reason, text, usage: seq.usage });
}
