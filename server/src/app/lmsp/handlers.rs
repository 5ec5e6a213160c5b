//! `/lmsp/v1/` handlers.

use super::idempotency::{header_key, run_once};
use super::map::{event_from_engine, request_to_engine, response_from_engine, sse_frame};
use super::problem::Problem;
use super::{CAPABILITIES, LMSP_VERSION};
use crate::app::drive::{drive, Sink};
use crate::app::auth::Tenant;
use crate::app::responses::{start_turn, with_owned, StartedTurn};
use crate::app::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::ErrorKind;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// POST /lmsp/v1/responses
pub async fn create(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Response {
    match create_inner(state, headers, body, tenant).await {
        Ok(r) => r,
        Err(p) => p.into_response(),
    }
}

async fn create_inner(state: Arc<AppState>, headers: HeaderMap, body: Result<Bytes, BytesRejection>, tenant: Tenant) -> Result<Response, Problem> {
    check_version(&headers)?;
    let body = body.map_err(|_| ApiError::payload_too_large(state.limits.max_body_bytes))?;
    let value: Value = serde_json::from_slice(&body).map_err(ApiError::invalid_json)?;
    let streaming = value["stream"].as_bool().unwrap_or(false);
    let Some(key) = header_key(&headers) else {
        return if streaming { stream(state, &value, &tenant).await } else { Ok(outcome_response(run_sync(&state, &value, &tenant).await)) };
    };
    if streaming {
        return Err(ApiError::invalid("stream", "Idempotency-Key applies to non-streaming requests; for resumable streamed output create a task.").into());
    }
    let outcome = run_once(&state.idempotency, "", &headers, &key, &body, || run_sync(&state, &value, &tenant)).await?;
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
async fn run_sync(state: &Arc<AppState>, value: &Value, tenant: &Tenant) -> (u16, String) {
    match run_sync_inner(state, value, tenant).await {
        Ok(v) => (200, v.to_string()),
        Err(p) => (p.0.status, p.to_value().to_string()),
    }
}

async fn run_sync_inner(state: &Arc<AppState>, value: &Value, tenant: &Tenant) -> Result<Value, Problem> {
    let turn = start_turn(state, request_to_engine(value)?, None, tenant).await?;
    let StartedTurn { stream, mapper, persist, .. } = turn;
    let response = drive(state.clone(), stream, mapper, None, persist).await;
    if response["status"] == "failed" {
        let message = response["error"]["message"].as_str().unwrap_or("generation failed").to_string();
        return Err(ApiError::model_error(message).into());
    }
    Ok(response_from_engine(&response))
}

pub(super) fn outcome_response((status, body): (u16, String)) -> Response {
    let content_type = if status >= 400 { "application/problem+json" } else { "application/json" };
    let mut r = (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert("lmsp-version", HeaderValue::from_static(LMSP_VERSION));
    r
}

/// Streams LMSP events (integer ids from 1); the stream belongs to this connection.
async fn stream(state: Arc<AppState>, value: &Value, tenant: &Tenant) -> Result<Response, Problem> {
    let turn = start_turn(&state, request_to_engine(value)?, None, tenant).await?;
    let StartedTurn { stream, mapper, persist, id, .. } = turn;
    let (engine_tx, mut engine_rx) = mpsc::channel::<String>(64);
    let (tx, rx) = mpsc::channel::<String>(64);
    tokio::spawn(drive(state, stream, mapper, Some(Sink::json(engine_tx)), persist));
    tokio::spawn(async move {
        let mut next_id = 1u64;
        while let Some(text) = engine_rx.recv().await {
            let Ok(event) = serde_json::from_str::<Value>(&text) else { continue };
            let Some((name, data)) = event_from_engine(&event, &id) else { continue };
            if tx.send(sse_frame(next_id, &name, &data)).await.is_err() {
                break; // the client left: dropping engine_rx stops the generation
            }
            next_id += 1;
        }
    });
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>));
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("lmsp-version", HeaderValue::from_static(LMSP_VERSION));
    Ok(r)
}

/// GET /lmsp/v1/responses/{id}: a response saved with `store: true`.
pub async fn retrieve(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, Path(id): Path<String>) -> Response {
    let key = id.clone();
    match with_owned(&state, &tenant, move |s| s.get(&key)).await {
        Ok(Some(stored)) => outcome_response((200, response_from_engine(&stored.response).to_string())),
        Ok(None) => Problem(ApiError::not_found(format!("No stored response with id '{id}'.")).with_code("response_not_found")).into_response(),
        Err(e) => Problem(e).into_response(),
    }
}

/// GET /lmsp/v1/capabilities
pub async fn capabilities(State(state): State<Arc<AppState>>) -> Response {
    let body = json!({"lmsp_version": LMSP_VERSION, "capabilities": CAPABILITIES, "models": [state.model.name]});
    outcome_response((200, body.to_string()))
}
