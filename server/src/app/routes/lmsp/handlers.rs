//! `/lmsp/v1/` handlers.

use crate::app::runtime::idempotency::{header_key, run_once};
use crate::app::http::json::json_text;
use crate::app::routes::lmsp::map::{request_to_engine, LmspRequest};
use crate::app::routes::lmsp::reply::{check_version, outcome_response};
use crate::app::http::problem::Problem;
use crate::protocol::lmsp::{CAPABILITIES, LMSP_VERSION};
use crate::app::runtime::drive::{drive, Outgoing, Sink, STREAM_BUFFER};
use crate::app::access::auth::Tenant;
use crate::app::runtime::start::{start_turn, StartedTurn};
use crate::app::runtime::stored::with_owned;
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::lmsp::{LmspEvent, LmspResponse};
use crate::protocol::ResponseStatus;
use crate::app::http::extract::JsonWithBytes;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// POST /lmsp/v1/responses
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    JsonWithBytes { value, bytes }: JsonWithBytes<LmspRequest>,
) -> Result<Response, Problem> {
    check_version(&headers)?;
    let streaming = value.streaming();
    let Some(key) = header_key(&headers) else {
        return if streaming { stream(state, &value, &tenant).await } else { Ok(outcome_response(run_sync(&state, &value, &tenant).await)) };
    };
    if streaming {
        return Err(ApiError::invalid("stream", "Idempotency-Key applies to non-streaming requests; for resumable streamed output create a task.").into());
    }
    let outcome = run_once(&state.idempotency, "", &headers, &key, &bytes, || run_sync(&state, &value, &tenant)).await?;
    Ok(outcome_response(outcome))
}

/// Runs a non-streaming request to its end: (status, body).
async fn run_sync(state: &Arc<AppState>, value: &LmspRequest, tenant: &Tenant) -> (u16, String) {
    match run_sync_inner(state, value, tenant).await {
        Ok(r) => (200, json_text(&r)),
        Err(p) => (p.0.status, p.to_json_text()),
    }
}

async fn run_sync_inner(state: &Arc<AppState>, value: &LmspRequest, tenant: &Tenant) -> Result<LmspResponse, Problem> {
    let turn = start_turn(state, request_to_engine(value)?, None, tenant).await?;
    let StartedTurn { stream, mapper, persist, .. } = turn;
    let response = drive(state.clone(), stream, mapper, None, persist).await;
    if let Some(error) = response.error.as_ref().filter(|_| response.status == ResponseStatus::Failed) {
        return Err(ApiError::model_error(error.message.clone()).into());
    }
    Ok(LmspResponse::from(&response))
}

/// Streams LMSP events (integer ids from 1); the stream belongs to this connection.
async fn stream(state: Arc<AppState>, value: &LmspRequest, tenant: &Tenant) -> Result<Response, Problem> {
    let turn = start_turn(&state, request_to_engine(value)?, None, tenant).await?;
    let StartedTurn { stream, mapper, persist, id, .. } = turn;
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(drive(state, stream, mapper, Some(Sink::new(tx)), persist));
    let mut next_id = 0u64;
    let frames = ReceiverStream::new(rx).filter_map(move |outgoing| match outgoing {
        Outgoing::Event(event) => LmspEvent::from_stream(&event, &id).map(|e| {
            next_id += 1;
            e.sse_frame(next_id)
        }),
        Outgoing::KeepAlive => Some(crate::app::http::sse::KEEP_ALIVE.to_string()),
        Outgoing::Done => None,
    });
    Ok(crate::app::routes::lmsp::reply::sse_response(Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>))))
}

/// GET /lmsp/v1/responses/{id}: a response saved with `store: true`.
pub async fn retrieve(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, Path(id): Path<String>) -> Response {
    let key = id.clone();
    match with_owned(&state, &tenant, move |s| s.get(&key)).await {
        Ok(Some(stored)) => outcome_response((200, json_text(&LmspResponse::from(&stored.response)))),
        Ok(None) => Problem(ApiError::not_found(format!("No stored response with id '{id}'.")).with_code("response_not_found")).into_response(),
        Err(e) => Problem(e).into_response(),
    }
}

/// GET /lmsp/v1/capabilities
pub async fn capabilities(State(state): State<Arc<AppState>>) -> Response {
    let body = json!({"lmsp_version": LMSP_VERSION, "capabilities": CAPABILITIES, "models": [state.model.name]});
    outcome_response((200, body.to_string()))
}
