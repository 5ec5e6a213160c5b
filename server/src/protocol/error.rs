//! The one error type of the Open Responses layer, with its wire shapes.
//!
//! Error `type` strings follow the digest's section 6 table, with the
//! OpenAI-style `invalid_request_error` for the table's `invalid_request`
//! (what the OpenAI SDK and clients expect):
//!
//! | kind | `type` | usual status |
//! |---|---|---|
//! | [`ErrorKind::InvalidRequest`] | `invalid_request_error` | 400 (413 for bodies that are too large) |
//! | [`ErrorKind::Authentication`] | `authentication_error` | 401 (not in the spec; OpenAI's name) |
//! | [`ErrorKind::NotFound`] | `not_found` | 404 |
//! | [`ErrorKind::TooManyRequests`] | `too_many_requests` | 429 |
//! | [`ErrorKind::ServerError`] | `server_error` | 500 |
//! | [`ErrorKind::ModelError`] | `model_error` | 500 |

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The error category, serialized as the error's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `invalid_request_error`: the request is malformed or not allowed.
    InvalidRequest,
    /// `authentication_error`: a missing or wrong API key.
    Authentication,
    /// `not_found`: a model, response or route that does not exist.
    NotFound,
    /// `too_many_requests`: the server is at capacity; retrying later helps.
    TooManyRequests,
    /// `server_error`: a failure on the server's side; retrying may help.
    ServerError,
    /// `model_error`: the model produced something unusable.
    ModelError,
}

impl ErrorKind {
    /// The wire `type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::NotFound => "not_found",
            Self::TooManyRequests => "too_many_requests",
            Self::ServerError => "server_error",
            Self::ModelError => "model_error",
        }
    }
}

/// Error codes this layer produces (the `code` field), in one place.
pub mod codes {
    /// A field has the wrong JSON type.
    pub const INVALID_TYPE: &str = "invalid_type";
    /// A field's value is not allowed (enum, pattern, combination).
    pub const INVALID_VALUE: &str = "invalid_value";
    /// A required field is absent.
    pub const MISSING_REQUIRED_PARAMETER: &str = "missing_required_parameter";
    /// An integer is below its minimum.
    pub const INTEGER_BELOW_MIN_VALUE: &str = "integer_below_min_value";
    /// An integer is above its maximum.
    pub const INTEGER_ABOVE_MAX_VALUE: &str = "integer_above_max_value";
    /// A number is below its minimum.
    pub const DECIMAL_BELOW_MIN_VALUE: &str = "decimal_below_min_value";
    /// A number is above its maximum.
    pub const DECIMAL_ABOVE_MAX_VALUE: &str = "decimal_above_max_value";
    /// A string is empty where it must not be.
    pub const EMPTY_STRING: &str = "empty_string";
    /// A string is longer than allowed.
    pub const STRING_ABOVE_MAX_LENGTH: &str = "string_above_max_length";
    /// An array (or object) has more entries than allowed.
    pub const ARRAY_ABOVE_MAX_LENGTH: &str = "array_above_max_length";
    /// The body is not valid JSON.
    pub const INVALID_JSON: &str = "invalid_json";
    /// The model cannot take this content (e.g. images on a text-only model).
    pub const UNSUPPORTED_CAPABILITY: &str = "unsupported_capability";
    /// The prompt does not fit the model's context window.
    pub const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";
    /// The requested model is not served here.
    pub const MODEL_NOT_FOUND: &str = "model_not_found";
    /// `previous_response_id` names no known response.
    pub const PREVIOUS_RESPONSE_NOT_FOUND: &str = "previous_response_not_found";
    /// Some other resource does not exist.
    pub const NOT_FOUND: &str = "not_found";
    /// The server is at capacity.
    pub const RATE_LIMIT_EXCEEDED: &str = "rate_limit_exceeded";
    /// The request body is larger than allowed.
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    /// Missing or wrong API key.
    pub const INVALID_API_KEY: &str = "invalid_api_key";
    /// A failure on the server's side.
    pub const SERVER_ERROR: &str = "server_error";
    /// The model produced something unusable.
    pub const MODEL_ERROR: &str = "model_error";
}

/// An error as the API reports it: HTTP status, category, code, message and
/// the request field it concerns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// Category (the wire `type`).
    pub kind: ErrorKind,
    /// Machine-readable detail, e.g. `model_not_found`.
    pub code: Option<String>,
    /// Human-readable message.
    pub message: String,
    /// The offending request field as a path, e.g. `input[2].content[0].type`.
    pub param: Option<String>,
    /// Seconds after which a retry may succeed (a `Retry-After` header).
    pub retry_after: Option<u64>,
}

/// The `error` object inside the streaming `error` event:
/// `{type, code, message, param}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorPayload {
    /// The error category (`invalid_request_error`, `server_error`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// Machine-readable detail.
    pub code: Option<String>,
    /// Human-readable message.
    pub message: String,
    /// The offending request field.
    pub param: Option<String>,
}

/// A failed response's `error`: `{code, message}`, both required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseError {
    /// Machine-readable code (never null).
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// A general error with no code, param or retry hint.
    pub fn new(status: u16, kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            code: None,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// Sets `code`.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    /// Sets `param`.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// The same error with a `param` path that starts with `from` starting
    /// with `to` instead (a field checked under another request's name).
    pub fn renamed_param(mut self, from: &str, to: &str) -> Self {
        if let Some(rest) = self.param.as_deref().and_then(|p| p.strip_prefix(from)) {
            let renamed = format!("{to}{rest}");
            self.message = self.message.replace(&format!("'{from}"), &format!("'{to}"));
            self.param = Some(renamed);
        }
        self
    }

    /// 400 `invalid_request_error`, code `invalid_value`, naming `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::invalid_with_code(param, codes::INVALID_VALUE, message)
    }

    /// 400 `invalid_request_error` with the given code, naming `param`.
    pub fn invalid_with_code(
        param: impl Into<String>,
        code: &str,
        message: impl Into<String>,
    ) -> Self {
        Self::new(400, ErrorKind::InvalidRequest, message)
            .with_code(code)
            .with_param(param)
    }

    /// 400: the body is not JSON (`detail` is the parser's message).
    pub fn invalid_json(detail: impl std::fmt::Display) -> Self {
        Self::new(
            400,
            ErrorKind::InvalidRequest,
            format!("We could not parse the JSON body of your request: {detail}"),
        )
        .with_code(codes::INVALID_JSON)
    }

    /// 404 `model_not_found` for `model`.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            404,
            ErrorKind::NotFound,
            format!("The model '{model}' does not exist or is not served here."),
        )
        .with_code(codes::MODEL_NOT_FOUND)
        .with_param("model")
    }

    /// 404 `previous_response_not_found` for `id`.
    pub fn previous_response_not_found(id: &str) -> Self {
        Self::new(
            404,
            ErrorKind::NotFound,
            format!("Previous response with id '{id}' not found."),
        )
        .with_code(codes::PREVIOUS_RESPONSE_NOT_FOUND)
        .with_param("previous_response_id")
    }

    /// 400 `context_length_exceeded`: `tokens` do not fit in `limit`.
    pub fn context_length_exceeded(tokens: usize, limit: usize) -> Self {
        Self::new(
            400,
            ErrorKind::InvalidRequest,
            format!(
                "The input is {tokens} tokens, but this model's context window leaves room for \
                 at most {limit}. Shorten the input or set truncation to \"auto\"."
            ),
        )
        .with_code(codes::CONTEXT_LENGTH_EXCEEDED)
        .with_param("input")
    }

    /// 400 `unsupported_capability`: content at `param` the model can't take.
    pub fn unsupported_capability(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::invalid_with_code(param, codes::UNSUPPORTED_CAPABILITY, message)
    }

    /// 429 `too_many_requests`; `retry_after` in seconds when known.
    pub fn too_many_requests(retry_after: Option<u64>) -> Self {
        let mut err = Self::new(
            429,
            ErrorKind::TooManyRequests,
            "The server is at capacity; retry the request later.",
        )
        .with_code(codes::RATE_LIMIT_EXCEEDED);
        err.retry_after = retry_after;
        err
    }

    /// 413 `payload_too_large`: the body exceeds `limit_bytes`.
    pub fn payload_too_large(limit_bytes: usize) -> Self {
        Self::new(
            413,
            ErrorKind::InvalidRequest,
            format!("The request body exceeds the limit of {limit_bytes} bytes."),
        )
        .with_code(codes::PAYLOAD_TOO_LARGE)
    }

    /// 401 `invalid_api_key`.
    pub fn unauthorized() -> Self {
        Self::new(
            401,
            ErrorKind::Authentication,
            "Missing or invalid API key: send 'Authorization: Bearer <key>'.",
        )
        .with_code(codes::INVALID_API_KEY)
    }

    /// 404 `not_found` with a message naming what is missing.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, ErrorKind::NotFound, message).with_code(codes::NOT_FOUND)
    }

    /// 503 `server_error`, code `service_unavailable`: the server cannot
    /// take work now (a load balancer should route elsewhere).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, ErrorKind::ServerError, message).with_code("service_unavailable")
    }

    /// 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, ErrorKind::ServerError, message).with_code(codes::SERVER_ERROR)
    }

    /// 500 `model_error`.
    pub fn model_error(message: impl Into<String>) -> Self {
        Self::new(500, ErrorKind::ModelError, message).with_code(codes::MODEL_ERROR)
    }

    /// The HTTP (non-streaming) body:
    /// `{"error":{"message","type","param","code"}}`.
    pub fn to_body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind.as_str(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// The WebSocket error envelope (digest §7):
    /// `{"type":"error","status","error":{"code","message","param","type"}}`.
    pub fn to_ws_envelope(&self) -> Value {
        json!({
            "type": "error",
            "status": self.status,
            "error": {
                "code": self.code.clone().unwrap_or_else(|| self.kind.as_str().to_owned()),
                "message": self.message,
                "param": self.param,
                "type": self.kind.as_str(),
            }
        })
    }

    /// The `error` object of the streaming `error` event.
    pub fn to_payload(&self) -> ErrorPayload {
        ErrorPayload {
            kind: self.kind.as_str().to_owned(),
            code: self.code.clone(),
            message: self.message.clone(),
            param: self.param.clone(),
        }
    }

    /// A failed response's `error` (`code` falls back to the `type`).
    pub fn to_response_error(&self) -> ResponseError {
        ResponseError {
            code: self
                .code
                .clone()
                .unwrap_or_else(|| self.kind.as_str().to_owned()),
            message: self.message.clone(),
        }
    }
}
