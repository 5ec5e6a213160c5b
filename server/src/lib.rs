//! Spindle's server: the Open Responses protocol over HTTP (JSON and SSE).
pub mod app;
pub mod net;
pub mod store;
pub mod protocol;
