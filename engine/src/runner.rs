//! `ModelRunner`: a model plus the physical KV pool, executing one
//! `ForwardBatch` per call and sampling a token per sequence.

use crate::batch::{ForwardBatch, SeqOutput, SeqSampling, StepOutput};
use crate::error::Result;
use crate::kv::KvPool;
use crate::model::LlamaModel;
use crate::sampling::{SampledToken, Sampler};
use rayon::prelude::*;

/// A backend that runs steps over its own KV cache (the CPU's
/// [`ModelRunner`], or the GPU's `cuda::CudaRunner`).
pub trait Executor {
    /// Run one step and sample where asked.
    fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput>;
    /// The model's context window.
    fn context_length(&self) -> usize;
    /// Tokens per KV block.
    fn block_size(&self) -> usize;
}

impl Executor for ModelRunner {
    fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        ModelRunner::execute(self, batch)
    }

    fn context_length(&self) -> usize {
        self.model.config().context_length
    }

    fn block_size(&self) -> usize {
        self.kv.block_size()
    }
}

/// Runs forward steps of one model over its own KV pool.
#[derive(Debug)]
pub struct ModelRunner {
    model: LlamaModel,
    kv: KvPool,
}

impl ModelRunner {
    /// A runner with a pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: LlamaModel, num_blocks: usize, block_size: usize) -> Self {
        let c = model.config();
        let kv = KvPool::new(c.num_layers, num_blocks, block_size, c.kv_dim());
        Self { model, kv }
    }

    /// The model.
    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// Mutable access to the model (e.g. to change matmul precision).
    pub fn model_mut(&mut self) -> &mut LlamaModel {
        &mut self.model
    }

    /// The KV pool's geometry.
    pub fn kv(&self) -> &KvPool {
        &self.kv
    }

    /// Run one step: all sequences' new tokens through the model, then sample
    /// for those that asked.
    ///
    /// The step runs on a worker of the rayon pool, so the many parallel
    /// regions inside it start without handing work across threads (the
    /// calling thread would otherwise block and wake once per region).
    pub fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        rayon::scope(|_| self.execute_here(batch))
    }

    fn execute_here(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        let logits = self.model.forward(batch, &mut self.kv)?;
        sample_outputs(batch, logits, self.model.config().vocab_size)
    }
}

/// The step's outputs from each sequence's logits (from any backend):
/// sampling where asked (with its grammar), logits kept where asked.
pub fn sample_outputs(batch: &ForwardBatch, logits: Vec<Vec<f32>>, vocab: usize) -> Result<StepOutput> {
    let none = vec![Presampled::No; batch.seqs.len()];
    sample_outputs_with(batch, logits, vocab, none)
}

/// What a backend that samples on its own (the GPU) did for a sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Presampled {
    /// Nothing: the host samples from the sequence's logits (if it samples).
    No,
    /// This token (its grammar already advanced past it).
    Token(SampledToken),
    /// Its grammar allows no token: the sequence ends without one.
    GrammarEnded,
}

/// [`sample_outputs`] where a backend already sampled some sequences
/// (`presampled[i]`, e.g. on the GPU); the others sample from their logits.
pub fn sample_outputs_with(batch: &ForwardBatch, logits: Vec<Vec<f32>>, vocab: usize, presampled: Vec<Presampled>) -> Result<StepOutput> {
    // Sequences sample independently (each with its own seeded generator),
    // so they run in parallel with the same results.
    let seqs = batch
        .seqs
        .par_iter()
        .zip(logits.into_par_iter().zip(presampled.into_par_iter()))
        .map(|(seq, (mut logits, presampled))| {
            let (sampled, grammar_ended) = match (&seq.sampling, presampled) {
                (Some(_), Presampled::Token(done)) => (Some(done), false),
                (Some(_), Presampled::GrammarEnded) => (None, true),
                (Some(s), Presampled::No) if logits.len() >= vocab => {
                    let start = logits.len() - vocab;
                    let mut last = logits[start..].to_vec();
                    let sampled = sample_one(s, &mut last)?;
                    let ended = sampled.is_none();
                    (sampled, ended)
                }
                _ => (None, false),
            };
            if seq.logits == crate::batch::LogitsRequest::None {
                logits = Vec::new();
            }
            Ok(SeqOutput { logits, sampled, grammar_ended })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(StepOutput { seqs })
}

/// Sample with a generator keyed by (seed, tokens generated so far), so a
/// seeded sequence draws the same tokens whatever else shares its batch.
/// `None` when the sequence's grammar allows no token at all.
fn sample_one(s: &SeqSampling, logits: &mut [f32]) -> Result<Option<SampledToken>> {
    let mut params = s.params.clone();
    if let Some(seed) = params.seed {
        params.seed = Some(mix(seed, s.generated as u64));
    }
    let mut sampler = Sampler::new(params)?;
    let Some(constraint) = &s.constraint else {
        return Ok(Some(sampler.sample(logits, &s.prompt_tokens, &s.output_tokens)));
    };
    let mut constraint = constraint.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !constraint.mask_logits(logits) {
        return Ok(None);
    }
    let mut sampled = sampler.sample(logits, &s.prompt_tokens, &s.output_tokens);
    // Forbidden tokens are -inf: they are not alternatives worth reporting.
    sampled.top_logprobs.retain(|(_, lp)| lp.is_finite());
    if let Err(e) = constraint.accept(sampled.token) {
        tracing::warn!("the grammar refused sampled token {}: {e}", sampled.token);
    }
    Ok(Some(sampled))
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
