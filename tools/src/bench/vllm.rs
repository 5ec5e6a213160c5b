//! `--save-result`: results in the layout of `vllm bench serve
//! --save-result` (with `--save-detailed`), under vLLM's key names, so
//! tools that read vLLM's files read ours. Per-request lists (`ttfts`,
//! `itls`) and `duration` are in seconds; `*_ms` summaries in milliseconds.

use super::args::{Api, Arrival, Args};
use super::client::RequestRecord;
use super::metrics::percentile;
use super::report::RunResult;
use super::run::{LevelResult, LoadLevel};
use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// Writes one file per level of `run` (see [`result_paths`]); returns their paths.
pub fn save(run: &RunResult, file: &Path) -> Result<Vec<PathBuf>> {
    let paths = result_paths(file, &run.levels);
    for (path, level) in paths.iter().zip(&run.levels) {
        let text = serde_json::to_string_pretty(&vllm_result(run, level))?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(paths)
}

/// With one level, `file` itself; with several, `file` with `-c{concurrency}`
/// (closed loop) or `-r{rate}` (open loop) before the extension.
pub fn result_paths(file: &Path, levels: &[LevelResult]) -> Vec<PathBuf> {
    if levels.len() <= 1 {
        return vec![file.to_path_buf()];
    }
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = file.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    levels.iter().map(|l| file.with_file_name(format!("{stem}{}{ext}", level_suffix(&l.level)))).collect()
}

/// `-c4` for concurrency 4, `-r2.5` for 2.5 requests/s.
pub fn level_suffix(level: &LoadLevel) -> String {
    match level.rate {
        Some(rate) => format!("-r{rate}"),
        None => format!("-c{}", level.concurrency),
    }
}

/// vLLM's result object for one level of `run`.
pub fn vllm_result(run: &RunResult, level: &LevelResult) -> Value {
    let mut out = header(run, level);
    let records = &level.records;
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.error.is_none()).collect();
    let a = &level.aggregates;
    let (input, output): (u64, u64) = (ok.iter().map(|r| r.input_tokens).sum(), ok.iter().map(|r| r.output_tokens).sum());
    let per_s = |x: f64| if a.duration_s > 0.0 { x / a.duration_s } else { 0.0 };
    let fields = [
        ("duration", json!(a.duration_s)),
        ("completed", json!(a.completed)),
        ("total_input_tokens", json!(input)),
        ("total_output_tokens", json!(output)),
        ("request_throughput", json!(a.request_s)),
        ("request_goodput", if run.args.slo.is_some() { json!(a.goodput) } else { Value::Null }),
        ("output_throughput", json!(per_s(output as f64))),
        ("total_token_throughput", json!(per_s((input + output) as f64))),
        ("input_lens", json!(records.iter().map(|r| r.input_tokens).collect::<Vec<_>>())),
        ("output_lens", json!(records.iter().map(|r| if r.error.is_none() { r.output_tokens } else { 0 }).collect::<Vec<_>>())),
        ("ttfts", json!(records.iter().map(|r| r.ttft_ms.unwrap_or(0.0) / 1e3).collect::<Vec<_>>())),
        ("itls", json!(records.iter().map(|r| r.itl_ms.iter().map(|x| x / 1e3).collect::<Vec<_>>()).collect::<Vec<_>>())),
        ("generated_texts", json!(records.iter().map(|r| r.text.as_str()).collect::<Vec<_>>())),
        ("errors", json!(records.iter().map(|r| r.error.clone().unwrap_or_default()).collect::<Vec<_>>())),
    ];
    out.extend(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
    let percentiles = &run.args.metric_percentiles;
    stats(&mut out, "ttft", ok.iter().filter_map(|r| r.ttft_ms).collect(), percentiles);
    stats(&mut out, "tpot", ok.iter().filter_map(|r| r.tpot_ms()).collect(), percentiles);
    stats(&mut out, "itl", ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect(), percentiles);
    stats(&mut out, "e2el", ok.iter().map(|r| r.e2e_ms).collect(), percentiles);
    Value::Object(out)
}

/// The run-level keys: date, backend, model and tokenizer, the load asked for.
fn header(run: &RunResult, level: &LevelResult) -> Map<String, Value> {
    let args = &run.args;
    let date = chrono::DateTime::parse_from_rfc3339(&run.started_at)
        .map(|t| t.with_timezone(&chrono::Local).format("%Y%m%d-%H%M%S").to_string())
        .unwrap_or_else(|_| run.started_at.clone());
    let tokenizer = args.tokenizer.as_ref().map_or_else(|| args.model.clone(), |p| p.display().to_string());
    // vLLM writes an unlimited rate as "inf", and constant gaps are its burstiness → ∞.
    let (rate, burstiness) = match level.level.rate {
        Some(rate) => (json!(rate), if args.arrival == Arrival::Constant { json!("inf") } else { json!(1.0) }),
        None => (json!("inf"), json!(1.0)),
    };
    let fields = [
        ("date", json!(date)),
        ("backend", json!(backend(args))),
        ("model_id", json!(args.model)),
        ("tokenizer_id", json!(tokenizer)),
        ("num_prompts", json!(args.requests)),
        ("request_rate", rate),
        ("burstiness", burstiness),
        ("max_concurrency", json!(level.level.concurrency)),
    ];
    fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// vLLM's backend name for the API driven.
fn backend(args: &Args) -> &'static str {
    match args.api {
        Api::Chat => "openai-chat",
        Api::Responses => "openai-responses",
        Api::Websocket => "openai-responses-websocket",
    }
}

/// `mean_{name}_ms`, `median_…`, `std_…` (population) and `p{N}_…` of `values` (ms).
fn stats(out: &mut Map<String, Value>, name: &str, mut values: Vec<f64>, percentiles: &[f64]) {
    values.sort_by(f64::total_cmp);
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let std = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    out.insert(format!("mean_{name}_ms"), json!(mean));
    out.insert(format!("median_{name}_ms"), json!(percentile(&values, 50.0)));
    out.insert(format!("std_{name}_ms"), json!(std));
    for &p in percentiles {
        out.insert(format!("p{}_{name}_ms", percentile_word(p)), json!(percentile(&values, p)));
    }
}

/// Python's `str(int(p)) if int(p) == p else str(p)`: 99 → "99", 99.9 → "99.9".
fn percentile_word(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn percentile_keys_and_file_names_follow_vllm() {
        assert_eq!((percentile_word(99.0), percentile_word(99.9), percentile_word(50.0)), ("99".into(), "99.9".into(), "50".into()));
        let mut out = Map::new();
        stats(&mut out, "ttft", vec![4.0, 1.0, 2.0, 3.0], &[50.0, 99.9]);
        assert_eq!(out["mean_ttft_ms"], json!(2.5));
        assert_eq!(out["median_ttft_ms"], json!(2.5));
        assert_eq!(out["std_ttft_ms"], json!(1.25f64.sqrt()));
        assert!(out.contains_key("p50_ttft_ms") && out.contains_key("p99.9_ttft_ms"));
        stats(&mut out, "itl", Vec::new(), &[99.0]);
        assert_eq!((out["mean_itl_ms"].clone(), out["p99_itl_ms"].clone()), (json!(0.0), json!(0.0)));
        assert_eq!(level_suffix(&LoadLevel { concurrency: 4, rate: None }), "-c4");
        assert_eq!(level_suffix(&LoadLevel { concurrency: 4, rate: Some(2.5) }), "-r2.5");
    }
}
