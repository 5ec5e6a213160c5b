//! Command-line flags (kept stable: scripts depend on them).

use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Which wire protocol to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// Open Responses `POST /v1/responses`, streaming.
    Responses,
    /// OpenAI-compatible `POST /v1/chat/completions`, streaming.
    Chat,
    /// Open Responses over WebSocket (`/v1/responses`, `response.create`
    /// turns); each client keeps its connection, agent turns chain on it.
    Websocket,
}

/// What the requests contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Independent single-turn requests (synthetic or from `--prompts`).
    Fixed,
    /// Conversations of `--turns` turns with a tool list, chained by
    /// `previous_response_id` (responses) or resent history (chat).
    Agent,
}

/// Inter-arrival times of the open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Equal gaps.
    Constant,
}

/// `spindle-bench` flags.
#[derive(Debug, Clone, Parser, Serialize, Deserialize)]
#[command(name = "spindle-bench", version, about = "Benchmark an LLM server under load (Open Responses or chat completions).")]
pub struct Args {
    /// Server base URL including `/v1`, e.g. http://127.0.0.1:8080/v1
    /// (`https://` is spoken with rustls, `wss://` for `--api websocket`).
    #[arg(long, env = "SPINDLE_BENCH_BASE_URL", required_unless_present = "replot", default_value = "")]
    pub base_url: String,
    /// Model name sent in every request; when left out, the first model
    /// listed by `GET {base-url}/models` (the choice is printed to stderr).
    #[arg(long, default_value = "")]
    pub model: String,
    /// Wire protocol.
    #[arg(long, value_enum, default_value = "responses")]
    pub api: Api,
    /// Bearer token.
    #[arg(long, env = "SPINDLE_BENCH_API_KEY")]
    #[serde(skip_serializing)]
    pub api_key: Option<String>,
    /// Extra HTTP header on every request (the WebSocket upgrade and the
    /// model query too), `NAME:VALUE`; repeatable. Not written to the JSON.
    #[arg(long = "header", value_name = "NAME:VALUE", value_parser = parse_header)]
    #[serde(skip)]
    pub headers: Vec<Header>,
    /// Open a fresh connection for every HTTP request, so TTFT and E2E
    /// include connecting (and the TLS handshake); over WebSocket, where each
    /// client keeps its connection, its first request pays the handshake.
    /// Default: one keep-alive pool, opened before each level, so they don't.
    #[arg(long)]
    #[serde(default)]
    pub include_connect_time: bool,
    /// Closed-loop concurrency levels (or, with `--rate`, the cap on requests in flight).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub concurrency: Vec<usize>,
    /// Open loop: request rates (requests/s) to sweep; arrivals per `--arrival`.
    #[arg(long, value_delimiter = ',')]
    pub rate: Vec<f64>,
    /// Open-loop arrival process.
    #[arg(long, value_enum, default_value = "poisson")]
    pub arrival: Arrival,
    /// Measured requests per load level (agent: turns in total).
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Stop issuing requests at a level after this many seconds.
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Warm-up requests before each level, excluded from the results.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Output tokens per request (`max_output_tokens` / `max_tokens`).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Prompt length in tokens for synthetic prompts.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Spread of lengths: each request draws uniformly within ±fraction of
    /// `--input-len` and `--output-len` (0 = fixed).
    #[arg(long, default_value_t = 0.0)]
    pub len_spread: f64,
    /// Prompt file, JSONL: `{"prompt": "..."}` per line (optional `"output_len"`).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Tokenizer (a GGUF file or tokenizer.json) for synthetic prompts of exact token counts.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Workload shape.
    #[arg(long, value_enum, default_value = "fixed")]
    pub workload: Workload,
    /// Turns per conversation (agent workload).
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Ask the server to ignore end-of-sequence tokens (fixed output lengths).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub ignore_eos: bool,
    /// Sampling temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// SLOs for goodput, e.g. `ttft=500ms,tpot=50ms,e2e=10s`.
    #[arg(long, value_parser = parse_slo)]
    pub slo: Option<Slo>,
    /// Per-request timeout in seconds (a hanging server becomes a counted error).
    #[arg(long, default_value_t = 300.0)]
    pub timeout_s: f64,
    /// Seed for prompts and arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Label of this run in tables and charts.
    #[arg(long)]
    pub label: Option<String>,
    /// Write the JSON results here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the results in `vllm bench serve --save-result` layout (vLLM's
    /// key names; times in seconds in the per-request lists, `*_ms` in ms).
    /// One level: exactly this file; several: one file per level, named
    /// with `-c{concurrency}` or `-r{rate}` before the extension
    /// (`out.json` → `out-c4.json`).
    #[arg(long, value_name = "FILE")]
    pub save_result: Option<PathBuf>,
    /// Percentiles written as `p{N}_{metric}_ms` by `--save-result`, e.g. `50,90,99`.
    #[arg(long, value_delimiter = ',', default_value = "99", value_parser = parse_percentile)]
    #[serde(default = "default_percentiles")]
    pub metric_percentiles: Vec<f64>,
    /// Write a self-contained HTML report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Earlier JSON results to draw on the same charts.
    #[arg(long)]
    pub compare: Vec<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Run nothing: write `--report` from the `--compare` files alone.
    #[arg(long, requires = "report")]
    #[serde(default)]
    pub replot: bool,
}

impl Args {
    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s.max(0.001))
    }

    /// The run's label.
    pub fn label(&self) -> String {
        self.label.clone().unwrap_or_else(|| format!("{} @ {}", self.model, self.base_url))
    }
}

/// One `--header NAME:VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The header name.
    pub name: reqwest::header::HeaderName,
    /// Its value.
    pub value: reqwest::header::HeaderValue,
}

/// Parses `NAME:VALUE` (spaces around either are trimmed).
pub fn parse_header(text: &str) -> Result<Header, String> {
    let (name, value) = text.split_once(':').ok_or_else(|| format!("`{text}`: expected NAME:VALUE, e.g. X-Tenant:team-a"))?;
    let name = reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| format!("`{}`: not a valid HTTP header name", name.trim()))?;
    let value = reqwest::header::HeaderValue::from_str(value.trim()).map_err(|_| format!("`{}`: not a valid HTTP header value", value.trim()))?;
    Ok(Header { name, value })
}

/// Parses one `--metric-percentiles` value (0–100).
pub fn parse_percentile(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!("`{text}`: a percentile is a number from 0 to 100")),
    }
}

fn default_percentiles() -> Vec<f64> {
    vec![99.0]
}

/// Latency objectives; a request counts toward goodput when it meets all set ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Time to first token, ms.
    pub ttft_ms: Option<f64>,
    /// Time per output token after the first, ms.
    pub tpot_ms: Option<f64>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<f64>,
}

/// Parses `ttft=500ms,tpot=50ms,e2e=10s`.
pub fn parse_slo(text: &str) -> Result<Slo, String> {
    let mut slo = Slo::default();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once('=').ok_or_else(|| format!("`{part}`: expected key=value"))?;
        let ms = parse_duration_ms(value)?;
        match key.trim() {
            "ttft" => slo.ttft_ms = Some(ms),
            "tpot" => slo.tpot_ms = Some(ms),
            "e2e" => slo.e2e_ms = Some(ms),
            other => return Err(format!("unknown SLO `{other}` (ttft, tpot, e2e)")),
        }
    }
    Ok(slo)
}

fn parse_duration_ms(value: &str) -> Result<f64, String> {
    let v = value.trim();
    let (number, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e3)
    } else {
        (v, 1.0)
    };
    let x: f64 = number.trim().parse().map_err(|_| format!("`{value}`: not a duration (e.g. 500ms, 2s)"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("`{value}`: must be a non-negative duration"));
    }
    Ok(x * scale)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn slo_flags_parse_with_units() {
        let slo = parse_slo("ttft=500ms,tpot=0.05s,e2e=2000").expect("valid");
        assert_eq!(slo, Slo { ttft_ms: Some(500.0), tpot_ms: Some(50.0), e2e_ms: Some(2000.0) });
        assert!(parse_slo("itl=5ms").is_err());
        assert!(parse_slo("ttft=fast").is_err());
        assert!(parse_slo("ttft=-1ms").is_err());
    }

    #[test]
    fn headers_parse_and_malformed_ones_are_refused_at_parsing() {
        let args = Args::try_parse_from(["b", "--base-url", "http://h/v1", "--header", "X-Tenant: team-a", "--header", "X-Url:http://a:1"]).expect("valid");
        let pairs: Vec<(&str, &str)> = args.headers.iter().map(|h| (h.name.as_str(), h.value.to_str().unwrap())).collect();
        assert_eq!(pairs, vec![("x-tenant", "team-a"), ("x-url", "http://a:1")]);
        let err = Args::try_parse_from(["b", "--base-url", "http://h/v1", "--header", "X-Tenant"]).expect_err("no colon").to_string();
        assert!(err.contains("expected NAME:VALUE"), "{err}");
        assert!(Args::try_parse_from(["b", "--base-url", "http://h/v1", "--header", "Bad Name:v"]).is_err());
    }

    #[test]
    fn new_flags_default_and_old_json_args_still_load() {
        let args = Args::try_parse_from(["b", "--base-url", "http://h/v1"]).expect("valid");
        assert_eq!((args.model.as_str(), args.include_connect_time, args.metric_percentiles.clone()), ("", false, vec![99.0]));
        assert!(Args::try_parse_from(["b", "--base-url", "http://h/v1", "--metric-percentiles", "50,101"]).is_err());
        // A version-1 file written before these flags existed.
        let mut old = serde_json::to_value(&args).unwrap();
        for key in ["include_connect_time", "save_result", "metric_percentiles"] {
            old.as_object_mut().unwrap().remove(key);
        }
        let back: Args = serde_json::from_value(old).expect("loads");
        assert_eq!(back.metric_percentiles, vec![99.0]);
    }
}
