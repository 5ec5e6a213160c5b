//! The seam between the decoder and the hardware. A [`Backend`] owns the
//! device, its paged KV cache and its step workspace, and provides the
//! operations a Llama-family layer needs over its own tensor and weight
//! types; the decoder ([`crate::model::Decoder`]) holds the only copy of
//! the layer loop and runs it through any backend.
//!
//! Backends: [`cpu::CpuBackend`] (f32 activations, GGUF block formats kept
//! for the weights) and, with feature `cuda`, `cuda::CudaBackend` (bf16 on
//! one GPU, CUDA graphs for decode steps, sampling on the device). A third,
//! deliberately simple one lives in the test tree and proves the seam.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod layout;

pub use layout::StepLayout;

/// Whether this build has the CUDA backend.
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// CUDA devices present (0 without the backend or a driver; never panics).
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// The model behind `meta` on GPU `ordinal` as an executor (an error in a
/// build without the CUDA backend).
pub(crate) fn cuda_executor(
    ordinal: usize,
    meta: &crate::load::ModelMeta,
    src: &dyn crate::weights::TensorSource,
    naming: crate::model::WeightNaming,
    options: &crate::open::EngineOptions,
    progress: crate::open::Progress<'_>,
) -> Result<Box<dyn crate::runner::Executor + Send>> {
    #[cfg(feature = "cuda")]
    {
        let switches = cuda::CudaSwitches { cuda_graphs: options.cuda_graphs, cublas: options.cublas };
        let backend = cuda::CudaBackend::open(ordinal, &meta.config, switches)?;
        let kv = options.kv_blocks.map_or(KvSize::MemoryFraction(options.gpu_memory_utilization), KvSize::Blocks);
        crate::open::assemble(backend, meta, src, naming, kv, options, progress)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ordinal, meta, src, naming, options, progress);
        Err(crate::error::EngineError::Backend("this spindle was built without the CUDA backend".into()))
    }
}

use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::ops::Rope;
use crate::sampling::{PenaltyCounts, SampledToken};
use crate::weights::TensorView;

/// The shape of a backend's paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks in the cache.
    pub num_blocks: usize,
    /// Bytes one block takes (every layer, keys and values).
    pub bytes_per_block: usize,
}

impl KvGeometry {
    /// Tokens the cache holds.
    pub fn tokens(&self) -> usize {
        self.block_size * self.num_blocks
    }
}

/// How big a backend makes its KV cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvSize {
    /// This many blocks.
    Blocks(usize),
    /// As many blocks as this many bytes hold.
    Bytes(usize),
    /// What is left of this fraction of the device's memory once the weights
    /// are loaded and the step workspace is set aside (GPU backends; the CPU
    /// takes it as a fraction of nothing and refuses it).
    MemoryFraction(f64),
}

/// What a backend that samples on its own (the GPU) did for a sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Presampled {
    /// Nothing: the host samples from the sequence's logits (if it samples).
    No,
    /// This token (its grammar already advanced past it).
    Token(SampledToken),
    /// Its grammar allows no token: the sequence ends without one.
    GrammarEnded,
}

/// What a step's sampling may do on the device.
#[derive(Debug, Clone, Copy)]
pub struct DeviceSampling<'a> {
    /// Whether the backend may sample on the device.
    pub enabled: bool,
    /// Each sequence's penalty counts, in batch order (kept by the executor).
    pub penalties: &'a [Option<&'a PenaltyCounts>],
}

/// A step's results before host sampling: per sequence (batch order), its
/// requested logits on the host, or what the device sampled for it (then
/// its logits are empty).
#[derive(Debug)]
pub struct StepLogits {
    /// The requested logits (flattened `[rows, vocab]`) per sequence.
    pub logits: Vec<Vec<f32>>,
    /// What the device sampled, per sequence.
    pub sampled: Vec<Presampled>,
}

/// One reading of a device's state.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReading {
    /// Device name.
    pub name: String,
    /// Memory in use, bytes.
    pub memory_used: u64,
    /// Memory on the device, bytes.
    pub memory_total: u64,
    /// Busy time of the last sample period, percent (when readable).
    pub utilization: Option<u32>,
    /// Core temperature, °C (when readable).
    pub temperature: Option<u32>,
    /// Board power, watts (when readable).
    pub power_watts: Option<f64>,
}

/// Reads a device's state on demand (shareable with the HTTP side while the
/// step loop owns the executor).
pub trait DeviceTelemetry: Send + Sync {
    /// The device now, when it can be read.
    fn read(&self) -> Option<DeviceReading>;
}

/// One layer's linear map over a backend's weight type, with its output.
pub type LinearJob<'a, B> = (&'a <B as Backend>::Weight, &'a mut <B as Backend>::Tensor);

/// The decoder's pass over one step, as a backend runs it: every layer from
/// the embedding to the logits of the wanted rows, over `rows` rows of the
/// step's inputs and the workspace. A backend may run it more than once for
/// one step (a CUDA graph is captured after a warm-up run).
pub type PassFn<'a, B> = dyn FnMut(&mut B, &mut Workspace<B>, &<B as Backend>::Step, usize) -> Result<()> + 'a;

/// The operations a Llama-family decoder needs, over the backend's own
/// tensors (`[rows, width]` activations, row-major), weights and KV cache.
/// Every op works on the first `rows` rows of buffers that may be larger
/// (the workspace is sized for the largest step so far).
pub trait Backend: Sized + Send {
    /// An activation buffer.
    type Tensor: Send;
    /// A linear layer's weights (`[out, in]`, with its bias if any).
    type Weight: Send + Sync;
    /// A norm's weights.
    type Vector: Send + Sync;
    /// The logits of a step's wanted rows.
    type Logits: Send;
    /// One step's inputs as the backend holds them (token ids, cache slots,
    /// RoPE tables, attention geometry, which rows want logits).
    type Step;

    /// A short description of the device (for logs).
    fn describe(&self) -> String;

    /// Weights of a linear layer from a `[rows, cols]` tensor and its bias.
    fn load_linear(&self, t: &TensorView<'_>, rows: usize, cols: usize, bias: Option<Vec<f32>>) -> Result<Self::Weight>;
    /// Marks `w` as a layer whose input has outliers that one 8-bit scale
    /// per block resolves badly (Gemma's attention and MLP output
    /// projections; the latter reads `gelu(gate)·up`): where activations
    /// are quantized to 8 bits, the quantization residual is multiplied too
    /// (two passes, about 15 bits). By default a no-op: backends whose
    /// activations are wider ignore it.
    fn refine_input(&self, _w: &mut Self::Weight) {}
    /// A norm's weights from f32 values.
    fn load_vector(&self, values: Vec<f32>) -> Result<Self::Vector>;
    /// Bytes a weight takes on the device.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;

    /// Allocate the KV cache for `config` (after the weights are loaded).
    fn allocate_kv(&mut self, config: &ModelConfig, size: KvSize, block_size: usize) -> Result<KvGeometry>;
    /// The KV cache's shape (zero blocks before [`Self::allocate_kv`]).
    fn kv_geometry(&self) -> KvGeometry;

    /// A zeroed activation buffer of `rows × width`.
    fn tensor(&self, rows: usize, width: usize) -> Result<Self::Tensor>;
    /// Sets the step workspace aside for steps of up to `rows` rows and
    /// `logit_rows` logits rows now, so that the first such step does not
    /// pay for it (on the CPU: ~0.5 s of page faults for a 512-token step
    /// of a 1.5B model). By default a no-op: the workspace grows on demand.
    fn reserve_workspace(&mut self, _rows: usize, _logit_rows: usize) -> Result<()> {
        Ok(())
    }
    /// A logits buffer of `rows × vocab`.
    fn logits_buffer(&self, rows: usize, vocab: usize) -> Result<Self::Logits>;

    /// Runs `pass` over the step `layout` (validated against this backend's
    /// cache) and returns each sequence's logits, or what the device sampled
    /// for it where `sampling` allows and it can.
    fn run_step(&mut self, batch: &ForwardBatch, layout: StepLayout, rope: &Rope, sampling: DeviceSampling<'_>, pass: &mut PassFn<'_, Self>) -> Result<StepLogits>;

    /// `out[r] = table[ids[r]]` for the step's token ids.
    fn embed(&self, out: &mut Self::Tensor, table: &Self::Weight, step: &Self::Step, rows: usize) -> Result<()>;
    /// `out = rmsnorm(x) · weight` per row of `width`; with `residual`, first
    /// `residual += x` and normalize that.
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(&self, out: &mut Self::Tensor, residual: Option<&mut Self::Tensor>, x: &Self::Tensor, weight: &Self::Vector, rows: usize, width: usize, eps: f32) -> Result<()>;
    /// `out[t] = w · x[t] (+ bias)` for each job (all read `x`), as one
    /// parallel region where the backend can.
    fn linear_many(&self, x: &Self::Tensor, rows: usize, jobs: &mut [LinearJob<'_, Self>]) -> Result<()>;
    /// RoPE in place on `x` (`[rows, heads · head_dim]`) at the step's positions.
    fn rope(&self, x: &mut Self::Tensor, step: &Self::Step, rows: usize, heads: usize) -> Result<()>;
    /// Store the step's keys and values of `layer` in the cache.
    fn kv_write(&mut self, layer: usize, k: &Self::Tensor, v: &Self::Tensor, step: &Self::Step, rows: usize) -> Result<()>;
    /// Causal attention of the step's queries over `layer`'s cache (which
    /// already holds this step's keys and values).
    fn attention(&self, layer: usize, out: &mut Self::Tensor, q: &Self::Tensor, step: &Self::Step, rows: usize) -> Result<()>;
    /// `out = silu(gate) · up` over `rows × width` values.
    fn silu_mul(&self, out: &mut Self::Tensor, gate: &Self::Tensor, up: &Self::Tensor, rows: usize, width: usize) -> Result<()>;
    /// `out = gelu_tanh(gate) · up` over `rows × width` values (Gemma).
    fn gelu_tanh_mul(&self, out: &mut Self::Tensor, gate: &Self::Tensor, up: &Self::Tensor, rows: usize, width: usize) -> Result<()> {
        let _ = (out, gate, up, rows, width);
        Err(self.lacks("the GELU-tanh MLP"))
    }
    /// `x *= factor` over `rows × width` values (Gemma's embedding scale).
    fn scale(&self, x: &mut Self::Tensor, rows: usize, width: usize, factor: f32) -> Result<()> {
        let _ = (x, rows, width, factor);
        Err(self.lacks("scaling activations"))
    }
    /// RoPE with the local layers' base frequency (sliding-window layers of
    /// Gemma 3); [`Self::attention`] then masks beyond the layer's window.
    fn rope_local(&self, x: &mut Self::Tensor, step: &Self::Step, rows: usize, heads: usize) -> Result<()> {
        let _ = (x, step, rows, heads);
        Err(self.lacks("sliding-window layers"))
    }

    /// The error for an operation this backend does not have.
    fn lacks(&self, what: &str) -> crate::error::EngineError {
        crate::error::EngineError::Backend(format!("{what} is not implemented on {}", self.describe()))
    }
    /// The wanted rows of `hidden` (per the step) through `head` into `out`;
    /// `picked` is scratch for the gathered rows.
    fn logits(&self, out: &mut Self::Logits, picked: &mut Self::Tensor, hidden: &Self::Tensor, head: &Self::Weight, step: &Self::Step) -> Result<()>;

    /// A live view of the device's state (GPU backends with NVML), for gauges.
    fn telemetry(&self) -> Option<std::sync::Arc<dyn DeviceTelemetry>> {
        None
    }

    /// `out = w · x (+ bias)`.
    fn linear(&self, out: &mut Self::Tensor, x: &Self::Tensor, w: &Self::Weight, rows: usize) -> Result<()> {
        self.linear_many(x, rows, &mut [(w, out)])
    }

    /// The gated MLP over `rows` rows of `x`: `out = down · act(gate · x,
    /// up · x)`, with `scratch` (gate, up, activation buffers of at least
    /// `rows` × the MLP's width) to work in. By default the projections,
    /// then the activation, then the down projection.
    fn gated_mlp(&self, out: &mut Self::Tensor, x: &Self::Tensor, mlp: &GatedMlp<'_, Self>, rows: usize, scratch: MlpScratch<'_, Self>) -> Result<()> {
        gated_mlp_composed(self, out, x, mlp, rows, scratch)
    }
}

/// The weights and shape of a gated MLP ([`Backend::gated_mlp`]).
pub struct GatedMlp<'a, B: Backend> {
    /// Gate projection.
    pub gate: &'a B::Weight,
    /// Up projection.
    pub up: &'a B::Weight,
    /// Down projection.
    pub down: &'a B::Weight,
    /// The gate's activation.
    pub activation: crate::config::Activation,
    /// The intermediate width (rows of gate and up).
    pub width: usize,
}

/// [`Backend::gated_mlp`]'s scratch buffers: gate, up, activation.
pub type MlpScratch<'a, B> = [&'a mut <B as Backend>::Tensor; 3];

/// [`Backend::gated_mlp`] as three steps: both projections in one
/// [`Backend::linear_many`], the activation, the down projection.
pub fn gated_mlp_composed<B: Backend>(
    b: &B,
    out: &mut B::Tensor,
    x: &B::Tensor,
    mlp: &GatedMlp<'_, B>,
    rows: usize,
    [gate, up, act]: MlpScratch<'_, B>,
) -> Result<()> {
    b.linear_many(x, rows, &mut [(mlp.gate, &mut *gate), (mlp.up, &mut *up)])?;
    match mlp.activation {
        crate::config::Activation::Silu => b.silu_mul(act, gate, up, rows, mlp.width)?,
        crate::config::Activation::GeluTanh => b.gelu_tanh_mul(act, gate, up, rows, mlp.width)?,
    }
    b.linear(out, act, mlp.down, rows)
}

/// A step's activation buffers for up to `capacity` rows (and the logits of
/// up to `logit_capacity` rows), reused from step to step.
pub struct Workspace<B: Backend> {
    /// Rows the buffers hold.
    pub capacity: usize,
    /// Logits rows the logits buffer holds.
    pub logit_capacity: usize,
    /// The residual stream.
    pub x: B::Tensor,
    /// The normalized hidden state; after the pass, the final norm's output.
    pub hn: B::Tensor,
    /// Queries.
    pub q: B::Tensor,
    /// Queries after the per-head norm (Qwen3, Gemma 3; empty otherwise).
    pub q_normed: B::Tensor,
    /// Keys.
    pub k: B::Tensor,
    /// Keys after the per-head norm (Qwen3, Gemma 3; empty otherwise).
    pub k_normed: B::Tensor,
    /// Values.
    pub v: B::Tensor,
    /// Attention output.
    pub attn: B::Tensor,
    /// A block's output before the residual add.
    pub o: B::Tensor,
    /// A block's output after its own norm (Gemma's post-norms; empty
    /// otherwise): then this, not `o`, joins the residual stream.
    pub post: B::Tensor,
    /// MLP gate.
    pub gate: B::Tensor,
    /// MLP up.
    pub up: B::Tensor,
    /// MLP activation.
    pub act: B::Tensor,
    /// The rows whose logits are wanted, gathered.
    pub picked: B::Tensor,
    /// Their logits.
    pub logits: B::Logits,
}

impl<B: Backend> Workspace<B> {
    /// Buffers of `c`'s widths for `capacity` rows and `logit_capacity` logits rows.
    pub fn new(b: &B, c: &ModelConfig, capacity: usize, logit_capacity: usize) -> Result<Self> {
        let rows = capacity.max(1);
        let (h, ff) = (c.hidden_size, c.intermediate_size);
        let qk_norm = c.qk_norm();
        Ok(Self {
            capacity,
            logit_capacity,
            x: b.tensor(rows, h)?,
            hn: b.tensor(rows, h)?,
            q: b.tensor(rows, c.q_dim())?,
            q_normed: b.tensor(if qk_norm { rows } else { 0 }, c.q_dim())?,
            k: b.tensor(rows, c.kv_dim())?,
            k_normed: b.tensor(if qk_norm { rows } else { 0 }, c.kv_dim())?,
            v: b.tensor(rows, c.kv_dim())?,
            attn: b.tensor(rows, c.q_dim())?,
            o: b.tensor(rows, h)?,
            post: b.tensor(if c.post_norms() { rows } else { 0 }, h)?,
            gate: b.tensor(rows, ff)?,
            up: b.tensor(rows, ff)?,
            act: b.tensor(rows, ff)?,
            picked: b.tensor(logit_capacity.max(1), h)?,
            logits: b.logits_buffer(logit_capacity.max(1), c.vocab_size)?,
        })
    }

    /// `old` if it fits a step of `rows` and `logit_rows`, else a new one
    /// at least as large as `old` and the step (so steps stop allocating
    /// once the largest has run).
    pub fn reuse_or_grow(old: Option<Self>, b: &B, c: &ModelConfig, rows: usize, logit_rows: usize) -> Result<Self> {
        match old {
            Some(ws) if ws.fits(rows, logit_rows) => Ok(ws),
            old => {
                let (capacity, logit_capacity) = old.map_or((0, 0), |w| (w.capacity, w.logit_capacity));
                Self::new(b, c, rows.max(capacity), logit_rows.max(logit_capacity))
            }
        }
    }

    /// Whether it fits a step of `rows` rows and `logit_rows` logits rows.
    pub fn fits(&self, rows: usize, logit_rows: usize) -> bool {
        self.capacity >= rows && self.logit_capacity >= logit_rows
    }
}
