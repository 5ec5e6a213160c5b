//! A uniform view of named tensors, whatever file format they come from.

use crate::error::{EngineError, Result};
use crate::gguf::types::GgmlType;

/// Borrowed raw bytes of one tensor plus how to read them.
///
/// `shape` is row-major, outermost dimension first (the HF / PyTorch order;
/// GGUF stores dims innermost first, so its reader reverses them). For a
/// linear weight that is `[out_features, in_features]`.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// Tensor name as stored in the file.
    pub name: String,
    /// Element type / quantization.
    pub dtype: GgmlType,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The raw bytes (exactly `dtype.bytes_for(numel)` long).
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Error unless the shape equals `expected`.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<()> {
        if self.shape != expected {
            return Err(EngineError::ShapeMismatch {
                name: self.name.clone(),
                expected: expected.to_vec(),
                actual: self.shape.clone(),
            });
        }
        Ok(())
    }
}

/// Anything that hands out tensors by name (a GGUF file, a safetensors directory).
pub trait TensorSource {
    /// The tensor called `name`, or `EngineError::MissingTensor`.
    fn tensor(&self, name: &str) -> Result<TensorView<'_>>;
    /// Whether a tensor called `name` exists.
    fn contains(&self, name: &str) -> bool;
}
