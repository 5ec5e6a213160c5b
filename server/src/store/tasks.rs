//! LMSP tasks: a response run independently of any connection, with its
//! event history kept (for a retention period after it ends) so that a
//! client can reconnect and replay from any event id.

use crate::protocol::lmsp::{LmspEvent, LmspResponse, ProblemDoc};
use crate::protocol::ResponseStatus;
use serde::{Deserialize, Serialize};

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
    pub response: Option<LmspResponse>,
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
    pub fn view(&self) -> TaskView<'_> {
        TaskView {
            id: &self.id,
            object: "task",
            status: &self.status,
            created_at: self.created_at,
            finished_at: self.finished_at,
            response_id: &self.response_id,
            last_event_id: self.last_event_id,
            response: self.response.as_ref(),
        }
    }
}

/// A task as the API shows it.
#[derive(Debug, Serialize)]
pub struct TaskView<'a> {
    /// `task_…`.
    pub id: &'a str,
    /// Always `task`.
    pub object: &'static str,
    /// Where it stands.
    pub status: &'a str,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds at its end.
    pub finished_at: Option<i64>,
    /// The response it produces.
    pub response_id: &'a str,
    /// The last event id written.
    pub last_event_id: u64,
    /// The final LMSP response (`null` while running).
    pub response: Option<&'a LmspResponse>,
}

/// One event of a task's stream: integer id from 1 and the LMSP event
/// (stored as `{id, event, data}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// Strictly increasing from 1 within the task.
    pub id: u64,
    /// The event.
    #[serde(flatten)]
    pub event: LmspEvent,
}

impl TaskEvent {
    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        self.event.is_terminal()
    }

    /// The event as one SSE frame.
    pub fn sse_frame(&self) -> String {
        self.event.sse_frame(self.id)
    }
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
    let problem = ProblemDoc::generation_failed("server_restarted", "The server restarted while this task ran.");
    task.status = "failed".into();
    task.finished_at = Some(now);
    task.last_event_id = task.last_event_id.max(last_stored) + MAX_UNSTORED_EVENTS + 1;
    task.response = Some(LmspResponse {
        id: task.response_id.clone(),
        object: "response".into(),
        created_at: task.created_at,
        status: ResponseStatus::Failed,
        model: String::new(),
        output: Vec::new(),
        usage: None,
        error: Some(problem.clone()),
        incomplete_details: None,
    });
    TaskEvent { id: task.last_event_id, event: LmspEvent::failed(&task.response_id, problem) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod conformance {
    //! Behaviour both backends must share.
    use super::*;
    use crate::protocol::lmsp::LmspDelta;

    fn task(id: &str, status: &str) -> TaskRecord {
        TaskRecord { id: id.into(), response_id: format!("resp_{id}"), created_at: 100, status: status.into(), tenant: String::new(),
            finished_at: None, last_event_id: 0, response: None }
    }

    fn event(id: u64, delta: &str) -> TaskEvent {
        TaskEvent { id, event: LmspEvent::OutputTextDelta(LmspDelta { response_id: "r".into(), item_id: "i".into(), delta: delta.into() }) }
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
        assert!(last[0].is_terminal() && last[0].event.name() == "response.failed");
        assert_eq!(store.fail_unfinished_tasks(300).unwrap(), 0);
    }
}
