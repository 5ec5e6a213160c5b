//! Scheduling policy, in one place; the executor fixes the rest.

use spindle_engine::runner::Executor;

/// Limits and switches of the scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Most new tokens (decode + prefill chunks) in one step.
    pub max_num_batched_tokens: usize,
    /// Most requests waiting for admission; past it `submit` fails fast.
    pub max_waiting: usize,
    /// Share full KV blocks between requests with equal prefixes.
    pub enable_prefix_caching: bool,
    /// Folded into every prefix-cache key (e.g. a hash of the model file), so
    /// blocks of one model revision are never reused for another.
    pub model_salt: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self { max_num_seqs: 64, max_num_batched_tokens: 512, max_waiting: 256, enable_prefix_caching: true, model_salt: 0 }
    }
}

/// What the executor fixes: its KV cache's shape and the model's context
/// window. [`crate::SchedulerHandle::spawn`] reads them from the executor,
/// so the scheduler's block ids always index the executor's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the cache.
    pub num_blocks: usize,
    /// The model's context window.
    pub context_length: usize,
}

impl ModelLimits {
    /// The limits of `executor`. The context window is the model's, or
    /// what the whole KV cache holds when that is less: a sequence alone can
    /// then always grow to its end (it is never preempted for good).
    pub fn of(executor: &dyn Executor) -> Self {
        let g = executor.kv_geometry();
        let cache_tokens = g.block_size * g.num_blocks;
        if cache_tokens < executor.context_length() {
            tracing::warn!("the KV cache holds {cache_tokens} tokens, less than the model's context of {}: sequences end there", executor.context_length());
        }
        Self { block_size: g.block_size, num_blocks: g.num_blocks, context_length: executor.context_length().min(cache_tokens) }
    }

    /// Tokens the KV cache holds.
    pub fn cache_tokens(&self) -> usize {
        self.block_size * self.num_blocks
    }
}
