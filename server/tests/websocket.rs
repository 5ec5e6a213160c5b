//! The WebSocket transport on /v1/responses with the real model: auth on the
//! handshake, the SSE event objects one per frame without `[DONE]`, one
//! terminal message per turn, connection-local `store: false` chains (and
//! their absence on a new connection), eviction after a failed continuation,
//! one response in flight, a close that frees the blocks, and the time limit.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use spindle_server::app::Limits;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const KEY: &str = "sk-ws-test";

async fn connect(s: &common::Server, key: Option<&str>) -> Result<Socket, tokio_tungstenite::tungstenite::Error> {
    let url = format!("{}/v1/responses", s.base.replace("http://", "ws://"));
    let mut request = url.into_client_request().unwrap();
    if let Some(key) = key {
        request.headers_mut().insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    tokio_tungstenite::connect_async(request).await.map(|(ws, _)| ws)
}

async fn send(ws: &mut Socket, body: Value) {
    ws.send(Message::Text(body.to_string().into())).await.unwrap();
}

/// The next text frame as JSON, within 60 s; pings and pongs are passed
/// over, while the end of the stream, a close or an error fail the test.
async fn next_event(ws: &mut Socket) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(60), ws.next()).await.expect("a frame in time");
        match frame {
            Some(Ok(Message::Text(text))) => {
                assert_ne!(text.as_str(), "[DONE]", "no [DONE] over WebSocket");
                return serde_json::from_str(text.as_str()).unwrap();
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("the connection ended while an event was expected: {other:?}"),
        }
    }
}

/// Frames until one terminal message (`response.completed/incomplete/failed` or `error`).
async fn turn(ws: &mut Socket) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let v = next_event(ws).await;
        let t = v["type"].as_str().unwrap().to_string();
        events.push(v);
        if matches!(t.as_str(), "response.completed" | "response.incomplete" | "response.failed" | "error" | "response.compaction") {
            return events;
        }
    }
}

fn create(input: Value, extra: Value) -> Value {
    let mut body = json!({"type": "response.create", "model": "smollm2-135m-instruct", "input": input,
                          "max_output_tokens": 16, "temperature": 0, "store": false});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn terminal(events: &[Value]) -> &Value {
    events.last().unwrap()
}

#[tokio::test]
async fn turns_stream_the_sse_events_and_chain_on_the_connection_only() {
    let s = common::start(vec![KEY.into()], Limits::default()).await;
    assert!(connect(&s, None).await.is_err(), "the handshake needs the API key");
    let mut ws = connect(&s, Some(KEY)).await.expect("connect");

    send(&mut ws, create(json!("Say hello."), json!({}))).await;
    let first = turn(&mut ws).await;
    assert_eq!(first[0]["type"], "response.created");
    for (i, e) in first.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "{e}");
    }
    let done = terminal(&first);
    assert!(matches!(done["type"].as_str(), Some("response.completed" | "response.incomplete")), "{done}");
    let id = done["response"]["id"].as_str().unwrap().to_string();

    // Continue a store:false response on the same socket: only the new input, prefix reused.
    send(&mut ws, create(json!("And goodbye?"), json!({"previous_response_id": id}))).await;
    let second = turn(&mut ws).await;
    let done2 = terminal(&second);
    assert!(matches!(done2["type"].as_str(), Some("response.completed" | "response.incomplete")), "{done2}");
    let usage = &done2["response"]["usage"];
    assert!(usage["input_tokens"].as_u64() > done["response"]["usage"]["input_tokens"].as_u64(), "the history is in the prompt");
    assert!(usage["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{usage}");

    // A new connection does not know it, and neither does HTTP (store:false is never stored).
    let mut other = connect(&s, Some(KEY)).await.expect("connect");
    send(&mut other, create(json!("Hi again."), json!({"previous_response_id": id}))).await;
    let missing = turn(&mut other).await;
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0]["type"], "error");
    assert_eq!(missing[0]["status"], 404);
    assert_eq!(missing[0]["error"]["code"], "previous_response_not_found");
    // The connection stays usable: a fresh turn works.
    send(&mut other, create(json!("Start over."), json!({}))).await;
    assert_ne!(terminal(&turn(&mut other).await)["type"], "error");
}

#[tokio::test]
async fn bad_turns_get_one_error_envelope_and_a_failed_continuation_evicts() {
    let s = common::start(vec![], Limits::default()).await;
    let mut ws = connect(&s, None).await.expect("connect");
    for (body, param) in [
        (create(json!("x"), json!({"stream": true})), "stream"),
        (create(json!("x"), json!({"background": true})), "background"),
        (json!({"type": "response.cancel"}), "type"),
        (create(json!("x"), json!({"temperature": 9})), "temperature"),
    ] {
        send(&mut ws, body).await;
        let events = turn(&mut ws).await;
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!((events[0]["type"].clone(), events[0]["status"].clone()), (json!("error"), json!(400)), "{events:?}");
        assert_eq!(events[0]["error"]["param"], param);
    }
    send(&mut ws, create(json!("Say hello."), json!({}))).await;
    let id = terminal(&turn(&mut ws).await)["response"]["id"].as_str().unwrap().to_string();
    let orphan = json!([{"type": "function_call_output", "call_id": "call_nope", "output": "42"}]);
    send(&mut ws, create(orphan, json!({"previous_response_id": id}))).await;
    let failed = turn(&mut ws).await;
    assert_eq!((failed.len(), failed[0]["status"].clone()), (1, json!(400)), "{failed:?}");
    send(&mut ws, create(json!("Carry on."), json!({"previous_response_id": id}))).await;
    let evicted = turn(&mut ws).await;
    assert_eq!(evicted[0]["error"]["code"], "previous_response_not_found", "a failed continuation evicts its parent");
}

#[tokio::test]
async fn one_response_in_flight_and_a_close_frees_the_blocks() {
    let s = common::start(vec![], Limits::default()).await;
    let mut ws = connect(&s, None).await.expect("connect");
    send(&mut ws, create(json!("Write a long story about the sea."), json!({"max_output_tokens": 400}))).await;
    send(&mut ws, create(json!("And another."), json!({}))).await;
    let mut saw_busy = false;
    let mut saw_created = false;
    while !(saw_busy && saw_created) {
        let v = next_event(&mut ws).await;
        if v["type"] == "error" {
            assert_eq!((v["status"].clone(), v["error"]["code"].clone()), (json!(409), json!("response_in_progress")));
            saw_busy = true;
        }
        saw_created |= v["type"] == "response.created";
    }
    // `response.created` precedes admission: wait until the first response holds blocks.
    let admitted = std::time::Instant::now() + Duration::from_secs(10);
    while s.state.scheduler.check_kv().unwrap().used == 0 {
        assert!(std::time::Instant::now() < admitted, "the first response never started generating");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ws.close(None).await.unwrap();
    drop(ws);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.state.scheduler.check_kv().unwrap().used > 0 {
        assert!(std::time::Instant::now() < deadline, "blocks still held after the client closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_connection_limit_ends_with_its_error_code() {
    let limits = Limits { websocket_max_connection: Duration::from_millis(300), ..Limits::default() };
    let s = common::start(vec![], limits).await;
    let mut ws = connect(&s, None).await.expect("connect");
    let events = turn(&mut ws).await;
    assert_eq!(events[0]["error"]["code"], "websocket_connection_limit_reached");
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(m)) = ws.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the server closes the connection after the limit");
}

/// A client that sends its next turn the moment it reads a terminal event is
/// never told a response is still in progress.
#[tokio::test]
async fn the_next_turn_may_follow_the_terminal_event_at_once() {
    let s = common::start(vec![], Limits::default()).await;
    let mut ws = connect(&s, None).await.expect("connect");
    let mut previous: Option<String> = None;
    for round in 0..8 {
        let extra = previous.as_ref().map_or(json!({}), |id| json!({"previous_response_id": id}));
        send(&mut ws, create(json!(format!("Turn {round}: one word please.")), extra)).await;
        let events = turn(&mut ws).await;
        let last = terminal(&events);
        assert_ne!(last["type"], "error", "round {round}: {last}");
        previous = last["response"]["id"].as_str().map(str::to_string);
    }
}

/// Compaction over WebSocket: a `store: false` chain (known only to this
/// connection) is compacted with a `response.compact` message, and its output
/// starts a new chain on the same socket (digest §7: no `previous_response_id`).
#[tokio::test]
async fn a_connection_local_chain_compacts_and_a_new_chain_starts_from_it() {
    let s = common::start(vec![], Limits::default()).await;
    let mut ws = connect(&s, None).await.expect("connect");
    send(&mut ws, create(json!("My name is Ada and I live in Lyon."), json!({}))).await;
    let first = turn(&mut ws).await;
    let id = terminal(&first)["response"]["id"].as_str().unwrap().to_string();

    send(&mut ws, json!({"type": "response.compact", "model": "smollm2-135m-instruct",
                         "previous_response_id": id, "input": "Where do I live?"})).await;
    let compacted = turn(&mut ws).await;
    assert_eq!(compacted.len(), 1);
    let c = &compacted[0];
    assert_eq!((c["type"].as_str(), c["object"].as_str()), (Some("response.compaction"), Some("response.compaction")), "{c}");
    let output = c["output"].as_array().unwrap();
    assert_eq!(output[0]["type"], "compaction");
    assert!(output[0]["encrypted_content"].as_str().is_some_and(|t| !t.contains("Lyon")), "sealed: {c}");
    assert!(output.iter().any(|i| i["content"][0]["text"] == "Where do I live?"), "the latest turn is kept: {c}");

    send(&mut ws, create(c["output"].clone(), json!({}))).await;
    let next = turn(&mut ws).await;
    let done = terminal(&next);
    assert!(matches!(done["type"].as_str(), Some("response.completed" | "response.incomplete")), "{done}");

    // Without a model it is the endpoint's 400, as an error envelope.
    send(&mut ws, json!({"type": "response.compact", "input": "x"})).await;
    let e = turn(&mut ws).await;
    assert_eq!((e[0]["type"].as_str(), e[0]["status"].as_u64()), (Some("error"), Some(400)), "{}", e[0]);
}

#[tokio::test]
async fn a_message_over_the_size_limit_closes_with_1009_and_frees_nothing_it_never_took() {
    let limits = Limits { max_body_bytes: 16 << 10, ..Limits::default() };
    let s = common::start(vec![], limits).await;
    let mut ws = connect(&s, None).await.expect("connect");
    let big = create(json!("x".repeat(20 << 10)), json!({}));
    send(&mut ws, big).await;
    let close = loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next()).await.expect("the server answers an oversized message");
        match frame {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    let code = close.map(|f| u16::from(f.code));
    assert_eq!(code, Some(1009), "an oversized message closes with 1009 (message too big)");
    assert_eq!(s.state.scheduler.check_kv().unwrap().used, 0);
    // A message just under the limit on a new connection is served.
    let mut ws = connect(&s, None).await.expect("connect");
    send(&mut ws, create(json!("x ".repeat(2 << 10)), json!({"max_output_tokens": 16}))).await;
    let done = terminal(&turn(&mut ws).await).clone();
    assert!(matches!(done["type"].as_str(), Some("response.completed" | "response.incomplete")), "{done}");
}

#[tokio::test]
async fn the_connection_remembers_only_its_last_sixteen_responses() {
    let s = common::start(vec![], Limits::default()).await;
    let mut ws = connect(&s, None).await.expect("connect");
    let mut ids = Vec::new();
    for i in 0..17 {
        send(&mut ws, create(json!(format!("Number {i}.")), json!({"max_output_tokens": 16}))).await;
        let done = terminal(&turn(&mut ws).await).clone();
        ids.push(done["response"]["id"].as_str().expect("id").to_string());
    }
    // The oldest of 17 store:false responses was forgotten; the newest is kept.
    send(&mut ws, create(json!("Go on."), json!({"previous_response_id": ids[0], "max_output_tokens": 16}))).await;
    let forgotten = turn(&mut ws).await;
    assert_eq!(forgotten[0]["error"]["code"], "previous_response_not_found", "{forgotten:?}");
    for id in [&ids[1], &ids[16]] {
        send(&mut ws, create(json!("Go on."), json!({"previous_response_id": id, "max_output_tokens": 16}))).await;
        let kept = turn(&mut ws).await;
        assert_ne!(terminal(&kept)["type"], "error", "{id} must still be remembered: {kept:?}");
    }
}
