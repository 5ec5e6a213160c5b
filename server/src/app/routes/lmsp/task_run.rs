//! Running one task: the generation is driven independently of any client;
//! its events are numbered from 1, published to live readers, and stored in
//! batches, the terminal one last (after the final task record is stored).

use crate::app::runtime::tasks::LiveTask;
use crate::app::runtime::drive::{drive, Outgoing, Persist, Sink};
use crate::app::runtime::stored::with_store;
use crate::app::runtime::stored::unix_now;
use crate::app::runtime::state::AppState;
use crate::protocol::lmsp::{LmspEvent, LmspResponse, ProblemDoc};
use crate::protocol::mapper::ResponseMapper;
use crate::protocol::{ResponseObject, ResponseStatus};
use crate::store::{TaskEvent, TaskRecord};
use spindle_scheduler::EventStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Events are stored at least this often while a task runs (and always at its end).
const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// …or once this many are pending (the restart path relies on this bound).
const FLUSH_BATCH: usize = crate::store::tasks::MAX_UNSTORED_EVENTS as usize;

/// Drives the task to its end, then forgets it from the hub.
pub async fn run_task(state: Arc<AppState>, live: Arc<LiveTask>, stream: EventStream, mapper: ResponseMapper, persist: Persist) {
    let stored_response = persist.store;
    let (tx, mut rx) = mpsc::channel(256);
    let driver = tokio::spawn(drive(state.clone(), stream, mapper, Some(Sink::new(tx)), persist));
    let response_id = live.record().response_id;
    let mut log = EventLog::new();
    let mut terminal: Option<LmspEvent> = None;
    while let Some(outgoing) = rx.recv().await {
        let Outgoing::Event(event) = outgoing else { continue };
        let Some(event) = LmspEvent::from_stream(&event, &response_id) else { continue };
        if terminal.is_some() {
            continue;
        }
        if event.is_terminal() {
            terminal = Some(event);
            continue;
        }
        let event = log.next(event);
        live.publish(std::slice::from_ref(&event));
        if log.should_flush() {
            log.flush(&state, &live.id).await;
        }
    }
    let response = driver.await.ok();
    let cancelled = live.cancel_requested() && terminal.as_ref().is_none_or(|t| matches!(t, LmspEvent::Failed(_)));
    let last = match terminal {
        _ if cancelled => LmspEvent::cancelled(&response_id),
        Some(t) => t,
        None => LmspEvent::failed(&response_id, ProblemDoc::generation_failed("server_error", "The generation ended without a result.")),
    };
    let last = log.next(last);
    let record = final_record(live.record(), &last, response.as_ref());
    log.flush(&state, &live.id).await;
    let stored = store_final_record(&state, &record).await;
    if cancelled && stored_response {
        mark_response_cancelled(&state, &response_id).await;
    }
    live.set_record(record);
    live.publish(&[last]);
    if stored {
        state.tasks.remove(&live.id);
    } else {
        // The hub keeps the finished task (its readers get the final record,
        // not the store's stale `in_progress` one) while the write is retried
        // in the background, for at most ten minutes.
        tokio::spawn(retry_final_record(state.clone(), live.id.clone(), live.record()));
    }
}

/// Retries storing a finished task's record every 10 s, then forgets the task
/// from the hub (stored or not).
async fn retry_final_record(state: Arc<AppState>, id: String, record: TaskRecord) {
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let to_store = record.clone();
        if with_store(&state, move |s| s.put_task(&to_store)).await.is_ok() {
            break;
        }
    }
    state.tasks.remove(&id);
}

/// Stores the final record, retrying twice; false when every try failed.
async fn store_final_record(state: &Arc<AppState>, record: &TaskRecord) -> bool {
    for (attempt, pause_ms) in [0u64, 50, 250].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        let to_store = record.clone();
        match with_store(state, move |s| s.put_task(&to_store)).await {
            Ok(()) => return true,
            Err(e) => tracing::error!("storing task {} failed (try {}): {}", record.id, attempt + 1, e.message),
        }
    }
    false
}

/// The task's final record: status from the terminal event, the LMSP response.
fn final_record(mut record: TaskRecord, last: &TaskEvent, response: Option<&ResponseObject>) -> TaskRecord {
    let status = last.event.terminal_status().unwrap_or(ResponseStatus::Failed);
    record.status = status.as_str().to_string();
    record.finished_at = Some(unix_now());
    record.last_event_id = last.id;
    record.response = response.map(|r| LmspResponse::from(r).ended_as(status));
    record
}

async fn mark_response_cancelled(state: &Arc<AppState>, id: &str) {
    let id = id.to_string();
    let result = with_store(state, move |s| {
        let Some(mut rec) = s.get(&id)? else { return Ok(()) };
        rec.status = ResponseStatus::Cancelled.as_str().to_string();
        rec.response.status = ResponseStatus::Cancelled;
        rec.response.error = None;
        s.put(&rec)
    })
    .await;
    if let Err(e) = result {
        tracing::warn!("recording a task's cancellation failed: {}", e.message);
    }
}

/// Numbers events and batches them for the store.
struct EventLog {
    next_id: u64,
    pending: Vec<TaskEvent>,
    last_flush: Instant,
}

impl EventLog {
    fn new() -> Self {
        Self { next_id: 1, pending: Vec::new(), last_flush: Instant::now() }
    }

    fn next(&mut self, event: LmspEvent) -> TaskEvent {
        let e = TaskEvent { id: self.next_id, event };
        self.next_id += 1;
        self.pending.push(e.clone());
        e
    }

    fn should_flush(&self) -> bool {
        self.pending.len() >= FLUSH_BATCH || self.last_flush.elapsed() >= FLUSH_EVERY
    }

    async fn flush(&mut self, state: &Arc<AppState>, task_id: &str) {
        self.last_flush = Instant::now();
        if self.pending.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.pending);
        let id = task_id.to_string();
        if let Err(e) = with_store(state, move |s| s.append_task_events(&id, &batch)).await {
            tracing::error!("storing task events failed: {}", e.message);
        }
    }
}
