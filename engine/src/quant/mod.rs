//! Quantized block formats: dequantization and SIMD dot products.

pub mod dequant;
pub mod dot;
pub mod gemm;
pub mod kquant;
pub mod quantize_avx512;

pub use dequant::{dequantize, dequantize_row, dequantize_tensor, dequantize_to_vec};
