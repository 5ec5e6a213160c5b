//! The Model Server Protocol's metrics under vLLM's names, so that an
//! inference gateway (the Gateway API Inference Extension, llm-d) or a
//! dashboard built for vLLM routes and graphs Spindle replicas as they are:
//! running and waiting requests, KV-cache utilization 0–1, the cache's block
//! size and count, prompt and generation tokens, prefix-cache queries and
//! hits, and the request phase histograms. They are registered in a
//! sub-registry that labels each series with `model_name`.

use crate::app::metrics::counters::{Latencies, TokenCounters};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use spindle_scheduler::metrics::MetricsSnapshot;

/// What the vLLM-named series are read from.
pub(super) struct VllmInputs<'a> {
    /// The HTTP layer's latency histograms.
    pub(super) latency: &'a Latencies,
    /// The HTTP layer's token counters.
    pub(super) tokens: &'a TokenCounters,
    /// Tokens per KV block.
    pub(super) block_size: usize,
    /// The scheduler's counters and gauges.
    pub(super) sched: &'a MetricsSnapshot,
}

/// All KV blocks: used, free and cached.
fn kv_blocks(s: &MetricsSnapshot) -> u64 {
    s.blocks_used + s.blocks_free + s.blocks_cached
}

/// KV blocks in use by sequences over all blocks (0 when there are none).
pub fn kv_usage(s: &MetricsSnapshot) -> f64 {
    let total = kv_blocks(s);
    if total == 0 {
        0.0
    } else {
        s.blocks_used as f64 / total as f64
    }
}

/// Adds the vLLM-named series to `r` (a registry labelled with the model).
pub(super) fn register(r: &mut Registry, m: &VllmInputs<'_>) {
    let s = m.sched;
    r.register("vllm:num_requests_running", "Requests running on the model", ConstGauge::new(s.running));
    r.register("vllm:num_requests_waiting", "Requests waiting to be scheduled", ConstGauge::new(s.waiting));
    let usage = kv_usage(s);
    r.register("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means every block is in use", ConstGauge::new(usage));
    r.register("vllm:gpu_cache_usage_perc", "KV-cache usage (the older name): 1 means every block is in use", ConstGauge::new(usage));
    let config = vec![("block_size", m.block_size.to_string()), ("num_gpu_blocks", kv_blocks(s).to_string())];
    r.register("vllm:cache_config", "The KV cache's configuration", Info::new(config));
    r.register("vllm:prompt_tokens", "Prompt tokens processed", m.tokens.input.clone());
    r.register("vllm:generation_tokens", "Tokens generated", m.tokens.output.clone());
    r.register("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", ConstCounter::new(s.prefix_query_tokens));
    r.register("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", ConstCounter::new(s.prefix_hit_tokens));
    let l = m.latency;
    for (name, help, h) in [
        ("vllm:e2e_request_latency", "End-to-end request latency", &l.e2e),
        ("vllm:request_queue_time", "Time waiting for admission", &l.queue),
        ("vllm:request_prefill_time", "Time from admission to the first token", &l.prefill),
        ("vllm:request_decode_time", "Time from the first token to the last", &l.decode),
        ("vllm:time_to_first_token", "Time to first token", &l.ttft),
        ("vllm:inter_token_latency", "Time between streamed tokens", &l.itl),
    ] {
        r.register_with_unit(name, help, Unit::Seconds, h.clone());
    }
}

#[cfg(test)]
mod tests {
    use crate::app::metrics::{HttpMetrics, Scrape};
    use super::*;

    #[test]
    fn series_carry_the_model_name_and_usage_is_a_fraction() {
        let sched = MetricsSnapshot { running: 2, waiting: 3, blocks_used: 25, blocks_free: 50, blocks_cached: 25, ..MetricsSnapshot::default() };
        let http = HttpMetrics::default();
        http.phases(0.001, 0.02, 0.3, 0.33);
        http.tokens(7, 0, 9);
        let out = http.exposition(&Scrape { sched: &sched, model_name: "m\"x", block_size: 16, gpu: None });
        assert!(out.contains("vllm:request_decode_time_seconds_bucket{model_name=\"m\\\"x\",le=\"0.5\"} 1\n"), "{out}");
        assert!(out.contains("vllm:e2e_request_latency_seconds_count{model_name=\"m\\\"x\"} 1\n"), "{out}");
        assert!(out.contains("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\\\"x\"} 3\n"), "{out}");
        assert!(out.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25\n"), "{out}");
        assert!(out.contains("vllm:cache_config_info{model_name=\"m\\\"x\",block_size=\"16\",num_gpu_blocks=\"100\"} 1\n"), "{out}");
        assert!(out.contains("# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{model_name=\"m\\\"x\"} 9\n"), "{out}");
        assert!(out.contains("vllm:prompt_tokens_total{model_name=\"m\\\"x\"} 7\n"), "{out}");
    }
}
