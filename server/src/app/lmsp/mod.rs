//! The LMSP 1.0 facade under `/lmsp/v1/` (the seed's request, response and
//! event shapes over the same engine): version negotiation, declared
//! capabilities, `Idempotency-Key`, problem documents, and SSE with integer
//! event ids from 1.

mod handlers;
pub mod idempotency;
pub mod live;
pub mod map;
pub mod problem;
mod task_run;
pub mod tasks;

pub use handlers::{capabilities, create, retrieve};

/// The protocol version served.
pub const LMSP_VERSION: &str = "1.0";

/// Capabilities this server declares (checked on every request).
pub const CAPABILITIES: &[&str] = &["text", "streaming", "tools", "structured_output", "conversations", "tasks"];
