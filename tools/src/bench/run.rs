//! Load shapes: closed loop at a concurrency, open loop at a rate (capped
//! concurrency), and agent conversations; warm-up excluded; bounded by
//! request count and time.

use super::args::{Api, Args, Arrival, Workload};
use super::client::{Client, RequestRecord, RequestSpec, Session};
use super::metrics::{aggregate, Aggregates};
use super::workload::{agent_tools, PromptSource, Rng, AGENT_INSTRUCTIONS};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One point of the sweep.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadLevel {
    /// Closed loop: clients; open loop: the cap on requests in flight.
    pub concurrency: usize,
    /// Open loop: requests per second.
    pub rate: Option<f64>,
}

/// A finished level: its aggregates and every measured request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelResult {
    /// The load applied.
    pub level: LoadLevel,
    /// Aggregates over `records`.
    #[serde(flatten)]
    pub aggregates: Aggregates,
    /// Per-request records, in completion order.
    pub records: Vec<RequestRecord>,
}

/// The levels the flags ask for.
pub fn levels(args: &Args) -> Result<Vec<LoadLevel>> {
    if args.concurrency.contains(&0) {
        bail!("--concurrency levels must be at least 1");
    }
    if args.rate.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        bail!("--rate values must be positive");
    }
    if !args.rate.is_empty() && args.workload == Workload::Agent {
        bail!("the agent workload runs closed loop: use --concurrency, not --rate");
    }
    let cap = args.concurrency.iter().copied().max().unwrap_or(1);
    Ok(if args.rate.is_empty() {
        args.concurrency.iter().map(|&c| LoadLevel { concurrency: c, rate: None }).collect()
    } else {
        args.rate.iter().map(|&r| LoadLevel { concurrency: cap, rate: Some(r) }).collect()
    })
}

/// Arrival offsets (s from the level start) of `n` requests at `rate`/s.
pub fn arrivals(n: usize, rate: f64, arrival: Arrival, rng: &mut Rng) -> Vec<f64> {
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += match arrival {
                    Arrival::Constant => 1.0 / rate,
                    Arrival::Poisson => -(1.0 - rng.unit()).ln() / rate,
                };
            }
            t
        })
        .collect()
}

/// Runs one level (pool and warm-up first) and aggregates it.
/// `index` numbers the level within the run: each level (and its warm-up)
/// draws its own prompts, so one level never hits the cache of another's.
pub async fn run_level(
    args: &Args,
    client: &Client,
    level: LoadLevel,
    index: usize,
    progress: &indicatif::ProgressBar,
) -> Result<LevelResult> {
    let mut prompts = PromptSource::new(args, level_seed(args.seed, index, false))?;
    client.warm_pool(level.concurrency).await;
    if args.warmup > 0 && args.workload == Workload::Fixed {
        let mut warm_prompts = PromptSource::new(args, level_seed(args.seed, index, true))?;
        let warm: Vec<RequestSpec> = (0..args.warmup).map(|_| fixed_spec(args, &mut warm_prompts)).collect::<Result<_>>()?;
        closed_loop(client, warm, level.concurrency.min(args.warmup), None, &indicatif::ProgressBar::hidden()).await;
    }
    let deadline = args.duration_s.map(Duration::from_secs_f64);
    let start = Instant::now();
    let records = match (args.workload, level.rate) {
        (Workload::Agent, _) => agent_loop(args, client, level.concurrency, level_seed(args.seed, index, false), deadline, progress).await,
        (Workload::Fixed, None) => {
            let specs = (0..args.requests).map(|_| fixed_spec(args, &mut prompts)).collect::<Result<_>>()?;
            closed_loop(client, specs, level.concurrency, deadline, progress).await
        }
        (Workload::Fixed, Some(rate)) => {
            let specs: Vec<RequestSpec> = (0..args.requests).map(|_| fixed_spec(args, &mut prompts)).collect::<Result<_>>()?;
            let mut rng = Rng::new(args.seed ^ rate.to_bits());
            let times = arrivals(specs.len(), rate, args.arrival, &mut rng);
            open_loop(client, specs, times, level.concurrency, deadline, progress).await
        }
    };
    let duration_s = start.elapsed().as_secs_f64();
    let aggregates = aggregate(&records, duration_s, args.slo.as_ref());
    Ok(LevelResult { level, aggregates, records })
}

fn level_seed(seed: u64, index: usize, warmup: bool) -> u64 {
    seed.wrapping_add((index as u64 + 1).wrapping_mul(0x9E37_79B9)).wrapping_add(u64::from(warmup) << 40)
}

fn generation_fields(args: &Args, output_len: usize) -> Value {
    let limit = match args.api {
        Api::Responses | Api::Websocket => "max_output_tokens",
        Api::Chat => "max_tokens",
    };
    let mut body = json!({"temperature": args.temperature});
    body[limit] = json!(output_len);
    if args.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    body
}

fn fixed_spec(args: &Args, prompts: &mut PromptSource) -> Result<RequestSpec> {
    let prompt = prompts.next(args)?;
    let mut body = generation_fields(args, prompt.output_len);
    match args.api {
        Api::Responses | Api::Websocket => {
            body["input"] = json!(prompt.text);
            body["store"] = json!(false);
        }
        Api::Chat => body["messages"] = json!([{"role": "user", "content": prompt.text}]),
    }
    Ok(RequestSpec { body, turn: None })
}

async fn closed_loop(
    client: &Client,
    specs: Vec<RequestSpec>,
    concurrency: usize,
    deadline: Option<Duration>,
    progress: &indicatif::ProgressBar,
) -> Vec<RequestRecord> {
    let start = Instant::now();
    let queue = Arc::new(Mutex::new(VecDeque::from(specs)));
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (queue, client, progress) = (queue.clone(), client.clone(), progress.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                let mut session = Session::default();
                loop {
                    if deadline.is_some_and(|d| start.elapsed() >= d) {
                        break;
                    }
                    let Some(spec) = queue.lock().ok().and_then(|mut q| q.pop_front()) else { break };
                    out.push(client.send_in(&mut session, &spec, start).await);
                    progress.inc(1);
                }
                out
            })
        })
        .collect();
    let mut records = Vec::new();
    for w in workers {
        records.extend(w.await.unwrap_or_default());
    }
    records
}

async fn open_loop(
    client: &Client,
    specs: Vec<RequestSpec>,
    times: Vec<f64>,
    cap: usize,
    deadline: Option<Duration>,
    progress: &indicatif::ProgressBar,
) -> Vec<RequestRecord> {
    let start = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(cap.max(1)));
    let mut tasks = Vec::new();
    for (spec, at) in specs.into_iter().zip(times) {
        let due = Duration::from_secs_f64(at);
        if deadline.is_some_and(|d| due >= d) {
            break;
        }
        tokio::time::sleep_until((start + due).into()).await;
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        let (client, progress) = (client.clone(), progress.clone());
        tasks.push(tokio::spawn(async move {
            let record = client.send_in(&mut Session::default(), &spec, start).await;
            drop(permit);
            progress.inc(1);
            record
        }));
    }
    let mut records = Vec::new();
    for t in tasks {
        if let Ok(r) = t.await {
            records.push(r);
        }
    }
    records
}

/// Agent conversations: `concurrency` at a time, each `--turns` turns, until
/// `--requests` turns have been sent. A failed turn ends its conversation.
async fn agent_loop(
    args: &Args,
    client: &Client,
    concurrency: usize,
    seed: u64,
    deadline: Option<Duration>,
    progress: &indicatif::ProgressBar,
) -> Vec<RequestRecord> {
    let turns = args.turns.max(1);
    let conversations = args.requests.div_ceil(turns);
    let start = Instant::now();
    let next = Arc::new(Mutex::new(0usize));
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|_| {
            let (next, client, progress, args) = (next.clone(), client.clone(), progress.clone(), args.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let id = match next.lock() {
                        Ok(mut n) if *n < conversations => {
                            *n += 1;
                            *n - 1
                        }
                        _ => break,
                    };
                    if deadline.is_some_and(|d| start.elapsed() >= d) {
                        break;
                    }
                    out.extend(conversation(&args, &client, seed, id, turns, start, &progress).await);
                }
                out
            })
        })
        .collect();
    let mut records = Vec::new();
    for w in workers {
        records.extend(w.await.unwrap_or_default());
    }
    records
}

async fn conversation(
    args: &Args,
    client: &Client,
    seed: u64,
    id: usize,
    turns: usize,
    start: Instant,
    progress: &indicatif::ProgressBar,
) -> Vec<RequestRecord> {
    let mut rng = Rng::new(seed ^ (id as u64).wrapping_mul(0x9E37));
    let mut history = vec![json!({"role": "system", "content": AGENT_INSTRUCTIONS})];
    let mut previous: Option<String> = None;
    let mut session = Session::default();
    let mut out = Vec::new();
    for turn in 0..turns {
        let ask = format!(
            "Task {id}.{turn}: the test `case_{}` fails after the last change to module {}. What should I check next?",
            rng.next_u64() % 1000,
            rng.next_u64() % 50
        );
        let mut body = generation_fields(args, args.output_len);
        body["tools"] = agent_tools(args.api);
        match args.api {
            Api::Responses | Api::Websocket => {
                body["instructions"] = json!(AGENT_INSTRUCTIONS);
                body["input"] = json!(ask);
                // Over WebSocket the chain lives on the connection (zero retention).
                body["store"] = json!(args.api == Api::Responses);
                if let Some(prev) = &previous {
                    body["previous_response_id"] = json!(prev);
                }
            }
            Api::Chat => {
                history.push(json!({"role": "user", "content": ask}));
                body["messages"] = json!(history);
            }
        }
        let record = client.send_in(&mut session, &RequestSpec { body, turn: Some(turn) }, start).await;
        progress.inc(1);
        let failed = record.error.is_some();
        previous = record.response_id.clone();
        history.push(json!({"role": "assistant", "content": record.text}));
        out.push(record);
        if failed || (args.api != Api::Chat && previous.is_none()) {
            break;
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn constant_arrivals_are_exact_and_poisson_follows_the_rate() {
        let mut rng = Rng::new(3);
        assert_eq!(arrivals(4, 2.0, Arrival::Constant, &mut rng), vec![0.0, 0.5, 1.0, 1.5]);
        let times = arrivals(20_001, 10.0, Arrival::Poisson, &mut rng);
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.1).abs() < 0.004, "mean gap {mean}");
        // Exponential gaps: standard deviation equals the mean.
        assert!((var.sqrt() / mean - 1.0).abs() < 0.05, "cv {}", var.sqrt() / mean);
        assert!(gaps.iter().all(|&g| g >= 0.0));
    }
}
