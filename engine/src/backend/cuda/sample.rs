//! Which sequences of a step sample on the GPU: every one that samples,
//! except those asking for top logprobs or for their logits back (the host
//! sampler serves those from copied logits). Grammar masks and penalties
//! go with the row: the mask is computed on the host (llguidance) right
//! before the launch, and the grammar advances on the sampled token after.

use crate::batch::{ForwardBatch, LogitsRequest, SeqInput, SeqSampling};
use crate::grammar::SharedConstraint;
use crate::runner::step_uniform;
use spindle_kernels::device::RowSampling;
use std::ops::Range;

/// A sequence sampled on the GPU: its row's parameters and its grammar.
#[derive(Debug, Clone)]
pub(super) struct DeviceRow {
    pub(super) sampling: RowSampling,
    pub(super) constraint: Option<SharedConstraint>,
}

/// Per sequence: how its last wanted row is sampled on the device, or
/// `None` when the host samples it (or nothing is sampled).
pub(super) fn device_rows(batch: &ForwardBatch, ranges: &[Range<usize>]) -> Vec<Option<DeviceRow>> {
    batch.seqs.iter().zip(ranges).map(|(seq, range)| device_row(seq, range)).collect()
}

fn device_row(seq: &SeqInput, range: &Range<usize>) -> Option<DeviceRow> {
    let s = seq.sampling.as_ref()?;
    let p = &s.params;
    if p.top_logprobs > 0 || seq.logits != LogitsRequest::None || range.is_empty() {
        return None;
    }
    let sampling = RowSampling {
        repetition_penalty: p.repetition_penalty,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        ..RowSampling::plain(range.end - 1, p.temperature, p.top_k, p.top_p, p.min_p, step_uniform(s))
    };
    Some(DeviceRow { sampling, constraint: s.constraint.clone() })
}

/// `row` completed for sequence `seq`: its penalties' tokens and its
/// grammar's mask (`None`: the grammar allows nothing, the sequence ends).
/// Run after the step's kernels are queued, one sequence per thread.
pub(super) fn complete(row: &DeviceRow, seq: &SeqInput, vocab: usize) -> Option<RowSampling> {
    let mut sampling = row.sampling.clone();
    if let Some(s) = &seq.sampling {
        sampling.seen = seen_tokens(s);
    }
    if let Some(c) = &row.constraint {
        sampling.mask = Some(c.lock().unwrap_or_else(std::sync::PoisonError::into_inner).mask_words(vocab)?);
    }
    Some(sampling)
}

/// The distinct tokens the penalties touch, in increasing order, each with
/// its count in the output: the prompt's too when the repetition penalty is on.
fn seen_tokens(s: &SeqSampling) -> Vec<(u32, u32)> {
    let p = &s.params;
    if !SeqSampling::needs_output_tokens(p) {
        return Vec::new();
    }
    // (token, 1 per output occurrence, 0 for a prompt one), sorted, then merged.
    let prompt = if p.repetition_penalty != 1.0 { s.prompt_tokens.as_slice() } else { &[] };
    let mut all: Vec<(u32, u32)> = prompt.iter().map(|&t| (t, 0)).chain(s.output_tokens.iter().map(|&t| (t, 1))).collect();
    all.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(all.len());
    for (t, c) in all {
        match merged.last_mut() {
            Some(last) if last.0 == t => last.1 += c,
            _ => merged.push((t, c)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn seq(params: SamplingParams, prompt: Vec<u32>, output: Vec<u32>) -> SeqSampling {
        SeqSampling { params, constraint: None, generated: output.len(), output_tokens: output, prompt_tokens: prompt }
    }

    #[test]
    fn seen_tokens_count_the_output_and_add_the_prompt_only_for_repetition() {
        let freq = SamplingParams { frequency_penalty: 0.5, ..SamplingParams::default() };
        assert_eq!(seen_tokens(&seq(freq, vec![9, 9, 4], vec![4, 7, 4])), vec![(4, 2), (7, 1)]);
        let rep = SamplingParams { repetition_penalty: 1.3, ..SamplingParams::default() };
        assert_eq!(seen_tokens(&seq(rep, vec![9, 9, 4], vec![4, 7, 4])), vec![(4, 2), (7, 1), (9, 0)]);
        assert!(seen_tokens(&seq(SamplingParams::default(), vec![1], vec![2])).is_empty(), "no penalties, no entries");
    }
}
