//! Request bodies arrive in time: a body must be read completely within
//! [`crate::app::runtime::state::Limits::body_read_timeout`] (408 otherwise) and within the size
//! limit (413), before the handler sees it, so a client trickling a body
//! byte by byte cannot hold a connection and a handler. Runs after
//! authentication: bodies of refused requests are never read.

use crate::app::http::problem::Problem;
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use crate::protocol::ErrorKind;
use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Middleware: reads the whole body within the time and size limits.
pub async fn read_in_time(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let problem_shape = crate::app::http::extract::wants_problem(request.uri().path());
    let (parts, body) = request.into_parts();
    let limit = state.limits.max_body_bytes;
    let read = tokio::time::timeout(state.limits.body_read_timeout, axum::body::to_bytes(body, limit)).await;
    let error = match read {
        Ok(Ok(bytes)) => return next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(e)) if is_too_large(&e) => ApiError::payload_too_large(limit),
        Ok(Err(_)) => ApiError::invalid("body", "The request body could not be read."),
        Err(_) => ApiError::new(
            408,
            ErrorKind::InvalidRequest,
            format!("The request body did not arrive within {} s.", state.limits.body_read_timeout.as_secs()),
        )
        .with_code("request_timeout"),
    };
    if problem_shape {
        Problem(error).into_response()
    } else {
        error.into_response()
    }
}

fn is_too_large(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}
