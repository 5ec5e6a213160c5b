//! Background responses (`background: true`): started, then run to their
//! end apart from any connection, with a handle through which `/cancel` and
//! DELETE stop them. A stopped response ends as the route says: cancelled
//! (stored with what it produced) or deleted (never written again).

use super::drive::{drive, Persist};
use super::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::mapper::ResponseMapper;
use crate::protocol::{ResponseObject, ResponseStatus};
use crate::store::StoredResponse;
use spindle_scheduler::RequestId;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long `/cancel` and DELETE wait for a stopped response to be written.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// Why a running background response was stopped from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// `/cancel`: stored as `cancelled` with what it produced.
    Cancelled,
    /// DELETE: not written again.
    Deleted,
}

/// A running background response, as the cancel and delete routes see it.
#[derive(Debug)]
pub struct Background {
    /// The scheduler request.
    pub request: RequestId,
    stopped: AtomicU8,
    finished: watch::Sender<bool>,
}

impl Background {
    /// The handle of a response running as `request`.
    pub fn new(request: RequestId) -> Arc<Self> {
        Arc::new(Self { request, stopped: AtomicU8::new(0), finished: watch::channel(false).0 })
    }

    /// Why it was stopped, if it was.
    pub fn stopped(&self) -> Option<Stopped> {
        match self.stopped.load(Ordering::Acquire) {
            1 => Some(Stopped::Cancelled),
            2 => Some(Stopped::Deleted),
            _ => None,
        }
    }

    /// Stops it (the scheduler request is aborted) and waits, at most
    /// [`STOP_WAIT`], until its final state is written.
    pub async fn stop(&self, state: &AppState, how: Stopped) {
        let code = match how {
            Stopped::Cancelled => 1,
            Stopped::Deleted => 2,
        };
        let _ = self.stopped.compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
        state.scheduler.abort(self.request);
        let mut finished = self.finished.subscribe();
        let _ = tokio::time::timeout(STOP_WAIT, finished.wait_for(|f| *f)).await;
    }

    /// Marks its final state written (or skipped).
    pub fn finish(&self) {
        self.finished.send_replace(true);
    }
}

/// Stores the response as `queued`, answers with it, and drives the
/// generation in a task registered in [`AppState::running`].
pub async fn start(
    state: Arc<AppState>,
    stream: spindle_scheduler::EventStream,
    mapper: ResponseMapper,
    mut persist: Persist,
    id: String,
) -> Result<ResponseObject, ApiError> {
    let mut queued = mapper.response();
    queued.status = ResponseStatus::Queued;
    let record = StoredResponse::new(queued.clone(), &persist.input_items, true, persist.tenant.as_str());
    super::responses::with_store(&state, move |s| s.put(&record)).await?;
    let handle = Background::new(stream.id());
    persist.control = Some(handle.clone());
    if let Ok(mut running) = state.running.lock() {
        running.insert(id.clone(), handle);
    }
    let st = state.clone();
    tokio::spawn(async move {
        drive(st.clone(), stream, mapper, None, persist).await;
        if let Ok(mut running) = st.running.lock() {
            running.remove(&id);
        }
    });
    Ok(queued)
}

/// The running background response with this id, if any.
pub fn running(state: &AppState, id: &str) -> Option<Arc<Background>> {
    state.running.lock().ok().and_then(|r| r.get(id).cloned())
}
