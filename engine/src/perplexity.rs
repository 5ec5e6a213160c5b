//! Perplexity over a token sequence, scored the way llama.cpp's
//! `llama-perplexity` scores it, so the two can be compared on the same text:
//! the tokens are cut into chunks of `ctx`; each chunk runs from an empty
//! cache (its first token replaced by BOS when the model has one); and only
//! the second half of each chunk is scored, every scored token predicted
//! from at least `ctx / 2` tokens of context.

use crate::batch::{BlockTable, ForwardBatch, LogitsRequest, SeqInput};
use crate::runner::Executor;
use crate::{EngineError, Result};

/// What scoring gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Perplexity {
    /// exp(mean negative log-likelihood).
    pub value: f64,
    /// Its standard error (from the per-token losses' spread, as llama.cpp
    /// reports it).
    pub std_error: f64,
    /// Tokens scored.
    pub scored: usize,
    /// Chunks run.
    pub chunks: usize,
}

/// Scores `tokens` in chunks of `ctx` (at most `max_chunks`), replacing each
/// chunk's first token with `bos` when given. Uses the KV cache's blocks
/// `0..ctx / block_size` (rounded up). Fewer than `2 * ctx` tokens is an
/// error, as in llama.cpp.
pub fn perplexity(executor: &mut dyn Executor, tokens: &[u32], ctx: usize, bos: Option<u32>, max_chunks: Option<usize>) -> Result<Perplexity> {
    if ctx < 4 || tokens.len() < 2 * ctx {
        return Err(EngineError::InvalidBatch(format!(
            "perplexity needs a context of at least 4 and at least 2 × {ctx} tokens; the text has {}",
            tokens.len()
        )));
    }
    let chunks = (tokens.len() / ctx).min(max_chunks.unwrap_or(usize::MAX));
    let blocks: Vec<u32> = (0..ctx.div_ceil(executor.block_size()) as u32).collect();
    let mut losses = Vec::with_capacity(chunks * ctx / 2);
    for chunk in 0..chunks {
        let mut ids = tokens[chunk * ctx..(chunk + 1) * ctx].to_vec();
        if let Some(bos) = bos {
            ids[0] = bos;
        }
        let id = chunk as u64;
        let seq = SeqInput { id, tokens: ids.clone(), start_pos: 0, block_table: BlockTable::Full(blocks.clone()), logits: LogitsRequest::All, sampling: None };
        let out = executor.execute(&ForwardBatch { seqs: vec![seq] })?;
        executor.release(&[id]);
        let logits = out.seqs.first().map(|s| s.logits.as_slice()).unwrap_or_default();
        let vocab = logits.len() / ctx;
        if vocab == 0 || logits.len() != vocab * ctx {
            return Err(EngineError::Backend(format!("expected {ctx} rows of logits, got {} values", logits.len())));
        }
        for j in ctx / 2..ctx - 1 {
            losses.push(negative_log_likelihood(&logits[j * vocab..(j + 1) * vocab], ids[j + 1] as usize));
        }
    }
    Ok(summarize(&losses, chunks))
}

/// −log softmax(row)[target], in f64.
fn negative_log_likelihood(row: &[f32], target: usize) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let logit = row.get(target).copied().unwrap_or(f32::NEG_INFINITY) as f64;
    max + sum.ln() - logit
}

/// The perplexity of per-token `losses` and its standard error.
fn summarize(losses: &[f64], chunks: usize) -> Perplexity {
    let n = losses.len().max(1) as f64;
    let mean = losses.iter().sum::<f64>() / n;
    let mean_sq = losses.iter().map(|l| l * l).sum::<f64>() / n;
    let variance = (mean_sq - mean * mean).max(0.0) / (n - 1.0).max(1.0);
    let value = mean.exp();
    Perplexity { value, std_error: value * variance.sqrt(), scored: losses.len(), chunks }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::backend::KvGeometry;
    use crate::batch::{SeqOutput, StepOutput};

    /// Logits where the next token (the input shifted by one, by the
    /// rule `t + 1 mod vocab`) gets `boost` over a flat rest.
    struct Fixed {
        vocab: usize,
        boost: f32,
    }

    impl Executor for Fixed {
        fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
            let seqs = batch
                .seqs
                .iter()
                .map(|s| {
                    let mut logits = vec![0.0; s.tokens.len() * self.vocab];
                    for (row, &t) in s.tokens.iter().enumerate() {
                        logits[row * self.vocab + (t as usize + 1) % self.vocab] = self.boost;
                    }
                    SeqOutput { logits, sampled: None, grammar_ended: false }
                })
                .collect();
            Ok(StepOutput { seqs })
        }
        fn context_length(&self) -> usize {
            4096
        }
        fn kv_geometry(&self) -> KvGeometry {
            KvGeometry { block_size: 16, num_blocks: 64, bytes_per_block: 0 }
        }
    }

    #[test]
    fn flat_logits_score_the_vocabulary_size_and_a_sure_model_scores_one() {
        let tokens: Vec<u32> = (0..1000).map(|i| i % 50).collect();
        let flat = perplexity(&mut Fixed { vocab: 50, boost: 0.0 }, &tokens, 128, None, None).unwrap();
        assert!((flat.value - 50.0).abs() < 1e-9, "{flat:?}");
        assert_eq!((flat.chunks, flat.scored), (7, 7 * 63));
        let sure = perplexity(&mut Fixed { vocab: 50, boost: 100.0 }, &tokens, 128, None, Some(2)).unwrap();
        assert!((sure.value - 1.0).abs() < 1e-9, "{sure:?}");
        assert_eq!(sure.chunks, 2);
    }

    #[test]
    fn a_known_mix_gives_its_exact_perplexity() {
        // Boost b over 49 flat logits: p(right) = e^b / (e^b + 49).
        let tokens: Vec<u32> = (0..512).map(|i| i % 50).collect();
        let b = 2.0f64;
        let got = perplexity(&mut Fixed { vocab: 50, boost: b as f32 }, &tokens, 256, None, None).unwrap();
        let want = (b.exp() + 49.0) / b.exp();
        assert!((got.value - want).abs() < 1e-6, "{} vs {want}", got.value);
        assert!(got.std_error < 1e-6, "every loss is equal: {got:?}");
    }

    #[test]
    fn too_short_a_text_is_an_error() {
        let tokens: Vec<u32> = (0..100).collect();
        assert!(perplexity(&mut Fixed { vocab: 128, boost: 0.0 }, &tokens, 64, None, None).is_err());
    }
}
