//! Starting a turn: validate a create body against the server's limits,
//! resolve the conversation, render and submit it for a tenant.

use crate::app::access::auth::Tenant;
use crate::app::format::reasoning::ReasoningSplitter;
use crate::app::runtime::drive::Persist;
use crate::app::runtime::state::AppState;
use crate::app::runtime::stored::{stored_input_items, unix_now};
use crate::app::runtime::turn;
use crate::protocol::error::ApiError;
use crate::protocol::mapper::ResponseMapper;
use crate::protocol::request::{validate, RequestLimits, ValidRequest};
use crate::protocol::InputItem;
use serde_json::Value;
use std::sync::Arc;

/// A validated turn, submitted to the scheduler, ready to be driven.
pub struct StartedTurn {
    /// The checked request (sampling defaults filled in).
    pub req: ValidRequest,
    /// The scheduler's event stream for this turn.
    pub stream: spindle_scheduler::EventStream,
    /// Maps the stream onto response events.
    pub mapper: ResponseMapper,
    /// What to store.
    pub persist: Persist,
    /// The new response's id.
    pub id: String,
    /// The conversation's earlier items (previous turns' inputs and outputs).
    pub history: Vec<InputItem>,
}

/// Validates a create body, resolves the conversation (from `local_history`
/// when the caller has it, else from the tenant's stored responses by
/// `previous_response_id`), renders and submits the turn for `tenant`.
pub async fn start_turn(state: &Arc<AppState>, value: Value, local_history: Option<Vec<InputItem>>, tenant: &Tenant) -> Result<StartedTurn, ApiError> {
    let req = validate_for(state, value)?;
    start_valid(state, req, TurnPrompt::Chat(local_history), tenant).await
}

/// Where a turn's prompt comes from.
pub enum TurnPrompt {
    /// The chat template over the conversation (its earlier items from
    /// `local_history` when given, else from the store).
    Chat(Option<Vec<InputItem>>),
    /// These token ids as they are (a raw completion).
    Raw(Vec<u32>),
}

/// [`start_turn`] for a request already validated (and adjusted) by the caller.
pub async fn start_valid(state: &Arc<AppState>, req: ValidRequest, prompt: TurnPrompt, tenant: &Tenant) -> Result<StartedTurn, ApiError> {
    let slot = state.slots.acquire(tenant, state.limits.max_streams_per_tenant)?;
    let (history, raw) = match prompt {
        TurnPrompt::Chat(local_history) => (turn::resolve_history(state, req.previous_response_id.clone(), local_history, tenant).await?, None),
        TurnPrompt::Raw(ids) => (Vec::new(), Some(ids)),
    };
    // Rendering, tokenizing and compiling the grammar are CPU work: off the
    // async threads.
    let (st, r, t) = (state.clone(), req.clone(), tenant.clone());
    let (history, stream, opens_thinking, prompt) = tokio::task::spawn_blocking(move || {
        let prepared = match raw {
            Some(prompt) => turn::PreparedTurn { prompt, history },
            None => turn::prepare(&st, &r, history, &t)?,
        };
        let opens_thinking = turn::prompt_opens_thinking(&st, &prepared.prompt);
        let stream = turn::submit(&st, &r, prepared.prompt.clone(), &t)?;
        Ok::<_, ApiError>((prepared.history, stream, opens_thinking, prepared.prompt))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    let id = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let mapper = ResponseMapper::new(id.clone(), unix_now(), &req);
    let reasoning = state.model.think_tags.map(|t| ReasoningSplitter::new(t, opens_thinking));
    let persist = Persist { store: req.store, input_items: stored_input_items(&req), background: req.background, reasoning, prompt,
        summary: req.reasoning.and_then(|r| r.summary), cache_salt: tenant.cache_salt(req.prompt_cache_key.as_deref()),
        tenant: tenant.clone(), control: None, slot: Some(slot), logprobs: req.wants_logprobs() };
    Ok(StartedTurn { req, stream, mapper, persist, id, history })
}

/// Validates a request body against this server's limits, fills in the
/// server's sampling defaults and checks (or sets) the model name.
pub fn validate_for(state: &AppState, value: Value) -> Result<ValidRequest, ApiError> {
    let limits = RequestLimits {
        max_input_items: state.limits.max_input_items,
        max_tools: state.limits.max_tools,
        max_output_tokens: state.limits.max_output_tokens as u32,
    };
    let mut req = validate(value, &limits)?;
    let d = state.limits.sampling;
    let s = &mut req.sampling;
    s.temperature.get_or_insert(d.temperature);
    s.top_p.get_or_insert(d.top_p);
    s.top_k.get_or_insert(d.top_k);
    s.min_p.get_or_insert(d.min_p);
    check_model(state, req.model.as_deref())?;
    req.model = Some(state.model.name.clone());
    Ok(req)
}

/// A request's `model`, if given, must be the one this server serves (404 otherwise).
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !state.model.answers_to(m) => Err(ApiError::model_not_found(m)),
        _ => Ok(()),
    }
}
