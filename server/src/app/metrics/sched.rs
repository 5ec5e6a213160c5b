//! The scheduler's series on `/metrics` (`spindle_*`): gauges and counters
//! read from a [`MetricsSnapshot`] at scrape time, and its step-time and
//! batch-size histograms from the bucket counts it keeps.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use spindle_scheduler::metrics::{MetricsSnapshot, BATCH_BUCKETS, STEP_MS_BUCKETS};

/// A histogram read from bucket counts kept elsewhere.
#[derive(Debug)]
struct BucketCounts {
    /// (upper bound, count in this bucket alone); the last bound is +Inf.
    buckets: Vec<(f64, u64)>,
    sum: f64,
}

impl BucketCounts {
    /// From bucket bounds scaled by `scale` and the counts of each bucket.
    fn new(bounds: &[f64], scale: f64, counts: &[u64], sum: f64) -> Self {
        let bound = |b: f64| if b.is_infinite() { f64::MAX } else { b * scale };
        Self { buckets: bounds.iter().zip(counts).map(|(b, c)| (bound(*b), *c)).collect(), sum }
    }
}

impl EncodeMetric for BucketCounts {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let count = self.buckets.iter().map(|(_, c)| c).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum, count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Adds the scheduler's series, read from `s`.
pub fn register(r: &mut Registry, s: &MetricsSnapshot) {
    for (name, help, v) in [
        ("spindle_running_sequences", "Sequences running", s.running),
        ("spindle_queue_depth", "Requests waiting for admission", s.waiting),
        ("spindle_kv_blocks_used", "KV blocks held by sequences", s.blocks_used),
        ("spindle_kv_blocks_free", "KV blocks free", s.blocks_free),
        ("spindle_kv_blocks_cached", "KV blocks cached and evictable", s.blocks_cached),
    ] {
        r.register(name, help, ConstGauge::new(v));
    }
    for (name, help, v) in [
        ("spindle_prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache", s.prefix_query_tokens),
        ("spindle_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache", s.prefix_hit_tokens),
        ("spindle_preemptions", "Sequences preempted for KV space", s.preemptions),
        ("spindle_aborts", "Requests aborted", s.aborts),
        ("spindle_steps", "Scheduler steps", s.steps),
    ] {
        r.register(name, help, ConstCounter::new(v));
    }
    let steps = BucketCounts::new(&STEP_MS_BUCKETS, 1e-3, &s.step_ms, s.step_seconds_sum);
    r.register_with_unit("spindle_step_duration", "Time of one scheduler step", Unit::Seconds, steps);
    let batches = BucketCounts::new(&BATCH_BUCKETS, 1.0, &s.batch_size, s.batch_size_sum as f64);
    r.register("spindle_batch_size", "Sequences per scheduler step", batches);
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn gauges_counters_and_step_histograms_read_the_snapshot() -> Result<(), std::fmt::Error> {
        let mut step_ms = vec![0; STEP_MS_BUCKETS.len()];
        step_ms[0] = 3; // <= 1 ms
        step_ms[3] = 1; // <= 10 ms
        let snapshot = MetricsSnapshot { blocks_free: 64, steps: 4, step_ms, step_seconds_sum: 0.012, batch_size: vec![0; BATCH_BUCKETS.len()], ..MetricsSnapshot::default() };
        let mut r = Registry::default();
        register(&mut r, &snapshot);
        let mut out = String::new();
        encode(&mut out, &r)?;
        assert!(out.contains("# TYPE spindle_kv_blocks_free gauge\nspindle_kv_blocks_free 64\n"), "{out}");
        assert!(out.contains("spindle_steps_total 4\n"), "{out}");
        assert!(out.contains("spindle_step_duration_seconds_bucket{le=\"0.001\"} 3\n"), "{out}");
        assert!(out.contains("spindle_step_duration_seconds_bucket{le=\"0.01\"} 4\n"), "{out}");
        assert!(out.contains("spindle_step_duration_seconds_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("spindle_step_duration_seconds_sum 0.012\n"), "{out}");
        assert!(out.contains("spindle_step_duration_seconds_count 4\n"), "{out}");
        Ok(())
    }
}
