//! The handlers of each API surface.

pub mod chat;
pub mod compact;
pub mod lmsp;
pub mod ops;
pub mod responses;
pub mod tokenize;
pub mod ws;
