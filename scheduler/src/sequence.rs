//! Per-request state inside the scheduler (no tensors, no KV data).

use crate::kv_cache::SeqKv;
use crate::output::OutputProcessor;
use crate::request::{GenerationEvent, Usage};
use spindle_engine::sampling::SamplingParams;
use tokio::sync::mpsc::UnboundedSender;

/// Identifies a request for `abort`.
pub type RequestId = u64;

/// One request's state.
pub(crate) struct Sequence {
    pub id: RequestId,
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Positions whose KV is in the cache.
    pub num_computed: usize,
    pub kv: SeqKv,
    pub sampling: SamplingParams,
    pub output: OutputProcessor,
    pub salt: u64,
    pub events: UnboundedSender<GenerationEvent>,
    pub usage: Usage,
    /// `Started` was sent (only on first admission, not after preemption).
    pub started: bool,
}

impl Sequence {
    /// Tokens still to run through the model before the next sample.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Generated tokens so far.
    pub fn output_tokens(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Send an event; false when the receiver is gone (treated as an abort).
    pub fn send(&self, event: GenerationEvent) -> bool {
        self.events.send(event).is_ok()
    }
}
