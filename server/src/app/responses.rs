//! `/v1/responses` handlers.

use super::auth::Tenant;
use super::background::Stopped;
use super::drive::{drive, Persist, Sink, STREAM_BUFFER};
use super::reasoning::ReasoningSplitter;
use super::sse;
use super::state::AppState;
use super::turn;
use crate::protocol::error::ApiError;
use crate::protocol::items::{InputContent, MessageContent, Role};
use crate::protocol::InputItem;
use crate::protocol::mapper::ResponseMapper;
use crate::protocol::request::{validate, RequestLimits, ValidRequest};
use crate::store::{Order, Owned, ResponseStore, StoreError, StoredResponse};
use super::extract::{JsonBody, QueryParams};
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// POST /v1/responses
pub async fn create(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, JsonBody(value): JsonBody<Value>) -> Result<Response, ApiError> {
    let turn = start_turn(&state, value, None, &tenant).await?;
    let StartedTurn { req, stream, mapper, persist, id, .. } = turn;
    if req.background {
        return Ok(Json(super::background::start(state, stream, mapper, persist, id).await?).into_response());
    }
    if req.stream {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(drive(state, stream, mapper, Some(Sink::new(tx)), persist));
        return Ok(sse::of_events(rx));
    }
    let response = drive(state, stream, mapper, None, persist).await;
    Ok(Json(response).into_response())
}

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

pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
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

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("No response found with id '{id}'."))
}

async fn load(state: &Arc<AppState>, tenant: &Tenant, id: String) -> Result<StoredResponse, ApiError> {
    let missing = not_found(&id);
    with_owned(state, tenant, move |s| s.get(&id)).await?.ok_or(missing)
}

/// Query of GET /v1/responses/{id}.
#[derive(Debug, Deserialize)]
pub struct RetrieveQuery {
    stream: Option<bool>,
    starting_after: Option<u64>,
}

/// GET /v1/responses/{id} (with `?stream=true` it replays the stored events).
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<RetrieveQuery>,
) -> Result<Response, ApiError> {
    let record = load(&state, &tenant, id.clone()).await?;
    if q.stream != Some(true) {
        return Ok(Json(record.response).into_response());
    }
    let events = with_owned(&state, &tenant, move |s| s.events(&id, q.starting_after)).await?.unwrap_or_default();
    let mut body: String = events.iter().map(sse::frame).collect();
    body.push_str(sse::DONE);
    Ok(sse::response(Body::from(body)))
}

/// DELETE /v1/responses/{id}
pub async fn delete(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let key = id.clone();
    if with_owned(&state, &tenant, move |s| s.tenant_owns(&key)).await? {
        // A running response stops first, so that its end is not written
        // after the delete.
        if let Some(running) = super::background::running(&state, &id) {
            running.stop(&state, Stopped::Deleted).await;
        }
    }
    let key = id.clone();
    let deleted = with_owned(&state, &tenant, move |s| s.delete(&key)).await?;
    if !deleted {
        return Err(not_found(&id));
    }
    state.model.ledger.forget(&id);
    Ok(Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response())
}

/// POST /v1/responses/{id}/cancel (background responses only): a running
/// one stops and is stored `cancelled` with what it produced; a finished one
/// is returned as it is.
pub async fn cancel(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let record = load(&state, &tenant, id.clone()).await?;
    if !record.background {
        return Err(ApiError::invalid("response_id", "Only background responses can be cancelled."));
    }
    let Some(running) = super::background::running(&state, &id) else {
        return Ok(Json(record.response).into_response());
    };
    running.stop(&state, Stopped::Cancelled).await;
    Ok(Json(load(&state, &tenant, id).await?.response).into_response())
}

/// Query of GET /v1/responses/{id}/input_items.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
    order: Option<String>,
}

/// GET /v1/responses/{id}/input_items
pub async fn input_items(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(20).clamp(1, 100);
    let order = match q.order.as_deref() {
        Some("asc") => Order::Asc,
        None | Some("desc") => Order::Desc,
        Some(_) => return Err(ApiError::invalid("order", "order must be 'asc' or 'desc'")),
    };
    let key = id.clone();
    let items = with_owned(&state, &tenant, move |s| s.input_items(&key, q.after.as_deref(), limit + 1, order))
        .await?
        .ok_or_else(|| not_found(&id))?;
    let has_more = items.len() > limit;
    let data: Vec<InputItem> = items.into_iter().take(limit).collect();
    let id_at = |item: Option<&InputItem>| item.and_then(InputItem::item_id).map(str::to_owned);
    let page = ItemPage { object: "list", first_id: id_at(data.first()), last_id: id_at(data.last()), data, has_more };
    Ok((StatusCode::OK, Json(page)).into_response())
}

/// A page of `input_items`.
#[derive(serde::Serialize)]
struct ItemPage {
    object: &'static str,
    data: Vec<InputItem>,
    first_id: Option<String>,
    last_id: Option<String>,
    has_more: bool,
}
