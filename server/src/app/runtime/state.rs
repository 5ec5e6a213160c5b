//! Shared server state handed to every handler.

use crate::app::access::auth::ApiKeys;
use crate::app::metrics::HttpMetrics;
use crate::store::ResponseStore;
use spindle_engine::chat_template::ChatTemplate;
use spindle_engine::tokenizer::Tokenizer;
use spindle_scheduler::SchedulerHandle;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server knows about the model it serves.
pub struct ModelInfo {
    /// The id clients send as `model` (the first `--served-model-name`).
    pub name: String,
    /// Other names requests may use for it (`--served-model-name`).
    pub aliases: Vec<String>,
    /// Tokenizer (prompt encoding).
    pub tokenizer: Tokenizer,
    /// Chat template.
    pub template: ChatTemplate,
    /// Context window in tokens.
    pub context_length: usize,
    /// Unix time the model was loaded (`created` in /v1/models).
    pub created: i64,
    /// Compiles grammars for constrained decoding (`None`: this tokenizer
    /// cannot be constrained; requests that need it get a 400).
    pub grammar: Option<spindle_engine::grammar::GrammarCompiler>,
    /// How the chat template writes tool calls.
    pub call_format: crate::app::format::constrain::CallFormat,
    /// The reasoning tags of a thinking model (`None`: answers only).
    pub think_tags: Option<crate::app::format::reasoning::ThinkTags>,
    /// Recent turns' token ids, so the next turn's prompt extends them exactly.
    pub ledger: crate::app::format::ledger::TokenLedger,
    /// The most bytes of text one token stands for (the longest vocabulary
    /// entry): text of `n` bytes is at least `n / max_token_bytes` tokens.
    pub max_token_bytes: usize,
}

impl ModelInfo {
    /// Model info with the grammar compiler and call format derived from the
    /// tokenizer (over `vocab_size` logits) and the template.
    pub fn new(name: String, tokenizer: Tokenizer, template: ChatTemplate, context_length: usize, vocab_size: usize, created: i64) -> Self {
        let grammar = match spindle_engine::grammar::GrammarCompiler::new(&tokenizer, vocab_size) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!("{e}");
                None
            }
        };
        let call_format = crate::app::format::constrain::CallFormat::of(&template, &tokenizer);
        let think_tags = crate::app::format::reasoning::ThinkTags::of(&tokenizer, &template);
        let max_token_bytes = tokenizer.hf().get_vocab(true).keys().map(String::len).max().unwrap_or(1).max(1);
        Self { name, aliases: Vec::new(), tokenizer, template, context_length, created, grammar, call_format, think_tags, ledger: Default::default(), max_token_bytes }
    }

    /// Whether requests may name the model `name`.
    pub fn answers_to(&self, name: &str) -> bool {
        name == self.name || self.aliases.iter().any(|a| a == name)
    }

    /// Whether the prompt ends inside a reasoning block (R1-style templates
    /// end with `<think>` or `<think>\n`): an opening tag among the last few
    /// tokens, after any closing one.
    pub fn prompt_opens_thinking(&self, prompt: &[u32]) -> bool {
        const TAIL: usize = 4;
        let Some(tags) = self.think_tags else { return false };
        let open = prompt.iter().rposition(|&t| t == tags.open);
        let close = prompt.iter().rposition(|&t| t == tags.close);
        match open {
            Some(o) => prompt.len() - o <= TAIL && close.is_none_or(|c| c < o),
            None => false,
        }
    }

    /// The grammar a validated request implies for a prompt, compiled as the
    /// server compiles it (`None` when nothing constrains it).
    pub fn constraint_for(&self, req: &crate::protocol::ValidRequest, prompt: &[u32]) -> Result<Option<spindle_engine::grammar::SharedConstraint>, crate::protocol::ApiError> {
        let think = self.think_tags.map(|t| (t, self.prompt_opens_thinking(prompt)));
        crate::app::format::constrain::constraint_after_thinking(self.grammar.as_ref(), self.call_format, req, think)
    }
}

/// Sampling used when a request leaves a field out (the protocol sets no
/// defaults; these follow llama.cpp's server, which suits small local models
/// far better than OpenAI's 1.0/1.0). The response echoes what was used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    /// Temperature.
    pub temperature: f64,
    /// Nucleus threshold.
    pub top_p: f64,
    /// Top-k (extension field).
    pub top_k: u32,
    /// Min-p (extension field).
    pub min_p: f64,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        Self { temperature: 0.8, top_p: 0.95, top_k: 40, min_p: 0.05 }
    }
}

/// Request limits enforced before anything reaches the scheduler.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Most input items per request.
    pub max_input_items: usize,
    /// Most tools per request.
    pub max_tools: usize,
    /// Largest `max_output_tokens`.
    pub max_output_tokens: usize,
    /// `max_output_tokens` when a request leaves it out.
    pub default_output_tokens: usize,
    /// Wall-clock limit of one request.
    pub request_timeout: Duration,
    /// Longest a streamed response may wait for its client to read before it
    /// is ended (and its KV blocks freed).
    pub stream_stall_timeout: Duration,
    /// Longest a request body may take to arrive (408 beyond).
    pub body_read_timeout: Duration,
    /// Most generations one tenant may run (or queue) at once (429 beyond).
    pub max_streams_per_tenant: usize,
    /// Sampling for fields a request leaves out.
    pub sampling: SamplingDefaults,
    /// Longest a WebSocket connection may stay open (60 minutes).
    pub websocket_max_connection: Duration,
    /// How long an LMSP task's event history stays replayable after it ends.
    pub task_event_retention: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 8 << 20,
            max_input_items: 1024,
            max_tools: 128,
            max_output_tokens: 4096,
            default_output_tokens: 4096,
            request_timeout: Duration::from_secs(600),
            body_read_timeout: Duration::from_secs(30),
            max_streams_per_tenant: 320,
            stream_stall_timeout: Duration::from_secs(30),
            sampling: SamplingDefaults::default(),
            websocket_max_connection: Duration::from_secs(60 * 60),
            task_event_retention: Duration::from_secs(60 * 60),
        }
    }
}

/// Everything handlers share.
pub struct AppState {
    /// The scheduler.
    pub scheduler: SchedulerHandle,
    /// Seals and opens compaction items.
    pub sealer: crate::app::access::seal::Sealer,
    /// LMSP tasks that are running now.
    pub tasks: crate::app::runtime::tasks::TaskHub,
    /// LMSP `Idempotency-Key` outcomes.
    pub idempotency: crate::app::runtime::idempotency::IdempotencyKeys,
    /// The served model.
    pub model: ModelInfo,
    /// Stored responses.
    pub store: Arc<dyn ResponseStore>,
    /// API keys (empty: none required).
    pub keys: ApiKeys,
    /// Limits.
    pub limits: Limits,
    /// HTTP-level metrics.
    pub metrics: HttpMetrics,
    /// Generations running per tenant.
    pub slots: crate::app::access::slots::TenantSlots,
    /// Background responses in flight: response id -> scheduler request.
    pub running: Mutex<HashMap<String, Arc<crate::app::runtime::control::Background>>>,
    /// Set when the drain period after a shutdown signal ends: in-flight
    /// generations then fail with a terminal event.
    pub draining: tokio::sync::watch::Sender<bool>,
}
