//! The [`Executor`] contract the scheduler drives (one step per call, over
//! the executor's own KV cache), and host sampling of a step's logits.

pub use crate::backend::{DeviceReading, DeviceTelemetry, KvGeometry, Presampled};
pub use crate::model::decoder::ModelRunner;

use crate::batch::{ForwardBatch, SeqInput, SeqOutput, SeqSampling, StepOutput, TokenMask};
use crate::error::Result;
use crate::sampling::{PenaltyBook, PenaltyCounts, SampledToken, Sampler};

/// What an executor runs on, for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorInfo {
    /// The device, in words.
    pub device: String,
    /// Bytes of weights on it.
    pub weight_bytes: usize,
}

/// Runs forward steps over its own KV cache: a model on a backend
/// ([`crate::model::Decoder`]), or a fake in tests.
pub trait Executor: Send {
    /// Run one step and sample where asked.
    fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput>;
    /// Forget what was kept for these sequences (their block tables and
    /// penalty histories): they finished, failed, were aborted or
    /// preempted. A later step sends them whole again.
    fn release(&mut self, _ids: &[crate::batch::SeqId]) {}
    /// Sets aside what steps of up to `rows` tokens and `logit_rows`
    /// logits rows need (the largest step the caller will send), so the
    /// first such step does not pay for it. By default nothing.
    fn reserve(&mut self, _rows: usize, _logit_rows: usize) -> Result<()> {
        Ok(())
    }
    /// The model's context window.
    fn context_length(&self) -> usize;
    /// The KV cache's shape: the scheduler allocates blocks of it.
    fn kv_geometry(&self) -> KvGeometry;
    /// Tokens per KV block.
    fn block_size(&self) -> usize {
        self.kv_geometry().block_size
    }
    /// What it runs on.
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo { device: "unknown".into(), weight_bytes: 0 }
    }
    /// A live view of the device's state, when the backend has one.
    fn telemetry(&self) -> Option<std::sync::Arc<dyn DeviceTelemetry>> {
        None
    }
}

/// The step's outputs from each sequence's logits (from any backend):
/// sampling where asked (under its grammar's mask), logits kept where
/// asked. The penalties count the histories the batch itself carries
/// (whole ones; an appended history is an invalid batch here).
pub fn sample_outputs(batch: &ForwardBatch, logits: Vec<Vec<f32>>, vocab: usize) -> Result<StepOutput> {
    let mut book = PenaltyBook::default();
    book.update(batch)?;
    let none = vec![Presampled::No; batch.seqs.len()];
    sample_outputs_with(batch, logits, vocab, none, &book.for_batch(batch))
}

/// [`sample_outputs`] where a backend already sampled some sequences
/// (`presampled[i]`, e.g. on the GPU) and the executor keeps the penalty
/// histories (`penalties[i]`); the others sample from their logits.
pub fn sample_outputs_with(
    batch: &ForwardBatch,
    logits: Vec<Vec<f32>>,
    vocab: usize,
    presampled: Vec<Presampled>,
    penalties: &[Option<&PenaltyCounts>],
) -> Result<StepOutput> {
    // Sequences sample independently (each with its own seeded generator),
    // so they run in parallel with the same results.
    let mut work: Vec<_> = batch.seqs.iter().zip(logits.into_iter().zip(presampled)).map(|(seq, (logits, presampled))| (seq, logits, presampled, None)).collect();
    crate::pool::for_each_mut(&mut work, |i, (seq, logits, presampled, result)| {
        let (logits, presampled) = (std::mem::take(logits), std::mem::replace(presampled, Presampled::No));
        *result = Some(sample_seq(seq, logits, presampled, vocab, penalties.get(i).copied().flatten()));
    });
    let seqs = work.into_iter().filter_map(|(_, _, _, result)| result).collect::<Result<Vec<_>>>()?;
    Ok(StepOutput { seqs })
}

/// One sequence's output of a step: its sampled token (unless presampled or
/// not sampling) and the logits it asked for.
fn sample_seq(seq: &SeqInput, mut logits: Vec<f32>, presampled: Presampled, vocab: usize, penalties: Option<&PenaltyCounts>) -> Result<SeqOutput> {
    let (sampled, grammar_ended) = match (&seq.sampling, presampled) {
        (Some(_), Presampled::Token(done)) => (Some(done), false),
        (Some(_), Presampled::GrammarEnded) => (None, true),
        (Some(s), Presampled::No) if logits.len() >= vocab => {
            let start = logits.len() - vocab;
            // Sampling rewrites the logits it reads (mask, penalties,
            // temperature): a copy only where they also go back (a
            // batch of 16 copied 16 vocab-sized rows per step).
            let sampled = if seq.logits == crate::batch::LogitsRequest::None {
                sample_one(s, penalties, &mut logits[start..])?
            } else {
                sample_one(s, penalties, &mut logits[start..].to_vec())?
            };
            let ended = sampled.is_none();
            (sampled, ended)
        }
        _ => (None, false),
    };
    if seq.logits == crate::batch::LogitsRequest::None {
        logits = Vec::new();
    }
    Ok(SeqOutput { logits, sampled, grammar_ended })
}

/// Sample with a generator keyed by (seed, tokens generated so far), so a
/// seeded sequence draws the same tokens whatever else shares its batch.
/// `None` when the sequence's grammar allows no token at all.
fn sample_one(s: &SeqSampling, penalties: Option<&PenaltyCounts>, logits: &mut [f32]) -> Result<Option<SampledToken>> {
    let mut params = s.params.clone();
    if let Some(seed) = params.seed {
        params.seed = Some(mix(seed, s.generated as u64));
    }
    let mut sampler = Sampler::new(params)?;
    let Some(mask) = &s.mask else {
        return Ok(Some(sampler.sample_counted(logits, penalties)));
    };
    Ok(sample_masked(&mut sampler, logits, mask, penalties))
}

/// What a NaN or `-inf` logit becomes before a grammar's mask: far below any
/// real logit, yet finite after the penalties scale it (by up to 1e8).
const NON_FINITE_FLOOR: f32 = -1e30;

/// Samples from `logits` after setting every token `mask` forbids to `-inf`
/// (`None` when it allows none). Non-finite logits are made finite
/// first (NaN and `-inf` become [`NON_FINITE_FLOOR`], `+inf` its opposite),
/// so that a token the mask allows always outranks one it forbids:
/// otherwise a model whose allowed logits are all NaN or `-inf` would leave
/// nothing finite, and the sampler would draw from the whole vocabulary.
fn sample_masked(sampler: &mut Sampler, logits: &mut [f32], mask: &TokenMask, penalties: Option<&PenaltyCounts>) -> Option<SampledToken> {
    if mask.allows_none() {
        return None;
    }
    for l in logits.iter_mut().filter(|l| !l.is_finite()) {
        *l = if *l == f32::INFINITY { -NON_FINITE_FLOOR } else { NON_FINITE_FLOOR };
    }
    mask.apply(logits);
    let mut sampled = sampler.sample_counted(logits, penalties);
    // Forbidden tokens are -inf: they are not alternatives worth reporting.
    sampled.top_logprobs.retain(|(_, lp)| lp.is_finite());
    Some(sampled)
}

/// The uniform draw in [0, 1) the sequence's sampler takes at this step
/// (its generator keyed by seed and step, as [`sample_outputs`] keys it), for
/// a backend that draws the token itself.
pub fn step_uniform(s: &SeqSampling) -> f64 {
    let seed = s.params.seed.map_or_else(crate::sampling::entropy_seed, |seed| mix(seed, s.generated as u64));
    crate::sampling::Rng::new(seed).next_f64()
}

fn mix(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<E: Executor + ?Sized> Executor for Box<E> {
    fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        (**self).execute(batch)
    }

    fn release(&mut self, ids: &[crate::batch::SeqId]) {
        (**self).release(ids);
    }

    fn reserve(&mut self, rows: usize, logit_rows: usize) -> Result<()> {
        (**self).reserve(rows, logit_rows)
    }

    fn context_length(&self) -> usize {
        (**self).context_length()
    }

    fn kv_geometry(&self) -> KvGeometry {
        (**self).kv_geometry()
    }

    fn info(&self) -> ExecutorInfo {
        (**self).info()
    }

    fn telemetry(&self) -> Option<std::sync::Arc<dyn DeviceTelemetry>> {
        (**self).telemetry()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{Rng, SamplingParams};

    /// A logit drawn to stress the sampler: ordinary, huge, or non-finite.
    fn wild_logit(r: &mut Rng) -> f32 {
        match r.next_u64() % 10 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => f32::MAX,
            4 => -1e30,
            _ => (r.next_f64() * 40.0 - 20.0) as f32,
        }
    }

    /// Sampling parameters over every path: greedy, temperature, top-k
    /// (heap and select), top-p, min-p, the penalties, logprobs.
    fn any_params(r: &mut Rng) -> SamplingParams {
        let pick = |r: &mut Rng, options: &[f32]| options[(r.next_u64() % options.len() as u64) as usize];
        SamplingParams {
            temperature: pick(r, &[0.0, 0.3, 1.0, 1.7]),
            top_k: [0, 1, 2, 5, 50, 300][(r.next_u64() % 6) as usize],
            top_p: pick(r, &[1.0, 0.9, 0.5, 0.01]),
            min_p: pick(r, &[0.0, 0.05, 0.5, 1.0]),
            repetition_penalty: pick(r, &[1.0, 0.5, 1.3]),
            presence_penalty: pick(r, &[0.0, -2.0, 1.5]),
            frequency_penalty: pick(r, &[0.0, 2.0, -1.0]),
            seed: Some(r.next_u64()),
            top_logprobs: (r.next_u64() % 4) as usize,
            logprobs: r.next_u64().is_multiple_of(2),
        }
    }

    /// Whatever the logits (NaN, infinities, huge values on forbidden
    /// tokens) and whatever the sampling parameters, the token returned is
    /// one the mask allows, and so are the reported alternatives.
    #[test]
    fn the_sampler_never_returns_a_token_the_mask_forbids() -> Result<()> {
        let mut r = Rng::new(17);
        for case in 0..4000 {
            let vocab = 1 + (r.next_u64() % 300) as usize;
            let mut logits: Vec<f32> = (0..vocab).map(|_| wild_logit(&mut r)).collect();
            let allowed: Vec<bool> = (0..vocab).map(|_| r.next_u64().is_multiple_of(4)).collect();
            let history: Vec<u32> = (0..(r.next_u64() % 20)).map(|_| (r.next_u64() % vocab as u64) as u32).collect();
            let mut sampler = Sampler::new(any_params(&mut r))?;
            let mut words = vec![0u32; vocab.div_ceil(32)];
            for (t, _) in allowed.iter().enumerate().filter(|(_, ok)| **ok) {
                words[t / 32] |= 1 << (t % 32);
            }
            let mask = TokenMask::from_words(words);
            let counts = PenaltyCounts::new(&history, &history);
            let Some(sampled) = sample_masked(&mut sampler, &mut logits, &mask, Some(&counts)) else {
                assert!(!allowed.contains(&true), "case {case}: refused although tokens are allowed");
                continue;
            };
            assert!(allowed[sampled.token as usize], "case {case}: sampled forbidden token {} ({:?})", sampled.token, sampler.params());
            assert!(sampled.top_logprobs.iter().all(|(t, _)| allowed[*t as usize]), "case {case}: a forbidden alternative");
        }
        Ok(())
    }
}
