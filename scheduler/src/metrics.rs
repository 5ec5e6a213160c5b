//! Counters and gauges the server exports (lock-free; read at any time).

use crate::kv_cache::{KvCacheStats, KvUsage};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (ms) of the step-time histogram buckets; the last is +inf.
pub const STEP_MS_BUCKETS: [f64; 10] = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, f64::INFINITY];
/// Upper bounds of the batch-size (sequences per step) histogram buckets.
pub const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, f64::INFINITY];

/// Scheduler observability.
#[derive(Debug, Default)]
pub struct Metrics {
    running: AtomicU64,
    waiting: AtomicU64,
    blocks_used: AtomicU64,
    blocks_free: AtomicU64,
    blocks_cached: AtomicU64,
    prefix_query_tokens: AtomicU64,
    prefix_hit_tokens: AtomicU64,
    preemptions: AtomicU64,
    aborts: AtomicU64,
    steps: AtomicU64,
    step_ms: [AtomicU64; STEP_MS_BUCKETS.len()],
    batch_size: [AtomicU64; BATCH_BUCKETS.len()],
    step_micros_sum: AtomicU64,
    batch_size_sum: AtomicU64,
    queued: AtomicU64,
}

/// A point-in-time copy of [`Metrics`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Sequences running.
    pub running: u64,
    /// Sequences waiting for admission.
    pub waiting: u64,
    /// KV blocks held by sequences.
    pub blocks_used: u64,
    /// KV blocks free.
    pub blocks_free: u64,
    /// KV blocks cached and evictable.
    pub blocks_cached: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_query_tokens: u64,
    /// Prompt tokens found there.
    pub prefix_hit_tokens: u64,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Aborted requests so far.
    pub aborts: u64,
    /// Steps run.
    pub steps: u64,
    /// Step-time histogram counts, per [`STEP_MS_BUCKETS`].
    pub step_ms: Vec<u64>,
    /// Batch-size histogram counts, per [`BATCH_BUCKETS`].
    pub batch_size: Vec<u64>,
    /// Sum of all step times, seconds.
    pub step_seconds_sum: f64,
    /// Sum of all batch sizes (sequences over all steps).
    pub batch_size_sum: u64,
}

impl Metrics {
    pub(crate) fn set_gauges(&self, running: usize, waiting: usize, usage: KvUsage) {
        self.running.store(running as u64, Relaxed);
        self.waiting.store(waiting as u64, Relaxed);
        self.blocks_used.store(usage.used as u64, Relaxed);
        self.blocks_free.store(usage.free as u64, Relaxed);
        self.blocks_cached.store(usage.cached_evictable as u64, Relaxed);
    }

    pub(crate) fn set_prefix_stats(&self, stats: KvCacheStats) {
        self.prefix_query_tokens.store(stats.prefix_query_tokens, Relaxed);
        self.prefix_hit_tokens.store(stats.prefix_hit_tokens, Relaxed);
    }

    pub(crate) fn preempted(&self) {
        self.preemptions.fetch_add(1, Relaxed);
    }

    pub(crate) fn aborted(&self) {
        self.aborts.fetch_add(1, Relaxed);
    }

    /// A request entered the waiting queue (admission control counts these).
    pub(crate) fn try_enqueue(&self, limit: usize) -> bool {
        self.queued
            .fetch_update(Relaxed, Relaxed, |q| (q < limit as u64).then_some(q + 1))
            .is_ok()
    }

    /// A queued request was admitted (or dropped before admission).
    pub(crate) fn admitted(&self) {
        let _ = self.queued.fetch_update(Relaxed, Relaxed, |q| Some(q.saturating_sub(1)));
    }

    pub(crate) fn record_step(&self, elapsed: Duration, batch: usize) {
        self.steps.fetch_add(1, Relaxed);
        let ms = elapsed.as_secs_f64() * 1e3;
        let i = STEP_MS_BUCKETS.iter().position(|b| ms <= *b).unwrap_or(STEP_MS_BUCKETS.len() - 1);
        self.step_ms[i].fetch_add(1, Relaxed);
        self.step_micros_sum.fetch_add(elapsed.as_micros() as u64, Relaxed);
        self.batch_size_sum.fetch_add(batch as u64, Relaxed);
        let j = BATCH_BUCKETS.iter().position(|b| batch as f64 <= *b).unwrap_or(BATCH_BUCKETS.len() - 1);
        self.batch_size[j].fetch_add(1, Relaxed);
    }

    /// Read everything.
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            running: self.running.load(Relaxed),
            waiting: self.waiting.load(Relaxed),
            blocks_used: self.blocks_used.load(Relaxed),
            blocks_free: self.blocks_free.load(Relaxed),
            blocks_cached: self.blocks_cached.load(Relaxed),
            prefix_query_tokens: self.prefix_query_tokens.load(Relaxed),
            prefix_hit_tokens: self.prefix_hit_tokens.load(Relaxed),
            preemptions: self.preemptions.load(Relaxed),
            aborts: self.aborts.load(Relaxed),
            steps: self.steps.load(Relaxed),
            step_ms: self.step_ms.iter().map(|c| c.load(Relaxed)).collect(),
            batch_size: self.batch_size.iter().map(|c| c.load(Relaxed)).collect(),
            step_seconds_sum: self.step_micros_sum.load(Relaxed) as f64 / 1e6,
            batch_size_sum: self.batch_size_sum.load(Relaxed),
        }
    }
}
