//! The daemon over a real socket with the real model: JSON and SSE replies,
//! the exact event order, errors in the protocol's shape, the store
//! (GET/DELETE/input_items), previous_response_id chains, background +
//! cancel, and a client disconnect that frees its KV blocks.

use serde_json::{json, Value};
use spindle_server::app::Limits;
use spindle_server::store::{Order, ResponseStore, SqliteStore, StoreError, StoredResponse, TaskEvent, TaskRecord, TaskStore};
use std::sync::Arc;
use std::time::Duration;

mod common;

use common::Server;

/// A server with a 64 KiB body limit (so the 413 case is cheap to provoke).
fn limits() -> Limits {
    Limits { max_body_bytes: 64 << 10, ..Limits::default() }
}

async fn start(keys: Vec<String>) -> Server {
    common::start(keys, limits()).await
}

async fn start_with_blocks(keys: Vec<String>, blocks: usize) -> Server {
    common::start_custom(keys, limits(), blocks, |s| Arc::new(s)).await
}

/// A store whose writes of finished responses take 300 ms (a busy disk).
struct SlowStore(SqliteStore);

impl TaskStore for SlowStore {
    fn put_task(&self, task: &TaskRecord) -> Result<(), StoreError> {
        self.0.put_task(task)
    }
    fn get_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError> {
        self.0.get_task(id)
    }
    fn append_task_events(&self, id: &str, events: &[TaskEvent]) -> Result<(), StoreError> {
        self.0.append_task_events(id, events)
    }
    fn task_events(&self, id: &str, after: u64) -> Result<Vec<TaskEvent>, StoreError> {
        self.0.task_events(id, after)
    }
    fn expire_tasks(&self, events_cutoff: i64, tasks_cutoff: i64) -> Result<usize, StoreError> {
        self.0.expire_tasks(events_cutoff, tasks_cutoff)
    }
    fn fail_unfinished_tasks(&self, now: i64) -> Result<usize, StoreError> {
        self.0.fail_unfinished_tasks(now)
    }
}

impl ResponseStore for SlowStore {
    fn put(&self, rec: &StoredResponse) -> Result<(), StoreError> {
        if !rec.is_unfinished() {
            std::thread::sleep(Duration::from_millis(300));
        }
        self.0.put(rec)
    }
    fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        self.0.get(id)
    }
    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        self.0.delete(id)
    }
    fn input_items(&self, id: &str, after: Option<&str>, limit: usize, order: Order) -> Result<Option<Vec<spindle_server::protocol::InputItem>>, StoreError> {
        self.0.input_items(id, after, limit, order)
    }
    fn append_events(&self, id: &str, events: &[spindle_server::protocol::StreamEvent]) -> Result<(), StoreError> {
        self.0.append_events(id, events)
    }
    fn events(&self, id: &str, starting_after: Option<u64>) -> Result<Option<Vec<spindle_server::protocol::StreamEvent>>, StoreError> {
        self.0.events(id, starting_after)
    }
    fn chain(&self, id: &str) -> Result<Option<Vec<StoredResponse>>, StoreError> {
        self.0.chain(id)
    }
    fn mark_unfinished_failed(&self) -> Result<usize, StoreError> {
        self.0.mark_unfinished_failed()
    }
    fn expire(&self, now: i64) -> Result<usize, StoreError> {
        self.0.expire(now)
    }
    fn len(&self) -> Result<usize, StoreError> {
        self.0.len()
    }
}

async fn post(s: &Server, body: Value) -> (u16, Value) {
    let r = common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Parse an SSE body into (event field, data JSON) pairs; checks framing.
fn parse_sse(text: &str) -> Vec<(String, Value)> {
    assert!(text.ends_with("data: [DONE]\n\n"), "stream must end with [DONE]: {text:?}");
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty() && !b.starts_with(':')) {
        if block == "data: [DONE]" {
            continue;
        }
        let mut lines = block.lines();
        let event = lines.next().and_then(|l| l.strip_prefix("event: ")).expect("event line").to_string();
        let data = lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data line");
        out.push((event, serde_json::from_str(data).expect("json data")));
    }
    out
}

#[tokio::test]
async fn non_streaming_text_response_has_every_key() {
    let s = start(vec![]).await;
    let (status, r) = post(&s, json!({"model": "smollm2-135m-instruct", "input": "Say hello.", "max_output_tokens": 16, "metadata": {"k": "v"}})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().is_some_and(|id| id.starts_with("resp_")));
    assert!(matches!(r["status"].as_str(), Some("completed" | "incomplete")), "{r}");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    // Sampling fields left out get the server's defaults, and the response says so.
    assert_eq!(r["temperature"], json!(0.8));
    assert_eq!(r["top_p"], json!(0.95));
    assert_eq!(r["output"][0]["type"], "message");
    assert_eq!(r["output"][0]["role"], "assistant");
    assert_eq!(r["output"][0]["content"][0]["type"], "output_text");
    assert!(r["usage"]["input_tokens"].as_u64().is_some_and(|n| n > 0));
    assert!(r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().is_some());
    assert!(r["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().is_some());
    for key in ["created_at", "model", "instructions", "tools", "tool_choice", "temperature", "top_p", "previous_response_id", "store"] {
        assert!(r.get(key).is_some(), "missing key {key}: {r}");
    }
}

#[tokio::test]
async fn streaming_text_follows_the_exact_event_order() {
    let s = start(vec![]).await;
    let r = common::http()
        .post(format!("{}/v1/responses", s.base))
        .json(&json!({"model": "smollm2-135m-instruct", "input": "Count to three.", "stream": true, "max_output_tokens": 24}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap_or("").starts_with("text/event-stream"));
    let events = parse_sse(&r.text().await.expect("body"));
    let kinds: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    for (i, (event, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], event.as_str(), "event: must equal type");
        assert_eq!(data["sequence_number"], i as u64, "sequence numbers count from 0");
    }
    let deltas = kinds.iter().filter(|k| **k == "response.output_text.delta").count();
    assert!(deltas >= 1);
    let mut expected = vec!["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend(["response.output_text.done", "response.content_part.done", "response.output_item.done"]);
    let last = *kinds.last().expect("events");
    assert!(matches!(last, "response.completed" | "response.incomplete"), "{last}");
    expected.push(last);
    assert_eq!(kinds, expected);
    let text: String = events.iter().filter(|(e, _)| e == "response.output_text.delta").map(|(_, d)| d["delta"].as_str().unwrap_or("")).collect();
    let done = events.iter().find(|(e, _)| e == "response.output_text.done").map(|(_, d)| d["text"].clone());
    assert_eq!(done, Some(json!(text)));
}

#[tokio::test]
async fn bad_input_gets_the_error_shape() {
    let s = start(vec![]).await;
    let model = "smollm2-135m-instruct";
    let cases: Vec<(Value, u16, Option<&str>)> = vec![
        (json!({"model": "nope", "input": "hi"}), 404, Some("model")),
        (json!({"model": model, "input": "hi", "temperature": 5}), 400, Some("temperature")),
        (json!({"model": model, "input": "hi", "top_p": -1}), 400, Some("top_p")),
        (json!({"model": model, "input": 42}), 400, Some("input")),
        (json!({"model": model, "input": "hi", "max_output_tokens": 1}), 400, Some("max_output_tokens")),
        (json!({"model": model, "input": [{"type": "bogus"}]}), 400, None),
        (json!({"model": model, "input": "hi", "background": true, "store": false}), 400, Some("background")),
        (json!({"model": model, "input": "hi", "previous_response_id": "resp_missing"}), 404, None),
        (json!({"model": model, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}), 400, None),
        (json!({"model": model, "input": "hi", "tools": "x"}), 400, Some("tools")),
        (json!({"model": model, "input": "hi", "metadata": "x"}), 400, Some("metadata")),
        (json!({"model": model, "input": "hi", "stream": "yes"}), 400, Some("stream")),
        (json!({"model": model, "input": "hi", "truncation": "sometimes"}), 400, Some("truncation")),
        (json!({"model": model, "input": "word ".repeat(9000)}), 400, None),
        (json!({"model": model, "input": "x".repeat(70_000)}), 413, None),
    ];
    for (body, status, param) in cases {
        let (got, r) = post(&s, body.clone()).await;
        assert_eq!(got, status, "{body:.80}: {r}");
        assert!(r["error"]["message"].as_str().is_some(), "error shape: {r}");
        assert!(r["error"]["type"].as_str().is_some(), "error shape: {r}");
        if let Some(p) = param {
            assert_eq!(r["error"]["param"], p, "{r}");
        }
    }
    let r = common::http().post(format!("{}/v1/responses", s.base)).body("{not json").header("content-type", "application/json").send().await.expect("send");
    assert_eq!(r.status(), 400);
    let r = common::http().get(format!("{}/v1/responses/resp_nope", s.base)).send().await.expect("get");
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn stored_responses_chain_and_can_be_deleted() {
    let s = start(vec![]).await;
    let model = "smollm2-135m-instruct";
    let mut prev: Option<String> = None;
    let mut ids = Vec::new();
    for (i, q) in ["My name is Ada.", "What is my name?", "Spell it backwards."].iter().enumerate() {
        let mut body = json!({"model": model, "input": q, "max_output_tokens": 16});
        if let Some(p) = &prev {
            body["previous_response_id"] = json!(p);
        }
        let (status, r) = post(&s, body).await;
        assert_eq!(status, 200, "turn {i}: {r}");
        if i > 0 {
            assert_eq!(r["previous_response_id"], json!(prev));
            let cached = r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
            assert!(cached > 0, "turn {i} should reuse the previous turn's prefix: {}", r["usage"]);
        }
        let id = r["id"].as_str().expect("id").to_string();
        ids.push(id.clone());
        prev = Some(id);
    }
    let got: Value = common::http().get(format!("{}/v1/responses/{}", s.base, ids[2])).send().await.expect("get").json().await.expect("json");
    assert_eq!(got["id"], ids[2]);
    let items: Value = common::http().get(format!("{}/v1/responses/{}/input_items", s.base, ids[1])).send().await.expect("get").json().await.expect("json");
    assert_eq!(items["object"], "list");
    assert!(!items["data"].as_array().expect("data").is_empty());
    let del = common::http().delete(format!("{}/v1/responses/{}", s.base, ids[0])).send().await.expect("delete");
    assert_eq!(del.status(), 200);
    let again = common::http().get(format!("{}/v1/responses/{}", s.base, ids[0])).send().await.expect("get");
    assert_eq!(again.status(), 404);
}

#[tokio::test]
async fn background_responses_can_be_polled_and_cancelled() {
    let s = start(vec![]).await;
    let (status, r) = post(&s, json!({"model": "smollm2-135m-instruct", "input": "Write a long story.", "background": true, "max_output_tokens": 2000})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "queued");
    let id = r["id"].as_str().expect("id").to_string();
    let cancel = common::http().post(format!("{}/v1/responses/{id}/cancel", s.base)).send().await.expect("cancel");
    assert_eq!(cancel.status(), 200);
    let body: Value = cancel.json().await.expect("json");
    assert_eq!(body["status"], "cancelled");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.state.scheduler.check_kv().expect("kv").used, 0, "cancel must free the blocks");
}

#[tokio::test]
async fn a_client_disconnect_frees_its_blocks() {
    let s = start(vec![]).await;
    let mut r = long_stream(&s).await;
    // Read until the sequence holds blocks, so the check below cannot pass
    // before the request was ever admitted.
    let admitted = std::time::Instant::now() + Duration::from_secs(30);
    while s.state.scheduler.check_kv().expect("kv").used == 0 {
        assert!(std::time::Instant::now() < admitted, "the request never got KV blocks");
        r.chunk().await.expect("chunk").expect("the stream ended before generation started");
    }
    drop(r);
    common::assert_blocks_freed(&s, 5, "after disconnect").await;
}

#[tokio::test]
async fn api_keys_are_required_when_configured() {
    let s = start(vec!["sekret".into()]).await;
    let r = common::http().get(format!("{}/v1/models", s.base)).send().await.expect("send");
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.expect("json");
    assert!(body["error"]["message"].is_string());
    let r = common::http().get(format!("{}/v1/models", s.base)).bearer_auth("sekret").send().await.expect("send");
    assert_eq!(r.status(), 200);
    let health = common::http().get(format!("{}/health", s.base)).send().await.expect("health");
    assert_eq!(health.status(), 200);
    let metrics = common::http().get(format!("{}/metrics", s.base)).bearer_auth("sekret").send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("spindle_kv_blocks_free"));
}

#[tokio::test]
async fn stored_streams_replay_from_a_sequence_number() {
    let s = start(vec![]).await;
    let r = common::http()
        .post(format!("{}/v1/responses", s.base))
        .json(&json!({"model": "smollm2-135m-instruct", "input": "Count to five.", "stream": true, "max_output_tokens": 16}))
        .send()
        .await
        .expect("send");
    let live = parse_sse(&r.text().await.expect("body"));
    let id = live[0].1["response"]["id"].as_str().expect("id").to_string();
    let replay = common::http().get(format!("{}/v1/responses/{id}?stream=true&starting_after=3", s.base)).send()
        .await
        .expect("replay")
        .text()
        .await
        .expect("body");
    let replayed = parse_sse(&replay);
    assert_eq!(replayed.len(), live.len() - 4, "events after sequence number 3");
    for ((e1, d1), (e2, d2)) in live[4..].iter().zip(&replayed) {
        assert_eq!(e1, e2);
        assert_eq!(d1, d2);
    }
}

#[tokio::test]
async fn truncation_auto_drops_the_oldest_turns_but_disabled_refuses() {
    // 64 blocks of 16: the server can hold 1024 tokens, so ~270-token turns
    // overflow after three or four turns.
    let s = start_with_blocks(vec![], 64).await;
    let model = "smollm2-135m-instruct";
    let long = "lorem ipsum dolor sit amet ".repeat(25);
    let turn_text = |i: usize| format!("Marker{i}X. {long}");
    let mut prev: Option<String> = None;
    for i in 0..5 {
        let mut body = json!({"model": model, "input": turn_text(i), "max_output_tokens": 16, "truncation": "auto"});
        if let Some(p) = &prev {
            body["previous_response_id"] = json!(p);
        }
        let (status, r) = post(&s, body).await;
        assert_eq!(status, 200, "{r}");
        prev = r["id"].as_str().map(str::to_string);
    }
    // Five turns of ~270 tokens exceed the 1024-token capacity: auto dropped old turns.
    let body = json!({"model": model, "input": turn_text(5), "max_output_tokens": 16, "previous_response_id": prev, "truncation": "disabled", "instructions": "Be brief."});
    let (status, r) = post(&s, body).await;
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["code"], "context_length_exceeded");
    let body = json!({"model": model, "input": turn_text(5), "max_output_tokens": 16, "previous_response_id": prev, "truncation": "auto", "instructions": "Be brief."});
    // The prompt the server builds for this request: the newest turns and the
    // new input survive, the oldest are gone, the instructions stay.
    let request = spindle_server::protocol::validate(body.clone(), &spindle_server::protocol::RequestLimits::default()).expect("valid");
    let tenant = spindle_server::app::access::auth::Tenant::anonymous();
    let history = spindle_server::app::runtime::turn::history(&s.state, prev.as_deref(), &tenant).expect("history");
    let prompt = spindle_server::app::runtime::turn::prepare(&s.state, &request, history, &tenant).expect("prepared").prompt;
    let text = s.state.model.tokenizer.decode(&prompt, false).expect("decode");
    // The user turns in the prompt, by their markers (outputs may echo a marker).
    let kept: Vec<usize> = text
        .split("<|im_start|>user\n")
        .skip(1)
        .filter_map(|turn| turn.strip_prefix("Marker")?.split_once('X')?.0.parse().ok())
        .collect();
    assert_eq!(kept.last(), Some(&5), "the new input survives: {kept:?}");
    assert!(kept.len() >= 2 && kept[0] >= 1, "some old turns dropped, the newest kept: {kept:?}");
    assert_eq!(kept, (kept[0]..=5).collect::<Vec<_>>(), "the survivors are the newest turns, in order");
    assert!(text.contains("Be brief."), "the instructions survive truncation");
    let (status, r) = post(&s, body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["instructions"], "Be brief.");
    assert_eq!(r["usage"]["input_tokens"].as_u64(), Some(prompt.len() as u64), "{r}");
}

#[tokio::test]
async fn ops_routes_report_the_model_and_metrics() {
    let s = start(vec![]).await;
    let models: Value = common::http().get(format!("{}/v1/models", s.base)).send().await.expect("models").json().await.expect("json");
    assert_eq!(models["data"][0]["id"], "smollm2-135m-instruct");
    assert_eq!(common::http().get(format!("{}/ready", s.base)).send().await.expect("ready").status(), 200);
    let (status, _) = post(&s, json!({"model": "smollm2-135m-instruct", "input": "hi", "max_output_tokens": 16})).await;
    assert_eq!(status, 200);
    let m = common::http().get(format!("{}/metrics", s.base)).send().await.expect("metrics").text().await.expect("text");
    for name in [
        "spindle_requests_total{route=\"/v1/responses\",status=\"200\"} 1",
        "spindle_time_to_first_token_seconds_count 1",
        "spindle_inter_token_latency_seconds_bucket",
        "spindle_output_tokens_total",
        "spindle_cached_tokens_total",
        "spindle_queue_depth",
        "spindle_running_sequences",
        "spindle_kv_blocks_used",
    ] {
        assert!(m.contains(name), "missing {name} in\n{m}");
    }
}

/// A client that chains as soon as it reads `response.completed` must find
/// the stored response: the terminal events are sent after the store write.
#[tokio::test]
async fn a_streamed_response_is_stored_before_its_terminal_event() {
    let s = common::start_custom(vec![], limits(), 256, |s| Arc::new(SlowStore(s))).await;
    let http = common::http();
    for round in 0..2 {
        let mut r = http
            .post(format!("{}/v1/responses", s.base))
            .json(&json!({"model": "smollm2-135m-instruct", "input": format!("Say hi {round}."), "stream": true,
                          "max_output_tokens": 16, "store": true}))
            .send()
            .await
            .expect("send");
        let mut text = String::new();
        while !text.contains("event: response.completed") && !text.contains("event: response.incomplete") {
            let chunk = r.chunk().await.expect("chunk").unwrap_or_else(|| panic!("the stream ended before its terminal event: {text}"));
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        let id = text.split("\"id\":\"").nth(1).and_then(|t| t.split('"').next()).expect("response id").to_string();
        let got = http.get(format!("{}/v1/responses/{id}", s.base)).send().await.expect("get");
        assert_eq!(got.status().as_u16(), 200, "round {round}: {id} not yet stored when its stream completed");
        drop(r);
    }
}

/// A streamed request for a long story (up to 2000 tokens).
async fn long_stream(s: &Server) -> reqwest::Response {
    let body = json!({"model": "smollm2-135m-instruct", "input": "Write a long story.", "stream": true, "max_output_tokens": 2000});
    common::http().post(format!("{}/v1/responses", s.base)).json(&body).send().await.expect("send")
}

#[tokio::test]
async fn a_request_past_the_time_limit_fails_and_frees_its_blocks() {
    let s = common::start(vec![], Limits { request_timeout: Duration::from_millis(500), ..limits() }).await;
    let started = std::time::Instant::now();
    let body = json!({"model": "smollm2-135m-instruct", "input": "Write a long story.", "max_output_tokens": 2000, "temperature": 0, "store": true});
    let (status, r) = post(&s, body).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "failed", "{r}");
    assert!(r["error"]["message"].as_str().is_some_and(|m| m.contains("time limit")), "{r}");
    assert!(took < Duration::from_secs(20), "the time limit did not stop generation: {took:?}");
    let tokens = r["usage"]["output_tokens"].as_u64().unwrap_or(0);
    assert!(tokens < 2000, "stopped early: {tokens} tokens");
    common::assert_blocks_freed(&s, 5, "after the time limit").await;
    // Stored as it ended: failed, not in progress.
    let got: Value = common::http().get(format!("{}/v1/responses/{}", s.base, r["id"].as_str().expect("id"))).send().await.expect("get").json().await.expect("json");
    assert_eq!(got["status"], "failed", "{got}");
}

#[tokio::test]
async fn draining_ends_an_in_flight_stream_with_a_terminal_event() {
    let s = start(vec![]).await;
    let mut r = long_stream(&s).await;
    let mut text = String::new();
    let admitted = std::time::Instant::now() + Duration::from_secs(30);
    while !text.contains("response.output_text.delta") {
        assert!(std::time::Instant::now() < admitted, "generation never started: {text}");
        let chunk = r.chunk().await.expect("chunk").expect("the stream ended before generating");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    s.state.draining.send_replace(true);
    while let Some(chunk) = r.chunk().await.expect("chunk") {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let events = parse_sse(&text);
    let (last, data) = events.last().expect("events");
    assert_eq!(last, "response.failed", "the drained stream ends with one terminal event");
    assert!(data["response"]["error"]["message"].as_str().is_some_and(|m| m.contains("shutting down")), "{data}");
    let terminals = events.iter().filter(|(e, _)| matches!(e.as_str(), "response.completed" | "response.failed" | "response.incomplete")).count();
    assert_eq!(terminals, 1);
    common::assert_blocks_freed(&s, 5, "after draining").await;
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip_and_refuse_bad_input() {
    let s = start(vec![]).await;
    let call = |path: &'static str, body: Value| {
        let url = format!("{}{path}", s.base);
        async move {
            let r = common::http().post(url).json(&body).send().await.expect("send");
            (r.status().as_u16(), r.json::<Value>().await.expect("json"))
        }
    };
    let (status, t) = call("/tokenize", json!({"prompt": "Hello there, general Kenobi."})).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["count"].as_u64(), t["tokens"].as_array().map(|a| a.len() as u64));
    assert_eq!(t["max_model_len"].as_u64(), Some(s.state.model.context_length as u64));
    let (status, d) = call("/detokenize", json!({"tokens": t["tokens"]})).await;
    assert_eq!((status, d["prompt"].as_str()), (200, Some("Hello there, general Kenobi.")), "{d}");
    // Chat messages give the prompt /v1/responses runs for the same input.
    let (_, chat) = call("/tokenize", json!({"messages": [{"role": "user", "content": "Say hi."}]})).await;
    let (_, r) = post(&s, json!({"model": "smollm2-135m-instruct", "input": [{"role": "user", "content": "Say hi."}], "max_output_tokens": 16})).await;
    assert_eq!(chat["count"], r["usage"]["input_tokens"], "{chat} vs {r}");
    // Chat Completions messages of an agent loop, as vLLM's /tokenize takes
    // them: an assistant turn with tool_calls and content null, a tool
    // result, tools in the Chat Completions shape. The count is the prompt
    // /v1/chat/completions runs for the same messages.
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, light rain"}]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let (status, loop_ids) = call("/tokenize", json!({"messages": messages, "tools": tools})).await;
    assert_eq!(status, 200, "{loop_ids}");
    let (status, c) = call("/v1/chat/completions", json!({"model": "smollm2-135m-instruct", "messages": messages, "tools": tools, "max_tokens": 1})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(loop_ids["count"], c["usage"]["prompt_tokens"], "{loop_ids} vs {c}");
    let (_, text) = call("/detokenize", json!({"tokens": loop_ids["tokens"]})).await;
    let text = text["prompt"].as_str().unwrap_or_default();
    assert!(text.contains("get_weather") && text.contains("18 C, light rain"), "the call and its result are in the prompt: {text}");

    let vocab = s.state.model.tokenizer.vocab_size();
    for (path, body, status, param) in [
        ("/tokenize", json!({"prompt": "a", "messages": []}), 400, Some("prompt")),
        ("/tokenize", json!({}), 400, Some("prompt")),
        ("/tokenize", json!({"messages": [{"role": "user", "content": "a"}], "add_generation_prompt": false}), 400, Some("add_generation_prompt")),
        ("/tokenize", json!({"messages": [{"role": "wizard", "content": "a"}]}), 400, None),
        ("/tokenize", json!({"prompt": "a", "model": "other"}), 404, None),
        ("/detokenize", json!({"tokens": [1, vocab]}), 400, Some("tokens[1]")),
        ("/detokenize", json!({"tokens": [-1]}), 400, Some("tokens[0]")),
        ("/detokenize", json!({"tokens": "nope"}), 400, None),
    ] {
        let (got, e) = call(path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {e}");
        assert!(e["error"]["message"].is_string(), "{e}");
        if let Some(param) = param {
            assert_eq!(e["error"]["param"], param, "{path} {body}: {e}");
        }
    }
    let (_, e) = call("/tokenize", json!({"messages": [{"role": "wizard", "content": "a"}]})).await;
    assert!(e["error"]["param"].as_str().is_some_and(|p| p.starts_with("messages")), "{e}");
}

/// The real model's runner, except that its second step panics (as a
/// kernel bug would).
struct PanicsOnSecondStep {
    inner: spindle_engine::runner::ModelRunner,
    steps: usize,
}

impl spindle_engine::runner::Executor for PanicsOnSecondStep {
    fn execute(&mut self, batch: &spindle_engine::batch::ForwardBatch) -> spindle_engine::Result<spindle_engine::batch::StepOutput> {
        self.steps += 1;
        assert!(self.steps < 2, "a deliberate panic in the executor's second step");
        self.inner.execute(batch)
    }

    fn context_length(&self) -> usize {
        self.inner.context_length()
    }

    fn kv_geometry(&self) -> spindle_engine::runner::KvGeometry {
        self.inner.kv_geometry()
    }
}

#[tokio::test]
async fn ready_turns_503_when_the_step_loop_dies_and_gauges_start_full() {
    let path = spindle_testenv::smollm2_gguf();
    let s = common::start_model_with(&path.to_string_lossy(), "smollm2-135m-instruct", vec![], limits(), |s| Arc::new(s), |model| {
        PanicsOnSecondStep { inner: spindle_engine::runner::ModelRunner::new(model, 64, 16), steps: 0 }
    })
    .await;
    let metrics = common::http().get(format!("{}/metrics", s.base)).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.lines().any(|l| l == "spindle_kv_blocks_free 64"), "free blocks before the first request:\n{metrics}");
    assert_eq!(common::http().get(format!("{}/ready", s.base)).send().await.expect("ready").status(), 200);

    let (status, r) = post(&s, json!({"model": "smollm2-135m-instruct", "input": "Say hi.", "max_output_tokens": 16})).await;
    assert!(status >= 500 || r["status"] == "failed", "a request whose step loop died does not succeed: {status} {r}");
    // The request can fail while the dying thread is still unwinding (its
    // sequences' channels close before its liveness flag drops): poll.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let ready = loop {
        let ready = common::http().get(format!("{}/ready", s.base)).send().await.expect("ready");
        if ready.status() == 503 || std::time::Instant::now() > deadline {
            break ready;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(ready.status(), 503);
    let body: Value = ready.json().await.expect("json");
    assert_eq!(body["status"], "unavailable", "{body}");
    let (status, r) = post(&s, json!({"model": "smollm2-135m-instruct", "input": "Again.", "max_output_tokens": 16})).await;
    assert_eq!(status, 503, "new work is refused once the step loop is gone: {r}");
}

#[tokio::test]
async fn a_bad_query_string_is_a_json_400_naming_the_parameter() {
    let s = start(vec![]).await;
    for (path, param) in [("/v1/responses/resp_x?stream=maybe", "stream"), ("/v1/responses/resp_x/input_items?limit=-3", "limit"),
                          ("/v1/responses/resp_x?starting_after=abc", "starting_after")] {
        let r = common::http().get(format!("{}{path}", s.base)).send().await.expect("send");
        assert_eq!(r.status().as_u16(), 400, "{path}");
        assert!(r.headers()["content-type"].to_str().unwrap_or("").starts_with("application/json"), "{path}");
        let e: Value = r.json().await.expect("json");
        assert_eq!(e["error"]["param"], param, "{path}: {e}");
    }
    let r = common::http().get(format!("{}/lmsp/v1/tasks/task_x/events?after=soon", s.base)).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}
