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

async fn start(mode: Mode) -> (String, Mock) {
    let mock = Mock { mode, bodies: Arc::default() };
    let app = Router::new().route("/v1/responses", post(responses).get(websocket)).with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, mock)
}

async fn bench(base: &str, flags: &[&str]) -> Vec<LevelResult> {
    let mut argv = vec!["spindle-bench", "--base-url", base, "--model", "m", "--quiet", "--warmup", "0"];
    argv.extend_from_slice(flags);
    let args = Args::parse_from(argv);
    let client = Client::new(&args.base_url, args.api, &args.model, None, args.timeout()).unwrap();
    let mut out = Vec::new();
    for (index, level) in levels(&args).unwrap().into_iter().enumerate() {
        out.push(run_level(&args, &client, level, index, &indicatif::ProgressBar::hidden()).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_delays_give_the_measured_latencies() {
    let (base, mock) = start(Mode::Stream { first_ms: 120, gap_ms: 40, deltas: 6 }).await;
    let result = bench(&base, &["--concurrency", "1,3", "--requests", "6", "--output-len", "6", "--slo", "ttft=1000ms,tpot=20ms"]).await;
    assert_eq!(result.len(), 2);
    for level in &result {
        let a = &level.aggregates;
        assert_eq!((a.completed, a.errors.len(), level.records.len()), (6, 0, 6));
        // Loopback adds little; scheduling noise on 2 shared cores stays well under 40 ms.
        assert!((120.0..170.0).contains(&a.ttft_ms.p50), "ttft {:?}", a.ttft_ms);
        assert!((40.0..75.0).contains(&a.itl_ms.p50), "itl {:?}", a.itl_ms);
        assert_eq!(a.itl_ms.count, 6 * 5);
        for r in &level.records {
            assert_eq!(r.output_tokens, 6);
            let itl_sum: f64 = r.itl_ms.iter().sum();
            assert!((r.ttft_ms.unwrap() + itl_sum - r.e2e_ms).abs() < 60.0, "{r:?}");
            assert!(r.tpot_ms().unwrap() >= 40.0);
        }
        // TPOT ≥ 40 ms misses the 20 ms SLO: no goodput.
        assert_eq!(a.goodput, 0.0);
        assert!(a.request_s > 0.0 && a.output_tok_s > 0.0);
        assert!(a.client_overhead_us > 0.0);
    }
    // Three clients finish six 320 ms requests in about two rounds.
    assert!(result[1].aggregates.duration_s < result[0].aggregates.duration_s * 0.6);
    let sent = mock.bodies.lock().unwrap();
    assert_eq!(sent.len(), 12);
    assert_eq!((sent[0]["stream"].clone(), sent[0]["max_output_tokens"].clone(), sent[0]["ignore_eos"].clone()), (json!(true), json!(6), json!(true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_arrivals_follow_the_rate() {
    let (base, _mock) = start(Mode::Stream { first_ms: 1, gap_ms: 1, deltas: 2 }).await;
    let result = bench(&base, &["--rate", "25", "--arrival", "constant", "--concurrency", "8", "--requests", "30"]).await;
    let mut starts: Vec<f64> = result[0].records.iter().map(|r| r.start_ms).collect();
    starts.sort_by(f64::total_cmp);
    let gaps: Vec<f64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!((mean - 40.0).abs() < 4.0, "mean gap {mean} ms for 25 req/s");
    assert!((starts[29] - 29.0 * 40.0).abs() < 60.0, "the last request is due at 1160 ms: {}", starts[29]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_hanging_servers_give_counted_errors_and_a_report() {
    let (base, _m) = start(Mode::Fail).await;
    let failed = bench(&base, &["--concurrency", "2", "--requests", "5"]).await;
    assert_eq!(failed[0].aggregates.completed, 0);
    assert_eq!(failed[0].aggregates.errors.get("http_500"), Some(&5));

    let (base, _m) = start(Mode::Hang).await;
    let began = std::time::Instant::now();
    let hung = bench(&base, &["--concurrency", "2", "--requests", "4", "--timeout-s", "0.5"]).await;
    assert!(began.elapsed() < Duration::from_secs(10), "a hanging server must not hang the run");
    assert_eq!(hung[0].aggregates.errors.get("timeout"), Some(&4));

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
