//! Every way a response can end leaves it stored in the state that says what
//! happened, over a real socket with the real model: a background response
//! reads `in_progress` while it generates, `/cancel` stores it `cancelled`,
//! DELETE of a running one keeps it deleted, a streamed stored response whose
//! client leaves is stored `cancelled` with what it produced, and a client
//! that stops reading its stream loses it (and its KV blocks) after the stall
//! timeout.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use futures_util::StreamExt;
use serde_json::{json, Value};
use spindle_server::app::access::auth::Tenant;
use spindle_server::app::runtime::drive::{drive, Sink};
use spindle_server::app::runtime::start::start_turn;
use spindle_server::app::Limits;
use std::time::Duration;
use tokio::time::Instant;

const MODEL: &str = "smollm2-135m-instruct";

fn long(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "input": "Write a very long story about a lighthouse.", "max_output_tokens": 4000,
        "ignore_eos": true, "temperature": 0, "store": true});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

async fn post(s: &common::Server, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = common::http().post(format!("{}{path}", s.base));
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn get(s: &common::Server, id: &str) -> (u16, Value) {
    let r = common::http().get(format!("{}/v1/responses/{id}", s.base)).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Polls the stored response until `done` holds for it; fails after `secs`.
async fn wait_for(s: &common::Server, id: &str, secs: u64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (status, r) = get(s, id).await;
        if status == 200 && done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: last seen {status} {}", r["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn output_text(r: &Value) -> String {
    r["output"][0]["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_cancelled_background_response_reads_in_progress_then_stays_cancelled() {
    let s = common::start(vec![], Limits::default()).await;
    let (status, made) = post(&s, "/v1/responses", Some(long(json!({"background": true})))).await;
    assert_eq!((status, made["status"].as_str()), (200, Some("queued")), "{made}");
    let id = made["id"].as_str().unwrap();
    wait_for(&s, id, 60, "in_progress while generating", |r| {
        assert!(matches!(r["status"].as_str(), Some("queued" | "in_progress")), "ended before the cancel: {}", r["status"]);
        r["status"] == "in_progress"
    })
    .await;
    // Some text first (the first token can take a while on 2 busy cores).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, cancelled) = post(&s, &format!("/v1/responses/{id}/cancel"), None).await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")), "{cancelled}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, stored) = get(&s, id).await;
    assert_eq!(stored["status"], "cancelled", "{stored}");
    assert!(!output_text(&stored).is_empty(), "what it produced is kept: {stored}");
    common::assert_blocks_freed(&s, 5, "after the cancel").await;
}

#[tokio::test]
async fn deleting_a_running_background_response_keeps_it_deleted() {
    let s = common::start(vec![], Limits::default()).await;
    let (status, made) = post(&s, "/v1/responses", Some(long(json!({"background": true})))).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap();
    wait_for(&s, id, 60, "in_progress while generating", |r| r["status"] == "in_progress").await;
    let r = common::http().delete(format!("{}/v1/responses/{id}", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    common::assert_blocks_freed(&s, 5, "after the delete").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, after) = get(&s, id).await;
    assert_eq!(status, 404, "the deleted response came back: {after}");
}

#[tokio::test]
async fn a_stored_stream_whose_client_leaves_is_stored_cancelled_with_its_text() {
    let s = common::start(vec![], Limits::default()).await;
    let r = common::http().post(format!("{}/v1/responses", s.base)).json(&long(json!({"stream": true}))).send().await.unwrap();
    let mut body = r.bytes_stream();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut id = None;
    while seen.matches("response.output_text.delta").count() < 20 {
        let chunk = tokio::time::timeout_at(deadline, body.next()).await.expect("events in time").expect("the stream ended early").unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
        if id.is_none() {
            id = seen.split("\"id\":\"").nth(1).and_then(|rest| rest.split('"').next()).map(str::to_string);
        }
    }
    drop(body);
    let id = id.expect("the response id in the first event");
    let stored = wait_for(&s, &id, 30, "stored after the client left", |r| r["status"] != "in_progress").await;
    assert_eq!(stored["status"], "cancelled", "{stored}");
    assert!(output_text(&stored).len() > 10, "{stored}");
    assert_eq!(stored["output"][0]["status"], "incomplete", "{stored}");
}

#[tokio::test]
async fn a_client_that_stops_reading_loses_its_stream_after_the_stall_timeout() {
    let limits = Limits { stream_stall_timeout: Duration::from_secs(1), ..Limits::default() };
    let s = common::start(vec![], limits).await;
    let body = long(json!({"stream": true, "store": false}));
    let turn = start_turn(&s.state, body, None, &Tenant::anonymous()).await.expect("started");
    // The client's buffer: it is never read.
    let (tx, _unread) = tokio::sync::mpsc::channel(64);
    let started = std::time::Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(60), drive(s.state.clone(), turn.stream, turn.mapper, Some(Sink::new(tx)), turn.persist))
        .await
        .expect("the generation ended on its own instead of at the stall timeout");
    let took = started.elapsed();
    assert_eq!(response.status, spindle_server::protocol::ResponseStatus::Cancelled, "{response:?}");
    let produced = response.usage.is_none_or(|u| u.output_tokens < 4000);
    assert!(produced, "{response:?}");
    assert!(took < Duration::from_secs(20), "took {took:?} for 4000 tokens nobody read");
    common::assert_blocks_freed(&s, 5, "after the stall").await;
}

#[tokio::test]
async fn a_socket_that_is_never_read_loses_its_stream_after_the_stall_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limits = Limits { stream_stall_timeout: Duration::from_secs(1), ..Limits::default() };
    // Small socket buffers at both ends: the server's writes block after a
    // few kB (loopback buffers would otherwise absorb the whole stream).
    let s = common::start_with_send_buffer(limits, 4096).await;
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().expect("the server's address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut conn = socket.connect(addr).await.expect("connect");
    let body = serde_json::to_vec(&long(json!({"stream": true}))).expect("json");
    let head = format!("POST /v1/responses HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    conn.write_all(head.as_bytes()).await.expect("write head");
    conn.write_all(&body).await.expect("write body");
    // Read until the response id has arrived, then never again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    let id = loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if let Some(id) = text.split("\"id\":\"resp_").nth(1).and_then(|rest| rest.split('"').next()) {
            break format!("resp_{id}");
        }
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout_at(deadline, conn.read(&mut buf)).await.expect("the first event in time").expect("read");
        assert!(n > 0, "the server closed the stream before its first event: {text}");
        seen.extend_from_slice(&buf[..n]);
    };
    let started = std::time::Instant::now();
    let stored = wait_for(&s, &id, 60, "ended while its client does not read", |r| r["status"] != "in_progress").await;
    let took = started.elapsed();
    assert_eq!(stored["status"], "cancelled", "{stored}");
    let produced = stored["usage"]["output_tokens"].as_u64().unwrap_or(0);
    assert!(produced < 4000, "the generation ran to its end ({produced} tokens) although nobody read it");
    assert!(took < Duration::from_secs(30), "took {took:?} to give up on a client that does not read");
    // The connection is still open, and the KV blocks are free.
    common::assert_blocks_freed(&s, 5, "with the unread socket still open").await;
    drop(conn);
}
