//! The engine's error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An I/O failure on a named file.
    #[error("i/o error on {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A GGUF file is malformed (truncated, bad magic, offset out of bounds...).
    #[error("invalid GGUF: {0}")]
    InvalidGguf(String),
    /// A safetensors file or HF model directory is malformed.
    #[error("invalid model directory: {0}")]
    InvalidModelDir(String),
    /// A tensor the model needs is not in the weights.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor has a shape other than the one the config implies.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Tensor name.
        name: String,
        /// Shape required by the model config.
        expected: Vec<usize>,
        /// Shape found in the file.
        actual: Vec<usize>,
    },
    /// The architecture is not one Spindle implements.
    #[error("unsupported architecture `{0}`")]
    UnsupportedArchitecture(String),
    /// A tensor data type (quantization) Spindle cannot use.
    #[error("unsupported tensor type {0}")]
    UnsupportedDtype(String),
    /// A model config value is missing or invalid.
    #[error("invalid model config: {0}")]
    InvalidConfig(String),
    /// Tokenizer construction or use failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// Chat template parsing or rendering failed.
    #[error("chat template error: {0}")]
    Template(String),
    /// A sequence would not fit in the model's context window.
    #[error("sequence of {len} tokens exceeds the context length of {max}")]
    ContextLengthExceeded {
        /// Tokens the sequence would hold.
        len: usize,
        /// The model's context length.
        max: usize,
    },
    /// A forward batch is inconsistent (bad block table, empty sequence...).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A model name is neither a path nor in the model cache.
    #[error("model `{0}` not found (not a path, and not in the model cache)")]
    ModelNotFound(String),
    /// Sampling parameters are out of range (temperature < 0, top_p outside (0, 1]...).
    #[error("invalid sampling parameters: {0}")]
    InvalidSampling(String),
    /// The compute backend (the GPU) failed or is unavailable.
    #[error("backend: {0}")]
    Backend(String),
}

/// Result alias for the engine.
pub type Result<T> = std::result::Result<T, EngineError>;
