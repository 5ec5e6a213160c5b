//! Which sequences of a step sample on the GPU: those whose sampler the
//! device kernel reproduces (no grammar, no penalties, no top logprobs, no
//! logits wanted back). The rest sample on the host from copied logits.

use crate::batch::{ForwardBatch, LogitsRequest, SeqInput};
use crate::runner::step_uniform;
use spindle_kernels::device::RowSampling;
use std::ops::Range;

/// Per sequence: how its last wanted row is sampled on the device, or
/// `None` when the host samples it (or nothing is sampled).
pub(super) fn device_rows(batch: &ForwardBatch, ranges: &[Range<usize>]) -> Vec<Option<RowSampling>> {
    batch.seqs.iter().zip(ranges).map(|(seq, range)| device_row(seq, range)).collect()
}

fn device_row(seq: &SeqInput, range: &Range<usize>) -> Option<RowSampling> {
    let s = seq.sampling.as_ref()?;
    let p = &s.params;
    let host_only = s.constraint.is_some()
        || crate::batch::SeqSampling::needs_output_tokens(p)
        || p.top_logprobs > 0
        || seq.logits != LogitsRequest::None
        || range.is_empty();
    if host_only {
        return None;
    }
    Some(RowSampling { row: range.end - 1, temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, min_p: p.min_p, uniform: step_uniform(s) })
}
