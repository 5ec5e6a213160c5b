//! LMSP errors as problem documents (`application/problem+json`).

use crate::protocol::error::ApiError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use crate::protocol::lmsp::ProblemDoc;

/// An error in LMSP's shape.
#[derive(Debug, Clone)]
pub struct Problem(pub ApiError);

impl Problem {
    /// The machine-readable code (falls back to the error category).
    pub fn code(&self) -> String {
        self.0.code.clone().unwrap_or_else(|| self.0.kind.as_str().to_owned())
    }

    /// The problem document: `type`, `title`, `status`, `detail`, `code` (and `param` when known).
    pub fn to_doc(&self) -> ProblemDoc {
        ProblemDoc { param: self.0.param.clone(), ..ProblemDoc::new(self.0.status, &self.code(), self.0.message.clone()) }
    }

    /// The problem document as JSON text.
    pub fn to_json_text(&self) -> String {
        crate::app::http::json::json_text(&self.to_doc())
    }
}

impl From<ApiError> for Problem {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, self.to_json_text()).into_response();
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        h.insert("lmsp-version", HeaderValue::from_static(crate::protocol::lmsp::LMSP_VERSION));
        if let Some(secs) = self.0.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                h.insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}
