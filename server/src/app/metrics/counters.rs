//! The HTTP layer's latency histograms and token counters, shared by the
//! Spindle and vLLM-named families.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

/// Latency histogram bucket bounds in seconds (+Inf is added).
const LATENCY_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The request phases' latency histograms, seconds.
#[derive(Debug, Clone)]
pub(crate) struct Latencies {
    /// Time to first token.
    pub(crate) ttft: Histogram,
    /// Time between streamed tokens.
    pub(crate) itl: Histogram,
    /// End to end.
    pub(crate) e2e: Histogram,
    /// Waiting for admission.
    pub(crate) queue: Histogram,
    /// Admission to the first token.
    pub(crate) prefill: Histogram,
    /// The first token to the last.
    pub(crate) decode: Histogram,
}

impl Default for Latencies {
    fn default() -> Self {
        let new = || Histogram::new(LATENCY_BUCKETS);
        Self { ttft: new(), itl: new(), e2e: new(), queue: new(), prefill: new(), decode: new() }
    }
}

/// Token counters of finished responses.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenCounters {
    /// Prompt tokens.
    pub(crate) input: Counter,
    /// Prompt tokens served from the prefix cache.
    pub(crate) cached: Counter,
    /// Generated tokens.
    pub(crate) output: Counter,
}

/// `value` escaped for a label (`prometheus-client` writes label values as
/// they are): backslash, double quote and line feed.
pub fn label_value(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

