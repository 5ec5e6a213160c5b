//! The in-memory backend of [`ResponseStore`]: a bounded map behind a
//! mutex. Nothing survives the process; for deployments that never persist and for tests.
//!
//! Same semantics as [`SqliteStore`](super::SqliteStore), including the TTL and the size cap.
//! Eviction scans the map (O(n) per evicting `put`), which is fine for the bounded sizes it is
//! meant for. Calls never block on I/O, so async code may call it directly.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};


use super::{
    fail_for_restart, follow_chain, json_len, record_len, restart_failed_event, ttl_secs,
    Order, ResponseStore, StoreConfig, StoreError, StoredResponse, STATUS_FAILED,
};
use crate::protocol::{InputItem, StreamEvent};

/// One stored response with its events and accounting.
#[derive(Debug)]
struct Entry {
    rec: StoredResponse,
    events: BTreeMap<u64, StreamEvent>,
    /// Serialized size of the response object plus input items.
    bytes: u64,
    /// Serialized size of the events.
    event_bytes: u64,
    /// Insertion order, the tie-break among equal `created_at`.
    order: u64,
}

impl Entry {
    fn total(&self) -> u64 {
        self.bytes + self.event_bytes
    }
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<String, Entry>,
    bytes: u64,
    next_order: u64,
}

impl Inner {
    fn remove(&mut self, id: &str) -> bool {
        match self.map.remove(id) {
            Some(entry) => {
                self.bytes = self.bytes.saturating_sub(entry.total());
                true
            }
            None => false,
        }
    }

    /// Removes the oldest finished entries (never `keep`) until the config's caps hold.
    fn evict(&mut self, keep: &str, config: &StoreConfig) {
        let over = |inner: &Inner| {
            inner.map.len() > config.max_responses || inner.bytes > config.max_bytes
        };
        if !over(self) {
            return;
        }
        let mut candidates: Vec<(i64, u64, String)> = self
            .map
            .iter()
            .filter(|(id, e)| id.as_str() != keep && !e.rec.is_unfinished())
            .map(|(id, e)| (e.rec.created_at, e.order, id.clone()))
            .collect();
        candidates.sort_unstable();
        for (_, _, id) in candidates {
            if !over(self) {
                break;
            }
            self.remove(&id);
        }
    }

    /// Appends events to an entry, keyed by `sequence_number`.
    fn append(&mut self, id: &str, events: &[StreamEvent]) -> Result<(), StoreError> {
        let entry = self
            .map
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let before = entry.event_bytes;
        for event in events {
            let seq = event.sequence_number();
            let len = json_len(event);
            if let Some(old) = entry.events.insert(seq, event.clone()) {
                entry.event_bytes = entry.event_bytes.saturating_sub(json_len(&old));
            }
            entry.event_bytes += len;
        }
        self.bytes = (self.bytes + entry.event_bytes).saturating_sub(before);
        Ok(())
    }
}

/// A [`ResponseStore`] in process memory, bounded by its [`StoreConfig`].
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
    pub(super) tasks: Mutex<HashMap<String, MemoryTask>>,
    config: StoreConfig,
}

/// One task with its event history (see [`super::tasks`]).
#[derive(Debug)]
pub(super) struct MemoryTask {
    pub(super) task: super::tasks::TaskRecord,
    pub(super) events: BTreeMap<u64, super::tasks::TaskEvent>,
}

impl MemoryStore {
    /// An empty store with these bounds.
    pub fn new(config: StoreConfig) -> Self {
        MemoryStore {
            inner: Mutex::new(Inner::default()),
            tasks: Mutex::new(HashMap::new()),
            config,
        }
    }

    /// The bounds this store enforces.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Total bytes counted against [`StoreConfig::max_bytes`].
    pub fn total_bytes(&self) -> u64 {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for MemoryStore {
    /// A store with [`StoreConfig::default`] bounds.
    fn default() -> Self {
        MemoryStore::new(StoreConfig::default())
    }
}

impl ResponseStore for MemoryStore {
    fn put(&self, rec: &StoredResponse) -> Result<(), StoreError> {
        let bytes = record_len(rec);
        let mut inner = self.lock();
        let inner = &mut *inner;
        match inner.map.get_mut(&rec.id) {
            Some(entry) => {
                inner.bytes = (inner.bytes + bytes).saturating_sub(entry.bytes);
                entry.rec = rec.clone();
                entry.bytes = bytes;
            }
            None => {
                let order = inner.next_order;
                inner.next_order += 1;
                inner.bytes += bytes;
                let entry = Entry {
                    rec: rec.clone(),
                    events: BTreeMap::new(),
                    bytes,
                    event_bytes: 0,
                    order,
                };
                inner.map.insert(rec.id.clone(), entry);
            }
        }
        inner.evict(&rec.id, &self.config);
        Ok(())
    }

    fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        Ok(self.lock().map.get(id).map(|e| e.rec.clone()))
    }

    fn delete(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.lock().remove(id))
    }

    fn input_items(
        &self,
        id: &str,
        after: Option<&str>,
        limit: usize,
        order: Order,
    ) -> Result<Option<Vec<InputItem>>, StoreError> {
        let inner = self.lock();
        let Some(entry) = inner.map.get(id) else {
            return Ok(None);
        };
        let items = &entry.rec.input_items;
        let cursor = match after {
            None => None,
            Some(after) => match items.iter().position(|i| i.item_id() == Some(after)) {
                Some(pos) => Some(pos),
                None => return Ok(Some(Vec::new())),
            },
        };
        let page = match order {
            Order::Asc => {
                let start = cursor.map_or(0, |p| p + 1);
                items[start..].iter().take(limit).cloned().collect()
            }
            Order::Desc => {
                let end = cursor.unwrap_or(items.len());
                items[..end].iter().rev().take(limit).cloned().collect()
            }
        };
        Ok(Some(page))
    }

    fn append_events(&self, id: &str, events: &[StreamEvent]) -> Result<(), StoreError> {
        self.lock().append(id, events)
    }

    fn events(
        &self,
        id: &str,
        starting_after: Option<u64>,
    ) -> Result<Option<Vec<StreamEvent>>, StoreError> {
        let inner = self.lock();
        let Some(entry) = inner.map.get(id) else {
            return Ok(None);
        };
        let events = match starting_after {
            None => entry.events.values().cloned().collect(),
            Some(after) => match after.checked_add(1) {
                Some(from) => entry.events.range(from..).map(|(_, e)| e.clone()).collect(),
                None => Vec::new(),
            },
        };
        Ok(Some(events))
    }

    fn chain(&self, id: &str) -> Result<Option<Vec<StoredResponse>>, StoreError> {
        let inner = self.lock();
        follow_chain(id, |cur| Ok(inner.map.get(cur).map(|e| e.rec.clone())))
    }

    fn mark_unfinished_failed(&self) -> Result<usize, StoreError> {
        let mut inner = self.lock();
        let unfinished: Vec<String> = inner
            .map
            .iter()
            .filter(|(_, e)| e.rec.is_unfinished())
            .map(|(id, _)| id.clone())
            .collect();
        for id in &unfinished {
            let Some(entry) = inner.map.get_mut(id) else {
                continue;
            };
            fail_for_restart(&mut entry.rec.response);
            entry.rec.status = STATUS_FAILED.to_owned();
            let new_bytes = record_len(&entry.rec);
            let old_bytes = std::mem::replace(&mut entry.bytes, new_bytes);
            let last = entry.events.keys().next_back().copied();
            let event = last.map(|l| restart_failed_event(&entry.rec.response, l + 1));
            inner.bytes = (inner.bytes + new_bytes).saturating_sub(old_bytes);
            if let Some(event) = event {
                inner.append(id, &[event])?;
            }
        }
        Ok(unfinished.len())
    }

    fn expire(&self, now: i64) -> Result<usize, StoreError> {
        let cutoff = now.saturating_sub(ttl_secs(self.config.ttl));
        let mut inner = self.lock();
        let doomed: Vec<String> = inner
            .map
            .iter()
            .filter(|(_, e)| !e.rec.is_unfinished() && e.rec.created_at <= cutoff)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &doomed {
            inner.remove(id);
        }
        Ok(doomed.len())
    }

    fn len(&self) -> Result<usize, StoreError> {
        Ok(self.lock().map.len())
    }
}
