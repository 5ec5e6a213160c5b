//! `/lmsp/v1/tasks`: responses run as tasks, independent of any connection,
//! with resumable event streams (`Last-Event-ID` or `?after=N`, `after`
//! wins), a retention period for the history (then `410
//! event_history_expired`), and cancel.

use crate::app::routes::lmsp::reply::{check_version, outcome_response, sse_response};
use crate::app::runtime::idempotency::{header_key, run_once};
use crate::app::runtime::tasks::LiveTask;
use crate::app::http::json::json_text;
use crate::app::routes::lmsp::map::{request_to_engine, LmspRequest};
use crate::app::http::problem::Problem;
use crate::app::routes::lmsp::task_run::run_task;
use crate::app::access::auth::Tenant;
use crate::app::runtime::start::{start_turn, StartedTurn};
use crate::app::runtime::stored::{with_owned, with_store};
use crate::app::runtime::stored::unix_now;
use crate::app::http::sse;
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::ErrorKind;
use crate::store::{TaskEvent, TaskRecord};
use axum::body::Body;
use crate::app::http::extract::{JsonWithBytes, QueryParams};
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

/// How long a cancel waits for the task's terminal event.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// Keep-alive comments on an idle event stream.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

/// POST /lmsp/v1/tasks: 202 with the task object (and `Location`).
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    headers: HeaderMap,
    JsonWithBytes { value, bytes }: JsonWithBytes<LmspRequest>,
) -> Result<Response, Problem> {
    check_version(&headers)?;
    let Some(key) = header_key(&headers) else {
        return Ok(outcome_response(start(&state, &value, &tenant).await));
    };
    let outcome = run_once(&state.idempotency, "tasks:", &headers, &key, &bytes, || start(&state, &value, &tenant)).await?;
    Ok(outcome_response(outcome))
}

/// Starts the task: (status, body) as for an idempotent outcome.
async fn start(state: &Arc<AppState>, value: &LmspRequest, tenant: &Tenant) -> (u16, String) {
    match start_inner(state, value, tenant).await {
        Ok(task) => (202, json_text(&task.view())),
        Err(p) => (p.0.status, p.to_json_text()),
    }
}

async fn start_inner(state: &Arc<AppState>, value: &LmspRequest, tenant: &Tenant) -> Result<TaskRecord, Problem> {
    let request = request_to_engine(&LmspRequest { stream: Some(false), ..value.clone() })?;
    let turn = start_turn(state, request, None, tenant).await?;
    let StartedTurn { stream, mapper, persist, id, .. } = turn;
    let record = TaskRecord {
        id: format!("task_{}", uuid::Uuid::new_v4().simple()),
        response_id: id,
        created_at: unix_now(),
        status: "in_progress".into(),
        finished_at: None,
        last_event_id: 0,
        response: None,
        tenant: tenant.as_str().to_string(),
    };
    let to_store = record.clone();
    with_store(state, move |s| s.put_task(&to_store)).await?;
    let live = LiveTask::new(record.clone(), stream.id());
    state.tasks.insert(live.clone());
    tokio::spawn(run_task(state.clone(), live, stream, mapper, persist));
    Ok(record)
}

/// GET /lmsp/v1/tasks/{id}
pub async fn retrieve(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, Path(id): Path<String>) -> Response {
    match find(&state, &id, &tenant).await {
        Ok(task) => outcome_response((200, json_text(&task.view()))),
        Err(p) => p.into_response(),
    }
}

/// POST /lmsp/v1/tasks/{id}/cancel: stops a running task (its stream ends
/// with `response.cancelled`); a finished task is returned unchanged.
pub async fn cancel(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, Path(id): Path<String>) -> Response {
    if let Some(live) = state.tasks.get(&id, tenant.as_str()) {
        let mut published = live.subscribe();
        live.request_cancel();
        state.scheduler.abort(live.request);
        let ended = async {
            while !live.ended() {
                if published.changed().await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(CANCEL_WAIT, ended).await;
        return outcome_response((200, json_text(&live.record().view())));
    }
    retrieve(State(state), Extension(tenant), Path(id)).await
}

async fn find(state: &Arc<AppState>, id: &str, tenant: &Tenant) -> Result<TaskRecord, Problem> {
    if let Some(live) = state.tasks.get(id, tenant.as_str()) {
        return Ok(live.record());
    }
    let key = id.to_string();
    with_owned(state, tenant, move |s| s.get_task(&key))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("No task with id '{id}'.")).with_code("task_not_found").into())
}

/// Query of the events endpoint.
#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    after: Option<u64>,
}

/// GET /lmsp/v1/tasks/{id}/events: the events after `?after=N` (or the
/// `Last-Event-ID` header), then live ones until the terminal event.
pub async fn events(
    State(state): State<Arc<AppState>>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<EventsQuery>,
    headers: HeaderMap,
) -> Response {
    match events_inner(state, id, q, headers, tenant).await {
        Ok(r) => r,
        Err(p) => p.into_response(),
    }
}

async fn events_inner(state: Arc<AppState>, id: String, q: EventsQuery, headers: HeaderMap, tenant: Tenant) -> Result<Response, Problem> {
    let after = match (q.after, headers.get("last-event-id")) {
        (Some(after), _) => after,
        (None, Some(h)) => h.to_str().ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
            Problem::from(ApiError::invalid("Last-Event-ID", "Last-Event-ID must be an integer event id."))
        })?,
        (None, None) => 0,
    };
    if let Some(live) = state.tasks.get(&id, tenant.as_str()) {
        return Ok(sse_response(follow(live, after)));
    }
    let task = find(&state, &id, &tenant).await?;
    if after >= task.last_event_id {
        return Ok(sse_response(Body::empty()));
    }
    let retention = state.limits.task_event_retention.as_secs();
    let expired = task.finished_at.is_some_and(|f| unix_now() >= f.saturating_add(i64::try_from(retention).unwrap_or(i64::MAX)));
    let key = id.clone();
    let stored = if expired { Vec::new() } else { with_owned(&state, &tenant, move |s| s.task_events(&key, after)).await?.unwrap_or_default() };
    // Stored events run without gaps, except after a crash: events published
    // live but not yet stored are lost, and the restart's terminal event
    // follows them. A reader resuming inside that gap still gets the end.
    if stored.is_empty() {
        return Err(ApiError::new(410, ErrorKind::InvalidRequest,
            format!("The events of task '{id}' after {after} are past their retention period; GET /lmsp/v1/tasks/{id} has the final result."))
            .with_code("event_history_expired")
            .into());
    }
    let body: String = stored.iter().map(frame).collect();
    Ok(sse_response(Body::from(body)))
}

/// Replays a running task's events after `after`, then follows it live.
fn follow(live: Arc<LiveTask>, mut after: u64) -> Body {
    let (tx, rx) = mpsc::channel::<String>(64);
    tokio::spawn(async move {
        let mut published = live.subscribe();
        loop {
            for e in live.events_after(after) {
                if tx.send(frame(&e)).await.is_err() {
                    return;
                }
                after = e.id;
                if e.is_terminal() {
                    return;
                }
            }
            tokio::select! {
                changed = published.changed() => if changed.is_err() { return },
                _ = tx.closed() => return,
                _ = tokio::time::sleep(KEEP_ALIVE_EVERY) => {
                    if tx.send(sse::KEEP_ALIVE.to_string()).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, std::convert::Infallible>))
}

fn frame(e: &TaskEvent) -> String {
    e.sse_frame()
}

