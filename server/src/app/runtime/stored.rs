//! The response store as the runtime uses it: calls off the async threads,
//! scoped to a tenant, a turn's input items in their stored shape, and the
//! clock records are stamped with.

use crate::app::access::auth::Tenant;
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::items::{InputContent, MessageContent, Role};
use crate::protocol::request::ValidRequest;
use crate::protocol::InputItem;
use crate::store::{Owned, ResponseStore, StoreError};
use std::sync::Arc;

/// This turn's input items as stored and listed by `input_items`: each with
/// an `id`, and message content always as a list of parts with a status
/// (the shape the OpenAI SDK's item types require).
pub(crate) fn stored_input_items(req: &ValidRequest) -> Vec<InputItem> {
    req.input.iter().cloned().map(with_id_and_parts).collect()
}

fn with_id_and_parts(mut item: InputItem) -> InputItem {
    let fresh = |prefix: &str| Some(format!("{prefix}_{}", uuid::Uuid::new_v4().simple()));
    match &mut item {
        InputItem::Message(m) => {
            m.id = m.id.take().or_else(|| fresh("msg"));
            if let MessageContent::Text(text) = &mut m.content {
                let text = std::mem::take(text);
                let part = match m.role {
                    Role::Assistant => InputContent::OutputText { text, annotations: Vec::new() },
                    _ => InputContent::InputText { text },
                };
                m.content = MessageContent::Parts(vec![part]);
            }
            m.status.get_or_insert_with(|| "completed".to_owned());
        }
        InputItem::FunctionCall(c) => c.id = c.id.take().or_else(|| fresh("fc")),
        InputItem::FunctionCallOutput(o) => o.id = o.id.take().or_else(|| fresh("fco")),
        InputItem::Reasoning(r) => r.id = r.id.take().or_else(|| fresh("rs")),
        InputItem::Compaction(c) => c.id = c.id.take().or_else(|| fresh("cmp")),
        InputItem::ItemReference(_) => {}
    }
    item
}

/// Run a store call off the async threads, mapping both failure kinds to 500.
pub(crate) async fn with_store<T: Send + 'static>(
    state: &Arc<AppState>,
    call: impl FnOnce(&dyn ResponseStore) -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || call(store.as_ref()))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| ApiError::internal(format!("response store: {e}")))
}

/// Run a store call on `tenant`'s view of the store ([`Owned`]), off the
/// async threads.
pub(crate) async fn with_owned<T: Send + 'static>(
    state: &Arc<AppState>,
    tenant: &Tenant,
    call: impl FnOnce(Owned<'_>) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ApiError> {
    let tenant = tenant.clone();
    with_store(state, move |s| call(Owned::new(s, tenant.as_str()))).await
}

/// Seconds since the Unix epoch (0 if the clock is before it): the time
/// stamp of stored records.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}
