//! LMSP errors as problem documents (`application/problem+json`).

use crate::protocol::error::ApiError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error in LMSP's shape.
#[derive(Debug, Clone)]
pub struct Problem(pub ApiError);

impl Problem {
    /// The machine-readable code (falls back to the error category).
    pub fn code(&self) -> String {
        self.0.code.clone().unwrap_or_else(|| self.0.kind.as_str().to_owned())
    }

    /// The problem object: `type`, `title`, `status`, `detail`, `code` (and `param` when known).
    pub fn to_value(&self) -> Value {
        let code = self.code();
        let mut v = json!({
            "type": format!("https://spindle.dev/problems/{code}"),
            "title": title(&code),
            "status": self.0.status,
            "detail": self.0.message,
            "code": code,
        });
        if let Some(param) = &self.0.param {
            v["param"] = json!(param);
        }
        v
    }
}

impl From<ApiError> for Problem {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

fn title(code: &str) -> String {
    let mut t = code.replace('_', " ");
    if let Some(first) = t.get_mut(..1) {
        first.make_ascii_uppercase();
    }
    t
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, self.to_value().to_string()).into_response();
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        h.insert("lmsp-version", HeaderValue::from_static(super::LMSP_VERSION));
        if let Some(secs) = self.0.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                h.insert(header::RETRY_AFTER, v);
            }
        }
        r
    }
}
