//! Operational routes: models, health, readiness, metrics.

use crate::app::runtime::state::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;

/// GET /v1/models: the one model this daemon serves, under each of its names.
pub async fn models(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let names = std::iter::once(&state.model.name).chain(&state.model.aliases);
    let data: Vec<_> = names
        .map(|name| json!({"id": name, "object": "model", "created": state.model.created, "owned_by": "spindle", "context_length": state.model.context_length, "max_model_len": state.model.context_length}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// GET /health: the process is alive.
pub async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// GET /ready: the model is loaded and the scheduler accepts work; 503 once
/// the scheduler's step loop has died (a load balancer then stops routing here).
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    if state.scheduler.is_running() {
        Json(json!({"status": "ready", "model": state.model.name})).into_response()
    } else {
        let body = json!({"status": "unavailable", "model": state.model.name, "reason": "the scheduler's step loop has stopped"});
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    }
}

/// GET /metrics: the OpenMetrics text format when `Accept` asks for it (as
/// Prometheus does), else the Prometheus 0.0.4 text format.
pub async fn metrics(State(state): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    // NVML calls block (a wedged GPU may hang them): off the async threads.
    let gpu = tokio::task::spawn_blocking(crate::app::metrics::gpu_stats::read).await.ok().flatten();
    let sched = state.scheduler.metrics().snapshot();
    let scrape = crate::app::metrics::Scrape { sched: &sched, model_name: &state.model.name, block_size: state.scheduler.limits().block_size, gpu: gpu.as_ref() };
    let openmetrics = state.metrics.exposition(&scrape);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if crate::app::metrics::text::wants_openmetrics(accept) {
        ([(header::CONTENT_TYPE, crate::app::metrics::CONTENT_TYPE)], openmetrics)
    } else {
        ([(header::CONTENT_TYPE, crate::app::metrics::text::CONTENT_TYPE)], crate::app::metrics::text::from_openmetrics(&openmetrics))
    }
}
