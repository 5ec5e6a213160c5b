//! `SqliteStore` against the shared store conformance tests, plus what only a database file
//! has: reopening, concurrent connections, schema versioning, WAL mode.
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod store_common;

use std::sync::Arc;

use spindle_server::store::{
    sqlite::SCHEMA_VERSION, Order, ResponseStore, SqliteStore, StoreConfig, StoreError,
};
use store_common::{big, event, rec, Fixture};

fn make(cfg: StoreConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"), cfg).unwrap();
    Fixture {
        store: Box::new(store),
        _dir: Some(dir),
    }
}

store_conformance!(make);

/// Writes a little of everything: records, a chain, events, an unfinished background one.
fn populate(s: &SqliteStore) {
    s.put(&rec("resp_1", 10, "completed", None)).unwrap();
    s.put(&rec("resp_2", 11, "completed", Some("resp_1")))
        .unwrap();
    let mut bg = rec("resp_3", 12, "in_progress", Some("resp_2"));
    bg.background = true;
    s.put(&bg).unwrap();
    s.append_events(
        "resp_3",
        &[
            event(0, "response.created"),
            event(1, "response.in_progress"),
        ],
    )
    .unwrap();
}

fn check_populated(s: &SqliteStore) {
    assert_eq!(s.len().unwrap(), 3);
    let chain = s.chain("resp_3").unwrap().unwrap();
    let ids: Vec<&str> = chain.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["resp_1", "resp_2", "resp_3"]);
    assert!(chain[2].background);
    assert_eq!(chain[0], rec("resp_1", 10, "completed", None));
    assert_eq!(
        s.events("resp_3", Some(0)).unwrap().unwrap(),
        [event(1, "response.in_progress")]
    );
    let items = s
        .input_items("resp_2", None, 10, Order::Asc)
        .unwrap()
        .unwrap();
    assert_eq!(items, rec("resp_2", 0, "x", None).input_items);
}

#[test]
fn reopen_sees_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/store.db");
    let s = SqliteStore::open(&path, big()).unwrap();
    populate(&s);
    let bytes = s.total_bytes();
    drop(s);
    let s = SqliteStore::open(&path, big()).unwrap();
    check_populated(&s);
    assert_eq!(s.total_bytes(), bytes, "totals recomputed on open");
    s.integrity_check().unwrap();
}

#[test]
fn second_store_on_the_same_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let a = SqliteStore::open(&path, big()).unwrap();
    populate(&a);
    let err = SqliteStore::open(&path, big()).unwrap_err();
    assert!(
        matches!(err, StoreError::Sqlite(ref m) if m.contains("another spindle")),
        "{err}"
    );
    drop(a);
    check_populated(&SqliteStore::open(&path, big()).unwrap());
}

#[test]
fn restart_marks_unfinished_failed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    populate(&SqliteStore::open(&path, big()).unwrap());
    let s = SqliteStore::open(&path, big()).unwrap();
    assert_eq!(s.mark_unfinished_failed().unwrap(), 1);
    let r = s.get("resp_3").unwrap().unwrap();
    assert_eq!(
        (r.status.as_str(), r.response.status),
        ("failed", spindle_server::protocol::ResponseStatus::Failed)
    );
    assert_eq!(r.response.error.map(|e| e.code).as_deref(), Some("server_error"));
    let last = s.events("resp_3", Some(1)).unwrap().unwrap();
    assert!(matches!(last[0], spindle_server::protocol::StreamEvent::Failed(_)), "{last:?}");
}

#[test]
fn wal_mode_and_schema_version_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    drop(SqliteStore::open(&path, big()).unwrap());
    let raw = rusqlite::Connection::open(&path).unwrap();
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let v: i64 = raw
        .query_row("SELECT version FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, SCHEMA_VERSION);
    raw.execute("UPDATE schema_version SET version = 99", [])
        .unwrap();
    drop(raw);
    let err = SqliteStore::open(&path, big()).unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt(ref m) if m.contains("99")),
        "{err}"
    );
}

#[test]
fn not_a_database_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    assert!(SqliteStore::open(&path, big()).is_err());
}

#[test]
fn concurrent_writers_from_threads() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(SqliteStore::open(dir.path().join("store.db"), big()).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0..25 {
                    let id = format!("resp_{t}_{i}");
                    s.put(&rec(&id, i, "in_progress", None)).unwrap();
                    s.append_events(&id, &[event(0, "response.created")])
                        .unwrap();
                    s.put(&rec(&id, i, "completed", None)).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(s.len().unwrap(), 100);
    s.integrity_check().unwrap();
}
