//! Per-request state inside the scheduler (no tensors, no KV data).

use crate::kv_cache::SeqKv;
use crate::output::OutputProcessor;
use crate::request::{GenerationEvent, GenerationRequest, Usage};
use spindle_engine::batch::PenaltyHistory;
use spindle_engine::sampling::SamplingParams;
use spindle_engine::tokenizer::Tokenizer;
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
    /// The grammar, when the output is constrained.
    pub constraint: Option<spindle_engine::grammar::SharedConstraint>,
    pub output: OutputProcessor,
    pub salt: u64,
    pub events: UnboundedSender<GenerationEvent>,
    pub usage: Usage,
    /// `Started` was sent (only on first admission, not after preemption).
    pub started: bool,
    /// What the executor holds of the block table since the last step: how
    /// many blocks, at which count of table rewrites (`None`: nothing).
    pub sent_table: Option<(usize, u64)>,
    /// How many generated tokens the executor holds of the penalty history
    /// (`None`: nothing).
    pub sent_history: Option<usize>,
}

impl Sequence {
    /// A fresh sequence for `request`, sending its events to `events`.
    pub fn new(
        id: RequestId,
        request: GenerationRequest,
        tokenizer: Tokenizer,
        model_salt: u64,
        events: UnboundedSender<GenerationEvent>,
    ) -> Self {
        Self {
            id,
            prompt_len: request.prompt.len(),
            usage: Usage { input_tokens: request.prompt.len(), ..Usage::default() },
            salt: cache_salt(model_salt, request.cache_salt.as_deref()),
            tokens: request.prompt,
            num_computed: 0,
            kv: SeqKv::default(),
            sampling: request.sampling,
            constraint: request.constraint,
            output: OutputProcessor::new(tokenizer, request.stop),
            events,
            started: false,
            sent_table: None,
            sent_history: None,
        }
    }

    /// Tokens still to run through the model before the next sample.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// Generated tokens so far.
    pub fn output_tokens(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// The block table for this step: only the blocks appended since the
    /// last step while the executor holds the rest, else the whole table.
    pub fn table_for_step(&mut self) -> spindle_engine::batch::BlockTable {
        use spindle_engine::batch::BlockTable;
        let blocks = &self.kv.blocks;
        let table = match self.sent_table {
            Some((sent, rewrites)) if rewrites == self.kv.rewrites() && sent <= blocks.len() => BlockTable::Append(blocks[sent..].to_vec()),
            _ => BlockTable::Full(blocks.clone()),
        };
        self.sent_table = Some((blocks.len(), self.kv.rewrites()));
        table
    }

    /// The penalty history for this step's sample (`None` when no penalty
    /// is on): the tokens generated since it was last sent while the
    /// executor holds the rest, else the whole history.
    pub fn history_for_step(&mut self) -> Option<PenaltyHistory> {
        if !self.sampling.has_penalties() {
            return None;
        }
        let output = &self.tokens[self.prompt_len..];
        let history = match self.sent_history {
            Some(sent) if sent <= output.len() => PenaltyHistory::Append(output[sent..].to_vec()),
            _ => {
                let prompt = if self.sampling.penalizes_prompt() { self.tokens[..self.prompt_len].to_vec() } else { Vec::new() };
                PenaltyHistory::Full { prompt, output: output.to_vec() }
            }
        };
        self.sent_history = Some(output.len());
        Some(history)
    }

    /// Send an event; false when the receiver is gone (treated as an abort).
    pub fn send(&self, event: GenerationEvent) -> bool {
        self.events.send(event).is_ok()
    }
}

/// The prefix-cache key of a request: the model's salt and its own salt.
fn cache_salt(model_salt: u64, salt: Option<&str>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ model_salt;
    for b in salt.unwrap_or("").bytes().chain([0xff]) {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}
