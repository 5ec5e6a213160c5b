//! LMSP tasks: a response run independently of any connection, with its
//! event history kept (for a retention period after it ends) so that a
//! client can reconnect and replay from any event id.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::StoreError;

/// Most events a running task publishes before they are stored (readers
/// following it live may have seen that many past the stored history).
pub const MAX_UNSTORED_EVENTS: u64 = 32;

/// Statuses a task has while it runs.
pub const TASK_UNFINISHED: [&str; 2] = ["queued", "in_progress"];

/// One stored task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// `task_…`
    pub id: String,
    /// The response the task produces.
    pub response_id: String,
    /// Unix seconds.
    pub created_at: i64,
    /// `queued`, `in_progress`, `completed`, `incomplete`, `failed` or `cancelled`.
    pub status: String,
    /// Unix seconds at the terminal event (`None` while running): the event
    /// history's retention counts from here.
    pub finished_at: Option<i64>,
    /// The last event id written (0 before the first).
    pub last_event_id: u64,
    /// The final LMSP response object (`null` while running).
    pub response: Value,
    /// The tenant that created it (empty: the anonymous tenant; tasks
    /// stored before tenants existed read as that).
    #[serde(default)]
    pub tenant: String,
}

impl TaskRecord {
    /// Whether the task still runs.
    pub fn is_unfinished(&self) -> bool {
        TASK_UNFINISHED.contains(&self.status.as_str())
    }

    /// The task as the API shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "task",
            "status": self.status,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "response_id": self.response_id,
            "last_event_id": self.last_event_id,
            "response": self.response,
        })
    }
}

/// One event of a task's stream: integer id from 1, LMSP event name, data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// Strictly increasing from 1 within the task.
    pub id: u64,
    /// The SSE event name.
    pub event: String,
    /// The SSE data.
    pub data: Value,
}

impl TaskEvent {
    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        is_terminal_event(&self.event)
    }
}

/// Whether an event of this name ends a task's stream.
pub fn is_terminal_event(name: &str) -> bool {
    matches!(name, "response.completed" | "response.incomplete" | "response.failed" | "response.cancelled" | "error")
}

/// Persistence for tasks and their event histories. Implemented by both
/// response stores, on the same database.
pub trait TaskStore: Send + Sync {
    /// Inserts or replaces a task (by id). Keeps its stored events.
    fn put_task(&self, task: &TaskRecord) -> Result<(), StoreError>;

    /// The task with this id, or `None`.
    fn get_task(&self, id: &str) -> Result<Option<TaskRecord>, StoreError>;

    /// Appends events to a task's history (a repeated id replaces the event).
    /// `Err(NotFound)` when the task is not stored.
    fn append_task_events(&self, id: &str, events: &[TaskEvent]) -> Result<(), StoreError>;

    /// The stored events with `id > after`, in order.
    fn task_events(&self, id: &str, after: u64) -> Result<Vec<TaskEvent>, StoreError>;

    /// Deletes the event histories of tasks that finished at or before
    /// `events_cutoff`, and whole tasks that finished at or before
    /// `tasks_cutoff` (unix seconds). Returns how many histories were dropped.
    fn expire_tasks(&self, events_cutoff: i64, tasks_cutoff: i64) -> Result<usize, StoreError>;

    /// At daemon start: every unfinished task becomes `failed`, with a final
    /// `response.failed` event. Returns how many changed.
    fn fail_unfinished_tasks(&self, now: i64) -> Result<usize, StoreError>;
}

/// The terminal event and final state of a task the daemon's restart cut off
/// (`last_stored`: the highest event id in its stored history). Its id skips
/// past any event a live reader may have seen but the store never got, so a
/// reconnecting reader still receives it.
pub fn fail_task_for_restart(task: &mut TaskRecord, last_stored: u64, now: i64) -> TaskEvent {
    let problem = json!({"type": "https://spindle.dev/problems/server_restarted", "title": "Generation failed",
        "status": 500, "detail": "The server restarted while this task ran.", "code": "server_restarted"});
    task.status = "failed".into();
    task.finished_at = Some(now);
    task.last_event_id = task.last_event_id.max(last_stored) + MAX_UNSTORED_EVENTS + 1;
    task.response = json!({"id": task.response_id, "object": "response", "created_at": task.created_at,
        "status": "failed", "output": [], "usage": null, "error": problem, "incomplete_details": null});
    TaskEvent {
        id: task.last_event_id,
        event: "response.failed".into(),
        data: json!({"response_id": task.response_id, "status": "failed", "error": problem}),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod conformance {
    //! Behaviour both backends must share.
    use super::*;

    fn task(id: &str, status: &str) -> TaskRecord {
        TaskRecord { id: id.into(), response_id: format!("resp_{id}"), created_at: 100, status: status.into(), tenant: String::new(),
            finished_at: None, last_event_id: 0, response: Value::Null }
    }

    fn event(id: u64, name: &str) -> TaskEvent {
        TaskEvent { id, event: name.into(), data: json!({"n": id}) }
    }

    /// Round trip, append and replay after an id, expiry, restart.
    pub(crate) fn check(store: &dyn TaskStore) {
        assert_eq!(store.get_task("t1").unwrap(), None);
        assert!(matches!(store.append_task_events("t1", &[event(1, "x")]), Err(StoreError::NotFound(_))));
        let mut t = task("t1", "in_progress");
        store.put_task(&t).unwrap();
        store.append_task_events("t1", &[event(1, "a"), event(2, "b")]).unwrap();
        store.append_task_events("t1", &[event(3, "c")]).unwrap();
        let ids: Vec<u64> = store.task_events("t1", 1).unwrap().iter().map(|e| e.id).collect();
        assert_eq!(ids, vec![2, 3]);
        assert_eq!(store.task_events("t1", 0).unwrap()[0], event(1, "a"));
        t.status = "completed".into();
        t.finished_at = Some(200);
        t.last_event_id = 3;
        store.put_task(&t).unwrap();
        assert_eq!(store.task_events("t1", 0).unwrap().len(), 3, "put keeps the events");
        assert_eq!(store.get_task("t1").unwrap(), Some(t.clone()));

        let running = task("t2", "in_progress");
        store.put_task(&running).unwrap();
        store.append_task_events("t2", &[event(1, "a")]).unwrap();
        assert_eq!(store.expire_tasks(199, 0).unwrap(), 0, "finished after the cutoff");
        assert_eq!(store.expire_tasks(200, 0).unwrap(), 1);
        assert!(store.task_events("t1", 0).unwrap().is_empty());
        assert!(store.get_task("t1").unwrap().is_some(), "the task outlives its events");
        assert_eq!(store.task_events("t2", 0).unwrap().len(), 1, "a running task keeps its events");
        store.expire_tasks(200, 200).unwrap();
        assert_eq!(store.get_task("t1").unwrap(), None);

        assert_eq!(store.fail_unfinished_tasks(300).unwrap(), 1);
        let failed = store.get_task("t2").unwrap().unwrap();
        assert_eq!((failed.status.as_str(), failed.finished_at, failed.last_event_id), ("failed", Some(300), 2 + MAX_UNSTORED_EVENTS));
        let last = store.task_events("t2", 1).unwrap();
        assert_eq!(last.len(), 1);
        assert!(last[0].is_terminal() && last[0].event == "response.failed");
        assert_eq!(store.fail_unfinished_tasks(300).unwrap(), 0);
    }
}
