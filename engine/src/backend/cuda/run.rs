//! One step on the GPU: the decoder's pass run eagerly over the eager
//! workspace, or replayed from a decode graph; then the logits the
//! sequences asked for: sampled on the GPU where it can, else copied to the
//! host.

use super::sample::DeviceRow;
use super::{CudaBackend, CudaStep, LogitRows};
use crate::backend::{DeviceSampling, PassFn, Presampled, StepLayout, StepLogits, Workspace};
use crate::batch::ForwardBatch;
use crate::error::Result;
use crate::model::ops::{Rope, RopeAngles};
use crate::sampling::{PenaltyCounts, SampledToken};
use cudarc::driver::CudaSlice;
use rayon::prelude::*;
use spindle_kernels::device::{Gpu, RowSample, RowSampling};
use std::ops::Range;

impl CudaBackend {
    /// Runs `pass` over `layout`'s step (from a graph when the step is one a
    /// graph takes) and finishes it.
    pub(super) fn run(&mut self, batch: &ForwardBatch, layout: &StepLayout, rope: &Rope, sampling: DeviceSampling<'_>, pass: &mut PassFn<'_, Self>) -> Result<StepLogits> {
        let vocab = self.config.vocab_size;
        if self.graph_eligible(layout) {
            let ranges = graph_ranges(layout);
            let device = device_rows(batch, &ranges, sampling.enabled);
            let finish_graph = |g: &Gpu, logits: &mut CudaSlice<f32>| finish(g, batch, vocab, &ranges, Some(logits), &device, sampling.penalties);
            if let Some(step) = self.run_graph(layout, rope, pass, finish_graph)? {
                return Ok(step);
            }
        }
        let step = self.eager_step(layout, rope)?;
        let t = layout.num_rows();
        let mut ws = Workspace::reuse_or_grow(self.workspace.take(), self, &self.config, t, layout.rows.len())?;
        let result = pass(self, &mut ws, &step, t).and_then(|()| {
            let device = device_rows(batch, &layout.ranges, sampling.enabled);
            let logits = if layout.rows.is_empty() { None } else { Some(&mut ws.logits) };
            finish(&self.gpu, batch, vocab, &layout.ranges, logits, &device, sampling.penalties)
        });
        self.workspace = Some(ws);
        result
    }

    /// `upload` of the sliding-window layers' RoPE angles at `positions`,
    /// where the model has such layers.
    pub(super) fn local_angles<T>(&self, positions: &[usize], upload: impl FnOnce(&RopeAngles) -> Result<T>) -> Result<Option<T>> {
        self.local_rope.as_ref().map(|r| upload(&r.angles(positions))).transpose()
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
            local: self.local_angles(&layout.positions, |a| Ok((s.clone_htod(a.cos())?, s.clone_htod(a.sin())?)))?,
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

/// Per sequence of a graphed decode step: its range of the graph's logits,
/// whose rows are the step's tokens (each sequence's one row, if wanted).
fn graph_ranges(layout: &StepLayout) -> Vec<Range<usize>> {
    layout
        .ranges
        .iter()
        .map(|r| if r.is_empty() { 0..0 } else { layout.rows[r.start] as usize..layout.rows[r.start] as usize + 1 })
        .collect()
}

/// Per sequence (its rows of `logits` in `ranges`): sampled on the GPU where
/// `device` says so (under its grammar's mask, with its `penalties`), else
/// its logits copied to the host.
fn finish(
    g: &Gpu,
    batch: &ForwardBatch,
    vocab: usize,
    ranges: &[Range<usize>],
    logits: Option<&mut CudaSlice<f32>>,
    device: &[Option<DeviceRow>],
    penalties: &[Option<&PenaltyCounts>],
) -> Result<StepLogits> {
    let mut sampled: Vec<Presampled> = vec![Presampled::No; ranges.len()];
    if let Some(logits) = logits {
        // Each row's penalty list and mask (the mask was computed by the
        // scheduler before the step: on the GPU its cost is not overlapped
        // with the forward pass), one sequence per thread.
        let completed: Vec<(usize, Option<RowSampling>)> = device
            .par_iter()
            .enumerate()
            .filter_map(|(i, d)| d.as_ref().map(|d| (i, super::sample::complete(d, &batch.seqs[i], penalties.get(i).copied().flatten(), vocab))))
            .collect();
        let (seqs, rows) = take_ended(completed, &mut sampled);
        let samples = g.sample_rows(logits, vocab, &rows)?;
        place_samples(&mut sampled, &seqs, &samples);
        if let Some(rows) = host_rows(ranges, &sampled) {
            let logits = g.read_host(logits, rows * vocab, |host| split_host_logits(ranges, &sampled, host, vocab))?;
            return Ok(StepLogits { logits, sampled });
        }
    }
    Ok(StepLogits { logits: split_host_logits(ranges, &sampled, &[], vocab), sampled })
}

/// Marks the sequences whose grammar allows nothing more (`None`) as ended
/// in `sampled`; the rest come back as the rows to sample, with their
/// sequences, in the same order.
fn take_ended(completed: Vec<(usize, Option<RowSampling>)>, sampled: &mut [Presampled]) -> (Vec<usize>, Vec<RowSampling>) {
    let mut wanted = (Vec::new(), Vec::new());
    for (i, row) in completed {
        match row {
            Some(row) => {
                wanted.0.push(i);
                wanted.1.push(row);
            }
            // The grammar allows nothing more: the sequence ends here.
            None => sampled[i] = Presampled::GrammarEnded,
        }
    }
    wanted
}

/// Puts `samples[k]` on sequence `seqs[k]` in `sampled` (batch order).
fn place_samples(sampled: &mut [Presampled], seqs: &[usize], samples: &[RowSample]) {
    for (&seq, s) in seqs.iter().zip(samples) {
        sampled[seq] = Presampled::Token(SampledToken { token: s.token, logprob: s.logprob, top_logprobs: Vec::new() });
    }
}

/// Rows of the logits to copy to the host: up to the last row any sequence
/// owns (a graph's buffer has padding rows after), or `None` when no
/// sequence with rows is left to the host.
fn host_rows(ranges: &[Range<usize>], sampled: &[Presampled]) -> Option<usize> {
    let needed = ranges.iter().zip(sampled).any(|(range, s)| *s == Presampled::No && !range.is_empty());
    needed.then(|| ranges.iter().map(|r| r.end).max().unwrap_or(0))
}

/// Each sequence's rows of `host` (`[rows, vocab]`), in batch order; empty
/// for those the device sampled or that want none.
fn split_host_logits(ranges: &[Range<usize>], sampled: &[Presampled], host: &[f32], vocab: usize) -> Vec<Vec<f32>> {
    ranges
        .iter()
        .zip(sampled)
        .map(|(range, s)| if *s != Presampled::No || range.is_empty() { Vec::new() } else { host[range.start * vocab..range.end * vocab].to_vec() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{config, sampled_seq};
    use super::*;
    use crate::batch::{LogitsRequest, SeqInput};
    use crate::sampling::SamplingParams;

    fn token(token: u32, logprob: f32) -> Presampled {
        Presampled::Token(SampledToken { token, logprob, top_logprobs: Vec::new() })
    }

    fn sample(token: u32, logprob: f32) -> RowSample {
        RowSample { token, logprob }
    }

    fn plain(row: usize) -> RowSampling {
        RowSampling::plain(row, 0.0, 0, 1.0, 0.0, 0.5)
    }

    #[test]
    fn device_sampling_off_leaves_every_row_to_the_host() {
        let batch = ForwardBatch { seqs: vec![sampled_seq(SamplingParams::default(), LogitsRequest::None, None); 3] };
        let ranges = [0..1, 1..2, 2..3];
        let on: Vec<Option<usize>> = device_rows(&batch, &ranges, true).iter().map(|d| d.as_ref().map(|d| d.sampling.row)).collect();
        assert_eq!(on, vec![Some(0), Some(1), Some(2)], "greedy rows sample on the device when it is on");
        let off = device_rows(&batch, &ranges, false);
        assert!(off.len() == 3 && off.iter().all(Option::is_none), "{off:?}");
    }

    #[test]
    fn a_graphed_step_reads_each_sequence_at_its_own_token_row() -> Result<()> {
        // Three decode sequences: no logits, sampled, last logits.
        let mut unwanted = sampled_seq(SamplingParams::default(), LogitsRequest::None, None);
        unwanted.sampling = None;
        let wanted = |logits| SeqInput { start_pos: 4, ..sampled_seq(SamplingParams::default(), logits, None) };
        let batch = ForwardBatch { seqs: vec![unwanted, wanted(LogitsRequest::None), wanted(LogitsRequest::Last)] };
        let layout = StepLayout::new(&config()?, 16, 8, &batch, &[&[0], &[1], &[2]])?;
        assert_eq!(layout.ranges, vec![0..0, 0..1, 1..2], "ranges over the wanted rows");
        // The graph's logits have a row per token: the sequences' own rows 1 and 2.
        assert_eq!(graph_ranges(&layout), vec![0..0, 1..2, 2..3]);
        Ok(())
    }

    #[test]
    fn grammars_that_allow_nothing_end_their_sequence_and_the_rest_are_sampled_in_order() {
        let mut sampled = vec![Presampled::No; 4];
        let (seqs, rows) = take_ended(vec![(0, Some(plain(0))), (2, None), (3, Some(plain(5)))], &mut sampled);
        assert_eq!((seqs, rows), (vec![0, 3], vec![plain(0), plain(5)]));
        assert_eq!(sampled, vec![Presampled::No, Presampled::No, Presampled::GrammarEnded, Presampled::No]);
    }

    #[test]
    fn device_tokens_land_on_their_own_sequences_and_host_rows_keep_their_logits() {
        // Batch order: sampled on the device, left to the host, nothing wanted,
        // all (two) rows wanted, sampled on the device; vocab of 2.
        let ranges = [0..1, 1..2, 2..2, 2..4, 4..5];
        let mut sampled = vec![Presampled::No; 5];
        // Samples come back in the order the rows were sent: sequences 4 then 0.
        place_samples(&mut sampled, &[4, 0], &[sample(40, -0.4), sample(10, -0.1)]);
        assert_eq!(sampled, vec![token(10, -0.1), Presampled::No, Presampled::No, Presampled::No, token(40, -0.4)]);
        assert_eq!(host_rows(&ranges, &sampled), Some(5), "every row up to the last a sequence owns");
        let host: Vec<f32> = (0..10).map(|v| v as f32).collect();
        let logits = split_host_logits(&ranges, &sampled, &host, 2);
        assert_eq!(logits, vec![vec![], vec![2.0, 3.0], vec![], vec![4.0, 5.0, 6.0, 7.0], vec![]]);
    }

    #[test]
    fn nothing_is_copied_when_the_device_sampled_every_sequence_with_rows() {
        let ranges = [0..1, 0..0, 1..2];
        let sampled = [token(1, 0.0), Presampled::No, Presampled::GrammarEnded];
        assert_eq!(host_rows(&ranges, &sampled), None);
        assert_eq!(split_host_logits(&ranges, &sampled, &[], 4), vec![Vec::<f32>::new(); 3]);
        // A graph's padded buffer: only up to the last owned row is copied.
        assert_eq!(host_rows(&[0..0, 1..2, 2..3], &[Presampled::No, Presampled::No, token(3, 0.0)]), Some(3));
    }
}
