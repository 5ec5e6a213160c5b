//! `MemoryStore` against the shared store conformance tests.
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod store_common;

use spindle_server::store::{MemoryStore, ResponseStore, StoreConfig};
use store_common::Fixture;

fn make(cfg: StoreConfig) -> Fixture {
    Fixture {
        store: Box::new(MemoryStore::new(cfg)),
        _dir: None,
    }
}

store_conformance!(make);

#[test]
fn memory_byte_accounting_returns_to_zero() {
    let s = MemoryStore::default();
    let r = store_common::fat("resp_a", 1, "in_progress");
    s.put(&r).unwrap();
    assert_eq!(s.total_bytes(), store_common::rec_bytes(&r));
    s.append_events("resp_a", &[store_common::event(0, "response.created")])
        .unwrap();
    s.mark_unfinished_failed().unwrap();
    assert!(s.delete("resp_a").unwrap());
    assert_eq!(s.total_bytes(), 0);
    assert!(s.is_empty().unwrap());
}
