//! The LMSP 1.0 facade under `/lmsp/v1/` (the seed's request, response and
//! event shapes over the same engine): version negotiation, declared
//! capabilities, `Idempotency-Key`, problem documents, and SSE with integer
//! event ids from 1.

mod handlers;
pub mod map;
mod reply;
mod task_run;
pub mod tasks;

pub use handlers::{capabilities, create, retrieve};

pub use crate::protocol::lmsp::{CAPABILITIES, LMSP_VERSION};

