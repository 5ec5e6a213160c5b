//! GGML tensor data types and their block layouts.

use crate::error::{EngineError, Result};

/// A GGML tensor element type, as stored in GGUF tensor infos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 4-bit, 32 per block, one f16 scale.
    Q4_0,
    /// 4-bit, 32 per block, f16 scale and min.
    Q4_1,
    /// 5-bit, 32 per block, one f16 scale (value = d·(q − 16)).
    Q5_0,
    /// 5-bit, 32 per block, f16 scale and min (value = d·q + m).
    Q5_1,
    /// 8-bit, 32 per block, one f16 scale.
    Q8_0,
    /// 8-bit, 32 per block, f32 scale and f32 sum (activation type; not in files).
    Q8_1,
    /// 4-bit k-quant, 256 per super-block.
    Q4K,
    /// 5-bit k-quant, 256 per super-block.
    Q5K,
    /// 6-bit k-quant, 256 per super-block.
    Q6K,
}

impl GgmlType {
    /// The types a GGUF file's tensors may have, as named in errors.
    pub const SUPPORTED_NAMES: &'static str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

    /// Map the numeric type id used in GGUF files.
    pub fn from_id(id: u32) -> Result<Self> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            other => {
                return Err(EngineError::UnsupportedDtype(format!(
                    "ggml type id {other} (supported: {})",
                    Self::SUPPORTED_NAMES
                )))
            }
        })
    }

    /// The numeric id used in GGUF files.
    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q8_1 => 9,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::BF16 => 30,
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 40,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    /// Bytes needed for `n` elements; errors if `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Result<usize> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return Err(EngineError::InvalidGguf(format!(
                "{n} elements is not a multiple of the {self:?} block size {bs}"
            )));
        }
        (n / bs)
            .checked_mul(self.type_size())
            .ok_or_else(|| EngineError::InvalidGguf(format!("tensor of {n} elements overflows")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in [0u32, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 30] {
            assert_eq!(GgmlType::from_id(id).map(|t| t.id()).ok(), Some(id));
        }
        match GgmlType::from_id(10) {
            Err(EngineError::UnsupportedDtype(m)) => assert!(m.contains("id 10") && m.contains("Q5_0"), "{m}"),
            other => panic!("Q2_K (id 10) must be refused naming the supported types, got {other:?}"),
        }
    }

    #[test]
    fn partial_block_is_an_error() {
        assert!(GgmlType::Q4_1.bytes_for(33).is_err());
        assert_eq!(GgmlType::Q4_1.bytes_for(64).ok(), Some(40));
    }
}
