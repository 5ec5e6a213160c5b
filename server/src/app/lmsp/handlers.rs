//! `/lmsp/v1/` handlers.

use super::idempotency::{header_key, run_once};
use super::map::{json_text, request_to_engine, LmspRequest};
use super::problem::Problem;
use super::{CAPABILITIES, LMSP_VERSION};
use crate::app::drive::{drive, Outgoing, Sink, STREAM_BUFFER};
use crate::app::auth::Tenant;
use crate::app::responses::{start_turn, with_owned, StartedTurn};
use crate::app::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::lmsp::{LmspEvent, LmspResponse};
use crate::protocol::{ErrorKind, ResponseStatus};
use crate::app::extract::JsonWithBytes;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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

pub(super) fn check_version(headers: &HeaderMap) -> Result<(), Problem> {
    let Some(asked) = headers.get("lmsp-version") else { return Ok(()) };
    let asked = asked.to_str().unwrap_or("");
    if asked.split('.').next() == Some("1") {
        return Ok(());
    }
    Err(ApiError::new(400, ErrorKind::InvalidRequest, format!("LMSP-Version '{asked}' is not supported; this server speaks {LMSP_VERSION}."))
        .with_code("unsupported_version")
        .with_param("LMSP-Version")
        .into())
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

pub(super) fn outcome_response((status, body): (u16, String)) -> Response {
    let content_type = if status >= 400 { "application/problem+json" } else { "application/json" };
    let mut r = (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert("lmsp-version", HeaderValue::from_static(LMSP_VERSION));
    r
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
        Outgoing::KeepAlive => Some(crate::app::sse::KEEP_ALIVE.to_string()),
        Outgoing::Done => None,
    });
    Ok(super::tasks::sse_response(Body::from_stream(frames.map(Ok::<_, std::convert::Infallible>))))
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
