//! The one place API errors become HTTP responses.

use crate::protocol::error::ApiError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(self.to_body())).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        response
    }
}

/// A query string that does not parse: 400 in the protocol's shape, naming
/// the parameter when the parser says which one (axum's own answer is
/// `text/plain`).
pub fn query_error(rejection: axum::extract::rejection::QueryRejection) -> ApiError {
    let text = rejection.body_text();
    let detail = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text);
    let param = detail.split_once(':').map(|(field, _)| field.trim()).filter(|f| !f.is_empty() && !f.contains(' '));
    ApiError::invalid(param.unwrap_or("query"), format!("Invalid query string: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::Query;
    use axum::http::Uri;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Q {
        after: Option<u64>,
    }

    #[test]
    fn a_bad_query_value_is_a_400_naming_the_parameter() -> Result<(), String> {
        let uri: Uri = "/x?after=abc".parse().map_err(|e| format!("{e}"))?;
        let Err(rejection) = Query::<Q>::try_from_uri(&uri) else { return Err("parsed".into()) };
        let e = query_error(rejection);
        assert_eq!((e.status, e.param.as_deref()), (400, Some("after")), "{e:?}");
        assert!(e.message.contains("invalid digit"), "{}", e.message);
        Ok(())
    }
}
