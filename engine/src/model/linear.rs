//! Linear layers whose weights stay in their file format (quantized blocks or
//! f32) and the CPU matmul over them.
//!
//! Quantized weights are never expanded to f32 up front: Q4_0/Q4_1/Q5_0/Q5_1/
//! Q8_0 rows are multiplied with activations quantized to 8 bits per 32
//! values, and K-quant rows (Q4_K/Q5_K/Q6_K) with activations quantized per
//! 256, by integer SIMD kernels (the llama.cpp approach). Only `--precision
//! exact` (or a row length the kernels cannot take) dequantizes rows, one at a
//! time into a small scratch buffer. This keeps the resident
//! weights at their file size (98 MB for SmolLM2 Q4_1, not 540 MB) and makes
//! decode memory-bandwidth bound on 4.5 bits per weight instead of 32.

use crate::error::{EngineError, Result};
use crate::gguf::types::GgmlType;
use crate::quant::dequant::dequantize;
use crate::quant::dot::{dot_kernels, quantize_row_q8, DotKernels, Q8Block, QK};
use crate::quant::dequant::QK_K;
use crate::quant::gemm::{gemm_kernels, interleave, GemmKernels, Q8Group, GROUP};
use crate::quant::kquant::gemm::{interleave_k, kgemm_kernels, KGemmKernels, Q8KGroup};
use crate::quant::kquant::{kdot_kernels, quantize_row_q8k, KDotKernels, Q8KBlock};
use super::sink::Sink;
use super::token_rows::{rows4_tokens, token_rows, TokenKernels};
use super::SendPtr;
use crate::simd;
use crate::weights::WeightBytes;
use crate::weights::TensorView;

/// How activations meet quantized weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulPrecision {
    /// Quantize activations to 8 bits and use integer kernels, and keep the
    /// CPU's KV cache in f16 (fast; llama.cpp's choices).
    #[default]
    Fast,
    /// Dequantize weight rows to f32 and keep activations and the KV cache
    /// in f32 (slow; for validation).
    Exact,
}

enum WeightData {
    F32(Vec<f32>),
    Blocks {
        dtype: GgmlType,
        bytes: WeightBytes,
        row_bytes: usize,
        kernels: Option<DotKernels>,
        gemm: Option<GemmKernels>,
        kquant: Option<KDotKernels>,
        kgemm: Option<KGemmKernels>,
    },
}

/// A `[rows, cols]` weight matrix (`y = x · Wᵀ`), optionally with a bias.
pub struct Linear {
    rows: usize,
    cols: usize,
    data: WeightData,
    bias: Option<Vec<f32>>,
    /// Whether fast mode also multiplies the input's quantization residual
    /// (see [`Linear::refine_input`]).
    refined: bool,
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
            GgmlType::Q8_1 => {
                return Err(EngineError::UnsupportedDtype(format!(
                    "Q8_1 weight `{}` (an activation-only type)",
                    t.name
                )))
            }
            dtype => {
                if !cols.is_multiple_of(dtype.block_size()) {
                    return Err(EngineError::UnsupportedDtype(format!(
                        "{dtype:?} tensor `{}` with {cols} columns (not a whole number of blocks)",
                        t.name
                    )));
                }
                let row_bytes = dtype.bytes_for(cols)?;
                // The bytes kept are the ones checked (a view's `shared` handle, where it has one).
                let bytes = t.keep_bytes();
                if t.data.len() != row_bytes * rows || bytes.len() != t.data.len() {
                    return Err(EngineError::InvalidGguf(format!("tensor `{}` has the wrong byte size", t.name)));
                }
                let kernels = if cols.is_multiple_of(QK) { dot_kernels(dtype) } else { None };
                let gemm = if cols.is_multiple_of(QK) { gemm_kernels(dtype) } else { None };
                let kquant = if cols.is_multiple_of(QK_K) { kdot_kernels(dtype) } else { None };
                let kgemm = if cols.is_multiple_of(QK_K) { kgemm_kernels(dtype) } else { None };
                // Mapped pages are made present now, not in the first request
                // (a copy's pages already are).
                if t.shared.is_some() {
                    std::hint::black_box(bytes.touch_pages());
                }
                WeightData::Blocks { dtype, bytes, row_bytes, kernels, gemm, kquant, kgemm }
            }
        };
        Ok(Self { rows, cols, data, bias: None, refined: false })
    }

    /// Build from plain f32 values, row-major `[rows, cols]`.
    pub fn from_f32(values: Vec<f32>, rows: usize, cols: usize) -> Self {
        debug_assert_eq!(values.len(), rows * cols);
        Self { rows, cols, data: WeightData::F32(values), bias: None, refined: false }
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

    /// Makes fast mode multiply this layer's input in two passes, the
    /// 8-bit quantized values and then their quantization residual (itself
    /// quantized): about 15 bits of activation for twice the tokens, for
    /// inputs whose outliers leave one 8-bit scale per block too coarse.
    /// Every token's result still depends on that token alone.
    pub fn refine_input(&mut self) {
        self.refined = true;
    }

    /// Whether fast mode refines this layer's input: it is marked and
    /// takes 8-bit activations.
    pub(super) fn refines(&self, precision: MatmulPrecision) -> bool {
        self.refined && (self.takes_q8(precision) || self.takes_q8k(precision))
    }

    /// Whether this layer's quantized bytes are `other`'s (shared, not a copy).
    #[cfg(test)]
    fn shares_bytes_with(&self, other: &WeightBytes) -> bool {
        matches!(&self.data, WeightData::Blocks { bytes, .. } if bytes.is_shared_with(other) && bytes.as_ptr() == other.as_ptr())
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
        matmul_many(&mut [MatmulJob { layer: self, out }], x, n, precision)
    }

    /// This layer's weights for the grouped K-quant kernels, where fast
    /// mode multiplies it with them alone (K-quant rows with a grouped
    /// kernel, no bias, no refinement).
    pub(super) fn grouped_rows(&self, precision: MatmulPrecision) -> Option<GroupedRows<'_>> {
        match &self.data {
            WeightData::Blocks { bytes, row_bytes, kgemm: Some(gemm), .. }
                if self.takes_q8k(precision) && self.bias.is_none() && !self.refines(precision) =>
            {
                Some(GroupedRows { gemm, bytes, row_bytes: *row_bytes })
            }
            _ => None,
        }
    }

    /// Whether the fast path multiplies this layer with per-32 8-bit activations.
    fn takes_q8(&self, precision: MatmulPrecision) -> bool {
        precision == MatmulPrecision::Fast && matches!(&self.data, WeightData::Blocks { kernels: Some(_), .. })
    }

    /// Whether the fast path multiplies this layer with per-256 8-bit activations.
    pub(super) fn takes_q8k(&self, precision: MatmulPrecision) -> bool {
        precision == MatmulPrecision::Fast && matches!(&self.data, WeightData::Blocks { kquant: Some(_), .. })
    }

    /// Compute output rows `rows` for all `n` tokens, writing through `write.put(r, t, v)`.
    fn compute_rows(
        &self,
        rows: std::ops::Range<usize>,
        x: &[f32],
        xq: &QuantizedInput,
        n: usize,
        precision: MatmulPrecision,
        write: &Sink,
    ) -> Result<()> {
        let cols = self.cols;
        match &self.data {
            WeightData::Blocks { bytes, row_bytes, gemm: Some(gemm), .. }
                if precision == MatmulPrecision::Fast && !xq.groups.is_empty() =>
            {
                let nb = cols / QK;
                let row = |r: usize| &bytes[r * row_bytes..(r + 1) * row_bytes];
                let mut r = rows.start;
                if let Some(rows4_groups) = gemm.rows4_groups {
                    // Each block of 4 rows unpacked once for all the groups.
                    let mut out = vec![[[0f32; GROUP]; 4]; xq.groups.len() / nb.max(1)];
                    while r + 4 <= rows.end {
                        rows4_groups([row(r), row(r + 1), row(r + 2), row(r + 3)], &xq.groups, nb, &mut out);
                        for (g, four) in out.iter().enumerate() {
                            write.put_group4(r, g, four, n);
                        }
                        r += 4;
                    }
                }
                for r in r..rows.end {
                    for (g, xg) in xq.groups.chunks_exact(nb).enumerate() {
                        let out = (gemm.one)(row(r), xg);
                        for (lane, v) in out.iter().enumerate().take(n.saturating_sub(g * GROUP)) {
                            write.put(r, g * GROUP + lane, *v);
                        }
                    }
                }
            }
            WeightData::Blocks { bytes, row_bytes, kgemm: Some(gemm), kquant, .. }
                if precision == MatmulPrecision::Fast && !xq.kgroups.is_empty() && !prefers_rows4_tokens(kquant, gemm, n, rows.len()) =>
            {
                let row = |r: usize| &bytes[r * row_bytes..(r + 1) * row_bytes];
                super::kquant_grouped::kquant_chunked(gemm, &row, rows, &xq.kgroups, cols / QK_K, n, write);
            }
            WeightData::Blocks { bytes, row_bytes, kquant: Some(k), .. }
                if precision == MatmulPrecision::Fast && !xq.krows.is_empty() =>
            {
                let nb = cols / QK_K;
                let rows = match k.rows4_tokens {
                    Some(many) if n > 1 => rows4_tokens(many, bytes, *row_bytes, rows, &xq.krows, nb, n, write),
                    _ => rows,
                };
                let kernels = TokenKernels { one: k.one, four: k.four, rows4: k.rows4 };
                token_rows(kernels, bytes, *row_bytes, rows, &xq.krows, nb, n, write);
            }
            WeightData::F32(w) => {
                for r in rows {
                    let wr = &w[r * cols..(r + 1) * cols];
                    for t in 0..n {
                        write.put(r, t, simd::dot(wr, &x[t * cols..(t + 1) * cols]));
                    }
                }
            }
            WeightData::Blocks { bytes, row_bytes, kernels: Some(k), .. } if precision == MatmulPrecision::Fast => {
                let kernels = TokenKernels { one: k.one, four: k.four, rows4: k.rows4 };
                token_rows(kernels, bytes, *row_bytes, rows, &xq.rows, cols / QK, n, write);
            }
            WeightData::Blocks { dtype, bytes, row_bytes, .. } => {
                let mut row = vec![0f32; cols];
                for r in rows {
                    dequantize(*dtype, &bytes[r * row_bytes..(r + 1) * row_bytes], &mut row)?;
                    for t in 0..n {
                        write.put(r, t, simd::dot(&row, &x[t * cols..(t + 1) * cols]));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The input of a fast matmul: 8-bit rows (per 32 values), for prefill-sized
/// batches the same values interleaved 16 tokens at a time for the grouped
/// kernel, and 8-bit rows per 256 values for K-quant layers. Each part is
/// empty when no layer of the matmul needs it.
#[derive(Default)]
struct QuantizedInput {
    rows: Vec<Q8Block>,
    groups: Vec<Q8Group>,
    krows: Vec<Q8KBlock>,
    kgroups: Vec<Q8KGroup>,
}

/// A K-quant layer's rows as the grouped kernels take them ([`Linear::grouped_rows`]).
pub(super) struct GroupedRows<'a> {
    /// The layer type's grouped kernels.
    pub(super) gemm: &'a KGemmKernels,
    bytes: &'a [u8],
    row_bytes: usize,
}

impl<'a> GroupedRows<'a> {
    /// Weight row `r`'s super-blocks.
    pub(super) fn row(&self, r: usize) -> &'a [u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// `x` (`n` tokens of `cols` values) quantized per 256 values and
/// interleaved in groups of 16 tokens, as the grouped K-quant kernels take
/// it (empty below [`GROUPED_MIN_TOKENS`] or without the kernels).
pub(super) fn kgroups_of(x: &[f32], n: usize, cols: usize) -> Vec<Q8KGroup> {
    QuantizedInput::new(x, n, cols, false, true).kgroups
}

/// `out = x · layerᵀ` for `n` tokens whose activations are already
/// quantized and interleaved (`kgroups`, `layer.cols() / 256` super-blocks
/// per group): the grouped K-quant kernels, as [`matmul_many`] runs them.
/// Needs a layer with [`Linear::grouped_rows`] and `n >= 16`.
pub(super) fn matmul_kgroups(layer: &Linear, kgroups: Vec<Q8KGroup>, n: usize, out: &mut [f32], precision: MatmulPrecision) -> Result<()> {
    let nb = layer.cols / QK_K;
    if layer.grouped_rows(precision).is_none() || n < GROUP || kgroups.len() < n.div_ceil(GROUP) * nb || out.len() < n * layer.rows {
        return Err(EngineError::InvalidBatch("grouped K-quant matmul: layer, groups or buffer do not match".into()));
    }
    // From 16 tokens every task takes the grouped kernels (never the
    // multi-token kernel, `prefers_rows4_tokens`), which read only `kgroups`:
    // no path reads the (empty) f32 input.
    let xq = QuantizedInput { kgroups, ..QuantizedInput::default() };
    run_tasks(&mut [MatmulJob { layer, out }], &[], &xq, n, precision)
}

/// Batches at least this large use the grouped (token-lane) kernel.
const GROUPED_MIN_TOKENS: usize = 8;

/// Whether a K-quant layer takes a batch of `n` tokens for a task of
/// `task_rows` rows with its four-row multi-token kernel rather than the
/// grouped GEMM: where it has one, below 16 tokens
/// (`cargo bench --bench kernels -- 'kquant_decode_(8|16)tok'`, AMD EPYC
/// VM, 1 thread: at 8 tokens Q4_K 4.1 against 2.0 GiB/s of weights, Q6_K
/// 5.9 against 2.5; at 16 about even, Q4_K 2.3 against 2.5, Q6_K 3.1
/// against 2.4), or below [`AMX_FROM_TOKENS`] where one group runs on AMX
/// tiles and the task has a whole block of rows for them. Types without
/// one (Q5_K) keep the GEMM from 8.
fn prefers_rows4_tokens(kernels: &Option<KDotKernels>, gemm: &KGemmKernels, n: usize, task_rows: usize) -> bool {
    let grouped_from = if amx_from_one_group(gemm, task_rows) { AMX_FROM_TOKENS } else { GROUP };
    n < grouped_from && kernels.is_some_and(|k| k.rows4_tokens.is_some())
}

/// Tokens from which one (partial) group on AMX tiles beats the
/// multi-token kernel, whose cost grows with the tokens while the tiles'
/// does not (Q4_K, 256 MiB of weights, one thread: 46 ms for 8 tokens
/// against ~61 ms on the tiles for any count up to 16;
/// `cargo bench --bench kernels -- kquant_decode`).
const AMX_FROM_TOKENS: usize = 11;

/// Whether `gemm` runs one group of 16 tokens on AMX tiles for a task of
/// `task_rows` rows (the tiles take whole blocks of 32; a smaller task
/// would run its one group on the VNNI kernel).
fn amx_from_one_group(gemm: &KGemmKernels, task_rows: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return gemm.amx.is_some() && gemm.amx_min_groups <= 1 && task_rows >= crate::quant::kquant::amx::ROWS;
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (gemm, task_rows);
        false
    }
}

impl QuantizedInput {
    fn new(x: &[f32], n: usize, cols: usize, q8: bool, q8k: bool) -> Self {
        let mut input = Self::default();
        if q8 && cols.is_multiple_of(QK) {
            let nb = cols / QK;
            input.rows = vec![Q8Block::default(); n * nb];
            per_token(x, cols, &mut input.rows, nb, quantize_row_q8);
            if n >= GROUPED_MIN_TOKENS {
                input.groups = interleave(&input.rows, n, nb);
            }
        }
        if q8k && cols.is_multiple_of(QK_K) {
            let nb = cols / QK_K;
            input.krows = vec![Q8KBlock::default(); n * nb];
            per_token(x, cols, &mut input.krows, nb, quantize_row_q8k);
            if n >= GROUPED_MIN_TOKENS && kgemm_kernels(GgmlType::Q4K).is_some() {
                input.kgroups = interleave_k(&input.krows, n, nb);
            }
        }
        input
    }
}

/// Tokens from which quantizing activations is split across the pool.
pub(super) const PARALLEL_QUANTIZE_TOKENS: usize = 16;

/// `quantize(x[t], out[t])` for every token `t` (`cols` values in, `nb`
/// blocks out); prefill-sized inputs are split across the pool (each token's
/// blocks are the same either way).
fn per_token<B: Send>(x: &[f32], cols: usize, out: &mut [B], nb: usize, quantize: fn(&[f32], &mut [B])) {
    if out.len() / nb.max(1) >= PARALLEL_QUANTIZE_TOKENS {
        let mut tokens: Vec<&mut [B]> = out.chunks_mut(nb).collect();
        crate::pool::for_each_mut(&mut tokens, |t, o| quantize(&x[t * cols..(t + 1) * cols], o));
    } else {
        for (o, xt) in out.chunks_mut(nb).zip(x.chunks(cols)) {
            quantize(xt, o);
        }
    }
}

/// One layer's part of a fused matmul: its weights and its output buffer.
pub struct MatmulJob<'a> {
    /// The layer.
    pub layer: &'a Linear,
    /// `[n, layer.rows()]` output.
    pub out: &'a mut [f32],
}

/// Several layers that read the same input (q/k/v, gate/up) in one parallel
/// region: the input is quantized once and all rows share one task list.
pub fn matmul_many(jobs: &mut [MatmulJob<'_>], x: &[f32], n: usize, precision: MatmulPrecision) -> Result<()> {
    let Some(cols) = jobs.first().map(|j| j.layer.cols) else { return Ok(()) };
    if n == 0 {
        return Ok(());
    }
    for j in jobs.iter() {
        if j.layer.cols != cols || x.len() < n * cols || j.out.len() < n * j.layer.rows {
            return Err(EngineError::InvalidBatch("matmul shapes or buffers do not match".into()));
        }
    }
    if jobs.iter().any(|j| j.layer.refines(precision)) {
        let (refined, mut plain): (Vec<_>, Vec<_>) =
            jobs.iter_mut().map(|j| MatmulJob { layer: j.layer, out: &mut *j.out }).partition(|j| j.layer.refines(precision));
        for mut job in refined {
            super::refine::matmul_refined(&mut job, x, n)?;
        }
        matmul_rows(&mut plain, x, n, precision)?;
    } else {
        matmul_rows(jobs, x, n, precision)?;
    }
    for job in jobs.iter_mut() {
        if let Some(bias) = &job.layer.bias {
            for row in job.out[..n * job.layer.rows].chunks_exact_mut(job.layer.rows) {
                for (o, b) in row.iter_mut().zip(bias) {
                    *o += b;
                }
            }
        }
    }
    Ok(())
}

/// The rows of every job for `n` tokens of `x` (shapes checked), without
/// biases: one quantized input and one parallel region.
pub(super) fn matmul_rows(jobs: &mut [MatmulJob<'_>], x: &[f32], n: usize, precision: MatmulPrecision) -> Result<()> {
    let Some(cols) = jobs.first().map(|j| j.layer.cols) else { return Ok(()) };
    let q8 = jobs.iter().any(|j| j.layer.takes_q8(precision));
    let q8k = jobs.iter().any(|j| j.layer.takes_q8k(precision));
    let xq = QuantizedInput::new(x, n, cols, q8, q8k);
    run_tasks(jobs, x, &xq, n, precision)
}

/// The rows of every job for `n` tokens of `x`, quantized as `xq`: one
/// parallel region.
fn run_tasks(jobs: &mut [MatmulJob<'_>], x: &[f32], xq: &QuantizedInput, n: usize, precision: MatmulPrecision) -> Result<()> {
    let outs: Vec<SendPtr> = jobs.iter_mut().map(|j| SendPtr(j.out.as_mut_ptr())).collect();
    let total_rows: usize = jobs.iter().map(|j| j.layer.rows).sum();
    let chunk = row_chunk(total_rows);
    let tasks: Vec<(usize, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| (0..j.layer.rows).step_by(chunk).map(move |r| (i, r)))
        .collect();
    let layers: Vec<&Linear> = jobs.iter().map(|j| j.layer).collect();
    let failed = std::sync::Mutex::new(None);
    crate::pool::run(tasks.len(), |t| {
        let (i, start) = tasks[t];
        let layer = layers[i];
        let rows = layer.rows;
        let write = Sink { ptr: outs[i], rows, tokens: n };
        if let Err(e) = layer.compute_rows(start..(start + chunk).min(rows), x, xq, n, precision, &write) {
            failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
        }
    });
    failed.into_inner().unwrap_or_else(|p| p.into_inner()).map_or(Ok(()), Err)
}

/// Rows per task for a parallel region over `rows` rows in all.
fn row_chunk(rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (rows / (threads * 4)).clamp(4, 256)
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "needs AVX-512 VNNI (the grouped kernels)")]
    fn kquant_types_with_the_multi_token_kernel_skip_the_gemm_below_16_tokens_or_below_the_tiles() {
        let gemm = kgemm_kernels(GgmlType::Q4K).expect("grouped kernels on a CPU with AVX-512 VNNI");
        let (q4k, q6k) = (kdot_kernels(GgmlType::Q4K), kdot_kernels(GgmlType::Q6K));
        assert!(!prefers_rows4_tokens(&kdot_kernels(GgmlType::Q5K), &gemm, 8, 64), "Q5_K has no multi-token kernel: grouped GEMM from 8");
        assert!(!prefers_rows4_tokens(&None, &gemm, 8, 64));
        assert!(!prefers_rows4_tokens(&q4k, &gemm, 16, 64), "from 16 tokens the grouped GEMM");
        let has_many = q4k.is_some_and(|k| k.rows4_tokens.is_some());
        assert_eq!(prefers_rows4_tokens(&q4k, &gemm, 8, 64), has_many);
        let tiles = amx_from_one_group(&gemm, 64);
        assert_eq!(prefers_rows4_tokens(&q4k, &gemm, 15, 64), has_many && !tiles, "one group on tiles from {AMX_FROM_TOKENS} tokens");
        assert_eq!(prefers_rows4_tokens(&q4k, &gemm, 15, 31), has_many, "a task under 32 rows has no block for the tiles");
        assert_eq!(prefers_rows4_tokens(&q4k, &gemm, 10, 64), has_many);
        let gemm6 = kgemm_kernels(GgmlType::Q6K).expect("grouped kernels");
        assert!(!amx_from_one_group(&gemm6, 64), "Q6_K's tiles win from two groups");
        assert_eq!(prefers_rows4_tokens(&q6k, &gemm6, 15, 64), q6k.is_some_and(|k| k.rows4_tokens.is_some()));
    }

    #[test]
    fn f32_matmul_with_bias() {
        let w = Linear::from_f32(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3).with_bias(vec![0.5, -0.5]).expect("bias");
        let x = [1.0, 0.0, -1.0, 2.0, 1.0, 0.0];
        let mut out = [0f32; 4];
        w.forward(&x, 2, &mut out, MatmulPrecision::Fast).expect("forward");
        assert_eq!(out, [1.0 - 3.0 + 0.5, 4.0 - 6.0 - 0.5, 2.0 + 2.0 + 0.5, 8.0 + 5.0 - 0.5]);
    }

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    /// A `[rows, cols]` layer of random blocks whose f16 scale fields are sane.
    fn random_layer(dtype: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Linear {
        let ts = dtype.type_size();
        let mut bytes: Vec<u8> = (0..rows * cols / dtype.block_size() * ts).map(|_| lcg(seed) as u8).collect();
        let scale_fields: &[usize] = match dtype {
            GgmlType::Q6K => &[208],
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            _ => &[0, 2],
        };
        for b in bytes.chunks_exact_mut(ts) {
            for &at in scale_fields {
                let v = half::f16::from_f32(0.001 + (lcg(seed) % 64) as f32 / 8000.0).to_bits().to_le_bytes();
                b[at..at + 2].copy_from_slice(&v);
            }
        }
        let view = TensorView { name: format!("{dtype:?}"), dtype, shape: vec![rows, cols], data: &bytes, shared: None };
        Linear::from_tensor(&view, rows, cols).expect("layer")
    }

    /// A view whose shared handle disagrees with its bytes is refused.
    #[test]
    fn a_view_whose_shared_bytes_differ_in_length_is_refused() {
        let bytes = vec![0u8; 2 * 34];
        let short = crate::weights::WeightBytes::owned(vec![0u8; 34]);
        let view = TensorView { name: "w".into(), dtype: GgmlType::Q8_0, shape: vec![2, 32], data: &bytes, shared: Some(short) };
        assert!(Linear::from_tensor(&view, 2, 32).is_err());
    }

    /// A random `dtype` layer written to a GGUF file and read back through
    /// `read`; the layer from the file must hold the file's bytes (no copy)
    /// and, once the file handle is gone, compute what the copy does.
    fn check_layer_keeps_the_files_bytes(dtype: GgmlType, rows: usize, cols: usize, read: impl FnOnce(&crate::gguf::GgufWriter) -> crate::gguf::GgufFile) {
        let mut seed = 5u64;
        let copied = random_layer(dtype, rows, cols, &mut seed);
        let WeightData::Blocks { bytes, .. } = &copied.data else { panic!("a block layer") };
        let mut w = crate::gguf::GgufWriter::new();
        w.add_tensor("w", dtype, &[rows, cols], bytes.to_vec()).expect("tensor");
        let file = read(&w);
        let view = crate::weights::TensorSource::tensor(&file, "w").expect("view");
        let mapped = Linear::from_tensor(&view, rows, cols).expect("layer");
        let file_bytes = view.shared.clone().expect("a GGUF view shares its bytes");
        assert!(mapped.shares_bytes_with(&file_bytes), "the layer holds the file's bytes, not a copy");
        assert!(!copied.shares_bytes_with(&file_bytes));
        drop(view);
        drop(file);
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 - 30.0) / 17.0).collect();
        let (mut a, mut b) = (vec![0f32; rows], vec![0f32; rows]);
        mapped.forward(&x, 1, &mut a, MatmulPrecision::Fast).expect("forward");
        copied.forward(&x, 1, &mut b, MatmulPrecision::Fast).expect("forward");
        assert_eq!(a, b);
    }

    /// Through a real memory-mapped file: the layer keeps the map.
    #[test]
    fn a_layer_from_a_mapped_file_keeps_the_map_after_the_file_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        check_layer_keeps_the_files_bytes(GgmlType::Q4_0, 4, 64, |w| {
            w.write_to(&path).expect("write");
            crate::gguf::GgufFile::open(&path).expect("open")
        });
    }

    /// Through a file held in memory.
    #[test]
    fn a_gguf_layer_shares_the_files_bytes_and_outlives_the_handle() {
        check_layer_keeps_the_files_bytes(GgmlType::Q8_0, 8, 64, |w| {
            crate::gguf::GgufFile::from_bytes(w.to_bytes().expect("gguf")).expect("parse")
        });
    }

    /// Every token's outputs are bit-identical whatever the batch: one token
    /// alone (decode kernels), 2-3 tokens (four-row kernels), 4-7 (four-token
    /// kernels) and 8+ (grouped prefill kernels, 16 tokens a group; for
    /// K-quants the AMX kernel where the CPU has it, Q4_K/Q5_K from 11
    /// tokens, Q6_K from 2 groups: the rows
    /// make tasks of 33 rows whatever the pool's size, 32 on the tiles and
    /// one on the grouped kernel).
    #[test]
    fn quantized_layers_are_batch_invariant() {
        let mut seed = 99u64;
        let cols = 512;
        for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let threads = rayon::current_num_threads().max(1);
            let rows = if crate::quant::kquant::is_kquant(dtype) { 33 * 4 * threads } else { 13 };
            assert!(!crate::quant::kquant::is_kquant(dtype) || row_chunk(rows) == 33, "tasks of 33 rows");
            let layer = random_layer(dtype, rows, cols, &mut seed);
            let n = 37;
            let x: Vec<f32> = (0..n * cols).map(|_| (lcg(&mut seed) % 2001) as f32 / 500.0 - 2.0).collect();
            assert_batch_invariant(&layer, &x, &[2, 3, 4, 7, 8, 9, 12, 15, 16, 21, 37], &format!("{dtype:?}"));
            // And close to the exact (dequantized, f32) product.
            let (mut fast, mut exact) = (vec![0f32; rows], vec![0f32; rows]);
            layer.forward(&x[..cols], 1, &mut fast, MatmulPrecision::Fast).expect("fast");
            layer.forward(&x[..cols], 1, &mut exact, MatmulPrecision::Exact).expect("exact");
            let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in fast.iter().zip(&exact) {
                assert!((a - b).abs() <= 0.02 * scale, "{dtype:?}: fast {a} vs exact {b}");
            }
        }
    }

    /// Tokens alone and in batches of `batches` give bit-identical outputs.
    fn assert_batch_invariant(layer: &Linear, x: &[f32], batches: &[usize], label: &str) {
        let (rows, cols) = (layer.rows, layer.cols);
        let alone = |t: usize| {
            let mut out = vec![0f32; rows];
            layer.forward(&x[t * cols..(t + 1) * cols], 1, &mut out, MatmulPrecision::Fast).expect("forward");
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        for &batch in batches {
            let mut out = vec![0f32; batch * rows];
            layer.forward(&x[..batch * cols], batch, &mut out, MatmulPrecision::Fast).expect("forward");
            for t in 0..batch {
                let got: Vec<u32> = out[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, alone(t), "{label}: token {t} in a batch of {batch}");
            }
        }
    }

    /// The largest |a - b| over two outputs.
    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
    }

    /// An input with outliers (one value in 97 is ±60, the rest in ±1, as
    /// Gemma's `gelu(gate)·up`) leaves one 8-bit scale per block coarse; a
    /// refined layer multiplies the residual too and lands far closer to
    /// the exact product, still batch-invariant.
    #[test]
    fn a_refined_layer_resolves_inputs_with_outliers_and_stays_batch_invariant() {
        let mut seed = 7u64;
        let cols = 512;
        for dtype in [GgmlType::Q6K, GgmlType::Q4K, GgmlType::Q5_0] {
            let threads = rayon::current_num_threads().max(1);
            let rows = if crate::quant::kquant::is_kquant(dtype) { 33 * 4 * threads } else { 13 };
            let mut layer = random_layer(dtype, rows, cols, &mut seed);
            let n = 37;
            let x: Vec<f32> = (0..n * cols)
                .map(|i| if i % 97 == 0 { if i % 2 == 0 { 60.0 } else { -60.0 } } else { (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0 })
                .collect();
            let forward = |layer: &Linear, precision| {
                let mut out = vec![0f32; n * rows];
                layer.forward(&x, n, &mut out, precision).expect("forward");
                out
            };
            let exact = forward(&layer, MatmulPrecision::Exact);
            let plain = max_diff(&forward(&layer, MatmulPrecision::Fast), &exact);
            layer.refine_input();
            let refined = max_diff(&forward(&layer, MatmulPrecision::Fast), &exact);
            assert!(refined * 16.0 < plain, "{dtype:?}: refined error {refined} against {plain} unrefined");
            assert_eq!(max_diff(&forward(&layer, MatmulPrecision::Exact), &exact), 0.0, "{dtype:?}: exact mode is not refined");
            assert_batch_invariant(&layer, &x, &[2, 3, 4, 8, 9, 16, 37], &format!("{dtype:?} refined"));
            // In one call with a plain layer (as q/k/v share one), each
            // gives what it gives alone.
            let plain = random_layer(dtype, rows, cols, &mut seed);
            let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            matmul_many(&mut [MatmulJob { layer: &plain, out: &mut a }, MatmulJob { layer: &layer, out: &mut b }], &x, n, MatmulPrecision::Fast).expect("matmul");
            assert_eq!(a, forward(&plain, MatmulPrecision::Fast), "{dtype:?}: the plain layer beside a refined one");
            assert_eq!(b, forward(&layer, MatmulPrecision::Fast), "{dtype:?}: the refined layer beside a plain one");
        }
    }

    #[test]
    fn buffer_too_small_is_an_error() {
        let w = Linear::from_f32(vec![0.0; 6], 2, 3);
        let mut out = [0f32; 1];
        assert!(w.forward(&[0.0; 3], 1, &mut out, MatmulPrecision::Fast).is_err());
    }
}
