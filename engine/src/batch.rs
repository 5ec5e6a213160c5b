//! The plain-data contract between the scheduler and the engine.

use crate::sampling::{SampledToken, SamplingParams};

/// Which logits a sequence wants back from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogitsRequest {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last new token's logits (what sampling uses).
    #[default]
    Last,
    /// Every new token's logits (for validation and scoring).
    All,
}

/// What a sequence needs to sample its next token.
#[derive(Debug, Clone, Default)]
pub struct SeqSampling {
    /// Sampling parameters.
    pub params: SamplingParams,
    /// The grammar the sample must follow (masked before, advanced after).
    pub constraint: Option<crate::grammar::SharedConstraint>,
    /// How many tokens the sequence has generated; with the seed it fixes the
    /// random draw, so a seeded sequence samples the same tokens whatever else
    /// is in the batch.
    pub generated: usize,
    /// Generated tokens (only needed for the penalties; empty otherwise).
    pub output_tokens: Vec<u32>,
    /// Prompt tokens (only needed for repetition_penalty; empty otherwise).
    pub prompt_tokens: Vec<u32>,
}

impl SeqSampling {
    /// Whether the penalties need the output tokens.
    pub fn needs_output_tokens(params: &SamplingParams) -> bool {
        params.repetition_penalty != 1.0 || params.presence_penalty != 0.0 || params.frequency_penalty != 0.0
    }

    /// Whether the penalties need the prompt tokens.
    pub fn needs_prompt_tokens(params: &SamplingParams) -> bool {
        params.repetition_penalty != 1.0
    }
}

/// Names a sequence across steps (the scheduler's request id).
pub type SeqId = u64;

/// A sequence's KV block table as a step carries it: whole, or as the
/// blocks appended since the sequence's previous step, so what a running
/// sequence sends per step is O(new blocks), not O(context). The executor
/// keeps tables by [`SeqId`] until released (`Executor::release`); a step
/// that fails leaves its sequences' kept tables undefined, so the caller
/// releases them (the scheduler fails and releases every sequence of a
/// failed step). Callers that never release should reuse ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockTable {
    /// The whole table (a new or resumed sequence, or one whose table
    /// changed other than by appending); the executor keeps it under the
    /// sequence's id.
    Full(Vec<u32>),
    /// Blocks to append to the table the executor kept from this
    /// sequence's previous step.
    Append(Vec<u32>),
}

impl Default for BlockTable {
    fn default() -> Self {
        Self::Full(Vec::new())
    }
}

impl From<Vec<u32>> for BlockTable {
    fn from(table: Vec<u32>) -> Self {
        Self::Full(table)
    }
}

/// One sequence's share of a forward step.
#[derive(Debug, Clone, Default)]
pub struct SeqInput {
    /// The sequence, for tables kept across steps (any value where every
    /// step sends [`BlockTable::Full`]).
    pub id: SeqId,
    /// New token ids to run (a prefill chunk, or one decode token).
    pub tokens: Vec<u32>,
    /// Position of the first new token (= tokens already in the KV cache).
    pub start_pos: usize,
    /// Physical KV blocks covering positions `0..start_pos + tokens.len()`.
    pub block_table: BlockTable,
    /// Which logits to return.
    pub logits: LogitsRequest,
    /// Sample a token from the last position's logits, if set.
    pub sampling: Option<SeqSampling>,
}

/// A batch of sequences run in one forward pass; prefill and decode may mix.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch {
    /// The sequences.
    pub seqs: Vec<SeqInput>,
}

/// One sequence's result.
#[derive(Debug, Clone, Default)]
pub struct SeqOutput {
    /// Logits as requested (`[n, vocab]` flattened; empty for `None`).
    pub logits: Vec<f32>,
    /// The sampled token, when sampling was asked for.
    pub sampled: Option<SampledToken>,
    /// The sequence's grammar allowed no token (finished, and the tokenizer
    /// has no EOS to end on): nothing was sampled and the sequence ends.
    pub grammar_ended: bool,
}

/// The result of a forward step, one entry per input sequence, in order.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Per-sequence results.
    pub seqs: Vec<SeqOutput>,
}

impl ForwardBatch {
    /// Total new tokens across sequences.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}
