//! One forward step on the GPU: the batch's new tokens through every layer
//! (writing their keys and values into the paged cache), then the logits the
//! sequences asked for: sampled on the GPU where it can, else copied to the host.

use super::CudaModel;
use crate::batch::{ForwardBatch, LogitsRequest};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use cudarc::driver::CudaSlice;
use half::bf16;
use super::sample::DeviceRow;
use rayon::prelude::*;
use crate::runner::Presampled;
use crate::sampling::SampledToken;
use super::step::{Inputs, Workspace};
use spindle_kernels::device::{Gpu, RowSampling};
use std::ops::Range;

/// The host-side index arrays of one step. Sequences are laid out in step
/// order: those with one new token (decode) first, then the rest, so each
/// attention kernel takes a contiguous run of rows; per-sequence arrays are
/// in step order, `ranges` in batch order.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) ids: Vec<u32>,
    pub(super) positions: Vec<usize>,
    pub(super) slots: Vec<i64>,
    /// Per sequence: its block table, padded to `max_blocks`.
    pub(super) tables: Vec<i32>,
    pub(super) max_blocks: usize,
    /// Per sequence: its first row among the new tokens (and the total last).
    pub(super) q_starts: Vec<i32>,
    /// Per sequence: the position of its first new token.
    pub(super) start_pos: Vec<i32>,
    /// Per token: its sequence (in step order).
    pub(super) seq_of: Vec<usize>,
    /// How many sequences (first in step order) have one new token.
    pub(super) decode_seqs: usize,
    /// Tokens whose logits are wanted, and each sequence's range of them.
    rows: Vec<u32>,
    ranges: Vec<Range<usize>>,
}

impl CudaModel {
    fn plan(&self, batch: &ForwardBatch) -> Result<Plan> {
        Plan::new(&self.config, self.block_size, self.num_blocks, batch)
    }
}

impl Plan {
    /// The step's arrays for `batch` on a cache of `num_blocks` blocks of
    /// `block_size`; a batch the model or the cache cannot take is an error.
    fn new(c: &ModelConfig, block_size: usize, num_blocks: usize, batch: &ForwardBatch) -> Result<Self> {
        let max_blocks = batch.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0).max(1);
        let mut p = Plan {
            ids: Vec::new(),
            positions: Vec::new(),
            slots: Vec::new(),
            tables: Vec::new(),
            max_blocks,
            q_starts: vec![0],
            start_pos: Vec::new(),
            seq_of: Vec::new(),
            decode_seqs: batch.seqs.iter().filter(|s| s.tokens.len() == 1).count(),
            rows: Vec::new(),
            ranges: vec![0..0; batch.seqs.len()],
        };
        let decode_first = (0..batch.seqs.len()).filter(|&i| batch.seqs[i].tokens.len() == 1);
        let order: Vec<usize> = decode_first.chain((0..batch.seqs.len()).filter(|&i| batch.seqs[i].tokens.len() != 1)).collect();
        for (step_index, &i) in order.iter().enumerate() {
            let seq = &batch.seqs[i];
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
            if end.div_ceil(block_size) > seq.block_table.len() {
                return Err(EngineError::InvalidBatch(format!("block table of {} blocks does not cover position {}", seq.block_table.len(), end - 1)));
            }
            if let Some(bad) = seq.block_table.iter().find(|&&b| b as usize >= num_blocks) {
                return Err(EngineError::InvalidBatch(format!("block {bad} is outside the pool of {num_blocks}")));
            }
            let mut table: Vec<i32> = seq.block_table.iter().map(|&b| b as i32).collect();
            table.resize(max_blocks, 0);
            let first_token = p.ids.len();
            p.tables.extend_from_slice(&table);
            p.start_pos.push(seq.start_pos as i32);
            for (j, &tok) in seq.tokens.iter().enumerate() {
                let pos = seq.start_pos + j;
                p.ids.push(tok);
                p.positions.push(pos);
                p.slots.push((seq.block_table[pos / block_size] as usize * block_size + pos % block_size) as i64);
                p.seq_of.push(step_index);
            }
            p.q_starts.push(p.ids.len() as i32);
            let wanted = match seq.logits {
                LogitsRequest::None if seq.sampling.is_none() => 0..0,
                LogitsRequest::All => 0..seq.tokens.len(),
                _ => seq.tokens.len() - 1..seq.tokens.len(),
            };
            let start = p.rows.len();
            p.rows.extend(wanted.map(|j| (first_token + j) as u32));
            p.ranges[i] = start..p.rows.len();
        }
        Ok(p)
    }
}

#[cfg(test)]
impl Plan {
    /// A decode-only plan: one token per sequence, tables `max_blocks` wide.
    pub(super) fn for_test(ids: Vec<u32>, positions: Vec<usize>, slots: Vec<i64>, tables: Vec<i32>, max_blocks: usize) -> Self {
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
        }
    }
}

impl CudaModel {
    /// Runs the batch; returns, per sequence, the requested logits
    /// (flattened), as the CPU model does. Nothing is sampled.
    pub fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>> {
        Ok(self.run(batch, false)?.logits)
    }

    /// Runs the batch and samples on the GPU the sequences whose sampling
    /// the device kernel reproduces (see [`super::sample`]); their logits
    /// stay on the device. The others get their logits, as [`Self::forward`].
    pub fn forward_step(&mut self, batch: &ForwardBatch) -> Result<StepLogits> {
        let on_device = self.device_sampling;
        self.run(batch, on_device)
    }

    fn run(&mut self, batch: &ForwardBatch, device_sampling: bool) -> Result<StepLogits> {
        let p = self.plan(batch)?;
        if self.graph_eligible(&p) {
            // Logits rows are the step's tokens: each sequence's one row.
            let ranges: Vec<Range<usize>> = p.ranges.iter().map(|r| if r.is_empty() { 0..0 } else { p.rows[r.start] as usize..p.rows[r.start] as usize + 1 }).collect();
            let device = self.device_rows(batch, &ranges, device_sampling);
            let vocab = self.config.vocab_size;
            if let Some(step) = self.run_graph(&p, |g, logits| finish(g, batch, vocab, &ranges, Some(logits), &device))? {
                return Ok(step);
            }
        }
        let t = p.ids.len();
        let s = &self.gpu.stream;
        let angles = self.rope.angles(&p.positions);
        let inputs = Inputs { ids: s.clone_htod(&p.ids)?, slots: s.clone_htod(&p.slots)?, cos: s.clone_htod(angles.cos())?, sin: s.clone_htod(angles.sin())? };
        let attention = super::attention::plan(self, &p)?;
        let mut ws = match self.workspace.take() {
            Some(ws) if ws.capacity >= t => ws,
            _ => Workspace::new(&self.gpu, &self.config, t)?,
        };
        let pass = self.layer_pass(&mut ws, &inputs, &attention, t);
        let logits = pass.and_then(|()| self.eager_logits(&p, &ws.hn));
        self.workspace = Some(ws);
        let mut logits = logits?;
        let device = self.device_rows(batch, &p.ranges, device_sampling);
        finish(&self.gpu, batch, self.config.vocab_size, &p.ranges, logits.as_mut(), &device)
    }

    fn device_rows(&self, batch: &ForwardBatch, ranges: &[Range<usize>], on: bool) -> Vec<Option<DeviceRow>> {
        if on {
            super::sample::device_rows(batch, ranges)
        } else {
            vec![None; batch.seqs.len()]
        }
    }

    /// The wanted rows of the final hidden states through the output head
    /// (rows in `p.rows` order), or `None` when no row is wanted.
    fn eager_logits(&self, p: &Plan, hidden: &CudaSlice<bf16>) -> Result<Option<CudaSlice<f32>>> {
        let (g, vocab, h) = (&self.gpu, self.config.vocab_size, self.config.hidden_size);
        let r = p.rows.len();
        if r == 0 {
            return Ok(None);
        }
        let rows = g.stream.clone_htod(&p.rows)?;
        let mut picked = g.stream.alloc_zeros::<bf16>(r * h)?;
        g.embedding(&mut picked, hidden, &rows, r, h, p.ids.len() as u32)?;
        let mut logits = g.stream.alloc_zeros::<f32>(r * vocab)?;
        g.gemm(&mut logits, &picked, self.lm_head.as_ref().unwrap_or(&self.embed), r, vocab, h)?;
        Ok(Some(logits))
    }
}

/// Per sequence (its rows of `logits` in `ranges`): sampled on the GPU where
/// `device` says so (its grammar masked first and advanced after), else its
/// logits copied to the host.
fn finish(g: &Gpu, batch: &ForwardBatch, vocab: usize, ranges: &[Range<usize>], logits: Option<&mut CudaSlice<f32>>, device: &[Option<DeviceRow>]) -> Result<StepLogits> {
    let mut host = Vec::new();
    let mut sampled: Vec<Presampled> = vec![Presampled::No; ranges.len()];
    if let Some(logits) = logits {
        // Penalty lists and grammar masks (llguidance), one sequence per
        // thread, while the GPU runs the step.
        let completed: Vec<(usize, Option<RowSampling>)> = device
            .par_iter()
            .enumerate()
            .filter_map(|(i, d)| d.as_ref().map(|d| (i, super::sample::complete(d, &batch.seqs[i], vocab))))
            .collect();
        let mut wanted: Vec<(usize, RowSampling)> = Vec::new();
        for (i, row) in completed {
            match row {
                Some(row) => wanted.push((i, row)),
                // The grammar allows nothing more: the sequence ends here.
                None => sampled[i] = Presampled::GrammarEnded,
            }
        }
        let rows: Vec<RowSampling> = wanted.iter().map(|(_, r)| r.clone()).collect();
        for ((seq, _), s) in wanted.iter().zip(g.sample_rows(logits, vocab, &rows)?) {
            if let Some(c) = device[*seq].as_ref().and_then(|d| d.constraint.as_ref()) {
                if let Err(e) = lock(c).accept(s.token) {
                    tracing::warn!("the grammar refused sampled token {}: {e}", s.token);
                }
            }
            sampled[*seq] = Presampled::Token(SampledToken { token: s.token, logprob: s.logprob, top_logprobs: Vec::new() });
        }
        if ranges.iter().zip(&sampled).any(|(range, s)| *s == Presampled::No && !range.is_empty()) {
            // Only the rows sequences own (a graph's buffer has padding rows).
            let rows = ranges.iter().map(|r| r.end).max().unwrap_or(0);
            host = g.stream.clone_dtoh(&logits.slice(..rows * vocab))?;
        }
    }
    let logits = ranges
        .iter()
        .zip(&sampled)
        .map(|(range, s)| if *s != Presampled::No || range.is_empty() { Vec::new() } else { host[range.start * vocab..range.end * vocab].to_vec() })
        .collect();
    Ok(StepLogits { logits, sampled })
}

fn lock(c: &crate::grammar::SharedConstraint) -> std::sync::MutexGuard<'_, crate::grammar::Constraint> {
    c.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A step's results: per sequence, its logits on the host, or the token the
/// GPU sampled for it (then its logits are empty).
#[derive(Debug)]
pub struct StepLogits {
    /// The requested logits (flattened) of sequences the host samples or
    /// that asked for logits.
    pub logits: Vec<Vec<f32>>,
    /// What the GPU sampled, per sequence.
    pub sampled: Vec<Presampled>,
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
        let sampling = sampled.then(|| SeqSampling { params: SamplingParams::default(), constraint: None, generated: 0, output_tokens: Vec::new(), prompt_tokens: Vec::new() });
        SeqInput { tokens, start_pos, block_table: table, logits, sampling }
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
        let p = Plan::new(&config(), 16, 8, &batch).unwrap();
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
        // Logits rows: seq 1's token (row 0), seq 3's (row 1), seq 0's three (rows 2..5).
        assert_eq!(p.rows, vec![0, 1, 2, 3, 4]);
        let rows_of = |i: usize| p.ranges[i].clone().map(|r| p.rows[r]).collect::<Vec<_>>();
        assert_eq!(rows_of(0), vec![2, 3, 4]);
        assert_eq!(rows_of(1), vec![0]);
        assert!(rows_of(2).is_empty());
        assert_eq!(rows_of(3), vec![1]);
    }

    #[test]
    fn batches_the_cache_or_model_cannot_take_are_errors() {
        let c = config();
        let bad = |s: SeqInput| Plan::new(&c, 16, 8, &ForwardBatch { seqs: vec![s] }).unwrap_err().to_string();
        assert!(bad(seq(vec![], 0, vec![0], LogitsRequest::None, false)).contains("no new tokens"));
        assert!(bad(seq(vec![100], 0, vec![0], LogitsRequest::None, false)).contains("outside the vocabulary"));
        assert!(bad(seq(vec![1; 17], 0, vec![0], LogitsRequest::None, false)).contains("does not cover"));
        assert!(bad(seq(vec![1], 0, vec![8], LogitsRequest::None, false)).contains("outside the pool"));
        assert!(matches!(Plan::new(&c, 16, 8, &ForwardBatch { seqs: vec![seq(vec![1], 4096, vec![0; 257], LogitsRequest::None, false)] }), Err(EngineError::ContextLengthExceeded { .. })));
    }
}
