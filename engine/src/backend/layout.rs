//! One step's plan, shared by every backend: the batch validated against
//! the model and the cache, and flattened into the index arrays kernels
//! take. Sequences are laid out in step order: those with one new token
//! (decode) first, then the rest, so each attention kernel takes a
//! contiguous run of rows; per-sequence arrays are in step order, `ranges`
//! in batch order.

use crate::batch::{ForwardBatch, LogitsRequest};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use std::ops::Range;

/// The index arrays of one step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLayout {
    /// Per row (new token, step order): its token id.
    pub ids: Vec<u32>,
    /// Per row: its position in its sequence.
    pub positions: Vec<usize>,
    /// Per row: the cache slot its key and value go to (block × block_size + offset).
    pub slots: Vec<i64>,
    /// Per sequence: its block table, padded with zeros to `max_blocks`.
    pub tables: Vec<i32>,
    /// Width of each row of `tables`.
    pub max_blocks: usize,
    /// Per sequence: its first row (and the total last).
    pub q_starts: Vec<i32>,
    /// Per sequence: the position of its first new token.
    pub start_pos: Vec<i32>,
    /// Per row: its sequence (step order).
    pub seq_of: Vec<usize>,
    /// How many sequences (first in step order) have one new token.
    pub decode_seqs: usize,
    /// The rows whose logits are wanted, in the order the logits come back.
    pub rows: Vec<u32>,
    /// Per sequence in batch order: its range of `rows`.
    pub ranges: Vec<Range<usize>>,
    /// Tokens per cache block.
    pub block_size: usize,
}

impl StepLayout {
    /// The step's arrays for `batch` on a cache of `num_blocks` blocks of
    /// `block_size`, `tables[i]` being sequence `i`'s whole block table (as
    /// the executor resolved it); a batch the model or the cache cannot take
    /// is an error.
    pub fn new(c: &ModelConfig, block_size: usize, num_blocks: usize, batch: &ForwardBatch, tables: &[&[u32]]) -> Result<Self> {
        if tables.len() != batch.seqs.len() {
            return Err(EngineError::InvalidBatch(format!("{} block tables for {} sequences", tables.len(), batch.seqs.len())));
        }
        let max_blocks = tables.iter().map(|t| t.len()).max().unwrap_or(0).max(1);
        let tokens = batch.num_tokens();
        let mut p = StepLayout {
            ids: Vec::with_capacity(tokens),
            positions: Vec::with_capacity(tokens),
            slots: Vec::with_capacity(tokens),
            tables: Vec::with_capacity(batch.seqs.len() * max_blocks),
            max_blocks,
            q_starts: vec![0],
            start_pos: Vec::with_capacity(batch.seqs.len()),
            seq_of: Vec::with_capacity(tokens),
            decode_seqs: batch.seqs.iter().filter(|s| s.tokens.len() == 1).count(),
            rows: Vec::new(),
            ranges: vec![0..0; batch.seqs.len()],
            block_size,
        };
        let decode_first = (0..batch.seqs.len()).filter(|&i| batch.seqs[i].tokens.len() == 1);
        let order: Vec<usize> = decode_first.chain((0..batch.seqs.len()).filter(|&i| batch.seqs[i].tokens.len() != 1)).collect();
        for (step_index, &i) in order.iter().enumerate() {
            p.push_seq(c, num_blocks, batch, tables[i], i, step_index)?;
        }
        Ok(p)
    }

    fn push_seq(&mut self, c: &ModelConfig, num_blocks: usize, batch: &ForwardBatch, table: &[u32], i: usize, step_index: usize) -> Result<()> {
        let seq = &batch.seqs[i];
        let block_size = self.block_size;
        if seq.tokens.is_empty() {
            return Err(EngineError::InvalidBatch(format!("sequence {i} has no new tokens")));
        }
        let end = seq.start_pos + seq.tokens.len();
        if end > c.context_length {
            return Err(EngineError::ContextLengthExceeded { len: end, max: c.context_length });
        }
        if let Some(bad) = seq.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(EngineError::InvalidBatch(format!("token id {bad} is outside the vocabulary")));
        }
        if end.div_ceil(block_size) > table.len() {
            return Err(EngineError::InvalidBatch(format!("block table of {} blocks does not cover position {}", table.len(), end - 1)));
        }
        if let Some(bad) = table.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(EngineError::InvalidBatch(format!("block {bad} is outside the pool of {num_blocks}")));
        }
        let first_token = self.ids.len();
        self.tables.extend(table.iter().map(|&b| b as i32));
        self.tables.resize(self.tables.len() + self.max_blocks - table.len(), 0);
        self.start_pos.push(seq.start_pos as i32);
        for (j, &tok) in seq.tokens.iter().enumerate() {
            let pos = seq.start_pos + j;
            self.ids.push(tok);
            self.positions.push(pos);
            self.slots.push((table[pos / block_size] as usize * block_size + pos % block_size) as i64);
            self.seq_of.push(step_index);
        }
        self.q_starts.push(self.ids.len() as i32);
        let wanted = match seq.logits {
            LogitsRequest::None if seq.sampling.is_none() => 0..0,
            LogitsRequest::All => 0..seq.tokens.len(),
            _ => seq.tokens.len() - 1..seq.tokens.len(),
        };
        let start = self.rows.len();
        self.rows.extend(wanted.map(|j| (first_token + j) as u32));
        self.ranges[i] = start..self.rows.len();
        Ok(())
    }

    /// New tokens in the step.
    pub fn num_rows(&self) -> usize {
        self.ids.len()
    }

    /// Sequences in the step.
    pub fn num_seqs(&self) -> usize {
        self.start_pos.len()
    }

    /// Sequence `s`'s (step order) block table.
    pub fn table(&self, s: usize) -> &[i32] {
        &self.tables[s * self.max_blocks..(s + 1) * self.max_blocks]
    }

    /// The cache slot of position `pos` of sequence `s` (step order).
    pub fn slot(&self, s: usize, pos: usize) -> usize {
        self.table(s)[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// Sequence `s`'s rows (step order).
    pub fn seq_rows(&self, s: usize) -> Range<usize> {
        self.q_starts[s] as usize..self.q_starts[s + 1] as usize
    }

    /// Splits logits of the wanted rows (`[rows.len(), vocab]`, in `rows`
    /// order) into each sequence's share, in batch order.
    pub fn split_logits(&self, logits: &[f32], vocab: usize) -> Vec<Vec<f32>> {
        self.ranges.iter().map(|r| logits[r.start * vocab..r.end * vocab].to_vec()).collect()
    }
}

#[cfg(all(test, feature = "cuda"))]
impl StepLayout {
    /// A decode-only layout: one token per sequence, tables `max_blocks` wide.
    pub(crate) fn for_test(ids: Vec<u32>, positions: Vec<usize>, slots: Vec<i64>, tables: Vec<i32>, max_blocks: usize) -> Self {
        let n = ids.len();
        Self {
            start_pos: positions.iter().map(|&p| p as i32).collect(),
            q_starts: (0..=n as i32).collect(),
            seq_of: (0..n).collect(),
            decode_seqs: n,
            rows: (0..n as u32).collect(),
            ranges: (0..n).map(|i| i..i + 1).collect(),
            ids,
            positions,
            slots,
            tables,
            max_blocks,
            block_size: 16,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::batch::{SeqInput, SeqSampling};
    use crate::sampling::SamplingParams;

    /// A small Llama-shaped config.
    fn config() -> ModelConfig {
        let json = serde_json::json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0});
        ModelConfig::from_hf_json(&json).unwrap()
    }

    fn seq(tokens: Vec<u32>, start_pos: usize, table: Vec<u32>, logits: LogitsRequest, sampled: bool) -> SeqInput {
        let sampling = sampled.then(|| SeqSampling { params: SamplingParams::default(), ..SeqSampling::default() });
        SeqInput { id: 0, tokens, start_pos, block_table: table.into(), logits, sampling }
    }

    /// Each sequence's table as sent whole.
    fn full_tables(batch: &ForwardBatch) -> Vec<&[u32]> {
        batch.seqs.iter().map(|s| match &s.block_table { crate::batch::BlockTable::Full(t) => t.as_slice(), crate::batch::BlockTable::Append(_) => &[][..] }).collect()
    }

    #[test]
    fn decode_sequences_come_first_and_ranges_stay_in_batch_order() {
        // Batch order: a prefill chunk (all logits), a decode step (sampled),
        // a prefill chunk (nothing wanted), a decode step (last logits).
        let batch = ForwardBatch { seqs: vec![
            seq(vec![1, 2, 3], 16, vec![4, 5], LogitsRequest::All, false),
            seq(vec![7], 40, vec![0, 1, 2], LogitsRequest::None, true),
            seq(vec![8, 9], 0, vec![6], LogitsRequest::None, false),
            seq(vec![10], 5, vec![3], LogitsRequest::Last, false),
        ] };
        let p = StepLayout::new(&config(), 16, 8, &batch, &full_tables(&batch)).unwrap();
        // Step order: seqs 1 and 3 (decode), then 0 and 2.
        assert_eq!(p.decode_seqs, 2);
        assert_eq!(p.ids, vec![7, 10, 1, 2, 3, 8, 9]);
        assert_eq!(p.positions, vec![40, 5, 16, 17, 18, 0, 1]);
        assert_eq!(p.slots, vec![2 * 16 + 8, 3 * 16 + 5, 5 * 16, 5 * 16 + 1, 5 * 16 + 2, 6 * 16, 6 * 16 + 1]);
        assert_eq!(p.q_starts, vec![0, 1, 2, 5, 7]);
        assert_eq!(p.start_pos, vec![40, 5, 16, 0]);
        assert_eq!(p.seq_of, vec![0, 1, 2, 2, 2, 3, 3]);
        assert_eq!(p.max_blocks, 3);
        assert_eq!(p.tables, vec![0, 1, 2, 3, 0, 0, 4, 5, 0, 6, 0, 0]);
        assert_eq!(p.slot(2, 17), 5 * 16 + 1);
        assert_eq!(p.seq_rows(2), 2..5);
        // Logits rows: seq 1's token (row 0), seq 3's (row 1), seq 0's three (rows 2..5).
        assert_eq!(p.rows, vec![0, 1, 2, 3, 4]);
        let rows_of = |i: usize| p.ranges[i].clone().map(|r| p.rows[r]).collect::<Vec<_>>();
        assert_eq!(rows_of(0), vec![2, 3, 4]);
        assert_eq!(rows_of(1), vec![0]);
        assert!(rows_of(2).is_empty());
        assert_eq!(rows_of(3), vec![1]);
        let split = p.split_logits(&[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5], 2);
        assert_eq!(split, vec![vec![2.0, 2.5, 3.0, 3.5, 4.0, 4.5], vec![0.0, 0.5], vec![], vec![1.0, 1.5]]);
    }

    #[test]
    fn batches_the_cache_or_model_cannot_take_are_errors() {
        let c = config();
        let bad = |s: SeqInput| {
            let batch = ForwardBatch { seqs: vec![s] };
            StepLayout::new(&c, 16, 8, &batch, &full_tables(&batch)).unwrap_err().to_string()
        };
        assert!(bad(seq(vec![], 0, vec![0], LogitsRequest::None, false)).contains("no new tokens"));
        assert!(bad(seq(vec![100], 0, vec![0], LogitsRequest::None, false)).contains("outside the vocabulary"));
        assert!(bad(seq(vec![1; 17], 0, vec![0], LogitsRequest::None, false)).contains("does not cover"));
        assert!(bad(seq(vec![1], 0, vec![8], LogitsRequest::None, false)).contains("outside the pool"));
        let long = ForwardBatch { seqs: vec![seq(vec![1], 4096, vec![0; 257], LogitsRequest::None, false)] };
        assert!(matches!(StepLayout::new(&c, 16, 8, &long, &full_tables(&long)), Err(EngineError::ContextLengthExceeded { .. })));
        let batch = ForwardBatch { seqs: vec![seq(vec![1], 0, vec![0], LogitsRequest::None, false)] };
        assert!(StepLayout::new(&c, 16, 8, &batch, &[]).is_err(), "a table per sequence");
    }
}
