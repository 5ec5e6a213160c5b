//! The server's shared state and the life of a turn: validate and render a
//! request, submit it to the scheduler, drive its event stream into typed
//! events, store the result, or run it in the background; running LMSP
//! tasks and idempotency keys.

pub mod background;
pub mod compaction;
pub mod control;
pub mod drive;
pub mod idempotency;
pub mod logprobs;
pub mod start;
pub mod state;
pub mod stored;
pub mod summary;
pub mod tasks;
pub mod truncate;
pub mod turn;
