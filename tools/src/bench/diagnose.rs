//! Explaining failures: when every request of a run failed, a message that
//! names the errors and hints at the likely cause (a base URL without
//! `/v1`, a wrong API key, a server that isn't running, ...).

use super::report::RunResult;
use std::collections::BTreeMap;

/// An error kind for people: `http_404` → `404 Not Found`, `connect` →
/// `connect error`; others unchanged.
pub fn describe(kind: &str) -> String {
    if kind == "connect" {
        return "connect error".to_string();
    }
    let status = kind.strip_prefix("http_").and_then(|code| code.parse::<u16>().ok());
    match status.and_then(|code| reqwest::StatusCode::from_u16(code).ok()) {
        Some(status) => match status.canonical_reason() {
            Some(reason) => format!("{} {reason}", status.as_u16()),
            None => format!("HTTP {}", status.as_u16()),
        },
        None => kind.to_string(),
    }
}

/// The likely cause of errors of `kind` against `base_url`, as a question or advice.
pub fn hint(kind: &str, base_url: &str) -> String {
    let base = base_url.trim_end_matches('/');
    match kind {
        "http_404" if !base.ends_with("/v1") => format!("is the base URL missing /v1? (got {base})"),
        "http_404" | "http_405" => format!("does the server serve this API under {base}? (check --api: responses, chat or websocket)"),
        "http_401" | "http_403" => "is the API key right? (pass it with --api-key or SPINDLE_BENCH_API_KEY, or a --header)".to_string(),
        "http_400" | "http_422" => "the server rejected the request: check --model and --api".to_string(),
        "connect" => format!("is the server running at {base}?"),
        "timeout" => "the server did not answer within --timeout-s: is it overloaded or stuck?".to_string(),
        k if k.starts_with("http_5") || k == "server_error" || k.starts_with("ws_error_") => "the server failed the requests: see its log".to_string(),
        _ => "see the error kinds in the table above".to_string(),
    }
}

/// When the run measured requests and none completed: "every request
/// failed (404 Not Found ×3); is the base URL missing /v1? (got ...)", the
/// hint following the most frequent error. `None` when any completed.
pub fn all_failed(run: &RunResult) -> Option<String> {
    let completed: usize = run.levels.iter().map(|l| l.aggregates.completed).sum();
    let mut errors: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, n) in run.levels.iter().flat_map(|l| &l.aggregates.errors) {
        *errors.entry(kind.as_str()).or_default() += n;
    }
    if completed > 0 || errors.is_empty() {
        return None;
    }
    let mut by_count: Vec<(&str, usize)> = errors.into_iter().collect();
    by_count.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let counts: Vec<String> = by_count.iter().map(|(kind, n)| format!("{} ×{n}", describe(kind))).collect();
    let hint = hint(by_count[0].0, &run.args.base_url);
    Some(format!("every request failed ({}); {hint}", counts.join(", ")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::bench::args::Args;
    use crate::bench::client::RequestRecord;
    use crate::bench::metrics::aggregate;
    use crate::bench::report::SCHEMA_VERSION;
    use crate::bench::run::{LevelResult, LoadLevel};
    use clap::Parser;

    fn run_with(base: &str, errors: &[&str], ok: usize) -> RunResult {
        let mut records: Vec<RequestRecord> = errors.iter().map(|e| RequestRecord { error: Some(e.to_string()), ..Default::default() }).collect();
        records.extend((0..ok).map(|_| RequestRecord { ttft_ms: Some(1.0), e2e_ms: 2.0, ..Default::default() }));
        let level = LevelResult { level: LoadLevel { concurrency: 1, rate: None }, aggregates: aggregate(&records, 1.0, None), records };
        let args = Args::parse_from(["b", "--base-url", base, "--model", "m"]);
        RunResult { schema_version: SCHEMA_VERSION, label: "t".into(), started_at: "now".into(), args, levels: vec![level] }
    }

    #[test]
    fn the_hint_follows_the_error() {
        let msg = all_failed(&run_with("http://h:1", &["http_404"; 3], 0)).expect("all failed");
        assert_eq!(msg, "every request failed (404 Not Found ×3); is the base URL missing /v1? (got http://h:1)");
        let msg = all_failed(&run_with("http://h:1/v1", &["http_401", "http_401", "timeout"], 0)).expect("all failed");
        assert!(msg.starts_with("every request failed (401 Unauthorized ×2, timeout ×1); is the API key right?"), "{msg}");
        let msg = all_failed(&run_with("http://h:1/v1", &["connect"], 0)).expect("all failed");
        assert_eq!(msg, "every request failed (connect error ×1); is the server running at http://h:1/v1?");
        assert!(hint("http_403", "x").contains("--api-key"));
        assert!(hint("http_404", "http://h/v1").contains("--api"));
        // Some completed, or nothing was measured: no message.
        assert_eq!(all_failed(&run_with("http://h:1", &["http_404"], 1)), None);
        assert_eq!(all_failed(&run_with("http://h:1", &[], 0)), None);
    }
}
