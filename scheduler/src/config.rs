//! Scheduling policy, in one place.

/// Limits and switches of the scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool (must equal the engine pool's).
    pub num_blocks: usize,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Most new tokens (decode + prefill chunks) in one step.
    pub max_num_batched_tokens: usize,
    /// Most requests waiting for admission; past it `submit` fails fast.
    pub max_waiting: usize,
    /// Share full KV blocks between requests with equal prefixes.
    pub enable_prefix_caching: bool,
    /// The model's context window.
    pub context_length: usize,
    /// Folded into every prefix-cache key (e.g. a hash of the model file), so
    /// blocks of one model revision are never reused for another.
    pub model_salt: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            num_blocks: 1024,
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            max_waiting: 256,
            enable_prefix_caching: true,
            context_length: 8192,
            model_salt: 0,
        }
    }
}
