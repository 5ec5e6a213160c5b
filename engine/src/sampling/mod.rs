//! Token sampling from logits.
//!
//! Each sequence owns a [`Sampler`] with its own seeded PRNG, so a given seed
//! yields the same tokens no matter which other sequences share the batch.
//!
//! One call to [`Sampler::sample`] runs, in order:
//!
//! 1. **Penalties**, in place on the logits: the repetition penalty (HF /
//!    llama.cpp: over the distinct tokens of prompt + output, positive logits
//!    are divided by it, the others multiplied), then the OpenAI presence and
//!    frequency penalties over the *output* tokens
//!    (`logit -= frequency * count + presence * (count > 0)`).
//! 2. **Sanitise**, in place: NaN logits become `-inf`, `+inf` becomes
//!    `f32::MAX`. If every logit is `-inf` they are all set to `0` (uniform).
//!    Exponentials use a vectorisable f32 `exp` (relative error ~2e-7) with
//!    f64 accumulation.
//! 3. **Logprobs**: the log-softmax of these penalised logits, *before*
//!    temperature and truncation: the model's distribution as the penalties
//!    left it. [`SampledToken::logprob`] is always filled in;
//!    [`SampledToken::top_logprobs`] when `top_logprobs > 0`.
//! 4. **Choice**: greedy (`temperature == 0` or `top_k == 1`) takes the
//!    argmax, the lowest id on ties. Otherwise the logits are divided by the
//!    temperature, then top-k, then top-p, then min-p are applied (the HF /
//!    vLLM order: top-p's mass is measured on the top-k set, min-p relative to
//!    the most likely token), and a token is drawn from what is left.
//!
//! The full vocabulary is never sorted: top-k uses `select_nth_unstable`,
//! top-p a weighted quickselect that sorts at most a small range (expected
//! O(vocab) either way), and scratch buffers live in the sampler.

mod math;
mod penalty;
mod rng;
mod select;
#[cfg(test)]
mod tests;

pub use penalty::{PenaltyBook, PenaltyCounts};
pub use rng::{entropy_seed, splitmix64, Rng};

use crate::error::{EngineError, Result};
use select::{mass, top_k_into, truncate_top_p, TopKHeap, HEAP_TOP_K};

/// The most alternatives [`SamplingParams::top_logprobs`] may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Temperatures below this are treated as greedy (as vLLM does), which also
/// keeps `1 / temperature` finite.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// How to pick the next token. `Default` is greedy with no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `0` (or anything below [`GREEDY_TEMPERATURE`])
    /// means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of tokens whose probability
    /// reaches `top_p`; `1` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `0` disables.
    pub min_p: f32,
    /// HF / llama.cpp repetition penalty over tokens seen in prompt + output:
    /// positive logits are divided by it, negative ones multiplied; `1` disables.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty: subtracted once from every token already in the output.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty: subtracted once per occurrence in the output.
    pub frequency_penalty: f32,
    /// PRNG seed; `None` draws one from entropy.
    pub seed: Option<u64>,
    /// How many most-likely alternatives to report with each token; `0` for none.
    pub top_logprobs: usize,
    /// Whether the caller wants the chosen token's logprob reported.
    pub logprobs: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            top_logprobs: 0,
            logprobs: false,
        }
    }
}

impl SamplingParams {
    /// Whether these parameters always pick the argmax: `top_k == 1`, or a
    /// temperature below [`GREEDY_TEMPERATURE`].
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE || self.top_k == 1
    }

    /// Whether any penalty is on (they need the sequence's history).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// Whether the penalties need the prompt's tokens (only the repetition
    /// penalty counts them).
    pub fn penalizes_prompt(&self) -> bool {
        self.repetition_penalty != 1.0
    }

    /// Check every value is in range; the error names the field, the value and the range.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(EngineError::InvalidSampling(msg));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!(
                "temperature must be a finite number >= 0 (0 = greedy), got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!(
                "top_p must be in (0, 1] (1 = off), got {}",
                self.top_p
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!(
                "min_p must be in [0, 1] (0 = off), got {}",
                self.min_p
            ));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad(format!(
                "repetition_penalty must be a finite number > 0 (1 = off), got {}",
                self.repetition_penalty
            ));
        }
        for (name, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&value) {
                return bad(format!("{name} must be in [-2, 2] (0 = off), got {value}"));
            }
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return bad(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.top_logprobs
            ));
        }
        Ok(())
    }
}

/// The token a [`Sampler`] chose, with its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledToken {
    /// The chosen token id.
    pub token: u32,
    /// Log-softmax of the penalised logits at `token`, before temperature and
    /// truncation (see the module docs). `-inf` only for an empty vocabulary.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens by the same measure, most likely
    /// first (lowest id first on ties).
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Per-sequence sampler: parameters, a seeded PRNG and reusable scratch space.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Rng,
    /// Temperature-scaled, max-shifted exponentials, one per vocabulary entry.
    probs: Vec<f32>,
    /// `(unnormalised probability, token)` candidates.
    cand: Vec<(f32, u32)>,
    /// Scratch heap for small top-k selections.
    heap: TopKHeap,
}

impl Sampler {
    /// A sampler for `params` (validated); seeded from entropy when `params.seed` is `None`.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(entropy_seed);
        Ok(Self {
            params,
            seed,
            rng: Rng::new(seed),
            probs: Vec::new(),
            cand: Vec::new(),
            heap: TopKHeap::new(),
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (drawn from entropy if none was given), for reproducing a run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Restart the random stream from `seed`, keeping the scratch buffers
    /// (e.g. to key the stream by step while reusing one sampler).
    pub fn set_seed(&mut self, seed: u64) {
        self.seed = seed;
        self.rng = Rng::new(seed);
    }

    /// Choose the next token, the penalties counted from `prompt_tokens`
    /// and `output_tokens` (see [`Self::sample_counted`]).
    pub fn sample(&mut self, logits: &mut [f32], prompt_tokens: &[u32], output_tokens: &[u32]) -> SampledToken {
        let p = &self.params;
        let counts = p.has_penalties().then(|| {
            let prompt = if p.repetition_penalty != 1.0 { prompt_tokens } else { &[] };
            PenaltyCounts::new(prompt, output_tokens)
        });
        self.sample_counted(logits, counts.as_ref())
    }

    /// Choose the next token.
    ///
    /// `logits` holds one value per vocabulary entry and is modified in place
    /// (penalised and sanitised, see the module docs). `penalties` holds the
    /// history the penalties count; ids outside the vocabulary are ignored.
    pub fn sample_counted(&mut self, logits: &mut [f32], penalties: Option<&PenaltyCounts>) -> SampledToken {
        if logits.is_empty() {
            return SampledToken {
                token: 0,
                logprob: f32::NEG_INFINITY,
                top_logprobs: Vec::new(),
            };
        }
        if let Some(counts) = penalties {
            let p = &self.params;
            counts.apply(logits, p.repetition_penalty, p.presence_penalty, p.frequency_penalty);
        }
        let (argmax, max) = math::sanitize_argmax(logits);
        self.probs.resize(logits.len(), 0.0);
        let probs = &mut self.probs[..logits.len()];
        let (token, sum) = if self.params.is_greedy() {
            (argmax, math::exp_sum(logits, max, 1.0, probs))
        } else {
            let t = self.params.temperature;
            let unscaled = (t != 1.0).then(|| math::exp_sum(logits, max, 1.0, &mut *probs));
            // `probs` ends up holding the temperature-scaled values for `draw`.
            let scaled = math::exp_sum(logits, max, 1.0 / t, probs);
            let token = self.draw(logits.len(), scaled).unwrap_or(argmax);
            (token, unscaled.unwrap_or(scaled))
        };
        let log_z = max + sum.ln() as f32;
        let top_logprobs = self.top_n(logits, log_z);
        let logprob = logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| l - log_z);
        SampledToken {
            token,
            logprob,
            top_logprobs,
        }
    }

    /// Top-k, top-p, min-p over `probs[..n]` (whose largest entry is 1 and
    /// whose sum is `total`), then a random draw. `None` only if no token has
    /// a non-zero probability.
    fn draw(&mut self, n: usize, total: f64) -> Option<u32> {
        let Self {
            params: p,
            probs,
            cand,
            heap,
            rng,
            ..
        } = self;
        let probs = &probs[..n];
        let top_k = if p.top_k < n { p.top_k } else { 0 };
        if top_k == 0 && p.top_p >= 1.0 && p.min_p <= 0.0 {
            return draw_from(probs.iter().copied().zip(0..), total, rng);
        }
        // min-p keeps a prefix of the descending order, as top-k does, so it
        // can be applied first; not so when top-p must measure the top-k mass.
        let early_min_p = if p.top_p >= 1.0 { p.min_p } else { 0.0 };
        if top_k > 0 && top_k <= HEAP_TOP_K {
            top_k_into(probs, top_k, early_min_p.max(f32::MIN_POSITIVE), heap, cand);
        } else {
            // Without top-k, tokens under `floor` hold at most half of the
            // 1 - top_p mass top-p drops, so they cannot be in the nucleus.
            let mut floor = early_min_p.max(f32::MIN_POSITIVE);
            if top_k == 0 && p.top_p < 1.0 {
                floor = floor.max((0.5 * (1.0 - f64::from(p.top_p)) * total / n as f64) as f32);
            }
            cand.clear();
            let kept = probs.iter().zip(0..).filter(|c| *c.0 >= floor);
            cand.extend(kept.map(|(&w, i)| (w, i)));
            if top_k > 0 && top_k < cand.len() {
                cand.select_nth_unstable_by(top_k - 1, select::desc);
                cand.truncate(top_k);
            }
        }
        if p.top_p < 1.0 {
            let base = if top_k > 0 { mass(cand) } else { total };
            truncate_top_p(cand, f64::from(p.top_p) * base);
        }
        if p.min_p > early_min_p {
            cand.retain(|c| c.0 >= p.min_p);
        }
        draw_from(cand.iter().copied(), mass(cand), rng)
    }

    /// The `top_logprobs` most likely tokens of `logits`, normalised by `log_z`.
    fn top_n(&mut self, logits: &[f32], log_z: f32) -> Vec<(u32, f32)> {
        let n = self.params.top_logprobs.min(logits.len());
        if n == 0 {
            return Vec::new();
        }
        top_k_into(logits, n, f32::NEG_INFINITY, &mut self.heap, &mut self.cand);
        self.cand.sort_unstable_by(select::desc);
        self.cand.iter().map(|&(l, tok)| (tok, l - log_z)).collect()
    }
}

/// Draw from `(weight, token)` pairs whose weights sum to about `total`.
/// Rounding that leaves the target past the end picks the last token with a
/// non-zero weight; `None` if there is none.
fn draw_from(items: impl Iterator<Item = (f32, u32)>, total: f64, rng: &mut Rng) -> Option<u32> {
    let target = rng.next_f64() * total;
    let mut acc = 0.0;
    let mut last = None;
    for (w, tok) in items {
        if w > 0.0 {
            acc += f64::from(w);
            last = Some(tok);
            if target < acc {
                break;
            }
        }
    }
    last
}
