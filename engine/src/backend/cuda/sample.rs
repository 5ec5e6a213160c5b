//! Which sequences of a step sample on the GPU: every one that samples,
//! except those asking for top logprobs or for their logits back (the host
//! sampler serves those from copied logits). Grammar masks (computed by the
//! scheduler) and penalty counts (kept by the executor) go with the row.

use crate::batch::{ForwardBatch, LogitsRequest, SeqInput};
use crate::runner::step_uniform;
use crate::sampling::PenaltyCounts;
use spindle_kernels::device::RowSampling;
use std::ops::Range;

/// A sequence sampled on the GPU: its row's parameters.
#[derive(Debug, Clone)]
pub(super) struct DeviceRow {
    pub(super) sampling: RowSampling,
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
    Some(DeviceRow { sampling })
}

/// `row` completed for sequence `seq`: the tokens its penalties count and
/// its grammar's mask over `vocab` (`None`: the mask allows nothing, the
/// sequence ends). Run after the step's kernels are queued.
pub(super) fn complete(row: &DeviceRow, seq: &SeqInput, penalties: Option<&PenaltyCounts>, vocab: usize) -> Option<RowSampling> {
    let mut sampling = row.sampling.clone();
    if let Some(counts) = penalties.filter(|_| seq.sampling.as_ref().is_some_and(|s| s.params.has_penalties())) {
        sampling.seen = counts.seen().to_vec();
    }
    if let Some(mask) = seq.sampling.as_ref().and_then(|s| s.mask.as_ref()) {
        if mask.allows_none() {
            return None;
        }
        sampling.mask = Some(mask.words_for(vocab));
    }
    Some(sampling)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{grammar, sampled_seq, GRAMMAR_VOCAB};
    use super::*;
    use crate::batch::TokenMask;
    use crate::sampling::SamplingParams;

    /// Sequence `seq`'s device row with its wanted rows `range`.
    fn row(seq: SeqInput, range: Range<usize>) -> Option<DeviceRow> {
        let batch = ForwardBatch { seqs: vec![seq] };
        device_rows(&batch, &[range]).pop().flatten()
    }

    #[test]
    fn plain_and_greedy_rows_sample_on_the_device_at_their_last_wanted_row() {
        let greedy = row(sampled_seq(SamplingParams::default(), LogitsRequest::None, None), 2..3);
        assert!(matches!(&greedy, Some(d) if d.sampling == RowSampling::plain(2, 0.0, 0, 1.0, 0.0, d.sampling.uniform)), "{greedy:?}");
        let p = SamplingParams { temperature: 0.7, top_k: 40, top_p: 0.9, min_p: 0.05, seed: Some(11), logprobs: true, ..SamplingParams::default() };
        let s = sampled_seq(p.clone(), LogitsRequest::None, None);
        let uniform = s.sampling.as_ref().map(step_uniform);
        let plain = row(s, 4..6);
        assert_eq!(plain.map(|d| d.sampling), Some(RowSampling::plain(5, 0.7, 40, 0.9, 0.05, uniform.unwrap_or(-1.0))), "the last row, the seeded draw; a logprob the device reports");
    }

    #[test]
    fn penalties_and_grammars_go_with_the_device_row() -> std::result::Result<(), String> {
        let p = SamplingParams { repetition_penalty: 1.2, presence_penalty: 0.5, frequency_penalty: 0.25, ..SamplingParams::default() };
        let penalised = row(sampled_seq(p, LogitsRequest::None, None), 0..1).ok_or("penalties stay on the device")?;
        assert_eq!((penalised.sampling.repetition_penalty, penalised.sampling.presence_penalty, penalised.sampling.frequency_penalty), (1.2, 0.5, 0.25));
        let mask = Some(TokenMask::from_words(vec![0b10]));
        row(sampled_seq(SamplingParams::default(), LogitsRequest::None, mask), 0..1).ok_or("grammars stay on the device")?;
        Ok(())
    }

    #[test]
    fn top_logprobs_returned_logits_and_no_sampling_go_to_the_host() {
        let top = SamplingParams { top_logprobs: 3, ..SamplingParams::default() };
        assert!(row(sampled_seq(top, LogitsRequest::None, None), 0..1).is_none(), "top logprobs");
        assert!(row(sampled_seq(SamplingParams::default(), LogitsRequest::Last, None), 0..1).is_none(), "logits wanted back");
        assert!(row(sampled_seq(SamplingParams::default(), LogitsRequest::All, None), 0..1).is_none(), "every row's logits wanted back");
        assert!(row(sampled_seq(SamplingParams::default(), LogitsRequest::None, None), 0..0).is_none(), "no wanted row");
        let mut unsampled = sampled_seq(SamplingParams::default(), LogitsRequest::None, None);
        unsampled.sampling = None;
        assert!(row(unsampled, 0..1).is_none(), "nothing to sample");
    }

    #[test]
    fn device_rows_are_per_sequence_in_batch_order() {
        let host = SamplingParams { top_logprobs: 1, ..SamplingParams::default() };
        let batch = ForwardBatch { seqs: vec![
            sampled_seq(SamplingParams::default(), LogitsRequest::None, None),
            sampled_seq(host, LogitsRequest::None, None),
            sampled_seq(SamplingParams::default(), LogitsRequest::None, None),
        ] };
        let rows: Vec<Option<usize>> = device_rows(&batch, &[0..1, 1..2, 2..3]).iter().map(|d| d.as_ref().map(|d| d.sampling.row)).collect();
        assert_eq!(rows, vec![Some(0), None, Some(2)]);
    }

    #[test]
    fn completing_a_row_adds_its_seen_tokens_and_grammar_mask() -> std::result::Result<(), String> {
        let p = SamplingParams { presence_penalty: 0.5, ..SamplingParams::default() };
        let s = sampled_seq(p, LogitsRequest::None, None);
        let d = row(s.clone(), 0..1).ok_or("a device row")?;
        let counts = PenaltyCounts::new(&[], &[5, 6, 5]);
        let done = complete(&d, &s, Some(&counts), 100).ok_or("no grammar, always a row")?;
        assert_eq!((done.seen, done.mask), (vec![(5, 2), (6, 1)], None), "the executor's counts");
        let plain = sampled_seq(SamplingParams::default(), LogitsRequest::None, None);
        let done = complete(&d, &plain, Some(&counts), 100).ok_or("a row")?;
        assert!(done.seen.is_empty(), "no penalty on, no counts sent");

        let (c, [a, b]) = grammar("start: \"ab\"", ["a", "b"])?;
        let next = || c.lock().map(|mut c| c.next_mask()).map_err(|e| e.to_string());
        let s = sampled_seq(SamplingParams::default(), LogitsRequest::None, Some(next()?));
        let d = row(s.clone(), 0..1).ok_or("a device row")?;
        let mask = complete(&d, &s, None, GRAMMAR_VOCAB).and_then(|r| r.mask).ok_or("a grammar mask")?;
        assert_eq!(mask.len(), GRAMMAR_VOCAB.div_ceil(32));
        let allowed: Vec<u32> = (0..GRAMMAR_VOCAB as u32).filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1).collect();
        assert_eq!(allowed, vec![a], "only the grammar's first token");
        for t in [a, b] {
            c.lock().map_err(|e| e.to_string())?.accept(t).map_err(|e| e.to_string())?;
        }
        let s = sampled_seq(SamplingParams::default(), LogitsRequest::None, Some(next()?));
        assert!(complete(&d, &s, None, GRAMMAR_VOCAB).is_none(), "a finished grammar allows nothing: the sequence ends");
        Ok(())
    }
}
