//! Spindle's engine: loads weights (GGUF, HF safetensors), the tokenizer and
//! chat template, and runs Llama-family models on a backend through a paged
//! KV pool. It knows nothing of HTTP or scheduling policy.

pub mod backend;
pub mod batch;
pub mod chat_template;
pub mod config;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod hf;
pub mod kv;
pub mod load;
pub mod model;
pub mod models;
pub mod open;
pub mod perplexity;
pub mod pool;
pub mod quant;
pub mod runner;
pub mod sampling;
pub mod simd;
pub mod tokenizer;
pub mod weights;

pub use error::{EngineError, Result};
pub use open::{open, Device, EngineOptions, OpenedModel};
