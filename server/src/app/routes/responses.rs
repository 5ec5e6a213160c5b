//! `/v1/responses` handlers.

use crate::app::access::auth::Tenant;
use crate::app::http::extract::{JsonBody, QueryParams};
use crate::app::http::sse;
use crate::app::runtime::control::Stopped;
use crate::app::runtime::drive::{drive, Outgoing, Sink, STREAM_BUFFER};
use crate::app::runtime::start::{start_turn, StartedTurn};
use crate::app::runtime::state::AppState;
use crate::app::runtime::stored::with_owned;
use crate::protocol::error::ApiError;
use crate::protocol::InputItem;
use crate::store::{Order, StoredResponse};
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
        return Ok(Json(crate::app::runtime::background::start(state, stream, mapper, persist, id).await?).into_response());
    }
    if req.stream {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(drive(state, stream, mapper, Some(Sink::new(tx)), persist));
        return Ok(sse::of_events(rx));
    }
    let response = drive(state, stream, mapper, None, persist).await;
    Ok(Json(response).into_response())
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
    let mut body: String = events.into_iter().filter_map(|e| sse::outgoing(Outgoing::Event(e))).collect();
    body.push_str(sse::DONE);
    Ok(sse::response(Body::from(body)))
}

/// DELETE /v1/responses/{id}
pub async fn delete(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let key = id.clone();
    if with_owned(&state, &tenant, move |s| s.tenant_owns(&key)).await? {
        // A running response stops first, so that its end is not written
        // after the delete.
        if let Some(running) = crate::app::runtime::background::running(&state, &id) {
            running.stop(&state.scheduler, Stopped::Deleted).await;
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
    let Some(running) = crate::app::runtime::background::running(&state, &id) else {
        return Ok(Json(record.response).into_response());
    };
    running.stop(&state.scheduler, Stopped::Cancelled).await;
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
