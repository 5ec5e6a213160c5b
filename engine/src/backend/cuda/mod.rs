//! The CUDA backend (feature `cuda`): bf16 weights and activations on one
//! GPU, its paged KV cache in device memory, Spindle's own kernels
//! (`spindle-kernels`), CUDA graphs for decode steps and sampling on the
//! device where its kernel reproduces the host sampler.
//!
//! Weights of any file type (GGUF quants included) are dequantized to bf16
//! at load; q/k/v biases (Qwen2) are added after their GEMM. The KV cache
//! has the CPU pool's layout (slot = block × block_size + offset, rows of
//! kv_dim) in bf16. A step with several new tokens in some sequence runs the
//! flash-attention prefill kernel (causal, varlen, over the cache, so cached
//! prefixes are attended); a step of single tokens runs split-K decode
//! attention. GEMMs run on cuBLAS when `libcublas.so.13` is on the library
//! path (and [`CudaSwitches::cublas`] is on), else on Spindle's own kernels.

mod attention;
mod graphs;
mod run;
mod sample;
mod telemetry;

use super::{Backend, DeviceSampling, KvGeometry, KvSize, LinearJob, PassFn, StepLayout, StepLogits, Workspace};
use crate::batch::ForwardBatch;
use crate::config::{ModelConfig, RopeStyle};
use crate::error::{EngineError, Result};
use crate::model::linear::tensor_to_f32;
use crate::model::ops::Rope;
use crate::weights::TensorView;
use attention::StepAttention;
use cudarc::driver::CudaSlice;
use half::bf16;
use spindle_kernels::device::{CudaError, GemvJob, Gpu, GEMV_MAX_JOBS, GEMV_MAX_M};

pub use spindle_kernels::device::driver_present;

/// CUDA devices present (0 without a driver; never panics).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    cudarc::driver::CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

impl From<CudaError> for EngineError {
    fn from(e: CudaError) -> Self {
        EngineError::Backend(e.to_string())
    }
}

impl From<cudarc::driver::DriverError> for EngineError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        EngineError::Backend(format!("CUDA driver: {e}"))
    }
}

/// Device memory kept free for a step's activations and logits.
pub const WORKSPACE_BYTES: usize = 2 << 30;

/// The CUDA backend's switches (all on by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaSwitches {
    /// Replay decode steps from CUDA graphs.
    pub cuda_graphs: bool,
    /// Run GEMMs on cuBLAS when it loads.
    pub cublas: bool,
}

impl Default for CudaSwitches {
    fn default() -> Self {
        Self { cuda_graphs: true, cublas: true }
    }
}

/// A linear layer on the GPU: `[rows, cols]` bf16 and its bias.
pub struct GpuLinear {
    w: CudaSlice<bf16>,
    bias: Option<CudaSlice<bf16>>,
    rows: usize,
    cols: usize,
}

/// One step's inputs on the device (at least as many rows as the pass runs).
pub struct CudaStep {
    /// Token id of each row.
    pub(crate) ids: CudaSlice<u32>,
    /// Cache slot of each row's key and value (negative: not written).
    pub(crate) slots: CudaSlice<i64>,
    /// RoPE cosines, rows of head_dim / 2.
    pub(crate) cos: CudaSlice<f32>,
    /// RoPE sines, rows of head_dim / 2.
    pub(crate) sin: CudaSlice<f32>,
    /// The sliding-window layers' RoPE cosines and sines (Gemma 3), if any.
    pub(crate) local: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    /// The step's attention launches.
    pub(crate) attention: StepAttention,
    /// Which rows go through the output head.
    pub(crate) logit_rows: LogitRows,
}

/// Which rows of the final hidden state go through the output head.
pub(crate) enum LogitRows {
    /// None.
    Nothing,
    /// The first n (a graph's bucket: every row).
    All(usize),
    /// These rows (a device array of row indices, its length, the step's rows).
    Picked(CudaSlice<u32>, usize, usize),
}

/// A model's device, KV cache and step buffers (see the module doc).
pub struct CudaBackend {
    config: ModelConfig,
    ordinal: usize,
    k_cache: Vec<CudaSlice<bf16>>,
    v_cache: Vec<CudaSlice<bf16>>,
    block_size: usize,
    num_blocks: usize,
    /// Activation buffers of eager steps, kept for the next one.
    workspace: Option<Workspace<CudaBackend>>,
    /// CUDA graphs of decode steps.
    graphs: graphs::DecodeGraphs,
    /// RoPE of the sliding-window layers, where the model has them.
    local_rope: Option<Rope>,
    /// Last, so that it (the cuBLAS handle and its workspace) outlives
    /// everything above.
    gpu: Gpu,
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Let the last step's work finish before its buffers are freed.
        let _ = self.gpu.stream.synchronize();
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("ordinal", &self.ordinal).field("num_blocks", &self.num_blocks).finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// Opens GPU `ordinal` for a model of `config`. No driver or device, or a
    /// head width the attention kernels do not take, is an error.
    pub fn open(ordinal: usize, config: &ModelConfig, switches: CudaSwitches) -> Result<Self> {
        if config.head_dim > spindle_kernels::device::MAX_HEAD_DIM {
            return Err(EngineError::Backend(format!("head_dim {} is over the CUDA attention kernel's {}", config.head_dim, spindle_kernels::device::MAX_HEAD_DIM)));
        }
        let gpu = Gpu::open_with(ordinal, switches.cublas)?;
        Ok(Self {
            config: config.clone(),
            ordinal,
            k_cache: Vec::new(),
            v_cache: Vec::new(),
            block_size: 0,
            num_blocks: 0,
            workspace: None,
            graphs: graphs::DecodeGraphs::new(switches.cuda_graphs),
            local_rope: local_rope(config),
            gpu,
        })
    }

    /// Replay decode steps from CUDA graphs, or launch every kernel.
    pub fn set_cuda_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    /// Whether `jobs` (several layers reading the same x of `rows` rows) run
    /// as one launch of Spindle's skinny kernel: the skinny kernel takes
    /// steps of this many rows (see [`Self::gemv_rows`]) and the shapes.
    fn fuses_linears(&self, rows: usize, jobs: &[LinearJob<'_, Self>]) -> bool {
        let Some(k) = jobs.first().map(|(w, _)| w.cols) else { return false };
        (2..=GEMV_MAX_JOBS).contains(&jobs.len())
            && rows <= self.gpu.gemv_rows().min(GEMV_MAX_M)
            && k.is_multiple_of(8)
            && jobs.iter().all(|(w, _)| w.cols == k)
    }

    /// Rows up to which linear layers run Spindle's skinny GEMM kernel
    /// rather than cuBLAS (see `Gpu::gemv_rows`).
    pub fn gemv_rows(&self) -> usize {
        self.gpu.gemv_rows()
    }

    /// Sets [`Self::gemv_rows`]; captured decode graphs are dropped so the
    /// next steps use the new choice.
    pub fn set_gemv_rows(&mut self, rows: usize) {
        self.gpu.set_gemv_rows(rows);
        // The graphs captured so far replay the old kernels.
        self.graphs.reset();
    }

    /// Decode graphs captured so far (0 with graphs off).
    pub fn captured_graphs(&self) -> usize {
        self.graphs.captured()
    }

    /// The GPU's UUID (`GPU-…`, as NVML names it).
    pub fn device_uuid(&self) -> Option<String> {
        self.gpu.uuid().ok()
    }

    /// What runs the linear layers (cuBLAS, or Spindle's kernels and why).
    pub fn gemm_backend(&self) -> String {
        self.gpu.gemm_backend()
    }

    /// The GPU's name.
    pub fn device_name(&self) -> String {
        self.gpu.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    /// Bytes of KV cache per block (all layers, keys and values, bf16).
    pub fn kv_bytes_per_block(config: &ModelConfig, block_size: usize) -> usize {
        2 * config.num_layers * block_size * config.kv_dim() * std::mem::size_of::<bf16>()
    }

    fn upload(&self, values: &[f32]) -> Result<CudaSlice<bf16>> {
        use rayon::prelude::*;
        // In parallel: a large model's load is otherwise bound by this loop.
        let host: Vec<bf16> = values.par_iter().with_min_len(1 << 16).map(|&v| bf16::from_f32(v)).collect();
        Ok(self.gpu.stream.clone_htod(&host)?)
    }
}

/// A GPU memory fraction, checked to be in (0, 1].
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fraction(f64);

impl Fraction {
    /// `fraction` if it is in (0, 1] (NaN is not), else an error.
    fn new(fraction: f64) -> Result<Self> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(Self(fraction))
        } else {
            Err(EngineError::Backend(format!("the GPU memory fraction must be in (0, 1], not {fraction}")))
        }
    }
}

/// The sliding-window layers' RoPE of a model of `c`, if it has them.
fn local_rope(c: &ModelConfig) -> Option<Rope> {
    c.sliding_window.map(|w| Rope::with_base(c, w.local_rope_theta))
}

/// KV blocks of `block_bytes` that fit in `fraction` of the device's memory
/// beside what is already used and [`WORKSPACE_BYTES`].
fn blocks_for_fraction(gpu: &Gpu, fraction: f64, block_bytes: usize) -> Result<usize> {
    // Checked before the device is asked anything.
    let fraction = Fraction::new(fraction)?;
    let (free, total) = gpu.ctx.mem_get_info()?;
    blocks_in_budget(free, total, fraction, block_bytes)
}

/// KV blocks of `block_bytes` that fit in `fraction` of `total` device bytes
/// once what is used (`total - free`) and [`WORKSPACE_BYTES`] are set
/// aside (rounded down); none is an error.
fn blocks_in_budget(free: usize, total: usize, fraction: Fraction, block_bytes: usize) -> Result<usize> {
    let used = total.saturating_sub(free);
    let budget = ((total as f64 * fraction.0) as usize).saturating_sub(used).saturating_sub(WORKSPACE_BYTES);
    let blocks = budget / block_bytes.max(1);
    if blocks == 0 {
        return Err(EngineError::Backend(format!(
            "no room for a KV cache: {:.1} GiB of {:.1} GiB used after loading the weights",
            used as f64 / f64::from(1u32 << 30),
            total as f64 / f64::from(1u32 << 30)
        )));
    }
    Ok(blocks)
}

/// The KV cache's blocks for `size`, blocks being `block_size` tokens and
/// `per_block` bytes; `fraction_blocks` sizes a memory fraction (it asks the
/// device). No blocks, or blocks of no tokens, is an error.
fn kv_blocks(size: KvSize, block_size: usize, per_block: usize, fraction_blocks: impl FnOnce(f64) -> Result<usize>) -> Result<usize> {
    let num_blocks = match size {
        KvSize::Blocks(n) => n,
        KvSize::Bytes(b) => b / per_block.max(1),
        KvSize::MemoryFraction(fraction) => fraction_blocks(fraction)?,
    };
    if num_blocks == 0 || block_size == 0 {
        return Err(EngineError::Backend(format!("no room for a KV cache ({num_blocks} blocks of {block_size} tokens)")));
    }
    Ok(num_blocks)
}

impl Backend for CudaBackend {
    type Tensor = CudaSlice<bf16>;
    type Weight = GpuLinear;
    type Vector = CudaSlice<bf16>;
    type Logits = CudaSlice<f32>;
    type Step = CudaStep;

    fn describe(&self) -> String {
        format!("cuda:{} ({}; linear layers: {})", self.ordinal, self.device_name(), self.gemm_backend())
    }

    fn load_linear(&self, t: &TensorView<'_>, rows: usize, cols: usize, bias: Option<Vec<f32>>) -> Result<GpuLinear> {
        t.expect_shape(&[rows, cols])?;
        if let Some(b) = &bias {
            if b.len() != rows {
                return Err(EngineError::InvalidConfig(format!("bias of length {} for a layer with {rows} outputs", b.len())));
            }
        }
        let w = self.upload(&tensor_to_f32(t)?)?;
        let bias = bias.map(|b| self.upload(&b)).transpose()?;
        Ok(GpuLinear { w, bias, rows, cols })
    }

    fn load_vector(&self, values: Vec<f32>) -> Result<CudaSlice<bf16>> {
        self.upload(&values)
    }

    fn weight_bytes(&self, w: &GpuLinear) -> usize {
        (w.w.len() + w.bias.as_ref().map_or(0, CudaSlice::len)) * std::mem::size_of::<bf16>()
    }

    fn allocate_kv(&mut self, c: &ModelConfig, size: KvSize, block_size: usize) -> Result<KvGeometry> {
        let per_block = Self::kv_bytes_per_block(c, block_size);
        let num_blocks = kv_blocks(size, block_size, per_block, |fraction| blocks_for_fraction(&self.gpu, fraction, per_block))?;
        let per_layer = num_blocks * block_size * c.kv_dim();
        // Graphs and buffers captured over the old cache must not outlive it.
        self.graphs.reset();
        self.workspace = None;
        self.k_cache.clear();
        self.v_cache.clear();
        for _ in 0..c.num_layers {
            self.k_cache.push(self.gpu.stream.alloc_zeros::<bf16>(per_layer)?);
            self.v_cache.push(self.gpu.stream.alloc_zeros::<bf16>(per_layer)?);
        }
        self.config = c.clone();
        self.local_rope = local_rope(c);
        self.block_size = block_size;
        self.num_blocks = num_blocks;
        Ok(self.kv_geometry())
    }

    fn kv_geometry(&self) -> KvGeometry {
        KvGeometry { block_size: self.block_size, num_blocks: self.num_blocks, bytes_per_block: Self::kv_bytes_per_block(&self.config, self.block_size) }
    }

    fn tensor(&self, rows: usize, width: usize) -> Result<CudaSlice<bf16>> {
        Ok(self.gpu.stream.alloc_zeros::<bf16>((rows * width).max(1))?)
    }

    fn logits_buffer(&self, rows: usize, vocab: usize) -> Result<CudaSlice<f32>> {
        Ok(self.gpu.stream.alloc_zeros::<f32>((rows * vocab).max(1))?)
    }

    fn run_step(&mut self, batch: &ForwardBatch, layout: StepLayout, rope: &Rope, sampling: DeviceSampling<'_>, pass: &mut PassFn<'_, Self>) -> Result<StepLogits> {
        self.run(batch, &layout, rope, sampling, pass)
    }

    fn embed(&self, out: &mut CudaSlice<bf16>, table: &GpuLinear, step: &CudaStep, rows: usize) -> Result<()> {
        Ok(self.gpu.embedding(out, &table.w, &step.ids, rows, table.cols, table.rows as u32)?)
    }

    fn add_rms_norm(&self, out: &mut CudaSlice<bf16>, residual: Option<&mut CudaSlice<bf16>>, x: &CudaSlice<bf16>, weight: &CudaSlice<bf16>, rows: usize, width: usize, eps: f32) -> Result<()> {
        Ok(self.gpu.add_rmsnorm(out, residual, x, weight, rows, width, eps)?)
    }

    fn linear_many(&self, x: &CudaSlice<bf16>, rows: usize, jobs: &mut [LinearJob<'_, Self>]) -> Result<()> {
        if self.fuses_linears(rows, jobs) {
            let k = jobs[0].0.cols;
            let mut fused: Vec<GemvJob<'_>> = jobs.iter_mut().map(|(w, out)| (&w.w, &mut **out, w.rows)).collect();
            self.gpu.gemv_jobs(x, rows, k, &mut fused)?;
        } else {
            for (w, out) in jobs.iter_mut() {
                self.gpu.gemm(out, x, &w.w, rows, w.rows, w.cols)?;
            }
        }
        for (w, out) in jobs.iter_mut() {
            if let Some(b) = &w.bias {
                self.gpu.add_bias(out, b, rows, w.rows)?;
            }
        }
        Ok(())
    }

    fn rope(&self, x: &mut CudaSlice<bf16>, step: &CudaStep, rows: usize, heads: usize) -> Result<()> {
        let interleaved = self.config.rope_style == RopeStyle::Interleaved;
        Ok(self.gpu.rope_table(x, &step.cos, &step.sin, rows, heads, self.config.head_dim, interleaved)?)
    }

    fn rope_local(&self, x: &mut CudaSlice<bf16>, step: &CudaStep, rows: usize, heads: usize) -> Result<()> {
        let (cos, sin) = step.local.as_ref().ok_or_else(|| EngineError::Backend("this model has no sliding-window layers".into()))?;
        let interleaved = self.config.rope_style == RopeStyle::Interleaved;
        Ok(self.gpu.rope_table(x, cos, sin, rows, heads, self.config.head_dim, interleaved)?)
    }

    fn kv_write(&mut self, layer: usize, k: &CudaSlice<bf16>, v: &CudaSlice<bf16>, step: &CudaStep, rows: usize) -> Result<()> {
        let kv_dim = self.config.kv_dim();
        let (kc, vc) = (&mut self.k_cache[layer], &mut self.v_cache[layer]);
        Ok(self.gpu.kv_write(kc, vc, k, v, &step.slots, rows, kv_dim)?)
    }

    fn attention(&self, layer: usize, out: &mut CudaSlice<bf16>, q: &CudaSlice<bf16>, step: &CudaStep, _rows: usize) -> Result<()> {
        let window = self.config.layer_window(layer);
        step.attention.run(&self.gpu, out, q, &self.k_cache[layer], &self.v_cache[layer], window)
    }

    fn silu_mul(&self, out: &mut CudaSlice<bf16>, gate: &CudaSlice<bf16>, up: &CudaSlice<bf16>, rows: usize, width: usize) -> Result<()> {
        Ok(self.gpu.silu_mul(out, gate, up, rows * width)?)
    }

    fn gelu_tanh_mul(&self, out: &mut CudaSlice<bf16>, gate: &CudaSlice<bf16>, up: &CudaSlice<bf16>, rows: usize, width: usize) -> Result<()> {
        Ok(self.gpu.gelu_tanh_mul(out, gate, up, rows * width)?)
    }

    fn scale(&self, x: &mut CudaSlice<bf16>, rows: usize, width: usize, factor: f32) -> Result<()> {
        Ok(self.gpu.scale(x, factor, rows * width)?)
    }

    fn logits(&self, out: &mut CudaSlice<f32>, picked: &mut CudaSlice<bf16>, hidden: &CudaSlice<bf16>, head: &GpuLinear, step: &CudaStep) -> Result<()> {
        let (vocab, h) = (head.rows, head.cols);
        match &step.logit_rows {
            LogitRows::Nothing => Ok(()),
            LogitRows::All(n) => Ok(self.gpu.gemm(out, hidden, &head.w, *n, vocab, h)?),
            LogitRows::Picked(rows, n, total) => {
                self.gpu.embedding(picked, hidden, rows, *n, h, *total as u32)?;
                Ok(self.gpu.gemm(out, picked, &head.w, *n, vocab, h)?)
            }
        }
    }

    fn telemetry(&self) -> Option<std::sync::Arc<dyn super::DeviceTelemetry>> {
        telemetry::Nvml::open(self.device_uuid()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{LogitsRequest, SeqInput, SeqSampling, TokenMask};
    use crate::grammar::{GrammarCompiler, SharedConstraint};
    use crate::sampling::SamplingParams;

    const GIB: usize = 1 << 30;

    /// A small Llama-shaped config: 2 layers, 4 heads of 16, 2 KV heads (kv_dim 32).
    pub(super) fn config() -> Result<ModelConfig> {
        let json = serde_json::json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 100,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0});
        ModelConfig::from_hf_json(&json)
    }

    /// A one-token sequence that samples with `params` (under `mask`),
    /// wanting `logits` back.
    pub(super) fn sampled_seq(params: SamplingParams, logits: LogitsRequest, mask: Option<TokenMask>) -> SeqInput {
        let sampling = SeqSampling { params, mask, generated: 3, history: None };
        SeqInput { id: 0, tokens: vec![1], start_pos: 0, block_table: vec![0].into(), logits, sampling: Some(sampling) }
    }

    /// Vocabulary of [`grammar`]'s constraints (the toy tokenizer's, plus padding).
    pub(super) const GRAMMAR_VOCAB: usize = 275;

    /// A constraint for the Lark grammar `lark` over the toy byte-level
    /// tokenizer, and the ids of the single-character `texts` in it.
    pub(super) fn grammar<const N: usize>(lark: &str, texts: [&str; N]) -> std::result::Result<(SharedConstraint, [u32; N]), String> {
        let tok = crate::tokenizer::tests::toy("smollm");
        let compiler = GrammarCompiler::new(&tok, GRAMMAR_VOCAB).map_err(|e| e.to_string())?;
        let constraint = compiler.compile_lark(lark).map_err(|e| e.to_string())?.shared();
        let mut ids = [0; N];
        for (id, text) in ids.iter_mut().zip(texts) {
            *id = *tok.encode(text, false).map_err(|e| e.to_string())?.first().ok_or("no token")?;
        }
        Ok((constraint, ids))
    }

    fn fraction(f: f64) -> Result<Fraction> {
        Fraction::new(f)
    }

    #[test]
    fn memory_fractions_outside_zero_to_one_are_errors_not_panics() {
        for bad in [0.0, -0.0, -0.5, 1.0 + 1e-9, 1.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = Fraction::new(bad);
            assert!(matches!(&err, Err(EngineError::Backend(m)) if m.contains("(0, 1]")), "{bad}: {err:?}");
        }
        assert!(matches!(Fraction::new(1.0), Ok(Fraction(f)) if f == 1.0));
        assert!(matches!(Fraction::new(1e-6), Ok(Fraction(f)) if f == 1e-6));
    }

    #[test]
    fn a_fraction_budget_sets_aside_used_memory_and_the_workspace_and_rounds_down() -> Result<()> {
        let total = 80 * GIB;
        // 10 GiB used (weights): 0.5 · 80 − 10 − 2 = 28 GiB for the cache.
        let free = 70 * GIB;
        assert_eq!(blocks_in_budget(free, total, fraction(0.5)?, GIB)?, 28);
        // Rounded down: 28 GiB in blocks of 3 GiB is 9 (not 10).
        assert_eq!(blocks_in_budget(free, total, fraction(0.5)?, 3 * GIB)?, 9);
        // The whole device: 80 − 10 − 2.
        assert_eq!(blocks_in_budget(free, total, fraction(1.0)?, GIB)?, 68);
        // Blocks of 0 bytes count as 1 byte (no division by zero).
        assert_eq!(blocks_in_budget(total, total, fraction(1.0)?, 0)?, total - WORKSPACE_BYTES);
        Ok(())
    }

    #[test]
    fn a_fraction_with_no_room_left_is_an_error() -> Result<()> {
        let total = 80 * GIB;
        // 0.1 · 80 = 8 GiB, already used by the weights.
        let err = blocks_in_budget(72 * GIB, total, fraction(0.1)?, 1024);
        assert!(matches!(&err, Err(EngineError::Backend(m)) if m.contains("no room")), "{err:?}");
        // Room for the workspace but not for one block.
        let err = blocks_in_budget(total, total, fraction(1.0)?, total);
        assert!(err.is_err(), "{err:?}");
        // Free over total counts as nothing used (no underflow): 40 − 0 − 2.
        assert_eq!(blocks_in_budget(total + GIB, total, fraction(0.5)?, GIB)?, 38);
        Ok(())
    }

    #[test]
    fn kv_sizes_turn_into_blocks_and_none_is_an_error() -> Result<()> {
        let no_device = |_: f64| -> Result<usize> { Err(EngineError::Backend("asked the device".into())) };
        assert_eq!(kv_blocks(KvSize::Blocks(7), 16, 4096, no_device)?, 7);
        assert_eq!(kv_blocks(KvSize::Bytes(10 * 4096 + 4095), 16, 4096, no_device)?, 10, "bytes round down to whole blocks");
        assert_eq!(kv_blocks(KvSize::MemoryFraction(0.9), 16, 4096, |f| Ok(if f == 0.9 { 33 } else { 0 }))?, 33);
        assert!(kv_blocks(KvSize::MemoryFraction(0.9), 16, 4096, no_device).is_err(), "the device's error comes back");
        for (size, block_size) in [(KvSize::Blocks(0), 16), (KvSize::Bytes(4095), 16), (KvSize::Blocks(4), 0)] {
            let err = kv_blocks(size, block_size, 4096, no_device);
            assert!(matches!(&err, Err(EngineError::Backend(m)) if m.contains("no room")), "{size:?} × {block_size}: {err:?}");
        }
        Ok(())
    }

    #[test]
    fn a_kv_block_holds_keys_and_values_of_every_layer_in_bf16() -> Result<()> {
        let c = config()?;
        // 2 (k and v) × 2 layers × 16 tokens × 32 (kv_dim) × 2 bytes.
        assert_eq!(CudaBackend::kv_bytes_per_block(&c, 16), 2 * 2 * 16 * 32 * 2);
        assert_eq!(CudaBackend::kv_bytes_per_block(&c, 32), 2 * CudaBackend::kv_bytes_per_block(&c, 16));
        Ok(())
    }
}
