//! Aggregates over request records: percentiles, throughput, goodput under
//! SLOs, error counts, per-turn prefix-cache hit rates.

use super::args::Slo;
use super::client::RequestRecord;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Mean and percentiles of one latency (ms). Percentiles interpolate
/// linearly between order statistics (numpy's default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of values.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

/// The `q`-th percentile (0–100) of sorted `values`, linearly interpolated.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = q.clamp(0.0, 100.0) / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// Summarises `values` (any order; NaNs dropped).
pub fn summarize(values: impl IntoIterator<Item = f64>) -> Summary {
    let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return Summary::default();
    }
    v.sort_by(f64::total_cmp);
    Summary {
        count: v.len(),
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50: percentile(&v, 50.0),
        p90: percentile(&v, 90.0),
        p99: percentile(&v, 99.0),
        max: v[v.len() - 1],
    }
}

/// One load level's aggregates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Aggregates {
    /// Requests that finished without error.
    pub completed: usize,
    /// Failed requests by kind.
    pub errors: BTreeMap<String, usize>,
    /// Wall time of the level, s (first send to last finish).
    pub duration_s: f64,
    /// Completed requests per second.
    pub request_s: f64,
    /// Output tokens per second (completed requests).
    pub output_tok_s: f64,
    /// Input tokens per second (completed requests).
    pub input_tok_s: f64,
    /// Time to first token.
    pub ttft_ms: Summary,
    /// Inter-token latency (every gap between output deltas).
    pub itl_ms: Summary,
    /// Time per output token after the first (per request).
    pub tpot_ms: Summary,
    /// End-to-end latency.
    pub e2e_ms: Summary,
    /// Completed requests per second that met every SLO given (equals
    /// `request_s` when no SLO is set).
    pub goodput: f64,
    /// Fraction of completed requests that met every SLO.
    pub goodput_fraction: f64,
    /// Cached input tokens / input tokens over the level.
    pub cache_hit_rate: f64,
    /// Cache hit rate per conversation turn (agent workload).
    pub cache_hit_rate_by_turn: Vec<f64>,
    /// Mean client-side processing per request, µs.
    pub client_overhead_us: f64,
}

/// Whether `r` meets every objective of `slo`.
pub fn meets(r: &RequestRecord, slo: &Slo) -> bool {
    let within = |limit: Option<f64>, value: Option<f64>| match (limit, value) {
        (None, _) => true,
        (Some(limit), Some(v)) => v <= limit,
        (Some(_), None) => false,
    };
    within(slo.ttft_ms, r.ttft_ms) && within(slo.tpot_ms, r.tpot_ms().or(Some(0.0))) && within(slo.e2e_ms, Some(r.e2e_ms))
}

/// Aggregates `records` of a level that lasted `duration_s`.
pub fn aggregate(records: &[RequestRecord], duration_s: f64, slo: Option<&Slo>) -> Aggregates {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.error.is_none()).collect();
    let mut errors = BTreeMap::new();
    for r in records {
        if let Some(kind) = &r.error {
            *errors.entry(kind.clone()).or_insert(0) += 1;
        }
    }
    let per_s = |x: f64| if duration_s > 0.0 { x / duration_s } else { 0.0 };
    let good = ok.iter().filter(|r| slo.is_none_or(|s| meets(r, s))).count();
    let input: u64 = ok.iter().map(|r| r.input_tokens).sum();
    let cached: u64 = ok.iter().map(|r| r.cached_tokens).sum();
    Aggregates {
        completed: ok.len(),
        errors,
        duration_s,
        request_s: per_s(ok.len() as f64),
        output_tok_s: per_s(ok.iter().map(|r| r.output_tokens).sum::<u64>() as f64),
        input_tok_s: per_s(input as f64),
        ttft_ms: summarize(ok.iter().filter_map(|r| r.ttft_ms)),
        itl_ms: summarize(ok.iter().flat_map(|r| r.itl_ms.iter().copied())),
        tpot_ms: summarize(ok.iter().filter_map(|r| r.tpot_ms())),
        e2e_ms: summarize(ok.iter().map(|r| r.e2e_ms)),
        goodput: per_s(good as f64),
        goodput_fraction: if ok.is_empty() { 0.0 } else { good as f64 / ok.len() as f64 },
        cache_hit_rate: ratio(cached, input),
        cache_hit_rate_by_turn: by_turn(&ok),
        client_overhead_us: if ok.is_empty() { 0.0 } else { ok.iter().map(|r| r.client_overhead_us).sum::<f64>() / ok.len() as f64 },
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn by_turn(ok: &[&RequestRecord]) -> Vec<f64> {
    let turns = ok.iter().filter_map(|r| r.turn).max().map_or(0, |t| t + 1);
    (0..turns)
        .map(|t| {
            let (cached, input) = ok
                .iter()
                .filter(|r| r.turn == Some(t))
                .fold((0, 0), |(c, i), r| (c + r.cached_tokens, i + r.input_tokens));
            ratio(cached, input)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn rec(ttft: f64, e2e: f64, out: u64, itl: &[f64]) -> RequestRecord {
        RequestRecord { ttft_ms: Some(ttft), e2e_ms: e2e, output_tokens: out, itl_ms: itl.to_vec(), input_tokens: 10, ..Default::default() }
    }

    #[test]
    fn percentiles_are_exact_on_known_inputs() {
        let s = summarize((1..=101).map(f64::from).rev());
        assert_eq!((s.count, s.mean, s.p50, s.p90, s.p99, s.max), (101, 51.0, 51.0, 91.0, 100.0, 101.0));
        let s = summarize([1.0, 2.0, 3.0, 4.0]);
        assert_eq!((s.p50, s.p90), (2.5, 3.7));
        assert_eq!(summarize([f64::NAN, 5.0]).p99, 5.0);
        assert_eq!(summarize(Vec::new()), Summary::default());
    }

    #[test]
    fn aggregates_throughput_goodput_errors_and_turns() {
        let mut records = vec![rec(100.0, 1000.0, 10, &[100.0; 9]), rec(600.0, 1500.0, 10, &[100.0; 9]), rec(50.0, 2050.0, 5, &[500.0; 4])];
        records.push(RequestRecord { error: Some("http_500".into()), ..Default::default() });
        records.push(RequestRecord { error: Some("timeout".into()), ..Default::default() });
        records[0].turn = Some(0);
        records[1].turn = Some(1);
        records[1].cached_tokens = 9;
        let slo = Slo { ttft_ms: Some(500.0), tpot_ms: Some(200.0), e2e_ms: None };
        let a = aggregate(&records, 2.0, Some(&slo));
        assert_eq!(a.completed, 3);
        assert_eq!(a.errors, BTreeMap::from([("http_500".to_string(), 1), ("timeout".to_string(), 1)]));
        assert_eq!((a.request_s, a.output_tok_s, a.input_tok_s), (1.5, 12.5, 15.0));
        // Only the first meets both: the second's TTFT is 600, the third's TPOT is 500.
        assert_eq!((a.goodput, a.goodput_fraction), (0.5, 1.0 / 3.0));
        assert_eq!(a.tpot_ms.mean, (100.0 + 100.0 + 500.0) / 3.0);
        assert_eq!(a.itl_ms.count, 22);
        assert_eq!(a.cache_hit_rate, 9.0 / 30.0);
        assert_eq!(a.cache_hit_rate_by_turn, vec![0.0, 0.9]);
        assert_eq!(aggregate(&records, 2.0, None).goodput, 1.5);
    }
}
