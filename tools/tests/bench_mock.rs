//! spindle-bench against a mock server with scripted delays: the metrics are
//! right, open-loop arrivals follow the rate, and failing or hanging servers
//! give counted errors and a finished report.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;
use serde_json::{json, Value};
use spindle_tools::bench::args::Args;
use spindle_tools::bench::client::Client;
use spindle_tools::bench::metrics::meets;
use spindle_tools::bench::report::{html, table, RunResult, SCHEMA_VERSION};
use spindle_tools::bench::run::{levels, run_level, LevelResult};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy)]
enum Mode {
    Stream { first_ms: u64, gap_ms: u64, deltas: usize },
    Fail,
    Hang,
}

#[derive(Clone)]
struct Mock {
    mode: Mode,
    bodies: Arc<Mutex<Vec<Value>>>,
}

async fn responses(State(mock): State<Mock>, Json(body): Json<Value>) -> Response {
    let turn_prev = body["previous_response_id"].as_str().map(str::to_string);
    let n = {
        let mut seen = mock.bodies.lock().unwrap();
        seen.push(body);
        seen.len()
    };
    let (first_ms, gap_ms, deltas) = match mock.mode {
        Mode::Fail => return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Mode::Hang => (10, 3_600_000, 3),
        Mode::Stream { first_ms, gap_ms, deltas } => (first_ms, gap_ms, deltas),
    };
    // A chained turn reports most of its prompt as cached.
    let cached = if turn_prev.is_some() { 90 } else { 0 };
    let done = json!({"type": "response.completed", "response": {"id": format!("resp_{n}"),
        "usage": {"input_tokens": 100, "output_tokens": deltas, "input_tokens_details": {"cached_tokens": cached}}}});
    let stream = futures_util::stream::unfold(0usize, move |i| {
        let done = done.clone();
        async move {
            if i > deltas {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(if i == 0 { first_ms } else { gap_ms })).await;
            let event = if i < deltas {
                format!("event: response.output_text.delta\ndata: {}\n\n", json!({"type": "response.output_text.delta", "delta": "x"}))
            } else {
                format!("event: response.completed\ndata: {done}\n\ndata: [DONE]\n\n")
            };
            Some((Ok::<_, std::convert::Infallible>(event), i + 1))
        }
    });
    Response::builder().header("content-type", "text/event-stream").body(Body::from_stream(stream)).unwrap()
}

/// WebSocket turns: three deltas then `response.completed`, per `response.create`.
async fn websocket(State(mock): State<Mock>, ws: axum::extract::ws::WebSocketUpgrade) -> Response {
    use axum::extract::ws::Message;
    ws.on_upgrade(move |mut socket| async move {
        while let Some(Ok(Message::Text(text))) = socket.recv().await {
            let body: Value = serde_json::from_str(text.as_str()).unwrap();
            let cached = if body["previous_response_id"].is_string() { 90 } else { 0 };
            let n = {
                let mut seen = mock.bodies.lock().unwrap();
                seen.push(body);
                seen.len()
            };
            for _ in 0..3 {
                let delta = json!({"type": "response.output_text.delta", "delta": "x"});
                socket.send(Message::Text(delta.to_string().into())).await.unwrap();
            }
            let done = json!({"type": "response.completed", "response": {"id": format!("resp_{n}"),
                "usage": {"input_tokens": 100, "output_tokens": 3, "input_tokens_details": {"cached_tokens": cached}}}});
            socket.send(Message::Text(done.to_string().into())).await.unwrap();
        }
    })
}

/// Upper bound on any one wait in these tests: a hang fails the test instead of stalling it.
const DEADLINE: Duration = Duration::from_secs(60);

async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut).await.unwrap_or_else(|_| panic!("{what}: no result within {limit:?}"))
}

async fn start(mode: Mode) -> (String, Mock) {
    let mock = Mock { mode, bodies: Arc::default() };
    let app = Router::new().route("/v1/responses", post(responses).get(websocket)).with_state(mock.clone());
    let listener = within(DEADLINE, "bind", tokio::net::TcpListener::bind("127.0.0.1:0")).await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, mock)
}

async fn bench_within(limit: Duration, base: &str, flags: &[&str]) -> Vec<LevelResult> {
    let mut argv = vec!["spindle-bench", "--base-url", base, "--model", "m", "--quiet", "--warmup", "0"];
    argv.extend_from_slice(flags);
    let args = Args::parse_from(argv);
    let client = Client::new(&args.base_url, args.api, &args.model, None, args.timeout()).unwrap();
    let run = async {
        let mut out = Vec::new();
        for (index, level) in levels(&args).unwrap().into_iter().enumerate() {
            out.push(run_level(&args, &client, level, index, &indicatif::ProgressBar::hidden()).await.unwrap());
        }
        out
    };
    within(limit, &format!("spindle-bench {flags:?}"), run).await
}

async fn bench(base: &str, flags: &[&str]) -> Vec<LevelResult> {
    bench_within(DEADLINE, base, flags).await
}

// Timing assertions below never use a fixed window: a sleep (the mock's, or
// the client's timeout) can only end late, never early, so scripted delays
// give safe *lower* bounds; everything else compares a fast and a slow
// server measured side by side (ratios with wide margins), or relates
// metrics of one request to each other on the client's own clock.

const DELTAS: usize = 6;
const FAST: (u64, u64) = (20, 5); // (first delta ms, gap ms)
const SLOW: (u64, u64) = (250, 80);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_delays_give_the_measured_latencies() {
    let flags = ["--concurrency", "1,3", "--requests", "6", "--output-len", "6", "--slo", "ttft=1000ms,tpot=20ms"];
    let mut runs = Vec::new();
    for (first_ms, gap_ms) in [FAST, SLOW] {
        let (base, mock) = start(Mode::Stream { first_ms, gap_ms, deltas: DELTAS }).await;
        let result = bench(&base, &flags).await;
        let slo = Args::parse_from(["spindle-bench", "--model", "m", "--base-url", &base, "--slo", "ttft=1000ms,tpot=20ms"]).slo.unwrap();
        let (first, gap, n) = (first_ms as f64, gap_ms as f64, DELTAS as f64);
        assert_eq!(result.len(), 2);
        for level in &result {
            let a = &level.aggregates;
            assert_eq!((a.completed, a.errors.len(), level.records.len()), (6, 0, 6));
            assert_eq!(a.itl_ms.count, 6 * 5);
            for r in &level.records {
                assert_eq!((r.output_tokens, r.itl_ms.len()), (6, 5), "{r:?}");
                let ttft = r.ttft_ms.unwrap();
                let last_delta = ttft + r.itl_ms.iter().sum::<f64>();
                // The first delta leaves the server `first` ms after the request reached it.
                assert!(ttft >= first, "ttft {ttft} < scripted {first}: {r:?}");
                // The last delta can't arrive before it was sent, nor after the stream ended.
                assert!(last_delta >= first + (n - 1.0) * gap, "ttft + itl {last_delta}: {r:?}");
                assert!(last_delta <= r.e2e_ms + 1e-6, "ttft + itl {last_delta} > e2e: {r:?}");
                // `response.completed` follows the last delta by another gap.
                assert!(r.e2e_ms >= first + n * gap, "{r:?}");
            }
            assert!(a.request_s > 0.0 && a.output_tok_s > 0.0);
            assert!(a.client_overhead_us > 0.0);
            // Goodput counts exactly the completed requests that meet the SLOs.
            let good = level.records.iter().filter(|r| meets(r, &slo)).count() as f64;
            assert_eq!(a.goodput_fraction, good / 6.0);
            assert!((a.goodput - good / a.duration_s).abs() < 1e-9, "{a:?}");
        }
        // Closed loop: one client runs six requests back to back, three run two rounds.
        let request_s = (first + n * gap) / 1e3;
        assert!(result[0].aggregates.duration_s >= 6.0 * request_s, "{:?}", result[0].aggregates);
        assert!(result[1].aggregates.duration_s >= 2.0 * request_s, "{:?}", result[1].aggregates);
        let sent = mock.bodies.lock().unwrap();
        assert_eq!(sent.len(), 12);
        assert_eq!((sent[0]["stream"].clone(), sent[0]["max_output_tokens"].clone(), sent[0]["ignore_eos"].clone()), (json!(true), json!(6), json!(true)));
        drop(sent);
        runs.push(result);
    }
    let (fast, slow) = (&runs[0], &runs[1]);
    for (f, s) in fast.iter().zip(slow) {
        let (f, s) = (&f.aggregates, &s.aggregates);
        // Scripted 12.5× apart: 3× holds unless the load adds ~95 ms to the median TTFT.
        assert!(s.ttft_ms.p50 >= 3.0 * f.ttft_ms.p50, "ttft slow {:?} fast {:?}", s.ttft_ms, f.ttft_ms);
        // Scripted 16× apart.
        assert!(s.itl_ms.p50 > 3.0 * f.itl_ms.p50, "itl slow {:?} fast {:?}", s.itl_ms, f.itl_ms);
        assert!(s.tpot_ms.p50 > 3.0 * f.tpot_ms.p50, "tpot slow {:?} fast {:?}", s.tpot_ms, f.tpot_ms);
        assert!(s.e2e_ms.p50 > s.ttft_ms.p50 && f.e2e_ms.p50 > f.ttft_ms.p50);
        // TPOT ≥ 80 ms misses the 20 ms SLO: no goodput.
        assert_eq!((s.goodput, s.goodput_fraction), (0.0, 0.0), "{s:?}");
    }
    // TTFT stops at the first delta: the slow stream's 6 × 80 ms of gaps
    // (one after each delta) come after it, so the end is at least 480 ms
    // minus the first delta's delivery delay later. Asking for 4 gaps leaves
    // 160 ms for that delay and still fails a TTFT taken at any later event.
    let gap = SLOW.1 as f64;
    for r in slow.iter().flat_map(|l| &l.records) {
        let ttft = r.ttft_ms.unwrap();
        assert!(ttft < r.e2e_ms - (DELTAS as f64 - 2.0) * gap, "ttft {ttft} includes the gaps: {r:?}");
    }
    // Three clients finish six 730 ms requests in about two rounds, one in six.
    assert!(slow[1].aggregates.duration_s < slow[0].aggregates.duration_s * 0.6, "c=3 {} s, c=1 {} s", slow[1].aggregates.duration_s, slow[0].aggregates.duration_s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_arrivals_follow_the_rate() {
    let (base, _mock) = start(Mode::Stream { first_ms: 1, gap_ms: 1, deltas: 2 }).await;
    let result = bench(&base, &["--rate", "100,25", "--arrival", "constant", "--concurrency", "8", "--requests", "30"]).await;
    let mut mean_gaps = Vec::new();
    for (level, rate) in result.iter().zip([100.0, 25.0]) {
        assert_eq!(level.level.rate, Some(rate));
        assert_eq!((level.aggregates.completed, level.records.len()), (30, 30), "{:?}", level.aggregates.errors);
        let mut starts: Vec<f64> = level.records.iter().map(|r| r.start_ms).collect();
        starts.sort_by(f64::total_cmp);
        // The k-th request is due at k / rate and is never sent early.
        for (k, &s) in starts.iter().enumerate() {
            let due = k as f64 * 1e3 / rate;
            assert!(s >= due - 0.01, "request {k} sent at {s} ms, due at {due} ms for {rate} req/s");
        }
        mean_gaps.push((starts[29] - starts[0]) / 29.0);
    }
    // Scripted 4× apart (10 vs 40 ms): gaps follow the rate, not a fixed pace.
    assert!(mean_gaps[1] > 2.0 * mean_gaps[0], "mean gaps {mean_gaps:?} ms at 100 and 25 req/s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_hanging_servers_give_counted_errors_and_a_report() {
    let (base, _m) = start(Mode::Fail).await;
    let failed = bench(&base, &["--concurrency", "2", "--requests", "5"]).await;
    assert_eq!(failed[0].aggregates.completed, 0);
    assert_eq!(failed[0].aggregates.errors.get("http_500"), Some(&5));

    let (base, _m) = start(Mode::Hang).await;
    let began = std::time::Instant::now();
    // A hanging server must not hang the run: four 0.5 s timeouts, two at a time.
    let hung = bench_within(Duration::from_secs(30), &base, &["--concurrency", "2", "--requests", "4", "--timeout-s", "0.5"]).await;
    assert_eq!(hung[0].aggregates.errors.get("timeout"), Some(&4));
    // ... and no request gives up before its timeout.
    assert!(hung[0].records.iter().all(|r| r.e2e_ms >= 500.0), "{:?}", hung[0].records);
    assert!(began.elapsed() >= Duration::from_secs(1), "two rounds of 0.5 s timeouts took {:?}", began.elapsed());

    let args = Args::parse_from(["spindle-bench", "--base-url", &base, "--model", "m"]);
    let run = RunResult { schema_version: SCHEMA_VERSION, label: "hang".into(), started_at: "now".into(), args, levels: hung };
    assert!(table(&run).contains("timeout"));
    let page = html(&[run]).unwrap();
    assert!(page.contains("<table>") && page.ends_with("</html>\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_turns_chain_and_report_cache_hits_per_turn() {
    let (base, mock) = start(Mode::Stream { first_ms: 2, gap_ms: 1, deltas: 3 }).await;
    let result = bench(&base, &["--workload", "agent", "--turns", "3", "--requests", "6", "--concurrency", "2"]).await;
    let a = &result[0].aggregates;
    assert_eq!(a.completed, 6);
    assert_eq!(a.cache_hit_rate_by_turn, vec![0.0, 0.9, 0.9]);
    let sent = mock.bodies.lock().unwrap();
    assert!(sent.iter().all(|b| b["tools"].as_array().map(Vec::len) == Some(2) && b["store"] == true));
    let chained: Vec<&Value> = sent.iter().filter(|b| b["previous_response_id"].is_string()).collect();
    assert_eq!(chained.len(), 4, "turns 2 and 3 of both conversations chain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_agent_turns_chain_on_one_connection() {
    let (base, mock) = start(Mode::Stream { first_ms: 1, gap_ms: 1, deltas: 3 }).await;
    let result = bench(&base, &["--api", "websocket", "--workload", "agent", "--turns", "3", "--requests", "6", "--concurrency", "2"]).await;
    let a = &result[0].aggregates;
    assert_eq!((a.completed, a.errors.len()), (6, 0), "{:?}", a.errors);
    assert_eq!(a.cache_hit_rate_by_turn, vec![0.0, 0.9, 0.9]);
    let sent = mock.bodies.lock().unwrap();
    assert!(sent.iter().all(|b| b["type"] == "response.create" && b["store"] == false && b.get("stream").is_none()), "{sent:?}");
    assert_eq!(sent.iter().filter(|b| b["previous_response_id"].is_string()).count(), 4);
}
