//! spindle-bench against a mock server with scripted delays: the metrics are
//! right, open-loop arrivals follow the rate, failing or hanging servers
//! give counted errors and a finished report, `--header`s reach every
//! request, the model is discovered, connections are pooled (or not), a
//! run where everything fails exits non-zero with a hint, `--save-result`
//! writes vLLM's layout, and the HTML report's charts are readable.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde_json::{json, Value};
use spindle_tools::bench::args::Args;
use spindle_tools::bench::client::{discover_model, Client, RequestRecord};
use spindle_tools::bench::metrics::{aggregate, meets};
use spindle_tools::bench::report::{html, table, RunResult, SCHEMA_VERSION};
use spindle_tools::bench::run::{levels, run_level, LevelResult, LoadLevel};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy)]
enum Mode {
    Stream { first_ms: u64, gap_ms: u64, deltas: usize },
    Fail,
    Hang,
}

/// One request as the mock saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: HeaderMap,
    peer: SocketAddr,
}

#[derive(Clone)]
struct Mock {
    mode: Mode,
    bodies: Arc<Mutex<Vec<Value>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    models: Vec<String>,
    /// Delay before answering the first request of a connection: the cost
    /// of connection setup (a TLS handshake, say), made big and certain.
    new_connection_delay: Duration,
}

impl Mock {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Records every request (method, path, headers, peer) before routing it.
async fn record(State(mock): State<Mock>, ConnectInfo(peer): ConnectInfo<SocketAddr>, request: Request, next: Next) -> Response {
    let seen = Seen { method: request.method().to_string(), path: request.uri().path().to_string(), headers: request.headers().clone(), peer };
    let new_connection = {
        let mut all = mock.seen.lock().unwrap();
        let new = all.iter().all(|s| s.peer != peer);
        all.push(seen);
        new
    };
    if new_connection {
        tokio::time::sleep(mock.new_connection_delay).await;
    }
    next.run(request).await
}

/// `GET /v1/models`: the mock's model list.
async fn models(State(mock): State<Mock>) -> Json<Value> {
    let data: Vec<Value> = mock.models.iter().map(|id| json!({"id": id, "object": "model", "owned_by": "mock"})).collect();
    Json(json!({"object": "list", "data": data}))
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
    start_with_models(mode, &["mock-model", "other-model"]).await
}

/// A mock on a free port; returns its base URL (with `/v1`) and its records.
async fn start_with_models(mode: Mode, model_ids: &[&str]) -> (String, Mock) {
    start_mock(mode, model_ids, Duration::ZERO).await
}

async fn start_mock(mode: Mode, model_ids: &[&str], new_connection_delay: Duration) -> (String, Mock) {
    let listed = model_ids.iter().map(|m| m.to_string()).collect();
    let mock = Mock { mode, bodies: Arc::default(), seen: Arc::default(), models: listed, new_connection_delay };
    let app = Router::new()
        .route("/v1/responses", post(responses).get(websocket))
        .route("/v1/models", get(models))
        .layer(axum::middleware::from_fn_with_state(mock.clone(), record))
        .with_state(mock.clone());
    let listener = within(DEADLINE, "bind", tokio::net::TcpListener::bind("127.0.0.1:0")).await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await });
    (base, mock)
}

async fn bench_within(limit: Duration, base: &str, flags: &[&str]) -> Vec<LevelResult> {
    let mut argv = vec!["spindle-bench", "--base-url", base, "--model", "m", "--quiet", "--warmup", "0"];
    argv.extend_from_slice(flags);
    let args = Args::parse_from(argv);
    let client = Client::from_args(&args).unwrap();
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

/// What a run of the real binary left: exit status, stdout, stderr.
struct BinRun {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs the `spindle-bench` binary with `args`, killed (and the test
/// failed) if it outlives [`DEADLINE`]. Output goes to files, so a chatty
/// run can't block on a full pipe.
async fn bench_bin(args: &[&str]) -> BinRun {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let run = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Seek};
        let (mut out, mut err) = (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_spindle-bench"))
            .args(&args)
            .env_remove("SPINDLE_BENCH_BASE_URL")
            .env_remove("SPINDLE_BENCH_API_KEY")
            .stdout(out.try_clone().unwrap())
            .stderr(err.try_clone().unwrap())
            .spawn()
            .unwrap();
        let began = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if began.elapsed() > DEADLINE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("spindle-bench {args:?}: still running after {DEADLINE:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (mut stdout, mut stderr) = (String::new(), String::new());
        out.rewind().unwrap();
        out.read_to_string(&mut stdout).unwrap();
        err.rewind().unwrap();
        err.read_to_string(&mut stderr).unwrap();
        BinRun { status, stdout, stderr }
    });
    within(DEADLINE + Duration::from_secs(5), "spindle-bench binary", run).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_headers_reach_every_request_including_models_and_the_websocket_upgrade() {
    let (base, mock) = start(Mode::Stream { first_ms: 1, gap_ms: 1, deltas: 2 }).await;
    let headers = ["--header", "X-Bench-Tenant:team-a", "--header", "X-Trace: one two"];
    let mut with_model = vec!["--base-url", base.as_str()];
    with_model.extend_from_slice(&headers);
    assert_eq!(within(DEADLINE, "models", discover_model(&Args::parse_from([&["spindle-bench"], &with_model[..]].concat()))).await.unwrap(), "mock-model");
    let http = bench(&base, &[&headers[..], &["--requests", "3", "--concurrency", "2"]].concat()).await;
    assert_eq!(http[0].aggregates.completed, 3, "{:?}", http[0].aggregates.errors);
    let ws = bench(&base, &[&headers[..], &["--api", "websocket", "--requests", "2"]].concat()).await;
    assert_eq!(ws[0].aggregates.completed, 2, "{:?}", ws[0].aggregates.errors);
    let seen = mock.seen();
    let kinds: HashSet<(&str, &str)> = seen.iter().map(|s| (s.method.as_str(), s.path.as_str())).collect();
    // The model query and pool warming, the POSTs, and the WebSocket upgrade.
    assert_eq!(kinds, HashSet::from([("GET", "/v1/models"), ("POST", "/v1/responses"), ("GET", "/v1/responses")]));
    for s in &seen {
        assert_eq!(s.headers.get("x-bench-tenant").map(|v| v.to_str().unwrap()), Some("team-a"), "{s:?}");
        assert_eq!(s.headers.get("x-trace").map(|v| v.to_str().unwrap()), Some("one two"), "{s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_is_discovered_from_v1_models_when_not_given() {
    let (base, mock) = start(Mode::Stream { first_ms: 1, gap_ms: 1, deltas: 2 }).await;
    let run = bench_bin(&["--base-url", &base, "--requests", "2", "--warmup", "0", "--quiet"]).await;
    assert!(run.status.success(), "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("using `mock-model`"), "{}", run.stderr);
    assert!(mock.bodies.lock().unwrap().iter().all(|b| b["model"] == "mock-model"));

    // None listed, or nothing at /models: a clear error.
    let (empty, _m) = start_with_models(Mode::Fail, &[]).await;
    let err = within(DEADLINE, "models", discover_model(&Args::parse_from(["b", "--base-url", &empty]))).await.unwrap_err().to_string();
    assert!(err.contains("listed no models") && err.contains("--model"), "{err}");
    let no_v1 = empty.trim_end_matches("/v1");
    let err = within(DEADLINE, "models", discover_model(&Args::parse_from(["b", "--base-url", no_v1]))).await.unwrap_err().to_string();
    assert!(err.contains("404 Not Found") && err.contains("missing /v1"), "{err}");
    let run = bench_bin(&["--base-url", &empty, "--requests", "1", "--quiet"]).await;
    assert!(!run.status.success() && run.stderr.contains("listed no models"), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_excludes_connecting_on_warmed_pooled_connections_unless_asked() {
    // The mock answers a connection's first request 250 ms late.
    let setup = Duration::from_millis(250);
    let posts = |mock: &Mock| -> Vec<SocketAddr> { mock.seen().iter().filter(|s| s.method == "POST").map(|s| s.peer).collect() };
    let ttfts = |level: &LevelResult| -> Vec<f64> { level.records.iter().map(|r| r.ttft_ms.unwrap()).collect() };
    let flags = ["--requests", "10", "--concurrency", "2"];
    let mode = Mode::Stream { first_ms: 1, gap_ms: 1, deltas: 2 };

    let (base, pooled) = start_mock(mode, &["m"], setup).await;
    let result = bench(&base, &flags).await;
    assert_eq!(result[0].aggregates.completed, 10, "{:?}", result[0].aggregates.errors);
    // The pool was opened before the first measured request ...
    let seen = pooled.seen();
    let first_post = seen.iter().position(|s| s.method == "POST").unwrap();
    assert!(seen[..first_post].iter().any(|s| s.path == "/v1/models"), "no pool warming: {seen:?}");
    // ... so the measured requests mostly don't pay for connecting, and reuse connections.
    assert!(result[0].aggregates.ttft_ms.p50 < setup.as_millis() as f64, "{:?}", ttfts(&result[0]));
    let used: HashSet<SocketAddr> = posts(&pooled).into_iter().collect();
    assert!(used.len() <= 5, "10 requests, 2 at a time, over {} connections", used.len());

    let (base, fresh) = start_mock(mode, &["m"], setup).await;
    let result = bench(&base, &[&flags[..], &["--include-connect-time"]].concat()).await;
    assert_eq!(result[0].aggregates.completed, 10, "{:?}", result[0].aggregates.errors);
    // A fresh connection per request: each TTFT includes the setup.
    assert!(ttfts(&result[0]).iter().all(|&t| t >= setup.as_millis() as f64), "{:?}", ttfts(&result[0]));
    assert_eq!(posts(&fresh).iter().collect::<HashSet<_>>().len(), 10, "one connection per request");
    assert!(fresh.seen().iter().all(|s| s.path != "/v1/models"), "no pool to warm");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_where_every_request_fails_exits_non_zero_with_a_hint() {
    let (base, _mock) = start(Mode::Stream { first_ms: 1, gap_ms: 1, deltas: 2 }).await;
    let no_v1 = base.trim_end_matches("/v1");
    let run = bench_bin(&["--base-url", no_v1, "--model", "m", "--requests", "3", "--quiet"]).await;
    assert!(!run.status.success(), "exit {:?}\n{}", run.status, run.stderr);
    let expected = format!("every request failed (404 Not Found ×3); is the base URL missing /v1? (got {no_v1})");
    assert!(run.stderr.contains(&expected), "{}", run.stderr);
    // The table still shows what happened.
    assert!(run.stdout.contains("http_404"), "{}", run.stdout);

    // A server that isn't there: the hint says so.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let run = bench_bin(&["--base-url", &gone, "--model", "m", "--requests", "2", "--warmup", "0", "--quiet"]).await;
    assert!(!run.status.success() && run.stderr.contains("is the server running at"), "{}", run.stderr);
}

fn load_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn save_result_writes_vllm_keys_in_vllm_units() {
    let (first_ms, gap_ms, deltas) = (30u64, 5u64, 4usize);
    let (base, _mock) = start(Mode::Stream { first_ms, gap_ms, deltas }).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vllm.json");
    let common = ["--base-url", &base, "--model", "m", "--requests", "5", "--warmup", "0", "--quiet", "--output-len", "4"];
    let run = bench_bin(&[&common[..], &["--save-result", file.to_str().unwrap(), "--metric-percentiles", "50,90,99.9"]].concat()).await;
    assert!(run.status.success(), "{}", run.stderr);
    let v = load_json(&file);
    let keys = [
        "date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness", "max_concurrency", "duration",
        "completed", "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
        "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
    ];
    for key in keys {
        assert!(v.get(key).is_some(), "no {key}: {v}");
    }
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        for stat in ["mean", "median", "std", "p50", "p90", "p99.9"] {
            let key = format!("{stat}_{metric}_ms");
            assert!(v[&key].as_f64().is_some_and(|x| x >= 0.0), "{key}: {}", v[&key]);
        }
    }
    assert!(v.get("p99_ttft_ms").is_none(), "only the percentiles asked for");
    assert_eq!((v["completed"].clone(), v["num_prompts"].clone(), v["model_id"].clone()), (json!(5), json!(5), json!("m")));
    assert_eq!((v["request_rate"].clone(), v["max_concurrency"].clone(), v["request_goodput"].clone()), (json!("inf"), json!(1), Value::Null));
    assert_eq!(v["total_output_tokens"], json!(5 * deltas));
    assert_eq!(v["total_input_tokens"], json!(5 * 100));
    assert_eq!(v["output_lens"], json!(vec![deltas; 5]));
    assert_eq!(v["errors"], json!(vec![""; 5]));
    assert_eq!(v["generated_texts"], json!(vec!["x".repeat(deltas); 5]));
    // Per-request times in seconds, summaries in milliseconds.
    let duration = v["duration"].as_f64().unwrap();
    let ttfts: Vec<f64> = v["ttfts"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect();
    assert_eq!(ttfts.len(), 5);
    for &t in &ttfts {
        assert!(t >= first_ms as f64 / 1e3 && t < duration, "ttft {t} s, duration {duration} s");
    }
    let mean_ttft_s = ttfts.iter().sum::<f64>() / 5.0;
    assert!((v["mean_ttft_ms"].as_f64().unwrap() - mean_ttft_s * 1e3).abs() < 1e-6, "{v}");
    assert!(v["mean_e2el_ms"].as_f64().unwrap() > v["mean_ttft_ms"].as_f64().unwrap());
    assert!(v["mean_e2el_ms"].as_f64().unwrap() / 1e3 < duration);
    let itls = v["itls"].as_array().unwrap();
    assert!(itls.iter().all(|l| l.as_array().unwrap().len() == deltas - 1));
    assert!(itls.iter().flat_map(|l| l.as_array().unwrap()).all(|x| x.as_f64().unwrap() < 1.0), "itls in seconds");
    let throughput = v["output_throughput"].as_f64().unwrap();
    assert!((throughput - (5 * deltas) as f64 / duration).abs() < 1e-6);
    assert!(!dir.path().join("vllm-c1.json").exists());

    // Several levels: one file per level, named after it.
    let run = bench_bin(&[&common[..], &["--concurrency", "1,2", "--save-result", file.to_str().unwrap()]].concat()).await;
    assert!(run.status.success(), "{}", run.stderr);
    for c in [1, 2] {
        let v = load_json(&dir.path().join(format!("vllm-c{c}.json")));
        assert_eq!((v["max_concurrency"].clone(), v["completed"].clone()), (json!(c), json!(5)));
        assert!(v["p99_ttft_ms"].is_number(), "default percentile 99");
    }
    let run = bench_bin(&[&common[..], &["--rate", "50,100", "--save-result", file.to_str().unwrap()]].concat()).await;
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(load_json(&dir.path().join("vllm-r100.json"))["request_rate"], json!(100.0));
    assert!(dir.path().join("vllm-r50.json").exists());
}

/// Every `<text>` element of `svg`: (x, y, content).
fn svg_texts(svg: &str) -> Vec<(f64, f64, String)> {
    let attr = |tag: &str, name: &str| -> f64 {
        let start = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        tag[start..].split('"').next().unwrap().parse().unwrap()
    };
    svg.split("<text").skip(1)
        .map(|rest| {
            let (tag, after) = rest.split_once('>').unwrap();
            let content = after.split("</text>").next().unwrap();
            (attr(tag, "x"), attr(tag, "y"), content.trim().to_string())
        })
        .collect()
}

/// Every `<polyline>` of `svg` with more than two points: (stroke, points).
fn svg_lines(svg: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    svg.split("<polyline").skip(1)
        .filter_map(|rest| {
            let tag = rest.split("/>").next().unwrap();
            let stroke = tag.split("stroke=\"").nth(1)?.split('"').next()?.to_string();
            let points: Vec<(f64, f64)> = tag.split("points=\"").nth(1)?.split('"').next()?.split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect();
            (points.len() > 2).then_some((stroke, points))
        })
        .collect()
}

fn synthetic_run(label: &str, ttfts: &[f64]) -> RunResult {
    let records: Vec<RequestRecord> = ttfts
        .iter()
        .map(|&t| RequestRecord { ttft_ms: Some(t), itl_ms: vec![t / 10.0; 3], e2e_ms: t * 2.0 + 50.0, output_tokens: 4, input_tokens: 10, ..Default::default() })
        .collect();
    let level = LevelResult { level: LoadLevel { concurrency: 1, rate: None }, aggregates: aggregate(&records, 1.0, None), records };
    let args = Args::parse_from(["spindle-bench", "--base-url", "http://h/v1", "--model", "m"]);
    RunResult { schema_version: SCHEMA_VERSION, label: label.into(), started_at: "now".into(), args, levels: vec![level] }
}

#[test]
fn report_of_two_runs_has_distinct_colours_log_cdf_axes_and_legends_off_the_data() {
    let runs = [synthetic_run("alpha", &[1.5, 3.0, 12.0, 40.0, 150.0, 900.0]), synthetic_run("beta", &[2.0, 5.0, 20.0, 80.0, 300.0, 700.0])];
    let page = html(&runs).unwrap();
    let figures: Vec<&str> = page.split("<figure>").skip(1).map(|f| f.split("</figure>").next().unwrap()).collect();
    assert_eq!(figures.len(), 4, "throughput and three CDFs");
    for figure in &figures {
        let texts = svg_texts(figure);
        // Both runs in the legend, below the plot: under every line drawn and every tick label.
        let legend: Vec<f64> = texts.iter().filter(|t| t.2.starts_with("alpha") || t.2.starts_with("beta")).map(|t| t.1).collect();
        assert_eq!(legend.len(), 2, "{texts:?}");
        let lowest_data = svg_lines(figure).iter().flat_map(|l| l.1.iter().map(|p| p.1)).fold(0f64, f64::max);
        let lowest_tick = texts.iter().filter(|t| t.2.ends_with(" ms") || t.2.ends_with(" s") || t.2.ends_with("tok/s")).map(|t| t.1).fold(0f64, f64::max);
        assert!(legend.iter().all(|&y| y > lowest_data && y > lowest_tick), "legend at {legend:?}, data to {lowest_data}, ticks to {lowest_tick}");
    }
    let ttft = figures.iter().find(|f| svg_texts(f).iter().any(|t| t.2 == "TTFT CDF")).unwrap();
    // The two series: two different, non-grey colours.
    let colours: HashSet<String> = svg_lines(ttft).into_iter().map(|l| l.0).collect();
    assert_eq!(colours.len(), 2, "{colours:?}");
    for c in &colours {
        let rgb: Vec<u8> = (0..3).map(|i| u8::from_str_radix(&c[1 + 2 * i..3 + 2 * i], 16).unwrap()).collect();
        assert!(rgb.iter().max().unwrap() - rgb.iter().min().unwrap() > 60, "{c} is grey");
    }
    // A log axis: decade labels, evenly spaced.
    let texts = svg_texts(ttft);
    let x_of = |label: &str| texts.iter().find(|t| t.2 == label).unwrap_or_else(|| panic!("no tick {label}: {texts:?}")).0;
    let (a, b, c) = (x_of("10 ms"), x_of("100 ms"), x_of("1 s"));
    assert!(b - a > 50.0 && ((c - b) - (b - a)).abs() <= 2.0, "decades at x = {a}, {b}, {c}");
    // Fractions as percentages, and not too many labels to read.
    assert!(texts.iter().any(|t| t.2 == "50%") && texts.iter().any(|t| t.2 == "100%"));
    let ticks = texts.iter().filter(|t| t.2.ends_with(" ms") || t.2.ends_with(" s")).count();
    assert!((3..=9).contains(&ticks), "{ticks} x ticks");
}
