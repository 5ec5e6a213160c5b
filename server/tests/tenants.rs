//! Two API keys are two tenants, over a real socket with the real model:
//! whatever one key created (stored responses, background responses, LMSP
//! tasks, compaction items, cached prompt prefixes) is invisible to the
//! other, which gets the same 404 as for an id that never existed.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use spindle_server::app::Limits;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const A: &str = "Bearer key-alice";
const B: &str = "Bearer key-bob";
const MODEL: &str = "smollm2-135m-instruct";

async fn start() -> common::Server {
    common::start(vec!["key-alice".into(), "key-bob".into()], Limits::default()).await
}

async fn call(base: &str, method: Method, path: &str, body: Option<Value>, auth: &str) -> (u16, Value) {
    let mut req = common::http().request(method, format!("{base}{path}")).header("authorization", auth);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn create(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "input": "Say hi.", "max_output_tokens": 16, "temperature": 0});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// Every route that names another tenant's response answers exactly as for
/// an id that does not exist.
#[tokio::test]
async fn another_key_cannot_see_use_or_delete_a_stored_response() {
    let s = start().await;
    let (status, made) = call(&s.base, Method::POST, "/v1/responses", Some(create(json!({"store": true}))), A).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let probes = [
        (Method::GET, format!("/v1/responses/{id}"), None),
        (Method::GET, format!("/v1/responses/{id}?stream=true"), None),
        (Method::GET, format!("/v1/responses/{id}/input_items"), None),
        (Method::POST, format!("/v1/responses/{id}/cancel"), None),
        (Method::DELETE, format!("/v1/responses/{id}"), None),
        (Method::POST, "/v1/responses".to_string(), Some(create(json!({"previous_response_id": id})))),
        (Method::POST, "/v1/responses/compact".to_string(), Some(json!({"model": MODEL, "input": "more", "previous_response_id": id}))),
    ];
    for (method, path, body) in probes {
        let unknown = path.replace(&id, "resp_00000000000000000000000000000000");
        let body_unknown = body.as_ref().map(|b| serde_json::from_str(&b.to_string().replace(&id, "resp_00000000000000000000000000000000")).unwrap());
        let (theirs, their_body) = call(&s.base, method.clone(), &path, body, B).await;
        let (none, none_body) = call(&s.base, method.clone(), &unknown, body_unknown, B).await;
        assert_eq!(theirs, 404, "{method} {path} as the other key: {their_body}");
        assert_eq!(their_body["error"]["code"], none_body["error"]["code"], "{method} {path}: {their_body} vs {none_body}");
        assert_eq!(none, 404, "{method} {unknown}");
    }
    let (status, lmsp) = call(&s.base, Method::GET, &format!("/lmsp/v1/responses/{id}"), None, B).await;
    assert_eq!(status, 404, "LMSP retrieve as the other key: {lmsp}");
    // Nothing the other key did touched it: the owner still reads and continues it.
    let (status, again) = call(&s.base, Method::GET, &format!("/v1/responses/{id}"), None, A).await;
    assert_eq!((status, again["id"].as_str()), (200, Some(id.as_str())), "{again}");
    let (status, next) = call(&s.base, Method::POST, "/v1/responses", Some(create(json!({"previous_response_id": id}))), A).await;
    assert_eq!(status, 200, "the owner continues its own response: {next}");
    let (status, items) = call(&s.base, Method::GET, &format!("/v1/responses/{id}/input_items"), None, A).await;
    assert_eq!((status, items["data"].as_array().map(Vec::len)), (200, Some(1)), "{items}");
}

/// A background response cannot be cancelled or read by another key.
#[tokio::test]
async fn another_key_cannot_cancel_a_background_response() {
    let s = start().await;
    let body = create(json!({"background": true, "store": true, "max_output_tokens": 64}));
    let (status, made) = call(&s.base, Method::POST, "/v1/responses", Some(body), A).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap();
    let (status, refused) = call(&s.base, Method::POST, &format!("/v1/responses/{id}/cancel"), None, B).await;
    assert_eq!(status, 404, "{refused}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, now) = call(&s.base, Method::GET, &format!("/v1/responses/{id}"), None, A).await;
        assert_eq!(status, 200, "{now}");
        let state = now["status"].as_str().unwrap_or_default().to_string();
        assert_ne!(state, "cancelled", "the other key's cancel took effect");
        if !matches!(state.as_str(), "queued" | "in_progress") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the background response never finished");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// LMSP tasks belong to the key that created them.
#[tokio::test]
async fn another_key_cannot_see_follow_or_cancel_a_task() {
    let s = start().await;
    let (status, task) = call(&s.base, Method::POST, "/lmsp/v1/tasks", Some(create(json!({"max_output_tokens": 64}))), A).await;
    assert_eq!(status, 202, "{task}");
    let id = task["id"].as_str().unwrap();
    for (method, path) in [
        (Method::GET, format!("/lmsp/v1/tasks/{id}")),
        (Method::GET, format!("/lmsp/v1/tasks/{id}/events")),
        (Method::POST, format!("/lmsp/v1/tasks/{id}/cancel")),
    ] {
        let (status, body) = call(&s.base, method.clone(), &path, None, B).await;
        assert_eq!(status, 404, "{method} {path} as the other key: {body}");
    }
    let (status, mine) = call(&s.base, Method::GET, &format!("/lmsp/v1/tasks/{id}"), None, A).await;
    assert_eq!(status, 200, "{mine}");
    assert_ne!(mine["status"], "cancelled", "{mine}");
}

/// A compaction item opens only for the key that made it.
#[tokio::test]
async fn a_compaction_item_opens_only_for_its_own_key() {
    let s = start().await;
    let body = json!({"model": MODEL, "input": [
        {"role": "user", "content": "My locker code is 4711."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Thanks."}
    ]});
    let (status, compacted) = call(&s.base, Method::POST, "/v1/responses/compact", Some(body), A).await;
    assert_eq!(status, 200, "{compacted}");
    let input = compacted["output"].clone();
    let (status, theirs) = call(&s.base, Method::POST, "/v1/responses", Some(create(json!({"input": input.clone()}))), B).await;
    assert_eq!(status, 400, "the other key used the sealed summary: {theirs}");
    let (status, mine) = call(&s.base, Method::POST, "/v1/responses", Some(create(json!({"input": input}))), A).await;
    assert_eq!(status, 200, "{mine}");
}

fn cached(r: &Value) -> u64 {
    r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens")
}

/// One key's cached prompt prefix is not a cache hit for another key, so
/// no key can confirm a guess of another's prompt.
#[tokio::test]
async fn a_cache_probe_from_another_key_sees_no_cached_tokens() {
    let s = start().await;
    let memo = "Private memo: the merger with Northwind closes on March 3rd at a price of 41 dollars a share. ".repeat(8);
    let body = create(json!({"input": memo}));
    let (status, first) = call(&s.base, Method::POST, "/v1/responses", Some(body.clone()), A).await;
    assert_eq!(status, 200, "{first}");
    let (status, probe) = call(&s.base, Method::POST, "/v1/responses", Some(body.clone()), B).await;
    assert_eq!(status, 200, "{probe}");
    let (status, again) = call(&s.base, Method::POST, "/v1/responses", Some(body), A).await;
    assert_eq!(status, 200, "{again}");
    assert!(cached(&again) >= 64, "the owner's own prefix is cached: {}", again["usage"]);
    assert_eq!(cached(&probe), 0, "the other key saw the owner's cached prefix: {}", probe["usage"]);
}

/// A WebSocket turn cannot continue another key's stored response.
#[tokio::test]
async fn a_websocket_turn_cannot_continue_another_keys_response() {
    let s = start().await;
    let (status, made) = call(&s.base, Method::POST, "/v1/responses", Some(create(json!({"store": true}))), A).await;
    assert_eq!(status, 200, "{made}");
    let mut request = format!("{}/v1/responses", s.base.replace("http://", "ws://")).into_client_request().unwrap();
    request.headers_mut().insert("authorization", B.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.expect("connect");
    let mut turn = create(json!({"previous_response_id": made["id"]}));
    turn["type"] = json!("response.create");
    ws.send(Message::Text(turn.to_string().into())).await.unwrap();
    let frame = tokio::time::timeout(Duration::from_secs(60), ws.next()).await.expect("a frame in time");
    let Some(Ok(Message::Text(text))) = frame else { panic!("the connection ended instead: {frame:?}") };
    let event: Value = serde_json::from_str(text.as_str()).unwrap();
    assert_eq!(event["type"], "error", "{event}");
    assert_eq!(event["error"]["code"], "previous_response_not_found", "{event}");
}

/// With keys configured, the metrics endpoint (which counts prefix-cache
/// hits) needs a key too.
#[tokio::test]
async fn metrics_need_a_key_when_keys_are_configured() {
    let s = start().await;
    let r = common::http().get(format!("{}/metrics", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let (status, text) = call(&s.base, Method::GET, "/metrics", None, B).await;
    assert_eq!(status, 200, "{text}");
}

/// The daemon's own flags: a keys file naming two keys as one tenant (they
/// share) beside a key of its own (it does not), and `--metrics-addr`
/// serving the scraper without a key while the main port wants one.
#[tokio::test]
async fn a_keys_file_groups_keys_into_tenants_and_metrics_get_their_own_address() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, "# two keys of one team\nacme k-acme-1\nacme k-acme-2\nk-solo\n").unwrap();
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let args = ["--api-key-file", keys.to_str().unwrap(), "--metrics-addr", metrics_addr.as_str()];
    let daemon = common::daemon::start_daemon(&spindle_testenv::smollm2_gguf(), dir.path(), &args);
    let base = daemon.base();
    let mut body = create(json!({"store": true}));
    body.as_object_mut().unwrap().remove("model"); // the daemon serves the file's own name
    let (status, made) = call(&base, Method::POST, "/v1/responses", Some(body), "Bearer k-acme-1").await;
    assert_eq!(status, 200, "{made}");
    let path = format!("/v1/responses/{}", made["id"].as_str().unwrap());
    let (status, _) = call(&base, Method::GET, &path, None, "Bearer k-acme-2").await;
    assert_eq!(status, 200, "a key of the same tenant reads it");
    let (status, _) = call(&base, Method::GET, &path, None, "Bearer k-solo").await;
    assert_eq!(status, 404, "a key of another tenant does not");
    let (status, metrics) = common::daemon::http_get(metrics_port, "/metrics").expect("the metrics address answers");
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("spindle_"), "{metrics}");
    let (status, _) = common::daemon::http_get(daemon.port, "/metrics").expect("the main address answers");
    assert_eq!(status, 401, "/metrics on the main address without a key");
    assert!(daemon.log_text().contains("2 tenants"), "{}", daemon.log_text());
}

/// One tenant at its cap of concurrent generations gets a 429 with
/// `Retry-After`; another tenant is not held back by it.
#[tokio::test]
async fn a_tenant_at_its_stream_cap_gets_a_429_and_others_still_run() {
    let limits = Limits { max_streams_per_tenant: 1, ..Limits::default() };
    let s = common::start(vec!["key-alice".into(), "key-bob".into()], limits).await;
    let long = create(json!({"background": true, "store": true, "max_output_tokens": 4000, "ignore_eos": true}));
    let (status, running) = call(&s.base, Method::POST, "/v1/responses", Some(long), A).await;
    assert_eq!(status, 200, "{running}");
    let r = common::http().post(format!("{}/v1/responses", s.base)).header("authorization", A).json(&create(json!({}))).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let (status, theirs) = call(&s.base, Method::POST, "/v1/responses", Some(create(json!({}))), B).await;
    assert_eq!(status, 200, "the other tenant is held back: {theirs}");
    let id = running["id"].as_str().unwrap();
    let (status, _) = call(&s.base, Method::POST, &format!("/v1/responses/{id}/cancel"), None, A).await;
    assert_eq!(status, 200);
    let (status, mine) = call(&s.base, Method::POST, "/v1/responses", Some(create(json!({}))), A).await;
    assert_eq!(status, 200, "the slot came back after the cancel: {mine}");
}
