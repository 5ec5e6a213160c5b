//! `/metrics`: the HTTP layer's series, the scheduler's, the Model Server
//! Protocol's under vLLM's names, and device telemetry, exposed in the
//! OpenMetrics text format by `prometheus-client`.
//!
//! The HTTP layer's counters and histograms live for the server's lifetime;
//! each scrape builds a registry around them and around constant series
//! read from the scheduler at that moment, then encodes it.

pub mod gpu_stats;
mod counters;
pub mod sched;
pub mod text;
pub mod vllm;

use counters::{Latencies, TokenCounters};
pub use counters::label_value;
use gpu_stats::GpuReading;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};
use spindle_scheduler::metrics::MetricsSnapshot;
use std::borrow::Cow;

/// The exposition's content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A request counter's labels: the matched route and the status code.
type RouteStatus = [(&'static str, String); 2];

/// Counters and histograms the HTTP layer maintains.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: Family<RouteStatus, Counter>,
    latency: Latencies,
    tokens: TokenCounters,
}

/// What a scrape reads besides [`HttpMetrics`].
pub struct Scrape<'a> {
    /// The scheduler's counters and gauges now.
    pub sched: &'a MetricsSnapshot,
    /// The served model's name (the `model_name` label).
    pub model_name: &'a str,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The device's telemetry, when there is any.
    pub gpu: Option<&'a GpuReading>,
}

impl HttpMetrics {
    /// Count a finished request by route and status.
    pub fn request(&self, route: &str, status: u16) {
        self.requests.get_or_create(&[("route", route.to_string()), ("status", status.to_string())]).inc();
    }

    /// Time to first token, seconds.
    pub fn ttft(&self, seconds: f64) {
        self.latency.ttft.observe(seconds);
    }

    /// Inter-token latency, seconds.
    pub fn itl(&self, seconds: f64) {
        self.latency.itl.observe(seconds);
    }

    /// The phases of a finished request, seconds: waiting for admission,
    /// prefill (admission to first token), decode (first token to the end),
    /// and end to end.
    pub fn phases(&self, queue: f64, prefill: f64, decode: f64, e2e: f64) {
        self.latency.queue.observe(queue);
        self.latency.prefill.observe(prefill);
        self.latency.decode.observe(decode);
        self.latency.e2e.observe(e2e);
    }

    /// Token counts of a finished response.
    pub fn tokens(&self, input: usize, cached: usize, output: usize) {
        self.tokens.input.inc_by(input as u64);
        self.tokens.cached.inc_by(cached as u64);
        self.tokens.output.inc_by(output as u64);
    }

    /// The OpenMetrics text of every series.
    pub fn exposition(&self, scrape: &Scrape<'_>) -> String {
        let mut registry = Registry::default();
        self.register_spindle(&mut registry);
        sched::register(&mut registry, scrape.sched);
        let model = registry.sub_registry_with_label((Cow::Borrowed("model_name"), Cow::Owned(label_value(scrape.model_name))));
        vllm::register(model, &vllm::VllmInputs { latency: &self.latency, tokens: &self.tokens, block_size: scrape.block_size, sched: scrape.sched });
        if let Some(reading) = scrape.gpu {
            gpu_stats::register(&mut registry, reading);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }

    fn register_spindle(&self, r: &mut Registry) {
        r.register("spindle_requests", "HTTP requests by route and status", self.requests.clone());
        let l = &self.latency;
        for (name, help, h) in [
            ("spindle_time_to_first_token", "Time to first token", &l.ttft),
            ("spindle_inter_token_latency", "Time between streamed tokens", &l.itl),
            ("spindle_request_duration", "End-to-end request latency", &l.e2e),
            ("spindle_request_queue", "Time waiting for admission", &l.queue),
            ("spindle_request_prefill", "Time from admission to the first token", &l.prefill),
            ("spindle_request_decode", "Time from the first token to the last", &l.decode),
        ] {
            r.register_with_unit(name, help, Unit::Seconds, h.clone());
        }
        let t = &self.tokens;
        r.register("spindle_input_tokens", "Prompt tokens", t.input.clone());
        r.register("spindle_cached_tokens", "Prompt tokens served from the prefix cache", t.cached.clone());
        r.register("spindle_output_tokens", "Generated tokens", t.output.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape_text(m: &HttpMetrics, sched: &MetricsSnapshot) -> String {
        m.exposition(&Scrape { sched, model_name: "m", block_size: 16, gpu: None })
    }

    #[test]
    fn requests_count_by_route_and_status() {
        let m = HttpMetrics::default();
        m.request("/v1/responses", 200);
        m.request("/v1/responses", 200);
        m.request("/v1/responses", 400);
        let out = scrape_text(&m, &MetricsSnapshot::default());
        assert!(out.contains("# TYPE spindle_requests counter\n"), "{out}");
        assert!(out.contains("spindle_requests_total{route=\"/v1/responses\",status=\"200\"} 2\n"), "{out}");
        assert!(out.contains("spindle_requests_total{route=\"/v1/responses\",status=\"400\"} 1\n"), "{out}");
        assert!(out.ends_with("# EOF\n"), "an OpenMetrics exposition ends with EOF: {out}");
    }

    #[test]
    fn latencies_are_seconds_histograms_with_sum_and_count() {
        let m = HttpMetrics::default();
        m.ttft(0.02);
        m.ttft(3.0);
        let out = scrape_text(&m, &MetricsSnapshot::default());
        assert!(out.contains("# TYPE spindle_time_to_first_token_seconds histogram\n# UNIT spindle_time_to_first_token_seconds seconds\n"), "{out}");
        assert!(out.contains("spindle_time_to_first_token_seconds_sum 3.02\n"), "{out}");
        assert!(out.contains("spindle_time_to_first_token_seconds_count 2\n"), "{out}");
        assert!(out.contains("spindle_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"), "{out}");
        assert!(out.contains("spindle_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"), "{out}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
