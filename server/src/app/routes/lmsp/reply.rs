//! LMSP's side of every answer: the version header checked on requests and
//! set on replies, JSON and problem bodies, and SSE responses.

use crate::app::http::problem::Problem;
use crate::app::http::sse;
use crate::protocol::error::ApiError;
use crate::protocol::lmsp::LMSP_VERSION;
use crate::protocol::ErrorKind;
use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

pub fn check_version(headers: &HeaderMap) -> Result<(), Problem> {
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

pub fn outcome_response((status, body): (u16, String)) -> Response {
    let content_type = if status >= 400 { "application/problem+json" } else { "application/json" };
    let mut r = (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r.headers_mut().insert("lmsp-version", HeaderValue::from_static(LMSP_VERSION));
    r
}

/// An SSE response with LMSP's version header.
pub fn sse_response(body: Body) -> Response {
    let mut r = sse::response(body);
    r.headers_mut().insert("lmsp-version", HeaderValue::from_static(LMSP_VERSION));
    r
}
