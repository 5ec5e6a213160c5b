//! LMSP tasks with the real model: a reader that drops its connection at 20
//! random event ids and reconnects (with `Last-Event-ID`, `?after=N`, or
//! both, where `after` wins) receives every event exactly once; the history
//! expires into `410 event_history_expired` while the task itself stays
//! readable; cancel ends the stream with `response.cancelled` and frees the
//! KV blocks; Idempotency-Key makes one task.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use serde_json::{json, Value};
use spindle_server::app::Limits;
use std::time::{Duration, Instant};

/// One SSE event as received.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    id: u64,
    name: String,
    data: Value,
}

fn task_body(text: &str, max_tokens: u32) -> Value {
    json!({"model": "smollm2-135m-instruct", "max_output_tokens": max_tokens, "temperature": 0.7,
           "input": text, "extensions": {"ignore_eos": true}})
}

async fn create_task(s: &common::Server, body: &Value) -> Value {
    let r = common::http().post(format!("{}/lmsp/v1/tasks", s.base)).json(body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let task: Value = r.json().await.unwrap();
    assert_eq!((task["object"].as_str(), task["status"].as_str()), (Some("task"), Some("in_progress")), "{task}");
    task
}

async fn get_task(s: &common::Server, id: &str) -> Value {
    common::http().get(format!("{}/lmsp/v1/tasks/{id}", s.base)).send().await.unwrap().json().await.unwrap()
}

/// Parses the complete frames at the front of `buf` (comments skipped).
fn take_frames(buf: &mut String) -> Vec<Event> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let frame: String = buf.drain(..end + 2).collect();
        let field = |name: &str| frame.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).map(str::to_string);
        let (Some(id), Some(name), Some(data)) = (field("id:"), field("event:"), field("data:")) else { continue };
        out.push(Event { id: id.parse().expect("integer id"), name, data: serde_json::from_str(&data).expect("JSON data") });
    }
    out
}

fn is_terminal(e: &Event) -> bool {
    ["response.completed", "response.incomplete", "response.failed", "response.cancelled"].contains(&e.name.as_str())
}

/// How a reconnect names its position.
#[derive(Clone, Copy)]
enum Resume {
    Header,
    Query,
    /// `?after=` right, `Last-Event-ID` deliberately wrong: `after` must win.
    Both,
}

/// Reads events after `after` until `stop_at` (then drops the connection) or
/// the terminal event; the end of the stream before either fails the test.
async fn read(s: &common::Server, task: &str, after: u64, how: Resume, stop_at: Option<u64>) -> Vec<Event> {
    let (got, ended) = read_stream(s, task, after, how, stop_at).await;
    assert!(!ended, "the event stream after {after} ended before {stop_at:?} or a terminal event; got {} events", got.len());
    got
}

/// Reads after the task's last event: the server ends the stream with nothing in it.
async fn read_past_the_end(s: &common::Server, task: &str, last: u64, how: Resume) {
    let (got, ended) = read_stream(s, task, last, how, None).await;
    assert!(ended && got.is_empty(), "nothing after the last event, and the stream ends: {got:?}");
}

/// Events after `after` until `stop_at`, a terminal event, or the end of
/// the stream (then `true`); the client's request deadline bounds the read.
async fn read_stream(s: &common::Server, task: &str, after: u64, how: Resume, stop_at: Option<u64>) -> (Vec<Event>, bool) {
    let mut req = common::http().get(format!("{}/lmsp/v1/tasks/{task}/events", s.base));
    req = match how {
        Resume::Header => req.header("Last-Event-ID", after.to_string()),
        Resume::Query => req.query(&[("after", after)]),
        Resume::Both => req.query(&[("after", after)]).header("Last-Event-ID", (after + 7).to_string()),
    };
    let mut r = req.send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "resume after {after}");
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let (mut buf, mut got) = (String::new(), Vec::new());
    while let Some(chunk) = r.chunk().await.unwrap() {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        for e in take_frames(&mut buf) {
            let stop = stop_at == Some(e.id) || is_terminal(&e);
            got.push(e);
            if stop {
                return (got, false); // dropping `r` closes the connection mid-stream
            }
        }
    }
    (got, true)
}

/// A small deterministic generator for the drop points.
fn drop_points(seed: u64, count: usize, below: u64) -> Vec<u64> {
    let mut x = seed;
    let mut points = std::collections::BTreeSet::new();
    while points.len() < count {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        points.insert(1 + (x >> 33) % below);
    }
    points.into_iter().collect()
}

#[tokio::test]
async fn twenty_random_drops_and_reconnects_get_every_event_exactly_once() {
    let s = common::start(vec![], Limits::default()).await;
    let task = create_task(&s, &task_body("Tell me a long story about a lighthouse keeper.", 160)).await;
    let id = task["id"].as_str().unwrap().to_string();
    let mut seen: Vec<Event> = Vec::new();
    let ways = [Resume::Header, Resume::Query, Resume::Both];
    for (n, stop) in drop_points(7, 20, 150).into_iter().enumerate() {
        let after = seen.last().map_or(0, |e| e.id);
        if stop <= after {
            continue;
        }
        seen.extend(read(&s, &id, after, ways[n % 3], Some(stop)).await);
        assert_eq!(seen.last().unwrap().id, stop, "reconnect {n} did not reach its drop point");
    }
    let after = seen.last().map_or(0, |e| e.id);
    seen.extend(read(&s, &id, after, Resume::Header, None).await);

    let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "gaps or duplicates");
    assert!(ids.len() > 150, "only {} events: the drops must fall inside the stream", ids.len());
    assert_eq!(seen[0].name, "response.created");
    let last = seen.last().unwrap();
    assert_eq!((last.name.as_str(), last.data["status"].as_str()), ("response.incomplete", Some("incomplete")));

    // The same sequence from a full replay out of the store, and the final task.
    let replay = read(&s, &id, 0, Resume::Query, None).await;
    assert_eq!(replay, seen, "a full replay differs from the reconnected reads");
    let done = get_task(&s, &id).await;
    assert_eq!((done["status"].as_str(), done["last_event_id"].as_u64()), (Some("incomplete"), Some(last.id)), "{done}");
    let text: String = seen.iter().filter(|e| e.name == "response.output_text.delta").map(|e| e.data["delta"].as_str().unwrap()).collect();
    assert_eq!(done["response"]["output"][0]["content"][0]["text"].as_str(), Some(text.as_str()));
    read_past_the_end(&s, &id, last.id, Resume::Query).await;
}

#[tokio::test]
async fn expired_history_is_410_and_the_task_stays_readable() {
    let limits = Limits { task_event_retention: Duration::from_secs(1), ..Limits::default() };
    let s = common::start(vec![], limits).await;
    let task = create_task(&s, &task_body("Say hi.", 16)).await;
    let id = task["id"].as_str().unwrap().to_string();
    let events = read(&s, &id, 0, Resume::Query, None).await;
    let last = events.last().unwrap().id;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = common::http().get(format!("{}/lmsp/v1/tasks/{id}/events?after=2", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 410);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!((p["status"].as_u64(), p["code"].as_str()), (Some(410), Some("event_history_expired")), "{p}");
    let done = get_task(&s, &id).await;
    assert_eq!((done["status"].as_str(), done["last_event_id"].as_u64()), (Some("incomplete"), Some(last)), "{done}");
    read_past_the_end(&s, &id, last, Resume::Header).await; // nothing was missed: not 410

    let missing = common::http().get(format!("{}/lmsp/v1/tasks/task_nope/events", s.base)).send().await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    let bad = common::http().get(format!("{}/lmsp/v1/tasks/{id}/events", s.base)).header("Last-Event-ID", "x").send().await.unwrap();
    assert_eq!(bad.status().as_u16(), 400);
}

#[tokio::test]
async fn cancel_ends_the_stream_with_cancelled_and_frees_the_blocks() {
    let s = common::start(vec![], Limits::default()).await;
    let task = create_task(&s, &task_body("Count to a thousand.", 4000)).await;
    let id = task["id"].as_str().unwrap().to_string();
    let first = read(&s, &id, 0, Resume::Query, Some(5)).await;
    assert_eq!(first.len(), 5);
    let r = common::http().post(format!("{}/lmsp/v1/tasks/{id}/cancel", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let cancelled: Value = r.json().await.unwrap();
    assert_eq!((cancelled["status"].as_str(), cancelled["response"]["status"].as_str()), (Some("cancelled"), Some("cancelled")), "{cancelled}");
    let rest = read(&s, &id, 5, Resume::Header, None).await;
    let last = rest.last().unwrap();
    assert_eq!((last.name.as_str(), last.data["status"].as_str()), ("response.cancelled", Some("cancelled")));
    assert!(rest.len() < 3000, "cancel did not stop the generation");
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.state.scheduler.check_kv().unwrap().used > 0 {
        assert!(Instant::now() < deadline, "blocks still held after cancel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(s.state.tasks.is_empty());
    let again = common::http().post(format!("{}/lmsp/v1/tasks/{id}/cancel", s.base)).send().await.unwrap();
    assert_eq!(again.json::<Value>().await.unwrap()["status"], "cancelled", "cancelling a finished task changes nothing");
}

#[tokio::test]
async fn one_idempotency_key_makes_one_task() {
    let s = common::start(vec![], Limits::default()).await;
    let body = task_body("Say hi.", 16);
    let post = |key: &'static str, body: Value| {
        let url = format!("{}/lmsp/v1/tasks", s.base);
        async move { common::http().post(url).header("Idempotency-Key", key).json(&body).send().await.unwrap() }
    };
    let (a, b) = tokio::join!(post("k1", body.clone()), post("k1", body.clone()));
    let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
    assert_eq!(a["id"], b["id"], "two tasks for one key");
    let other = post("k1", task_body("Something else.", 16)).await;
    assert_eq!(other.status().as_u16(), 422);
    let events = read(&s, a["id"].as_str().unwrap(), 0, Resume::Query, None).await;
    assert!(is_terminal(events.last().unwrap()));
}

/// After a crash, a reader resuming from an id it saw live (past what was
/// stored before the crash) still reaches the final event: the restart's
/// `response.failed`, not a 410.
#[tokio::test]
async fn a_reader_resuming_after_a_crash_reaches_the_final_event() {
    use spindle_server::protocol::lmsp::{LmspDelta, LmspEvent};
    use spindle_server::store::{TaskEvent, TaskRecord};
    let s = common::start(vec![], Limits::default()).await;
    let task = TaskRecord {
        id: "task_crashed".into(),
        response_id: "resp_crashed".into(),
        created_at: 1,
        status: "in_progress".into(),
        finished_at: None,
        last_event_id: 5,
        response: None,
        tenant: String::new(),
    };
    s.state.store.put_task(&task).unwrap();
    let delta = |id| LmspEvent::OutputTextDelta(LmspDelta { response_id: "resp_crashed".into(), item_id: "msg_1".into(), delta: format!("x{id}") });
    let stored: Vec<TaskEvent> = (1..=5).map(|id| TaskEvent { id, event: delta(id) }).collect();
    s.state.store.append_task_events("task_crashed", &stored).unwrap();
    // What the next start does for a task the previous process left running.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert_eq!(s.state.store.fail_unfinished_tasks(now).unwrap(), 1);
    for after in [3, 12] {
        // 12: an event the reader saw live that never reached the store.
        let events = read(&s, "task_crashed", after, Resume::Query, None).await;
        let last = events.last().expect("events");
        assert_eq!(last.name, "response.failed", "after {after}: {events:?}");
        assert!(events.iter().all(|e| e.id > after), "after {after}: {events:?}");
    }
}
