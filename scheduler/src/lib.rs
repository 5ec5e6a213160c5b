//! Spindle's scheduler: continuous batching over a paged KV cache.
//!
//! Placeholder crate: the scheduler issue builds the block pool, prefix cache
//! and step loop here. The engine already takes a `ForwardBatch` of sequences
//! with block tables, which is what this crate will produce.
