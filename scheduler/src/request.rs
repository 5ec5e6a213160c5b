//! What callers submit and what they get back.

use crate::output::StopConditions;
use spindle_engine::sampling::SamplingParams;

/// A request to generate from an already-tokenized prompt.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    /// The prompt tokens (chat template already applied).
    pub prompt: Vec<u32>,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// When to stop.
    pub stop: StopConditions,
    /// Isolation key for the prefix cache: requests with different salts
    /// never share cached blocks (so one tenant cannot probe another's
    /// prompts by timing). `None` shares with every other unsalted request.
    pub cache_salt: Option<String>,
    /// A grammar the output must follow: each sample is masked by it and
    /// advances it (constrained decoding).
    pub constraint: Option<spindle_engine::grammar::SharedConstraint>,
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token.
    Eos,
    /// A stop string (not included in the text).
    StopString(String),
    /// `max_tokens` reached.
    MaxTokens,
    /// The model's context window is full.
    ContextLength,
}

/// Token counts for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: usize,
    /// Prompt tokens served from the prefix cache (on first admission).
    pub cached_tokens: usize,
    /// Generated tokens.
    pub output_tokens: usize,
}

/// A token as generated, with its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// Token id.
    pub id: u32,
    /// Log-probability under the model.
    pub logprob: f32,
    /// Most likely alternatives, when asked for.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Everything a request's stream carries, in order: one `Started`, any number
/// of `Delta`s, then exactly one `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// Admitted and its prompt scheduled.
    Started {
        /// Prompt tokens found in the prefix cache.
        cached_tokens: usize,
    },
    /// New text (may be empty while a possible stop string is held back).
    Delta {
        /// Text since the last delta.
        text: String,
        /// The token this delta came from.
        token: GeneratedToken,
    },
    /// Finished normally.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Text held back until the end (flushed here).
        text: String,
        /// Token counts.
        usage: Usage,
    },
    /// Failed (engine error); no more events follow.
    Failed {
        /// What went wrong.
        message: String,
    },
}
