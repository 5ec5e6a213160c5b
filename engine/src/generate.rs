//! A single-sequence generation loop over an [`Executor`] (either backend): chunked prefill,
//! then one decode step per token. The CLI and tests use it; the server uses
//! the scheduler instead.

use crate::batch::{ForwardBatch, LogitsRequest, PenaltyHistory, SeqInput, SeqSampling};
use crate::error::{EngineError, Result};
use crate::kv::BlockAllocator;
use crate::runner::Executor;
use crate::sampling::{SampledToken, SamplingParams};
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The prompt, already tokenized.
    pub prompt: Vec<u32>,
    /// Stop after this many new tokens.
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Token ids that end generation (not emitted).
    pub stop_tokens: Vec<u32>,
    /// Largest prefill chunk per forward pass.
    pub prefill_chunk: usize,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The context window is full.
    ContextFull,
    /// The token callback asked to stop.
    Cancelled,
}

/// Counts and timings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (stop token excluded).
    pub generated_tokens: usize,
    /// Time to process the prompt and sample the first token.
    pub prefill_time: Duration,
    /// Time spent in decode steps.
    pub decode_time: Duration,
    /// Why it stopped.
    pub finish: FinishReason,
}

/// Run `req`, calling `on_token` with each generated token (return `false` to stop).
pub fn generate(
    runner: &mut dyn Executor,
    alloc: &mut BlockAllocator,
    req: &GenerateRequest,
    on_token: &mut dyn FnMut(&SampledToken) -> bool,
) -> Result<GenerateStats> {
    let mut table = Vec::new();
    let result = generate_inner(runner, alloc, req, &mut table, on_token);
    alloc.release(&mut table);
    result
}

fn generate_inner(
    runner: &mut dyn Executor,
    alloc: &mut BlockAllocator,
    req: &GenerateRequest,
    table: &mut Vec<u32>,
    on_token: &mut dyn FnMut(&SampledToken) -> bool,
) -> Result<GenerateStats> {
    let ctx = runner.context_length();
    if req.prompt.is_empty() {
        return Err(EngineError::InvalidBatch("empty prompt".into()));
    }
    if req.prompt.len() >= ctx {
        return Err(EngineError::ContextLengthExceeded { len: req.prompt.len(), max: ctx });
    }
    let bs = runner.block_size();
    // The penalties' history goes whole with the first sample, then one
    // token per step (the executor keeps it under id 0).
    let prompt = if req.sampling.penalizes_prompt() { req.prompt.clone() } else { Vec::new() };
    let penalised = req.sampling.has_penalties();
    let first_history = PenaltyHistory::Full { prompt, output: Vec::new() };
    let mut sampling = SeqSampling { params: req.sampling.clone(), mask: None, generated: 0, history: penalised.then_some(first_history) };
    let started = Instant::now();
    let chunk = req.prefill_chunk.max(1);
    let mut pos = 0;
    let mut next = None;
    while pos < req.prompt.len() {
        let end = (pos + chunk).min(req.prompt.len());
        alloc.ensure(table, end, bs)?;
        let last = end == req.prompt.len();
        let seq = SeqInput {
            id: 0,
            tokens: req.prompt[pos..end].to_vec(),
            start_pos: pos,
            block_table: table.clone().into(),
            logits: LogitsRequest::None,
            sampling: last.then(|| sampling.clone()),
        };
        next = runner.execute(&ForwardBatch { seqs: vec![seq] })?.seqs.pop().and_then(|s| s.sampled);
        pos = end;
    }
    let prefill_time = started.elapsed();
    let decode_start = Instant::now();
    let mut generated = 0;
    let finish = loop {
        let Some(tok) = next.take() else {
            return Err(EngineError::InvalidBatch("the runner returned no sampled token".into()));
        };
        if req.stop_tokens.contains(&tok.token) {
            break FinishReason::Stop;
        }
        generated += 1;
        if !on_token(&tok) {
            break FinishReason::Cancelled;
        }
        sampling.generated += 1;
        if penalised {
            sampling.history = Some(PenaltyHistory::Append(vec![tok.token]));
        }
        if generated >= req.max_tokens {
            break FinishReason::Length;
        }
        if pos + 1 > ctx - 1 {
            break FinishReason::ContextFull;
        }
        alloc.ensure(table, pos + 1, bs)?;
        let seq = SeqInput {
            id: 0,
            tokens: vec![tok.token],
            start_pos: pos,
            block_table: table.clone().into(),
            logits: LogitsRequest::None,
            sampling: Some(sampling.clone()),
        };
        next = runner.execute(&ForwardBatch { seqs: vec![seq] })?.seqs.pop().and_then(|s| s.sampled);
        pos += 1;
    };
    Ok(GenerateStats {
        prompt_tokens: req.prompt.len(),
        generated_tokens: generated,
        prefill_time,
        decode_time: decode_start.elapsed(),
        finish,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::KvGeometry;
    use crate::batch::{SeqOutput, StepOutput};
    use crate::sampling::PenaltyBook;

    /// Keeps penalty histories as a real executor does and samples a
    /// repeating token sequence, recording the counts it saw each sample.
    #[derive(Default)]
    struct CountingRunner {
        book: PenaltyBook,
        seen: Vec<Vec<(u32, u32)>>,
        whole: usize,
    }

    impl Executor for CountingRunner {
        fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
            self.book.update(batch)?;
            let history = batch.seqs[0].sampling.as_ref().and_then(|s| s.history.as_ref());
            self.whole += usize::from(matches!(history, Some(PenaltyHistory::Full { .. })));
            let counts = self.book.for_batch(batch);
            self.seen.push(counts[0].map(|c| c.seen().to_vec()).unwrap_or_default());
            let token = 7 + (self.seen.len() % 2) as u32;
            let sampled = batch.seqs[0].sampling.as_ref().map(|_| SampledToken { token, logprob: 0.0, top_logprobs: Vec::new() });
            Ok(StepOutput { seqs: vec![SeqOutput { sampled, ..SeqOutput::default() }] })
        }

        fn context_length(&self) -> usize {
            64
        }

        fn kv_geometry(&self) -> KvGeometry {
            KvGeometry { block_size: 4, num_blocks: 16, bytes_per_block: 0 }
        }
    }

    #[test]
    fn the_penalty_history_goes_whole_once_then_one_token_per_step() -> Result<()> {
        let sampling = SamplingParams { repetition_penalty: 1.2, ..SamplingParams::default() };
        let req = GenerateRequest { prompt: vec![3, 3, 5], max_tokens: 4, sampling, stop_tokens: Vec::new(), prefill_chunk: 8 };
        let (mut runner, mut alloc) = (CountingRunner::default(), BlockAllocator::new(16));
        generate(&mut runner, &mut alloc, &req, &mut |_| true)?;
        // Samples 8, 7, 8, 7: each step counts the prompt and every earlier token.
        let expected = vec![vec![(3, 0), (5, 0)], vec![(3, 0), (5, 0), (8, 1)], vec![(3, 0), (5, 0), (7, 1), (8, 1)], vec![(3, 0), (5, 0), (7, 1), (8, 2)]];
        assert_eq!(runner.seen, expected);
        assert_eq!(runner.whole, 1, "the whole history is sent once");
        Ok(())
    }
}
