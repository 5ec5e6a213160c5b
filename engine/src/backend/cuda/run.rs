//! One step on the GPU: the decoder's pass run eagerly over the eager
//! workspace, or replayed from a decode graph; then the logits the
//! sequences asked for: sampled on the GPU where it can, else copied to the
//! host.

use super::sample::DeviceRow;
use super::{CudaBackend, CudaStep, LogitRows};
use crate::backend::{PassFn, Presampled, StepLayout, StepLogits, Workspace};
use crate::batch::ForwardBatch;
use crate::error::Result;
use crate::model::ops::Rope;
use crate::sampling::SampledToken;
use cudarc::driver::CudaSlice;
use rayon::prelude::*;
use spindle_kernels::device::{Gpu, RowSampling};
use std::ops::Range;

impl CudaBackend {
    /// Runs `pass` over `layout`'s step (from a graph when the step is one a
    /// graph takes) and finishes it.
    pub(super) fn run(&mut self, batch: &ForwardBatch, layout: &StepLayout, rope: &Rope, device_sampling: bool, pass: &mut PassFn<'_, Self>) -> Result<StepLogits> {
        let vocab = self.config.vocab_size;
        if self.graph_eligible(layout) {
            // Logits rows are the step's tokens: each sequence's one row.
            let ranges: Vec<Range<usize>> = layout
                .ranges
                .iter()
                .map(|r| if r.is_empty() { 0..0 } else { layout.rows[r.start] as usize..layout.rows[r.start] as usize + 1 })
                .collect();
            let device = device_rows(batch, &ranges, device_sampling);
            let finish_graph = |g: &Gpu, logits: &mut CudaSlice<f32>| finish(g, batch, vocab, &ranges, Some(logits), &device);
            if let Some(step) = self.run_graph(layout, rope, pass, finish_graph)? {
                return Ok(step);
            }
        }
        let step = self.eager_step(layout, rope)?;
        let t = layout.num_rows();
        let mut ws = Workspace::reuse_or_grow(self.workspace.take(), self, &self.config, t, layout.rows.len())?;
        let result = pass(self, &mut ws, &step, t).and_then(|()| {
            let device = device_rows(batch, &layout.ranges, device_sampling);
            let logits = if layout.rows.is_empty() { None } else { Some(&mut ws.logits) };
            finish(&self.gpu, batch, vocab, &layout.ranges, logits, &device)
        });
        self.workspace = Some(ws);
        result
    }

    /// The step's inputs on the device, for an eager run.
    fn eager_step(&self, layout: &StepLayout, rope: &Rope) -> Result<CudaStep> {
        let s = &self.gpu.stream;
        let angles = rope.angles(&layout.positions);
        let logit_rows = match layout.rows.len() {
            0 => LogitRows::Nothing,
            n => LogitRows::Picked(s.clone_htod(&layout.rows)?, n, layout.num_rows()),
        };
        Ok(CudaStep {
            ids: s.clone_htod(&layout.ids)?,
            slots: s.clone_htod(&layout.slots)?,
            cos: s.clone_htod(angles.cos())?,
            sin: s.clone_htod(angles.sin())?,
            attention: super::attention::plan(self, layout)?,
            logit_rows,
        })
    }
}

/// Per sequence: how its last wanted row is sampled on the device, or
/// `None` when the host samples it (or device sampling is off).
fn device_rows(batch: &ForwardBatch, ranges: &[Range<usize>], on: bool) -> Vec<Option<DeviceRow>> {
    if on {
        super::sample::device_rows(batch, ranges)
    } else {
        vec![None; batch.seqs.len()]
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
