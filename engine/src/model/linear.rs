//! Linear layers whose weights stay in their file format (quantized blocks or
//! f32) and the CPU matmul over them.
//!
//! Quantized weights are never expanded to f32 up front: Q4_0/Q4_1/Q8_0 rows
//! are multiplied with 8-bit-quantized activations by integer SIMD kernels
//! (the llama.cpp approach), and other block types (K-quants) are dequantized
//! one row at a time into a small scratch buffer. This keeps the resident
//! weights at their file size (98 MB for SmolLM2 Q4_1, not 540 MB) and makes
//! decode memory-bandwidth bound on 4.5 bits per weight instead of 32.

use crate::error::{EngineError, Result};
use crate::gguf::types::GgmlType;
use crate::quant::dequant::dequantize;
use crate::quant::dot::{dot_kernel, quantize_row_q8, DotFn, Q8Block, QK};
use super::SendPtr;
use crate::simd;
use crate::weights::TensorView;
use rayon::prelude::*;

/// How activations meet quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulPrecision {
    /// Quantize activations to 8 bits and use integer kernels (fast; llama.cpp's choice).
    #[default]
    Fast,
    /// Dequantize weight rows to f32 and keep activations in f32 (slow; for validation).
    Exact,
}

enum WeightData {
    F32(Vec<f32>),
    Blocks { dtype: GgmlType, bytes: Vec<u8>, row_bytes: usize, kernel: Option<DotFn> },
}

/// A `[rows, cols]` weight matrix (`y = x · Wᵀ`), optionally with a bias.
pub struct Linear {
    rows: usize,
    cols: usize,
    data: WeightData,
    bias: Option<Vec<f32>>,
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Linear").field("rows", &self.rows).field("cols", &self.cols).finish()
    }
}

/// Convert a float tensor (F32/F16/BF16) or any block type to f32 values.
pub fn tensor_to_f32(t: &TensorView<'_>) -> Result<Vec<f32>> {
    let mut out = vec![0f32; t.numel()];
    dequantize(t.dtype, t.data, &mut out)?;
    Ok(out)
}

impl Linear {
    /// Build from a tensor of shape `[rows, cols]`; float types become f32,
    /// block types keep their bytes.
    pub fn from_tensor(t: &TensorView<'_>, rows: usize, cols: usize) -> Result<Self> {
        t.expect_shape(&[rows, cols])?;
        let data = match t.dtype {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => WeightData::F32(tensor_to_f32(t)?),
            dtype => {
                if cols % dtype.block_size() != 0 {
                    return Err(EngineError::UnsupportedDtype(format!(
                        "{dtype:?} tensor `{}` with {cols} columns (not a whole number of blocks)",
                        t.name
                    )));
                }
                let row_bytes = dtype.bytes_for(cols)?;
                if t.data.len() != row_bytes * rows {
                    return Err(EngineError::InvalidGguf(format!("tensor `{}` has the wrong byte size", t.name)));
                }
                let kernel = if cols % QK == 0 { dot_kernel(dtype) } else { None };
                WeightData::Blocks { dtype, bytes: t.data.to_vec(), row_bytes, kernel }
            }
        };
        Ok(Self { rows, cols, data, bias: None })
    }

    /// Build from plain f32 values, row-major `[rows, cols]`.
    pub fn from_f32(values: Vec<f32>, rows: usize, cols: usize) -> Self {
        debug_assert_eq!(values.len(), rows * cols);
        Self { rows, cols, data: WeightData::F32(values), bias: None }
    }

    /// Attach a bias of length `rows`.
    pub fn with_bias(mut self, bias: Vec<f32>) -> Result<Self> {
        if bias.len() != self.rows {
            return Err(EngineError::InvalidConfig(format!(
                "bias of length {} for a layer with {} outputs",
                bias.len(),
                self.rows
            )));
        }
        self.bias = Some(bias);
        Ok(self)
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the weights occupy in memory.
    pub fn weight_bytes(&self) -> usize {
        match &self.data {
            WeightData::F32(v) => v.len() * 4,
            WeightData::Blocks { bytes, .. } => bytes.len(),
        }
    }

    /// Row `r` of the weights as f32 (used for embedding lookups).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        if r >= self.rows {
            return Err(EngineError::InvalidBatch(format!("row {r} out of range 0..{}", self.rows)));
        }
        match &self.data {
            WeightData::F32(v) => out.copy_from_slice(&v[r * self.cols..(r + 1) * self.cols]),
            WeightData::Blocks { dtype, bytes, row_bytes, .. } => {
                dequantize(*dtype, &bytes[r * row_bytes..(r + 1) * row_bytes], out)?
            }
        }
        Ok(())
    }

    /// `out[t, r] = Σ_c x[t, c] · W[r, c] (+ bias[r])` for `n` rows of `x`.
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32], precision: MatmulPrecision) -> Result<()> {
        if x.len() < n * self.cols || out.len() < n * self.rows {
            return Err(EngineError::InvalidBatch("matmul buffer too small".into()));
        }
        let out_ptr = SendPtr(out.as_mut_ptr());
        let chunk = row_chunk(self.rows);
        let chunks = self.rows.div_ceil(chunk);
        let rows = self.rows;
        let write = |r: usize, t: usize, v: f32| {
            // SAFETY: r < rows and t < n, so the index is inside `out`; each (t, r)
            // is written by exactly one task because tasks own disjoint row ranges.
            unsafe { *out_ptr.get().add(t * rows + r) = v }
        };
        match &self.data {
            WeightData::F32(w) => (0..chunks).into_par_iter().for_each(|c| {
                for r in c * chunk..((c + 1) * chunk).min(rows) {
                    let wr = &w[r * self.cols..(r + 1) * self.cols];
                    for t in 0..n {
                        write(r, t, simd::dot(wr, &x[t * self.cols..(t + 1) * self.cols]));
                    }
                }
            }),
            WeightData::Blocks { kernel: Some(kernel), bytes, row_bytes, .. }
                if precision == MatmulPrecision::Fast =>
            {
                let nb = self.cols / QK;
                let mut xq = vec![Q8Block::default(); n * nb];
                for t in 0..n {
                    quantize_row_q8(&x[t * self.cols..(t + 1) * self.cols], &mut xq[t * nb..(t + 1) * nb]);
                }
                (0..chunks).into_par_iter().for_each(|c| {
                    for r in c * chunk..((c + 1) * chunk).min(rows) {
                        let wr = &bytes[r * row_bytes..(r + 1) * row_bytes];
                        for t in 0..n {
                            write(r, t, kernel(wr, &xq[t * nb..(t + 1) * nb]));
                        }
                    }
                })
            }
            WeightData::Blocks { dtype, bytes, row_bytes, .. } => {
                let failed = std::sync::atomic::AtomicBool::new(false);
                (0..chunks).into_par_iter().for_each(|c| {
                    let mut row = vec![0f32; self.cols];
                    for r in c * chunk..((c + 1) * chunk).min(rows) {
                        if dequantize(*dtype, &bytes[r * row_bytes..(r + 1) * row_bytes], &mut row).is_err() {
                            failed.store(true, std::sync::atomic::Ordering::Relaxed);
                            return;
                        }
                        for t in 0..n {
                            write(r, t, simd::dot(&row, &x[t * self.cols..(t + 1) * self.cols]));
                        }
                    }
                });
                if failed.into_inner() {
                    return Err(EngineError::UnsupportedDtype(format!("{dtype:?} rows could not be dequantized")));
                }
            }
        }
        if let Some(bias) = &self.bias {
            for t in 0..n {
                for (o, b) in out[t * rows..(t + 1) * rows].iter_mut().zip(bias) {
                    *o += b;
                }
            }
        }
        Ok(())
    }
}

fn row_chunk(rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (rows / (threads * 8)).clamp(4, 64)
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_matmul_with_bias() {
        let w = Linear::from_f32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3).with_bias(vec![0.5, -0.5]).expect("bias");
        let x = [1.0, 0.0, -1.0, 2.0, 1.0, 0.0];
        let mut out = [0f32; 4];
        w.forward(&x, 2, &mut out, MatmulPrecision::Fast).expect("forward");
        assert_eq!(out, [1.0 - 3.0 + 0.5, 4.0 - 6.0 - 0.5, 2.0 + 2.0 + 0.5, 8.0 + 5.0 - 0.5]);
    }

    #[test]
    fn buffer_too_small_is_an_error() {
        let w = Linear::from_f32(vec![0.0; 6], 2, 3);
        let mut out = [0f32; 1];
        assert!(w.forward(&[0.0; 3], 1, &mut out, MatmulPrecision::Fast).is_err());
    }
}
