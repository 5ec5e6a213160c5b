//! Refined activations (see [`Linear::refine_input`]): a layer's input
//! quantized twice, the values and then their quantization residual, both
//! through the layer's own integer kernels as one batch of twice the tokens.

use super::linear::{matmul_rows, Linear, MatmulJob, MatmulPrecision, PARALLEL_QUANTIZE_TOKENS};
use crate::error::Result;
use crate::quant::dequant::QK_K;
use crate::quant::dot::{quantize_row_q8, Q8Block, QK};
use crate::quant::kquant::{quantize_row_q8k, Q8KBlock};

/// A block of 8-bit activations: how it is made and what it holds.
trait ActivationBlock: Default + Clone {
    /// Values per block.
    const SIZE: usize;
    /// Quantizes `x` into `out` (the kernels' own function).
    fn quantize(x: &[f32], out: &mut [Self]);
    /// The scale and the values (value = scale · q).
    fn scale_and_values(&self) -> (f32, &[i8]);
}

impl ActivationBlock for Q8Block {
    const SIZE: usize = QK;
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_row_q8(x, out)
    }
    fn scale_and_values(&self) -> (f32, &[i8]) {
        (self.d, &self.qs)
    }
}

impl ActivationBlock for Q8KBlock {
    const SIZE: usize = QK_K;
    fn quantize(x: &[f32], out: &mut [Self]) {
        quantize_row_q8k(x, out)
    }
    fn scale_and_values(&self) -> (f32, &[i8]) {
        (self.d, &self.qs)
    }
}

/// `out = x − dequantize(quantize(x))` in blocks of `B`.
fn residual<B: ActivationBlock>(x: &[f32], out: &mut [f32]) {
    let mut blocks = vec![B::default(); x.len() / B::SIZE];
    B::quantize(x, &mut blocks);
    for ((block, xb), ob) in blocks.iter().zip(x.chunks_exact(B::SIZE)).zip(out.chunks_exact_mut(B::SIZE)) {
        let (d, qs) = block.scale_and_values();
        for ((o, v), &q) in ob.iter_mut().zip(xb).zip(qs) {
            *o = v - d * f32::from(q);
        }
    }
}

/// `x`'s residual after 8-bit quantization into `out`, quantized the way
/// `layer`'s kernels quantize it (per 256 values for K-quants, per 32
/// otherwise).
fn residual_into(layer: &Linear, x: &[f32], out: &mut [f32]) {
    if layer.takes_q8k(MatmulPrecision::Fast) {
        residual::<Q8KBlock>(x, out)
    } else {
        residual::<Q8Block>(x, out)
    }
}

/// `job`'s layer (fast mode, input refined) over `n` tokens: the tokens and
/// then their quantization residuals run as `2n` tokens of one matmul,
/// and each token's output is the sum of its two (no bias).
pub(super) fn matmul_refined(job: &mut MatmulJob<'_>, x: &[f32], n: usize) -> Result<()> {
    let (cols, rows, layer) = (job.layer.cols(), job.layer.rows(), job.layer);
    let mut input = vec![0f32; 2 * n * cols];
    let (values, residuals) = input.split_at_mut(n * cols);
    values.copy_from_slice(&x[..n * cols]);
    let mut tokens: Vec<(&mut [f32], &[f32])> = residuals.chunks_mut(cols).zip(values.chunks(cols)).collect();
    if n >= PARALLEL_QUANTIZE_TOKENS {
        crate::pool::for_each_mut(&mut tokens, |_, (out, xt)| residual_into(layer, xt, out));
    } else {
        tokens.iter_mut().for_each(|(out, xt)| residual_into(layer, xt, out));
    }
    let mut both = vec![0f32; 2 * n * rows];
    matmul_rows(&mut [MatmulJob { layer, out: &mut both }], &input, 2 * n, MatmulPrecision::Fast)?;
    let (values, residuals) = both.split_at(n * rows);
    for ((o, v), r) in job.out[..n * rows].iter_mut().zip(values).zip(residuals) {
        *o = v + r;
    }
    Ok(())
}
