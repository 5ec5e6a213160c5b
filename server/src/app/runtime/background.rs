//! Background responses (`background: true`): started, then run to their
//! end apart from any connection, with a handle through which `/cancel` and
//! DELETE stop them. A stopped response ends as the route says: cancelled
//! (stored with what it produced) or deleted (never written again); the
//! handle is [`Background`].

use crate::app::runtime::control::Background;
use crate::app::runtime::drive::{drive, Persist};
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::mapper::ResponseMapper;
use crate::protocol::{ResponseObject, ResponseStatus};
use crate::store::StoredResponse;
use std::sync::Arc;

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
    crate::app::runtime::stored::with_store(&state, move |s| s.put(&record)).await?;
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
