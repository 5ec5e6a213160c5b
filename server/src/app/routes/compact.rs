//! `POST /v1/responses/compact` (digest §8): the conversation so far becomes
//! a model-written summary, sealed into a `compaction` item, followed by the
//! most recent turn kept verbatim. The `output` goes back as the `input` of a
//! new chain, where the summary is opened and rendered as context.

use crate::app::runtime::compaction::{seal_context, SealedSummary};
use crate::app::runtime::stored::stored_input_items;
use crate::app::runtime::stored::unix_now;
use crate::app::access::auth::Tenant;
use crate::app::runtime::state::AppState;
use crate::app::runtime::turn;
use crate::protocol::error::ApiError;
use crate::protocol::items::{CompactionInput, Role};
use crate::protocol::request::{validate, RequestLimits};
use crate::protocol::{to_chat_messages, InputItem, Usage};
use crate::app::http::extract::JsonBody;
use axum::extract::{Extension, State};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};
use spindle_engine::sampling::SamplingParams;
use spindle_scheduler::output::StopConditions;
use spindle_scheduler::{GenerationEvent, GenerationRequest};
use std::sync::Arc;

/// Longest summary the model may write.
const SUMMARY_TOKENS: usize = 160;
const SUMMARY_INSTRUCTIONS: &str = "You compress conversations. Summarize the conversation below in a few sentences. Keep facts, names, numbers, decisions and open tasks. Write only the summary.";

/// POST /v1/responses/compact
pub async fn compact(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, JsonBody(value): JsonBody<Value>) -> Result<Json<Compaction>, ApiError> {
    compact_value(state, value, None, &tenant).await.map(Json)
}

/// Compacts the conversation of a `/compact` body. `local_history` (the
/// WebSocket connection's memory of `previous_response_id`) replaces the
/// store lookup when given.
pub async fn compact_value(state: Arc<AppState>, value: Value, local_history: Option<Vec<InputItem>>, tenant: &Tenant) -> Result<Compaction, ApiError> {
    let limits = RequestLimits {
        max_input_items: state.limits.max_input_items,
        max_tools: state.limits.max_tools,
        max_output_tokens: state.limits.max_output_tokens as u32,
    };
    let req = validate(value, &limits)?;
    let Some(model) = req.model.as_deref() else {
        return Err(ApiError::invalid("model", "Missing required parameter: 'model'.").with_code("missing_required_parameter"));
    };
    crate::app::runtime::start::check_model(&state, Some(model))?;
    let mut history = turn::resolve_history(&state, req.previous_response_id.clone(), local_history, tenant).await?;
    history.extend(stored_input_items(&req));
    let opened = turn::open_compactions(&state, &history, "input", tenant)?;
    let keep_from = opened.iter().rposition(is_user_message).unwrap_or(opened.len());
    let (summary, usage) = summarize(&state, req.instructions.as_deref(), &opened[..keep_from], tenant).await?;
    let plain = serde_json::to_vec(&SealedSummary { summary }).map_err(|e| ApiError::internal(e.to_string()))?;
    let sealed = state.sealer.seal(&plain, &seal_context(&state, tenant));
    let mut output = vec![InputItem::Compaction(CompactionInput {
        id: Some(format!("cmp_{}", uuid::Uuid::new_v4().simple())),
        encrypted_content: sealed,
    })];
    output.extend_from_slice(&history[keep_from..]);
    Ok(Compaction {
        id: format!("resp_{}", uuid::Uuid::new_v4().simple()),
        object: "response.compaction",
        created_at: unix_now(),
        output,
        usage,
    })
}

/// The answer of `/responses/compact`: the compacted window (a sealed
/// summary, then the items from the last user message on) and the usage of
/// writing the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Compaction {
    /// `resp_…`.
    pub id: String,
    /// `response.compaction`.
    pub object: &'static str,
    /// Unix seconds.
    pub created_at: i64,
    /// The window to send as the next input.
    pub output: Vec<InputItem>,
    /// Tokens spent summarizing.
    pub usage: Usage,
}

fn is_user_message(item: &InputItem) -> bool {
    matches!(item, InputItem::Message(m) if m.role == Role::User)
}

/// The model's summary of `items` (empty when there is nothing before the
/// kept turn) and the usage of making it.
async fn summarize(state: &AppState, instructions: Option<&str>, items: &[InputItem], tenant: &Tenant) -> Result<(String, Usage), ApiError> {
    if items.is_empty() && instructions.is_none_or(str::is_empty) {
        return Ok((String::new(), Usage::new(0, 0, 0, 0)));
    }
    let transcript = to_chat_messages(instructions, items)?
        .iter()
        .map(|m| format!("{}: {}", m.role, m.content))
        .collect::<Vec<_>>()
        .join("\n");
    let messages = vec![json!({"role": "system", "content": SUMMARY_INSTRUCTIONS}), json!({"role": "user", "content": transcript})];
    let text = state
        .model
        .template
        .render(&messages, None, true)
        .map_err(|e| ApiError::internal(format!("the chat template failed: {e}")))?;
    let prompt = state.model.tokenizer.encode(&text, false).map_err(|e| ApiError::internal(format!("tokenizer: {e}")))?;
    let limit = state.model.context_length.min(state.scheduler.limits().cache_tokens());
    if prompt.len() + SUMMARY_TOKENS > limit {
        return Err(ApiError::context_length_exceeded(prompt.len() + SUMMARY_TOKENS, limit));
    }
    let request = GenerationRequest {
        prompt,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: StopConditions {
            stop_token_ids: state.model.tokenizer.eos_ids().to_vec(),
            max_tokens: SUMMARY_TOKENS,
            ..StopConditions::default()
        },
        cache_salt: tenant.cache_salt(None),
        constraint: None,
    };
    let mut stream = state.scheduler.submit(request).map_err(|e| ApiError::internal(e.to_string()))?;
    let mut summary = String::new();
    let deadline = tokio::time::Instant::now() + state.limits.request_timeout;
    loop {
        let event = tokio::time::timeout_at(deadline, stream.recv())
            .await
            .map_err(|_| ApiError::internal("compaction exceeded the server's time limit"))?;
        match event {
            Some(GenerationEvent::Delta { text, .. }) => summary.push_str(&text),
            Some(GenerationEvent::Finished { text, usage, .. }) => {
                summary.push_str(&text);
                let usage = Usage::new(usage.input_tokens, usage.cached_tokens, usage.output_tokens, 0);
                return Ok((summary.trim().to_string(), usage));
            }
            Some(GenerationEvent::Failed { message }) => return Err(ApiError::model_error(message)),
            Some(GenerationEvent::Started { .. }) => {}
            None => return Err(ApiError::internal("the scheduler ended the compaction early")),
        }
    }
}
