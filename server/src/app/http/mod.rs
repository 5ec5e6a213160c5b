//! Transport plumbing shared by the routes: body extractors whose rejections
//! are the protocol's errors, the body read deadline, SSE framing, problem
//! documents, JSON text, and the access log.

pub mod access_log;
pub mod body;
pub mod error;
pub mod extract;
pub mod json;
pub mod problem;
pub mod sse;
