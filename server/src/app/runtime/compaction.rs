//! What a compaction item holds: a model-written summary, sealed to the model
//! and the tenant, and the message it becomes when a later turn opens it.

use crate::app::access::auth::Tenant;
use crate::app::runtime::state::AppState;
use crate::protocol::items::{InputMessage, MessageContent, Role};
use crate::protocol::InputItem;
use serde::{Deserialize, Serialize};

/// What a compaction item's `encrypted_content` holds, sealed.
#[derive(Debug, Serialize, Deserialize)]
pub struct SealedSummary {
    /// The model's summary of the compacted turns.
    pub summary: String,
}

/// What a compaction item is sealed to: the model, and the tenant (so one
/// key's summary never opens for another). The anonymous tenant of a server
/// without keys seals to the model alone.
pub fn seal_context(state: &AppState, tenant: &Tenant) -> Vec<u8> {
    let mut context = state.model.name.as_bytes().to_vec();
    if !tenant.as_str().is_empty() {
        context.push(0);
        context.extend_from_slice(tenant.as_str().as_bytes());
    }
    context
}

/// The message a compaction item becomes in the prompt.
pub fn summary_message(summary: &str) -> InputItem {
    InputItem::Message(InputMessage {
        id: None,
        role: Role::User,
        content: MessageContent::Text(format!("Summary of the earlier conversation:\n{summary}")),
        status: None,
        phase: None,
    })
}
