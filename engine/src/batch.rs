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

/// What a sequence needs to sample its next token: plain data, computed
/// where the sequence lives (the scheduler).
#[derive(Debug, Clone, Default)]
pub struct SeqSampling {
    /// Sampling parameters.
    pub params: SamplingParams,
    /// The tokens its grammar allows at this step (`None`: unconstrained).
    pub mask: Option<TokenMask>,
    /// How many tokens the sequence has generated; with the seed it fixes the
    /// random draw, so a seeded sequence samples the same tokens whatever else
    /// is in the batch.
    pub generated: usize,
    /// The history the penalties count (`None` when no penalty is on).
    pub history: Option<PenaltyHistory>,
}

/// A sequence's history for the penalties as a step carries it: whole, or
/// as the tokens generated since it was last sent. The executor keeps the
/// counts by [`SeqId`] until released, as it keeps block tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PenaltyHistory {
    /// The whole history: the prompt's tokens (only where the repetition
    /// penalty is on) and the generated ones.
    Full {
        /// Prompt tokens.
        prompt: Vec<u32>,
        /// Generated tokens.
        output: Vec<u32>,
    },
    /// Tokens generated since the history was last sent.
    Append(Vec<u32>),
}

/// The tokens a grammar allows next, as bits (bit `t % 32` of word `t / 32`;
/// ids past the words are forbidden). No bit set: the grammar allows
/// nothing, and the sequence ends without sampling.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask of these words.
    pub fn from_words(words: Vec<u32>) -> Self {
        Self { words }
    }

    /// A mask that allows nothing.
    pub fn nothing() -> Self {
        Self::default()
    }

    /// The words (bit `t % 32` of word `t / 32`).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The words over exactly `vocab` ids (`vocab.div_ceil(32)` words; bits
    /// at or past `vocab` clear), for a sampler that masks on its own.
    pub fn words_for(&self, vocab: usize) -> Vec<u32> {
        let mut words: Vec<u32> = (0..vocab.div_ceil(32)).map(|w| self.words.get(w).copied().unwrap_or(0)).collect();
        if let (Some(last), tail @ 1..) = (words.last_mut(), vocab % 32) {
            *last &= (1u32 << tail) - 1;
        }
        words
    }

    /// Whether token `id` is allowed.
    pub fn allows(&self, id: u32) -> bool {
        self.words.get(id as usize / 32).is_some_and(|w| w & (1 << (id % 32)) != 0)
    }

    /// Whether no token is allowed.
    pub fn allows_none(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// Sets every logit whose token is not allowed to `-inf`.
    pub fn apply(&self, logits: &mut [f32]) {
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = self.words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, logit) in chunk.iter_mut().enumerate() {
                if bits & (1 << b) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_forbids_every_token_whose_bit_is_clear_and_every_token_past_it() {
        let mask = TokenMask::from_words(vec![0b101, u32::MAX]);
        let mut logits = vec![1.0; 70];
        mask.apply(&mut logits);
        let allowed: Vec<usize> = (0..70).filter(|&t| logits[t] == 1.0).collect();
        let expected: Vec<usize> = [0, 2].into_iter().chain(32..64).collect();
        assert_eq!(allowed, expected);
        assert!(allowed.iter().all(|&t| mask.allows(t as u32)) && !mask.allows(1) && !mask.allows(64));
        assert!(!mask.allows_none() && TokenMask::nothing().allows_none() && TokenMask::from_words(vec![0, 0]).allows_none());
    }

    #[test]
    fn words_for_a_vocabulary_are_cut_or_padded_to_it() {
        let mask = TokenMask::from_words(vec![u32::MAX, u32::MAX]);
        assert_eq!(mask.words_for(40), vec![u32::MAX, 0xFF], "bits past 40 cleared");
        assert_eq!(mask.words_for(96), vec![u32::MAX, u32::MAX, 0], "ids past the mask forbidden");
        assert_eq!(mask.words_for(32), vec![u32::MAX]);
    }
}
