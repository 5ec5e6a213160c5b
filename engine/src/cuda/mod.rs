//! The CUDA backend (feature `cuda`): a Llama-family model (Llama, SmolLM2,
//! Mistral, Qwen3) in bf16 on one GPU, with its paged KV cache in device
//! memory, running [`ForwardBatch`]es with Spindle's own kernels
//! (`spindle-kernels`) and sampling on the host with the CPU sampler.
//!
//! Weights of any file type (GGUF quants included) are dequantized to bf16
//! at load. The KV cache has the CPU pool's layout (slot = block ×
//! block_size + offset, rows of kv_dim) in bf16. A step with several new
//! tokens in some sequence runs the flash-attention prefill kernel (causal,
//! varlen, over the cache, so cached prefixes are attended); a step of
//! single tokens runs split-K decode attention. GEMMs run on cuBLAS when
//! `libcublas.so.13` is on the library path, else on Spindle's own kernels.
//! Qwen2 (q/k/v biases) is not supported here yet.

mod attention;
mod forward;
mod graphs;
mod sample;
mod step;
mod weights;

pub use forward::StepLogits;

use crate::batch::{ForwardBatch, StepOutput};
use crate::config::{ArchFamily, ModelConfig};
use crate::error::{EngineError, Result};
use crate::model::ops::Rope;
use crate::model::WeightNaming;
use crate::weights::TensorSource;
use cudarc::driver::CudaSlice;
use half::bf16;
use spindle_kernels::device::{CudaError, Gpu};
use weights::GpuLayer;

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

/// How big the KV cache is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvSize {
    /// This many blocks.
    Blocks(usize),
    /// What is left of this fraction of the device's memory once the weights
    /// are loaded and [`WORKSPACE_BYTES`] are set aside for activations.
    MemoryFraction(f64),
}

/// Device memory kept free for a step's activations and logits.
pub const WORKSPACE_BYTES: usize = 2 << 30;

/// A model on the GPU with its KV cache.
pub struct CudaModel {
    config: ModelConfig,
    rope: Rope,
    embed: CudaSlice<bf16>,
    lm_head: Option<CudaSlice<bf16>>,
    final_norm: CudaSlice<bf16>,
    layers: Vec<GpuLayer>,
    k_cache: Vec<CudaSlice<bf16>>,
    v_cache: Vec<CudaSlice<bf16>>,
    block_size: usize,
    num_blocks: usize,
    /// Whether [`Self::forward_step`] samples on the GPU where it can.
    device_sampling: bool,
    /// Activation buffers of eager steps, kept for the next one.
    workspace: Option<step::Workspace>,
    /// CUDA graphs of decode steps.
    graphs: graphs::DecodeGraphs,
    /// Last, so that it (the cuBLAS handle and its workspace) outlives
    /// everything above.
    gpu: Gpu,
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        // Let the last step's work finish before its buffers are freed.
        let _ = self.gpu.stream.synchronize();
    }
}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel").field("config", &self.config).field("num_blocks", &self.num_blocks).finish_non_exhaustive()
    }
}

impl CudaModel {
    /// Loads the model onto GPU `ordinal` with a KV cache of `kv` in blocks
    /// of `block_size` tokens. No driver or device is an error.
    pub fn load(config: ModelConfig, src: &dyn TensorSource, naming: WeightNaming, ordinal: usize, kv: KvSize, block_size: usize) -> Result<Self> {
        Self::build(config, ordinal, kv, block_size, |gpu, config| weights::upload(gpu, config, src, naming))
    }

    /// A model of `config`'s shapes with random weights (see
    /// [`weights::random`]), for benchmarks without a file.
    pub fn random(config: ModelConfig, seed: u64, ordinal: usize, kv: KvSize, block_size: usize) -> Result<Self> {
        Self::build(config, ordinal, kv, block_size, |gpu, config| weights::random(gpu, config, seed))
    }

    fn build(
        config: ModelConfig,
        ordinal: usize,
        kv: KvSize,
        block_size: usize,
        weights: impl FnOnce(&Gpu, &ModelConfig) -> Result<weights::Uploaded>,
    ) -> Result<Self> {
        if config.family == ArchFamily::Qwen2 {
            return Err(EngineError::Backend("Qwen2 (q/k/v biases) is not supported by the CUDA backend yet".into()));
        }
        if config.head_dim > spindle_kernels::device::MAX_HEAD_DIM {
            return Err(EngineError::Backend(format!("head_dim {} is over the CUDA attention kernel's {}", config.head_dim, spindle_kernels::device::MAX_HEAD_DIM)));
        }
        let gpu = Gpu::open(ordinal)?;
        let loaded = weights(&gpu, &config)?;
        let num_blocks = match kv {
            KvSize::Blocks(n) => n,
            KvSize::MemoryFraction(fraction) => blocks_for_fraction(&gpu, fraction, Self::kv_bytes_per_block(&config, block_size))?,
        };
        let per_layer = num_blocks * block_size * config.kv_dim();
        let mut k_cache = Vec::with_capacity(config.num_layers);
        let mut v_cache = Vec::with_capacity(config.num_layers);
        for _ in 0..config.num_layers {
            k_cache.push(gpu.stream.alloc_zeros::<bf16>(per_layer)?);
            v_cache.push(gpu.stream.alloc_zeros::<bf16>(per_layer)?);
        }
        Ok(Self {
            rope: Rope::new(&config),
            embed: loaded.embed,
            lm_head: loaded.lm_head,
            final_norm: loaded.final_norm,
            layers: loaded.layers,
            gpu,
            config,
            k_cache,
            v_cache,
            block_size,
            num_blocks,
            device_sampling: std::env::var("SPINDLE_HOST_SAMPLING").map_or(true, |v| v.is_empty() || v == "0"),
            workspace: None,
            graphs: graphs::DecodeGraphs::new(),
        })
    }

    /// Loads a GGUF file or HF directory (a path or a cached model name)
    /// onto GPU `ordinal`, as [`Self::load`].
    pub fn open(name_or_path: &str, ordinal: usize, kv: KvSize, block_size: usize) -> Result<Self> {
        let location = crate::models::resolve(name_or_path)?;
        match location.format {
            crate::models::ModelFormat::Gguf => {
                let file = crate::gguf::GgufFile::open(&location.path)?;
                let config = ModelConfig::from_gguf(&file)?;
                Self::load(config, &file, WeightNaming::Gguf, ordinal, kv, block_size)
            }
            crate::models::ModelFormat::HfDir => {
                let dir = crate::hf::HfModelDir::open(&location.path)?;
                let config = ModelConfig::from_hf_json(dir.config())?;
                Self::load(config, &dir, WeightNaming::Hf, ordinal, kv, block_size)
            }
        }
    }

    /// Sample on the GPU where the kernel reproduces the host sampler (the
    /// default; `SPINDLE_HOST_SAMPLING=1` at start turns it off), or always
    /// copy logits to the host.
    pub fn set_device_sampling(&mut self, on: bool) {
        self.device_sampling = on;
    }

    /// Replay decode steps from CUDA graphs (the default;
    /// `SPINDLE_CUDA_GRAPHS=0` at start turns it off), or launch every kernel.
    pub fn set_cuda_graphs(&mut self, on: bool) {
        self.graphs.set_enabled(on);
    }

    /// Decode graphs captured so far (0 with graphs off).
    pub fn captured_graphs(&self) -> usize {
        self.graphs.captured()
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Blocks in the KV cache.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Bytes the weights take on the device.
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self.layers.iter().map(GpuLayer::bytes).sum();
        let head = self.lm_head.as_ref().map_or(0, |h| h.len() * 2);
        l + (self.embed.len() + self.final_norm.len()) * 2 + head
    }

    /// The GPU's UUID (`GPU-…`, as NVML names it).
    pub fn device_uuid(&self) -> Option<String> {
        self.gpu.uuid().ok()
    }

    /// Bytes of weights a decode step streams: every layer and the output
    /// head, not the embedding table (a lookup) unless it is the head.
    pub fn streamed_weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(GpuLayer::bytes).sum();
        let head = self.lm_head.as_ref().unwrap_or(&self.embed).len() * 2;
        layers + head + self.final_norm.len() * 2
    }

    /// Parameters in the layers (what every token multiplies through).
    pub fn layer_params(&self) -> usize {
        self.layers.iter().map(GpuLayer::bytes).sum::<usize>() / 2
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
}

/// KV blocks of `block_bytes` that fit in `fraction` of the device's memory
/// beside what is already used and [`WORKSPACE_BYTES`].
fn blocks_for_fraction(gpu: &Gpu, fraction: f64, block_bytes: usize) -> Result<usize> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(EngineError::Backend(format!("the GPU memory fraction must be in (0, 1], not {fraction}")));
    }
    let (free, total) = gpu.ctx.mem_get_info()?;
    let used = total.saturating_sub(free);
    let budget = ((total as f64 * fraction) as usize).saturating_sub(used).saturating_sub(WORKSPACE_BYTES);
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

impl crate::runner::Executor for CudaRunner {
    fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        CudaRunner::execute(self, batch)
    }

    fn context_length(&self) -> usize {
        self.model.config.context_length
    }

    fn block_size(&self) -> usize {
        self.model.block_size
    }
}

/// Runs forward steps on the GPU and samples on the host, like the CPU
/// [`crate::runner::ModelRunner`].
#[derive(Debug)]
pub struct CudaRunner {
    model: CudaModel,
}

impl CudaRunner {
    /// A runner for `model`.
    pub fn new(model: CudaModel) -> Self {
        Self { model }
    }

    /// The model.
    pub fn model(&self) -> &CudaModel {
        &self.model
    }

    /// Run one step: the batch through the model, then sampling for the
    /// sequences that asked.
    pub fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        let step = self.model.forward_step(batch)?;
        crate::runner::sample_outputs_with(batch, step.logits, self.model.config.vocab_size, step.sampled)
    }
}
