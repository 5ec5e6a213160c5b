//! Extractors whose rejections are the protocol's own errors: a body that is
//! not JSON (or not the expected shape) and a query string that does not
//! parse are 400s in the Responses error shape, or as problem documents on
//! LMSP routes, never axum's `text/plain`.

use crate::app::http::problem::Problem;
use crate::app::runtime::state::AppState;
use crate::protocol::error::ApiError;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// Whether errors on this path are answered as LMSP problem documents.
pub fn wants_problem(path: &str) -> bool {
    path.starts_with("/lmsp/")
}

/// A refused request, answered in the error shape of the route it came to.
#[derive(Debug)]
pub struct Rejected {
    /// What was wrong.
    pub error: ApiError,
    /// Answer as an LMSP problem document.
    pub problem: bool,
}

impl Rejected {
    fn for_path(error: ApiError, path: &str) -> Self {
        Self { error, problem: wants_problem(path) }
    }
}

impl IntoResponse for Rejected {
    fn into_response(self) -> Response {
        if self.problem {
            Problem(self.error).into_response()
        } else {
            self.error.into_response()
        }
    }
}

/// A JSON body parsed as `T`.
pub struct JsonBody<T>(pub T);

/// A JSON body parsed as `T`, with the bytes it came in (LMSP idempotency
/// compares them).
pub struct JsonWithBytes<T> {
    /// The parsed body.
    pub value: T,
    /// The body as received.
    pub bytes: Bytes,
}

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = Rejected;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, Rejected> {
        let JsonWithBytes { value, .. } = JsonWithBytes::from_request(request, state).await?;
        Ok(Self(value))
    }
}

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for JsonWithBytes<T> {
    type Rejection = Rejected;

    async fn from_request(request: Request, state: &Arc<AppState>) -> Result<Self, Rejected> {
        let path = request.uri().path().to_owned();
        let limit = state.limits.max_body_bytes;
        let bytes = Bytes::from_request(request, state).await.map_err(|_| Rejected::for_path(ApiError::payload_too_large(limit), &path))?;
        let value = parse_json(&bytes).map_err(|e| Rejected::for_path(e, &path))?;
        Ok(Self { value, bytes })
    }
}

/// `bytes` as `T`; a syntax or shape error says where (`param` is the path
/// of the field that did not fit, when there is one).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(shape_error)?;
    deserializer.end().map_err(ApiError::invalid_json)?;
    Ok(value)
}

/// `value` as `T`, with the same errors as [`parse_json`].
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(shape_error)
}

/// A syntax error is `invalid_json`; JSON of the wrong shape is
/// `invalid_value` naming the field (`body` at the top level).
fn shape_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if !inner.is_data() {
        return ApiError::invalid_json(inner);
    }
    let param = if path == "." { "body".to_owned() } else { path };
    ApiError::invalid(param.clone(), format!("Invalid value for '{param}': {inner}"))
}

/// A query string parsed as `T`.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = Rejected;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Rejected> {
        match Query::<T>::try_from_uri(&parts.uri) {
            Ok(Query(q)) => Ok(Self(q)),
            Err(rejection) => Err(Rejected::for_path(query_error(rejection), parts.uri.path())),
        }
    }
}

/// A query string that does not parse: 400 naming the parameter when the
/// parser says which one.
pub fn query_error(rejection: axum::extract::rejection::QueryRejection) -> ApiError {
    let text = rejection.body_text();
    let detail = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text);
    let param = detail.split_once(':').map(|(field, _)| field.trim()).filter(|f| !f.is_empty() && !f.contains(' '));
    ApiError::invalid(param.unwrap_or("query"), format!("Invalid query string: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{header, StatusCode};

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Q {
        after: Option<u64>,
    }

    async fn query_rejection(uri: &str) -> Result<Rejected, String> {
        let (mut parts, ()) = axum::http::Request::get(uri).body(()).map_err(|e| e.to_string())?.into_parts();
        match QueryParams::<Q>::from_request_parts(&mut parts, &()).await {
            Ok(_) => Err(format!("{uri} parsed")),
            Err(r) => Ok(r),
        }
    }

    #[tokio::test]
    async fn a_bad_query_value_is_a_400_naming_the_parameter() -> Result<(), String> {
        let r = query_rejection("/v1/responses/x?after=abc").await?;
        assert_eq!((r.error.status, r.error.param.as_deref(), r.problem), (400, Some("after"), false), "{r:?}");
        assert!(r.error.message.contains("invalid digit"), "{}", r.error.message);
        let response = r.into_response();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        Ok(())
    }

    #[tokio::test]
    async fn lmsp_routes_get_problem_documents() -> Result<(), String> {
        let r = query_rejection("/lmsp/v1/tasks/t/events?after=-1").await?;
        assert!(r.problem, "{r:?}");
        let response = r.into_response();
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        Ok(())
    }

    #[test]
    fn a_body_of_the_wrong_shape_names_the_problem() {
        let e = parse_json::<Q>(br#"{"after": "x"}"#).err();
        let e = e.map(|e| (e.status, e.code, e.param, e.message));
        assert!(matches!(&e, Some((400, Some(code), Some(param), m)) if code == "invalid_value" && param == "after" && m.contains("invalid type")), "{e:?}");
        let syntax = parse_json::<Q>(b"{\"after\": ").err().and_then(|e| e.code);
        assert_eq!(syntax.as_deref(), Some("invalid_json"));
        let nested = parse_json::<Vec<Q>>(br#"[{"after": 1}, {"after": -1}]"#).err().and_then(|e| e.param);
        assert_eq!(nested.as_deref(), Some("[1].after"));
        assert!(parse_json::<Q>(br#"{"after": 3} trailing"#).is_err());
        assert!(parse_json::<Q>(b"{").is_err());
        assert!(matches!(parse_json::<Q>(br#"{"after": 3}"#), Ok(Q { after: Some(3) })));
    }
}
