//! Conformance tests shared by every `ResponseStore` backend. A backend's test file does
//! `#[macro_use] mod store_common;` and `store_conformance!(make)` where `make(StoreConfig)`
//! returns a [`Fixture`].
#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::time::Duration;

use serde_json::json;
use spindle_server::protocol::request::{validate, RequestLimits};
use spindle_server::protocol::events::OutputTextDeltaEvent;
use spindle_server::protocol::{InputItem, ResponseObject, ResponseStatus, StreamEvent};
use spindle_server::store::{
    Order, ResponseStore, StoreConfig, StoreError, StoredResponse, MAX_CHAIN_DEPTH,
};

/// A store plus whatever must outlive it (a temporary directory for SQLite).
pub struct Fixture {
    pub store: Box<dyn ResponseStore>,
    pub _dir: Option<tempfile::TempDir>,
}

pub fn cfg(ttl_secs: u64, max_responses: usize, max_bytes: u64) -> StoreConfig {
    StoreConfig {
        ttl: Duration::from_secs(ttl_secs),
        max_responses,
        max_bytes,
    }
}

pub fn big() -> StoreConfig {
    cfg(3600, 1000, 1 << 30)
}

/// A response object in the digest's §3 shape with one assistant message.
/// An unknown `status` (some tests use "x") reads as `in_progress`.
pub fn response(id: &str, created_at: i64, status: &str, prev: Option<&str>) -> ResponseObject {
    let body = json!({"model": "m", "input": "hello", "store": true, "previous_response_id": prev});
    let req = validate(body, &RequestLimits::default()).unwrap();
    let mut r = ResponseObject::new(id.to_owned(), created_at, &req);
    r.status = serde_json::from_value(json!(status)).unwrap_or(ResponseStatus::InProgress);
    r.output = vec![serde_json::from_value(json!({
        "type": "message", "id": format!("msg_{id}"), "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": format!("answer {id}"), "annotations": []}]}))
    .unwrap()];
    r
}

/// A record of [`response`] with one input item.
pub fn rec(id: &str, created_at: i64, status: &str, prev: Option<&str>) -> StoredResponse {
    StoredResponse {
        id: id.to_owned(),
        created_at,
        status: status.to_owned(),
        previous_response_id: prev.map(str::to_owned),
        background: false,
        tenant: String::new(),
        response: response(id, created_at, status, prev),
        input_items: vec![user_item(&format!("{id}_in0"), "hello")],
    }
}

pub fn user_item(id: &str, text: &str) -> InputItem {
    serde_json::from_value(json!({"type": "message", "id": id, "role": "user", "status": "completed",
           "content": [{"type": "input_text", "text": text}]}))
    .unwrap()
}

/// A stream event at `seq` whose text is `text` (what the store keeps is
/// typed; its kind does not matter to it).
pub fn event(seq: u64, text: &str) -> StreamEvent {
    StreamEvent::OutputTextDelta(OutputTextDeltaEvent {
        sequence_number: seq,
        item_id: "msg_1".into(),
        output_index: 0,
        content_index: 0,
        delta: text.into(),
        logprobs: Vec::new(),
    })
}

fn ids(items: &[InputItem]) -> Vec<String> {
    items
        .iter()
        .map(|i| i.item_id().unwrap().to_owned())
        .collect()
}

fn seqs(events: &[StreamEvent]) -> Vec<u64> {
    events
        .iter()
        .map(StreamEvent::sequence_number)
        .collect()
}

pub fn round_trip(s: &dyn ResponseStore) {
    assert!(s.is_empty().unwrap());
    let mut r = rec("resp_a", 100, "in_progress", None);
    r.background = true;
    s.put(&r).unwrap();
    assert_eq!(s.get("resp_a").unwrap(), Some(r.clone()));
    assert_eq!(s.len().unwrap(), 1);
    // replace on completion keeps the key, replaces the fields
    r.status = "completed".into();
    r.response.status = ResponseStatus::Completed;
    r.input_items.push(user_item("resp_a_in1", "more"));
    s.put(&r).unwrap();
    assert_eq!(s.get("resp_a").unwrap(), Some(r));
    assert_eq!(s.len().unwrap(), 1);
    assert_eq!(s.get("resp_missing").unwrap(), None);
    assert!(s.delete("resp_a").unwrap());
    assert!(!s.delete("resp_a").unwrap());
    assert_eq!(s.get("resp_a").unwrap(), None);
    assert_eq!(s.input_items("resp_a", None, 10, Order::Asc).unwrap(), None);
    assert_eq!(s.events("resp_a", None).unwrap(), None);
    assert!(s.is_empty().unwrap());
}

pub fn input_items_pagination(s: &dyn ResponseStore) {
    let mut r = rec("resp_p", 1, "completed", None);
    r.input_items = (0..5).map(|i| user_item(&format!("it{i}"), "x")).collect();
    // Every kind of item pages by its id, tool results and compactions too.
    r.input_items[2] = serde_json::from_value(json!({"type": "function_call_output", "id": "it2", "call_id": "c", "output": "ok"})).unwrap();
    r.input_items[3] = serde_json::from_value(json!({"type": "compaction", "id": "it3", "encrypted_content": "e"})).unwrap();
    s.put(&r).unwrap();
    let page = |after, limit, order| {
        ids(&s
            .input_items("resp_p", after, limit, order)
            .unwrap()
            .unwrap())
    };
    assert_eq!(
        page(None, 100, Order::Asc),
        ["it0", "it1", "it2", "it3", "it4"]
    );
    assert_eq!(
        page(None, 100, Order::Desc),
        ["it4", "it3", "it2", "it1", "it0"]
    );
    assert_eq!(page(None, 2, Order::Asc), ["it0", "it1"]);
    assert_eq!(page(Some("it1"), 2, Order::Asc), ["it2", "it3"]);
    assert_eq!(page(Some("it3"), 2, Order::Asc), ["it4"]);
    assert_eq!(page(Some("it4"), 2, Order::Asc), Vec::<String>::new());
    assert_eq!(page(None, 2, Order::Desc), ["it4", "it3"]);
    assert_eq!(page(Some("it3"), 2, Order::Desc), ["it2", "it1"]);
    assert_eq!(page(Some("it1"), 2, Order::Desc), ["it0"]);
    assert_eq!(page(Some("it0"), 2, Order::Desc), Vec::<String>::new());
    assert_eq!(page(Some("nope"), 2, Order::Asc), Vec::<String>::new());
    assert_eq!(page(None, 0, Order::Asc), Vec::<String>::new());
    // items come back exactly as stored
    let all = s
        .input_items("resp_p", None, 100, Order::Asc)
        .unwrap()
        .unwrap();
    assert_eq!(all, r.input_items);
    assert_eq!("asc".parse::<Order>().unwrap(), Order::Asc);
    assert_eq!("desc".parse::<Order>().unwrap(), Order::Desc);
    assert!(matches!("up".parse::<Order>(), Err(StoreError::Invalid(_))));
    assert_eq!(Order::default(), Order::Desc);
}

pub fn events_replay(s: &dyn ResponseStore) {
    s.put(&rec("resp_e", 1, "in_progress", None)).unwrap();
    assert_eq!(s.events("resp_e", None).unwrap(), Some(vec![]));
    s.append_events(
        "resp_e",
        &[
            event(0, "response.created"),
            event(1, "response.in_progress"),
        ],
    )
    .unwrap();
    s.append_events("resp_e", &[event(2, "response.output_text.delta")])
        .unwrap();
    s.append_events("resp_e", &[event(3, "response.output_text.delta")])
        .unwrap();
    let all = s.events("resp_e", None).unwrap().unwrap();
    assert_eq!(all.len(), 4);
    assert_eq!(seqs(&all), [0, 1, 2, 3]);
    assert_eq!(all[3], event(3, "response.output_text.delta"));
    let tail = s.events("resp_e", Some(1)).unwrap().unwrap();
    assert_eq!(tail.len(), 2);
    assert_eq!(tail[0], event(2, "response.output_text.delta"));
    assert_eq!(s.events("resp_e", Some(3)).unwrap(), Some(vec![]));
    assert_eq!(s.events("resp_e", Some(u64::MAX)).unwrap(), Some(vec![]));
    // completion put keeps the events
    s.put(&rec("resp_e", 1, "completed", None)).unwrap();
    s.append_events("resp_e", &[event(4, "response.completed")])
        .unwrap();
    assert_eq!(
        s.events("resp_e", Some(3)).unwrap().unwrap(),
        [event(4, "response.completed")]
    );
    // a repeated sequence number replaces
    s.append_events("resp_e", &[event(4, "response.completed")])
        .unwrap();
    assert_eq!(s.events("resp_e", None).unwrap().unwrap().len(), 5);
    assert_eq!(
        s.append_events("resp_nope", &[event(0, "x")]),
        Err(StoreError::NotFound("resp_nope".into()))
    );
    assert!(s.delete("resp_e").unwrap());
    s.put(&rec("resp_e", 1, "completed", None)).unwrap();
    assert_eq!(
        s.events("resp_e", None).unwrap(),
        Some(vec![]),
        "delete drops events"
    );
}

pub fn chain_three_hops(s: &dyn ResponseStore) {
    s.put(&rec("resp_1", 10, "completed", None)).unwrap();
    s.put(&rec("resp_2", 11, "completed", Some("resp_1")))
        .unwrap();
    s.put(&rec("resp_3", 12, "completed", Some("resp_2")))
        .unwrap();
    s.put(&rec("resp_4", 13, "completed", Some("resp_3")))
        .unwrap();
    let chain = s.chain("resp_4").unwrap().unwrap();
    let got: Vec<&str> = chain.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(got, ["resp_1", "resp_2", "resp_3", "resp_4"]);
    assert_eq!(chain[1], rec("resp_2", 11, "completed", Some("resp_1")));
    let root = s.chain("resp_1").unwrap().unwrap();
    assert_eq!(root.len(), 1);
}

pub fn chain_missing_link(s: &dyn ResponseStore) {
    assert_eq!(s.chain("resp_nope").unwrap(), None);
    s.put(&rec("resp_1", 10, "completed", None)).unwrap();
    s.put(&rec("resp_2", 11, "completed", Some("resp_1")))
        .unwrap();
    s.put(&rec("resp_3", 12, "completed", Some("resp_2")))
        .unwrap();
    assert!(s.delete("resp_2").unwrap());
    assert_eq!(s.chain("resp_3").unwrap(), None);
    s.put(&rec("resp_5", 12, "completed", Some("resp_gone")))
        .unwrap();
    assert_eq!(s.chain("resp_5").unwrap(), None);
}

pub fn chain_cycle_and_depth(s: &dyn ResponseStore) {
    s.put(&rec("resp_x", 1, "completed", Some("resp_y")))
        .unwrap();
    s.put(&rec("resp_y", 2, "completed", Some("resp_x")))
        .unwrap();
    assert!(matches!(s.chain("resp_x"), Err(StoreError::Chain(_))));
    s.put(&rec("resp_self", 1, "completed", Some("resp_self")))
        .unwrap();
    assert!(matches!(s.chain("resp_self"), Err(StoreError::Chain(_))));
    // exactly MAX_CHAIN_DEPTH is fine, one more is an error
    let mut prev: Option<String> = None;
    for i in 0..=MAX_CHAIN_DEPTH {
        let id = format!("resp_d{i}");
        s.put(&rec(&id, 100, "completed", prev.as_deref())).unwrap();
        prev = Some(id);
    }
    let last_ok = format!("resp_d{}", MAX_CHAIN_DEPTH - 1);
    assert_eq!(s.chain(&last_ok).unwrap().unwrap().len(), MAX_CHAIN_DEPTH);
    let too_deep = format!("resp_d{MAX_CHAIN_DEPTH}");
    assert!(matches!(s.chain(&too_deep), Err(StoreError::Chain(_))));
}

pub fn ttl_expiry(s: &dyn ResponseStore) {
    // ttl is 100 s
    s.put(&rec("resp_old", 1000, "completed", None)).unwrap();
    s.put(&rec("resp_mid", 1050, "failed", None)).unwrap();
    s.put(&rec("resp_new", 1100, "completed", None)).unwrap();
    s.put(&rec("resp_run", 900, "in_progress", None)).unwrap();
    s.append_events("resp_old", &[event(0, "response.created")])
        .unwrap();
    assert_eq!(
        s.expire(1099).unwrap(),
        0,
        "created_at + ttl == 1100 > 1099"
    );
    assert_eq!(s.expire(1100).unwrap(), 1);
    assert_eq!(s.get("resp_old").unwrap(), None);
    assert_eq!(s.events("resp_old", None).unwrap(), None);
    assert!(s.get("resp_mid").unwrap().is_some());
    assert_eq!(s.expire(1150).unwrap(), 1);
    assert_eq!(s.get("resp_mid").unwrap(), None);
    assert!(s.get("resp_new").unwrap().is_some());
    assert_eq!(s.expire(1150).unwrap(), 0);
    assert_eq!(s.expire(i64::MAX).unwrap(), 1);
    assert_eq!(
        s.get("resp_run").unwrap().unwrap().status,
        "in_progress",
        "never expire unfinished"
    );
    assert_eq!(s.len().unwrap(), 1);
}

pub fn size_cap_rows(s: &dyn ResponseStore) {
    // max_responses is 3
    s.put(&rec("resp_q", 1, "queued", None)).unwrap();
    s.put(&rec("resp_a", 2, "completed", None)).unwrap();
    s.put(&rec("resp_b", 3, "incomplete", None)).unwrap();
    s.put(&rec("resp_c", 4, "completed", None)).unwrap();
    assert_eq!(s.len().unwrap(), 3);
    assert!(
        s.get("resp_q").unwrap().is_some(),
        "queued is never evicted"
    );
    assert_eq!(s.get("resp_a").unwrap(), None, "oldest finished goes first");
    s.put(&rec("resp_i", 5, "in_progress", None)).unwrap();
    assert_eq!(s.get("resp_b").unwrap(), None);
    s.put(&rec("resp_j", 6, "in_progress", None)).unwrap();
    assert_eq!(s.get("resp_c").unwrap(), None);
    // only unfinished left: the cap is exceeded rather than evicting one of them
    s.put(&rec("resp_k", 7, "in_progress", None)).unwrap();
    assert_eq!(s.len().unwrap(), 4);
    for id in ["resp_q", "resp_i", "resp_j", "resp_k"] {
        assert!(s.get(id).unwrap().is_some(), "{id} kept");
    }
    // completing one makes it evictable, but never by its own put
    s.put(&rec("resp_i", 5, "completed", None)).unwrap();
    assert!(s.get("resp_i").unwrap().is_some());
    s.put(&rec("resp_l", 8, "completed", None)).unwrap();
    assert_eq!(s.get("resp_i").unwrap(), None);
    assert_eq!(s.len().unwrap(), 4);
}

/// A ~1.4 kB record (a 1000-character input item).
pub fn fat(id: &str, t: i64, status: &str) -> StoredResponse {
    let mut r = rec(id, t, status, None);
    r.input_items = vec![user_item(&format!("{id}_in"), &"z".repeat(1000))];
    r
}

/// Serialized bytes of a record as the stores count them (response + input items).
pub fn rec_bytes(r: &StoredResponse) -> u64 {
    json_len(&r.response) + r.input_items.iter().map(json_len).sum::<u64>()
}

fn json_len<T: serde::Serialize>(v: &T) -> u64 {
    serde_json::to_string(v).unwrap().len() as u64
}

/// The byte cap [`size_cap_bytes`] runs under: three fat records and a little slack.
pub fn bytes_cap() -> u64 {
    3 * rec_bytes(&fat("resp_run", 0, "in_progress")) + 100
}

pub fn size_cap_bytes(s: &dyn ResponseStore) {
    s.put(&fat("resp_run", 0, "in_progress")).unwrap();
    s.put(&fat("resp_1", 1, "completed")).unwrap();
    s.put(&fat("resp_2", 2, "completed")).unwrap();
    assert_eq!(s.len().unwrap(), 3);
    s.put(&fat("resp_3", 3, "completed")).unwrap();
    assert_eq!(s.len().unwrap(), 3);
    assert!(
        s.get("resp_run").unwrap().is_some(),
        "unfinished is never evicted"
    );
    assert_eq!(s.get("resp_1").unwrap(), None, "oldest finished goes first");
    // re-putting an existing record at the same size evicts nothing
    s.put(&fat("resp_2", 2, "completed")).unwrap();
    assert_eq!(s.len().unwrap(), 3);
    // events count too: with them the same re-put is over the cap
    let pad = event(0, &"y".repeat(300));
    s.append_events("resp_3", &[pad]).unwrap();
    s.put(&fat("resp_2", 2, "completed")).unwrap();
    assert_eq!(
        s.get("resp_3").unwrap(),
        None,
        "resp_3 with its events evicted"
    );
    assert!(
        s.get("resp_2").unwrap().is_some(),
        "never the record being put"
    );
    assert_eq!(s.len().unwrap(), 2);
}

pub fn mark_unfinished(s: &dyn ResponseStore) {
    let mut bg = rec("resp_bg", 1, "in_progress", None);
    bg.background = true;
    s.put(&bg).unwrap();
    s.append_events(
        "resp_bg",
        &[
            event(0, "response.created"),
            event(1, "response.in_progress"),
        ],
    )
    .unwrap();
    s.put(&rec("resp_q", 2, "queued", None)).unwrap();
    s.put(&rec("resp_done", 3, "completed", None)).unwrap();
    assert_eq!(s.mark_unfinished_failed().unwrap(), 2);
    for id in ["resp_bg", "resp_q"] {
        let r = s.get(id).unwrap().unwrap();
        assert_eq!(r.status, "failed");
        assert_eq!(r.response.status, ResponseStatus::Failed);
        let error = r.response.error.unwrap();
        assert_eq!(error.code, "server_error");
        assert!(error.message.contains("restarted"));
        assert_eq!(r.input_items, rec(id, 0, "x", None).input_items);
    }
    let events = s.events("resp_bg", None).unwrap().unwrap();
    assert_eq!(events.len(), 3);
    let StreamEvent::Failed(failed) = &events[2] else { panic!("a response.failed event last: {:?}", events[2]) };
    assert_eq!(failed.sequence_number, 2);
    assert_eq!(failed.response.status, ResponseStatus::Failed);
    assert_eq!(
        s.events("resp_q", None).unwrap(),
        Some(vec![]),
        "no events, none added"
    );
    assert_eq!(
        s.get("resp_done").unwrap(),
        Some(rec("resp_done", 3, "completed", None))
    );
    assert_eq!(s.mark_unfinished_failed().unwrap(), 0);
}

/// Generates one `#[test]` per conformance check, each on a fresh store from `$make`.
#[macro_export]
macro_rules! store_conformance {
    ($make:expr) => {
        #[test]
        fn conformance_round_trip() {
            store_common::round_trip(&*$make(store_common::big()).store);
        }
        #[test]
        fn conformance_input_items_pagination() {
            store_common::input_items_pagination(&*$make(store_common::big()).store);
        }
        #[test]
        fn conformance_events_replay() {
            store_common::events_replay(&*$make(store_common::big()).store);
        }
        #[test]
        fn conformance_chain_three_hops() {
            store_common::chain_three_hops(&*$make(store_common::big()).store);
        }
        #[test]
        fn conformance_chain_missing_link() {
            store_common::chain_missing_link(&*$make(store_common::big()).store);
        }
        #[test]
        fn conformance_chain_cycle_and_depth() {
            let cfg = store_common::cfg(3600, 5000, 1 << 30);
            store_common::chain_cycle_and_depth(&*$make(cfg).store);
        }
        #[test]
        fn conformance_ttl_expiry() {
            store_common::ttl_expiry(&*$make(store_common::cfg(100, 1000, 1 << 30)).store);
        }
        #[test]
        fn conformance_size_cap_rows() {
            store_common::size_cap_rows(&*$make(store_common::cfg(3600, 3, 1 << 30)).store);
        }
        #[test]
        fn conformance_size_cap_bytes() {
            let cfg = store_common::cfg(3600, 1000, store_common::bytes_cap());
            store_common::size_cap_bytes(&*$make(cfg).store);
        }
        #[test]
        fn conformance_mark_unfinished_failed() {
            store_common::mark_unfinished(&*$make(store_common::big()).store);
        }
    };
}
