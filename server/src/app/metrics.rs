//! HTTP-level metrics and the Prometheus text rendering of `/metrics`.

use spindle_scheduler::metrics::{MetricsSnapshot, BATCH_BUCKETS, STEP_MS_BUCKETS};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Latency histogram bucket bounds in seconds.
const LATENCY_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, f64::INFINITY];

/// A fixed-bucket histogram.
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; LATENCY_BUCKETS.len()],
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, seconds: f64) {
        let i = LATENCY_BUCKETS.iter().position(|b| seconds <= *b).unwrap_or(LATENCY_BUCKETS.len() - 1);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add((seconds * 1e6) as u64, Relaxed);
    }

    /// The histogram's lines; `labels` (e.g. `model_name="m"`) go on every one.
    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let (sep, braces) = if labels.is_empty() { ("", String::new()) } else { (",", format!("{{{labels}}}")) };
        let mut cumulative = 0;
        for (b, c) in LATENCY_BUCKETS.iter().zip(&self.counts) {
            cumulative += c.load(Relaxed);
            let le = if b.is_infinite() { "+Inf".to_string() } else { b.to_string() };
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum_micros.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

/// Counters the HTTP layer maintains.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    input_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    output_tokens: AtomicU64,
}

impl HttpMetrics {
    /// Count a finished request by route and status.
    pub fn request(&self, route: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route.to_string(), status)).or_default() += 1;
        }
    }

    /// Time to first token, seconds.
    pub fn ttft(&self, seconds: f64) {
        self.ttft.observe(seconds);
    }

    /// Inter-token latency, seconds.
    pub fn itl(&self, seconds: f64) {
        self.itl.observe(seconds);
    }

    /// The phases of a finished request, seconds: waiting for admission,
    /// prefill (admission to first token), decode (first token to the end),
    /// and end to end.
    pub fn phases(&self, queue: f64, prefill: f64, decode: f64, e2e: f64) {
        self.queue.observe(queue);
        self.prefill.observe(prefill);
        self.decode.observe(decode);
        self.e2e.observe(e2e);
    }

    /// The latency histograms under vLLM's names, labelled `labels`.
    pub fn render_vllm_histograms(&self, out: &mut String, labels: &str) {
        self.e2e.render(out, "vllm:e2e_request_latency_seconds", "End-to-end request latency.", labels);
        self.queue.render(out, "vllm:request_queue_time_seconds", "Time waiting for admission.", labels);
        self.prefill.render(out, "vllm:request_prefill_time_seconds", "Time from admission to the first token.", labels);
        self.decode.render(out, "vllm:request_decode_time_seconds", "Time from the first token to the last.", labels);
        self.ttft.render(out, "vllm:time_to_first_token_seconds", "Time to first token.", labels);
        self.itl.render(out, "vllm:inter_token_latency_seconds", "Time between streamed tokens.", labels);
    }

    /// Token counts of a finished response.
    pub fn tokens(&self, input: usize, cached: usize, output: usize) {
        self.input_tokens.fetch_add(input as u64, Relaxed);
        self.cached_tokens.fetch_add(cached as u64, Relaxed);
        self.output_tokens.fetch_add(output as u64, Relaxed);
    }

    /// Prompt and generated tokens of finished responses so far.
    pub fn token_totals(&self) -> (u64, u64) {
        (self.input_tokens.load(Relaxed), self.output_tokens.load(Relaxed))
    }

    /// Prometheus text exposition of these and the scheduler's metrics.
    pub fn render(&self, sched: &MetricsSnapshot) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP spindle_requests_total HTTP requests by route and status.\n# TYPE spindle_requests_total counter");
        if let Ok(m) = self.requests.lock() {
            for ((route, status), n) in m.iter() {
                let _ = writeln!(out, "spindle_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
            }
        }
        self.ttft.render(&mut out, "spindle_time_to_first_token_seconds", "Time to first token.", "");
        self.itl.render(&mut out, "spindle_inter_token_latency_seconds", "Time between streamed tokens.", "");
        self.e2e.render(&mut out, "spindle_request_duration_seconds", "End-to-end request latency.", "");
        self.queue.render(&mut out, "spindle_request_queue_seconds", "Time waiting for admission.", "");
        self.prefill.render(&mut out, "spindle_request_prefill_seconds", "Time from admission to the first token.", "");
        self.decode.render(&mut out, "spindle_request_decode_seconds", "Time from the first token to the last.", "");
        for (name, v, help) in [
            ("spindle_input_tokens_total", &self.input_tokens, "Prompt tokens."),
            ("spindle_cached_tokens_total", &self.cached_tokens, "Prompt tokens served from the prefix cache."),
            ("spindle_output_tokens_total", &self.output_tokens, "Generated tokens."),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
        }
        render_scheduler(&mut out, sched);
        out
    }
}

fn render_scheduler(out: &mut String, s: &MetricsSnapshot) {
    for (name, v, help) in [
        ("spindle_running_sequences", s.running, "Sequences running."),
        ("spindle_queue_depth", s.waiting, "Requests waiting for admission."),
        ("spindle_kv_blocks_used", s.blocks_used, "KV blocks held by sequences."),
        ("spindle_kv_blocks_free", s.blocks_free, "KV blocks free."),
        ("spindle_kv_blocks_cached", s.blocks_cached, "KV blocks cached and evictable."),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    for (name, v, help) in [
        ("spindle_prefix_cache_query_tokens_total", s.prefix_query_tokens, "Prompt tokens looked up in the prefix cache."),
        ("spindle_prefix_cache_hit_tokens_total", s.prefix_hit_tokens, "Prompt tokens found in the prefix cache."),
        ("spindle_preemptions_total", s.preemptions, "Sequences preempted for KV space."),
        ("spindle_aborts_total", s.aborts, "Requests aborted."),
        ("spindle_steps_total", s.steps, "Scheduler steps."),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
    }
    bucket_lines(out, "spindle_step_duration_ms", &STEP_MS_BUCKETS, &s.step_ms);
    bucket_lines(out, "spindle_batch_size", &BATCH_BUCKETS, &s.batch_size);
}

fn bucket_lines(out: &mut String, name: &str, bounds: &[f64], counts: &[u64]) {
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (b, c) in bounds.iter().zip(counts) {
        cumulative += c;
        let le = if b.is_infinite() { "+Inf".to_string() } else { b.to_string() };
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_count {cumulative}");
}
