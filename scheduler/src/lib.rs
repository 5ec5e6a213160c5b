//! Spindle's scheduler: continuous batching over a paged KV cache.
//!
//! One step-loop thread owns all state: the waiting queue, the running
//! sequences and the [`kv_cache::KvCacheManager`] (ref-counted blocks, LRU
//! free list, prefix cache). Each step [`core`] plans a `ForwardBatch` mixing
//! decode tokens and prefill chunks under a token budget, the engine runs it,
//! and the results become [`GenerationEvent`]s. Callers use
//! [`SchedulerHandle`] (`submit`, `abort`) and read an [`EventStream`];
//! dropping the stream aborts the request.

pub mod config;
pub mod core;
pub mod handle;
pub mod kv_cache;
pub mod metrics;
pub mod output;
pub mod request;
mod sequence;

pub use config::{ModelLimits, SchedulerConfig};
pub use handle::{EventStream, SchedulerHandle, SubmitError};
pub use metrics::{Metrics, MetricsSnapshot};
pub use request::{FinishReason, GeneratedToken, GenerationEvent, GenerationRequest, Usage};
pub use sequence::RequestId;
