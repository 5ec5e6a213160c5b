//! The Model Server Protocol's metrics under vLLM's names, so that an
//! inference gateway (the Gateway API Inference Extension, llm-d) or a
//! dashboard built for vLLM routes and graphs Spindle replicas as they are:
//! running and waiting requests, KV-cache utilization 0–1, the cache's block
//! size and count, prompt and generation tokens, prefix-cache queries and
//! hits. Each series carries `model_name`.

use spindle_scheduler::metrics::MetricsSnapshot;
use std::fmt::Write;

/// What the vLLM-named series are computed from.
pub struct VllmInputs<'a> {
    /// The HTTP layer's latency histograms.
    pub http: &'a super::metrics::HttpMetrics,
    /// The served model's name.
    pub model_name: &'a str,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The scheduler's counters and gauges.
    pub sched: &'a MetricsSnapshot,
    /// Prompt tokens of finished responses.
    pub prompt_tokens: u64,
    /// Generated tokens of finished responses.
    pub generation_tokens: u64,
}

/// KV blocks in use by sequences over all blocks (0 when there are none).
pub fn kv_usage(s: &MetricsSnapshot) -> f64 {
    let total = s.blocks_used + s.blocks_free + s.blocks_cached;
    if total == 0 {
        0.0
    } else {
        s.blocks_used as f64 / total as f64
    }
}

/// Appends the vLLM-named series to a Prometheus text body.
pub fn render(out: &mut String, m: &VllmInputs<'_>) {
    let s = m.sched;
    let label = format!("model_name=\"{}\"", m.model_name.replace('\\', "\\\\").replace('"', "\\\""));
    let usage = kv_usage(s);
    let gauges: [(&str, String, &str); 4] = [
        ("vllm:num_requests_running", s.running.to_string(), "Requests running on the model."),
        ("vllm:num_requests_waiting", s.waiting.to_string(), "Requests waiting to be scheduled."),
        ("vllm:kv_cache_usage_perc", usage.to_string(), "KV-cache usage: 1 means every block is in use."),
        ("vllm:gpu_cache_usage_perc", usage.to_string(), "KV-cache usage (the older name): 1 means every block is in use."),
    ];
    for (name, value, help) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{label}}} {value}");
    }
    let blocks = s.blocks_used + s.blocks_free + s.blocks_cached;
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info The KV cache's configuration.\n# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{label},block_size=\"{}\",num_gpu_blocks=\"{blocks}\"}} 1",
        m.block_size
    );
    let counters = [
        ("vllm:prompt_tokens_total", m.prompt_tokens, "Prompt tokens processed."),
        ("vllm:generation_tokens_total", m.generation_tokens, "Tokens generated."),
        ("vllm:prefix_cache_queries_total", s.prefix_query_tokens, "Prompt tokens looked up in the prefix cache."),
        ("vllm:prefix_cache_hits_total", s.prefix_hit_tokens, "Prompt tokens found in the prefix cache."),
    ];
    for (name, value, help) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{label}}} {value}");
    }
    m.http.render_vllm_histograms(out, &label);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_carry_the_model_name_and_usage_is_a_fraction() {
        let sched = MetricsSnapshot { running: 2, waiting: 3, blocks_used: 25, blocks_free: 50, blocks_cached: 25, ..MetricsSnapshot::default() };
        let mut out = String::new();
        let http = super::super::metrics::HttpMetrics::default();
        http.phases(0.001, 0.02, 0.3, 0.33);
        render(&mut out, &VllmInputs { http: &http, model_name: "m\"x", block_size: 16, sched: &sched, prompt_tokens: 7, generation_tokens: 9 });
        assert!(out.contains("vllm:request_decode_time_seconds_bucket{model_name=\"m\\\"x\",le=\"0.5\"} 1"), "{out}");
        assert!(out.contains("vllm:e2e_request_latency_seconds_count{model_name=\"m\\\"x\"} 1"), "{out}");
        assert!(out.contains("vllm:num_requests_waiting{model_name=\"m\\\"x\"} 3"), "{out}");
        assert!(out.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25"), "{out}");
        assert!(out.contains("block_size=\"16\",num_gpu_blocks=\"100\"} 1"), "{out}");
        assert!(out.contains("# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"m\\\"x\"} 9"), "{out}");
    }
}
