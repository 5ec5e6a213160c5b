//! The HTTP application: routes, middleware and handlers over [`AppState`].
//!
//! The layout shows the layers; each imports only from the ones above it in
//! this list (checked by `import_layers_point_one_way` below):
//! - [`format`]: the model's output formats (tool-call syntax and its
//!   grammars, reasoning tags, the token ledger), plain functions of text and
//!   tokens, testable without a server;
//! - [`metrics`]: the Prometheus registry and its families;
//! - [`access`]: who is calling (API keys and tenants), their stream slots,
//!   and the sealing key of opaque blobs;
//! - [`runtime`]: the shared state and the life of a turn (validate, render,
//!   submit, drive the event stream, store, run in the background);
//! - [`http`]: transport plumbing (body extractors and their errors, SSE
//!   framing, problem documents, the access log);
//! - [`routes`]: the handlers of each API surface (Responses, WebSocket,
//!   compaction, Chat Completions, LMSP, tokenize, operations).

pub mod access;
pub mod format;
pub mod http;
pub mod metrics;
pub mod routes;
pub mod runtime;

use routes::{chat, compact, lmsp, ops, responses, tokenize, ws};
use http::{access_log, body};

pub use runtime::state::{AppState, Limits, ModelInfo, SamplingDefaults};

use crate::protocol::error::ApiError;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;

/// The whole router (tests drive it without a socket, `serve` binds it).
pub fn app(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/responses", post(responses::create).get(ws::upgrade))
        .route("/v1/responses/compact", post(compact::compact))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/v1/models", get(ops::models))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(chat::completions))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/metrics", get(ops::metrics))
        .layer(middleware::from_fn_with_state(state.clone(), body::read_in_time))
        .layer(middleware::from_fn_with_state(state.clone(), require_key));
    let lmsp_routes = Router::new()
        .route("/lmsp/v1/responses", post(lmsp::create))
        .route("/lmsp/v1/responses/{id}", get(lmsp::retrieve))
        .route("/lmsp/v1/capabilities", get(lmsp::capabilities))
        .route("/lmsp/v1/tasks", post(lmsp::tasks::create))
        .route("/lmsp/v1/tasks/{id}", get(lmsp::tasks::retrieve))
        .route("/lmsp/v1/tasks/{id}/events", get(lmsp::tasks::events))
        .route("/lmsp/v1/tasks/{id}/cancel", post(lmsp::tasks::cancel))
        .layer(middleware::from_fn_with_state(state.clone(), body::read_in_time))
        .layer(middleware::from_fn_with_state(state.clone(), require_key_problem));
    Router::new()
        .merge(v1)
        .merge(lmsp_routes)
        .route("/health", get(ops::health))
        .route("/ready", get(ops::ready))
        .fallback(|| async { ApiError::not_found("No such route.") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(405, crate::protocol::ErrorKind::InvalidRequest, "Method not allowed for this route.")
        })
        .layer(middleware::from_fn_with_state(state.clone(), count_requests))
        .layer(DefaultBodyLimit::max(state.limits.max_body_bytes))
        .with_state(state)
}

/// `/metrics` alone, without authentication, for a separate listen address
/// (`--metrics-addr`) that only a scraper reaches.
pub fn metrics_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(ops::metrics))
        .fallback(|| async { ApiError::not_found("No such route.") })
        .with_state(state)
}

/// Admits a request whose key is configured, with its [`auth::Tenant`] in
/// the request's extensions for the handlers; `None` when it is refused.
fn admit(state: &AppState, mut request: Request) -> Option<Request> {
    let auth = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let tenant = state.keys.identify(auth)?;
    request.extensions_mut().insert(tenant);
    Some(request)
}

async fn require_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match admit(&state, request) {
        Some(request) => next.run(request).await,
        None => ApiError::unauthorized().into_response(),
    }
}

async fn require_key_problem(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match admit(&state, request) {
        Some(request) => next.run(request).await,
        None => http::problem::Problem(ApiError::unauthorized()).into_response(),
    }
}

/// Request id (`x-request-id`, echoed or made), an access log line, and the
/// per-route request counter.
async fn count_requests(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "other".into());
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 128)
        .map(str::to_string)
        .unwrap_or_else(|| format!("req_{}", uuid::Uuid::new_v4().simple()));
    let method = request.method().to_string();
    let started = std::time::Instant::now();
    let mut response = next.run(request).await;
    let status = response.status().as_u16();
    state.metrics.request(&route, status);
    if let Ok(v) = header::HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    access_log::log(access_log::AccessLine { request_id: id, method, route, status, started }, response)
}

#[cfg(test)]
mod layers_test;
