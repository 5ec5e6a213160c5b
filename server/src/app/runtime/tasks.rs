//! Tasks while they run: each one's event log in memory (readers follow it
//! live) and the registry of running tasks. Events reach the store in
//! batches; the terminal event becomes visible only after the final task
//! record and every event are stored, so a reader that sees it can read the
//! finished task back, and a reader that no longer finds the task here finds
//! its whole history in the store.

use crate::store::{TaskEvent, TaskRecord};
use spindle_scheduler::RequestId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::watch;

/// The running tasks, by id.
#[derive(Debug, Default)]
pub struct TaskHub {
    running: Mutex<HashMap<String, Arc<LiveTask>>>,
}

impl TaskHub {
    /// Registers a running task.
    pub fn insert(&self, task: Arc<LiveTask>) {
        self.map().insert(task.id.clone(), task);
    }

    /// The running task with this id, if `tenant` owns it.
    pub fn get(&self, id: &str, tenant: &str) -> Option<Arc<LiveTask>> {
        self.map().get(id).filter(|t| t.tenant == tenant).cloned()
    }

    /// Forgets a task (after its history is stored).
    pub fn remove(&self, id: &str) {
        self.map().remove(id);
    }

    /// How many tasks run now.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no task runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<LiveTask>>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One running task: its record, its events so far, and a signal that
/// bumps with each published event.
#[derive(Debug)]
pub struct LiveTask {
    /// The task id.
    pub id: String,
    /// The scheduler request (for cancel).
    pub request: RequestId,
    /// The tenant that created it.
    pub tenant: String,
    cancel_requested: AtomicBool,
    state: Mutex<LiveState>,
    published: watch::Sender<u64>,
}

#[derive(Debug)]
struct LiveState {
    record: TaskRecord,
    events: Vec<TaskEvent>,
}

impl LiveTask {
    /// A task starting with `record` (no events yet).
    pub fn new(record: TaskRecord, request: RequestId) -> Arc<Self> {
        Arc::new(Self {
            id: record.id.clone(),
            request,
            tenant: record.tenant.clone(),
            cancel_requested: AtomicBool::new(false),
            state: Mutex::new(LiveState { record, events: Vec::new() }),
            published: watch::channel(0).0,
        })
    }

    /// Publishes events to live readers (ids must continue the sequence).
    pub fn publish(&self, events: &[TaskEvent]) {
        let Some(last) = events.last().map(|e| e.id) else { return };
        {
            let mut state = self.lock();
            state.events.extend_from_slice(events);
            state.record.last_event_id = last;
        }
        self.published.send_replace(last);
    }

    /// Whether the terminal event has been published.
    pub fn ended(&self) -> bool {
        self.lock().events.last().is_some_and(TaskEvent::is_terminal)
    }

    /// Events with `id > after`.
    pub fn events_after(&self, after: u64) -> Vec<TaskEvent> {
        let state = self.lock();
        let start = state.events.partition_point(|e| e.id <= after);
        state.events[start..].to_vec()
    }

    /// A receiver that changes with every publish.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.published.subscribe()
    }

    /// The task record as it stands.
    pub fn record(&self) -> TaskRecord {
        self.lock().record.clone()
    }

    /// Replaces the record (status changes).
    pub fn set_record(&self, record: TaskRecord) {
        self.lock().record = record;
    }

    /// Marks the task as cancelled by a client.
    pub fn request_cancel(&self) {
        self.cancel_requested.store(true, Ordering::Release);
    }

    /// Whether a client asked to cancel.
    pub fn cancel_requested(&self) -> bool {
        self.cancel_requested.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, LiveState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::protocol::lmsp::LmspEvent;

    fn ev(id: u64) -> TaskEvent {
        TaskEvent { id, event: LmspEvent::cancelled(&id.to_string()) }
    }

    #[tokio::test]
    async fn readers_see_events_after_their_id_and_wake_on_publish() {
        let record = TaskRecord { id: "t".into(), response_id: "r".into(), created_at: 0, status: "queued".into(),
            finished_at: None, last_event_id: 0, response: None, tenant: String::new() };
        let task = LiveTask::new(record, 1);
        let mut rx = task.subscribe();
        task.publish(&[ev(1), ev(2)]);
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 2);
        task.publish(&[ev(3)]);
        assert_eq!(task.events_after(1).iter().map(|e| e.id).collect::<Vec<_>>(), vec![2, 3]);
        assert!(task.events_after(3).is_empty());
        let hub = TaskHub::default();
        hub.insert(task.clone());
        assert!(hub.get("t", "").is_some());
        assert!(hub.get("t", "someone-else").is_none(), "another tenant sees the task");
        hub.remove("t");
        assert!(hub.is_empty());
    }
}
