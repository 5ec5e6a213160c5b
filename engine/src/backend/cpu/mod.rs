//! The CPU backend: f32 activations, weights kept in their file's block
//! formats ([`Linear`], integer SIMD kernels), a paged [`KvPool`] (f16 rows
//! in fast mode, f32 in exact mode), and sampling on the host. Ops split
//! across threads run on [`crate::pool`].

mod aligned;
pub mod attention;

pub use aligned::AlignedBuffer;

use super::{gated_mlp_composed, Backend, DeviceSampling, GatedMlp, KvGeometry, KvSize, LinearJob, MlpScratch, PassFn, Presampled, StepLayout, StepLogits, Workspace};
use crate::batch::ForwardBatch;
use crate::config::{Activation, ModelConfig};
use crate::error::{EngineError, Result};
use crate::kv::{KvDtype, KvPool};
use crate::model::linear::{matmul_many, MatmulJob};
use crate::model::mlp::{gated_mlp_fused, GateFn, MlpLayers};
use crate::model::ops::{add_in_place, gelu_tanh_mul, rms_norm_into, silu_mul, Rope, RopeAngles};
use crate::model::{Linear, MatmulPrecision};
use crate::weights::TensorView;
use attention::{paged_attention, HeadShape};

/// The CPU backend (see the module doc).
#[derive(Debug, Default)]
pub struct CpuBackend {
    precision: MatmulPrecision,
    /// The KV dtype asked for, if not the precision's.
    kv_dtype: Option<KvDtype>,
    kv: Option<KvPool>,
    shape: Option<HeadShape>,
    config: Option<ModelConfig>,
    /// RoPE of the sliding-window layers, where the model has them.
    local_rope: Option<Rope>,
    workspace: Option<Workspace<CpuBackend>>,
}

impl std::fmt::Debug for Workspace<CpuBackend> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace").field("capacity", &self.capacity).field("logit_capacity", &self.logit_capacity).finish_non_exhaustive()
    }
}

/// Writes every buffer of `ws` once: fresh allocations are pages the
/// kernel has not mapped yet, and each first write would fault one in.
fn touch_pages(ws: &mut Workspace<CpuBackend>) {
    let Workspace { capacity: _, logit_capacity: _, x, hn, q, q_normed, k, k_normed, v, attn, o, post, gate, up, act, picked, logits } = ws;
    let buffers = [x, hn, q, q_normed, k, k_normed, v, attn, o, post, gate, up, act, picked].map(|b| &mut b[..]);
    for buffer in buffers.into_iter().chain([logits.as_mut_slice()]) {
        // Opaque, so the writes are not dropped as redundant (the logits
        // come from calloc; their pages are mapped at the first write).
        std::hint::black_box(buffer).fill(0.0);
    }
}

/// One step's inputs on the CPU.
#[derive(Debug)]
pub struct CpuStep {
    layout: StepLayout,
    angles: RopeAngles,
    rope: Rope,
    /// The local layers' RoPE and its angles (Gemma 3).
    local: Option<(Rope, RopeAngles)>,
}

impl CpuBackend {
    /// A backend multiplying with `precision`.
    pub fn new(precision: MatmulPrecision) -> Self {
        Self { precision, ..Self::default() }
    }

    /// Store the KV cache as `dtype` whatever the precision (`None`: f16 in
    /// fast mode, f32 in exact mode). Takes effect at the next allocation.
    pub fn with_kv_dtype(mut self, dtype: Option<KvDtype>) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// The KV cache dtype the next allocation uses.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype.unwrap_or(match self.precision {
            MatmulPrecision::Exact => KvDtype::F32,
            MatmulPrecision::Fast => KvDtype::F16,
        })
    }

    /// Choose fast (8-bit activations, an f16 KV cache) or exact (f32
    /// matmuls and cache). An allocated pool of the other dtype is replaced
    /// by an empty one of the same geometry: its contents are lost, so
    /// switch between requests, not during one.
    pub fn set_precision(&mut self, precision: MatmulPrecision) {
        self.precision = precision;
        let pool = self.kv.as_ref().map(|kv| (kv.num_blocks(), kv.block_size(), kv.dtype()));
        if let (Some((blocks, block_size, dtype)), Some(c)) = (pool, self.config.clone()) {
            if dtype != self.kv_dtype() {
                self.attach_pool(&c, blocks, block_size);
            }
        }
    }

    /// The matmul precision in force.
    pub fn precision(&self) -> MatmulPrecision {
        self.precision
    }

    /// Allocates a pool of `num_blocks` blocks of `block_size` tokens for
    /// `c` (replacing any earlier one).
    pub fn attach_pool(&mut self, c: &ModelConfig, num_blocks: usize, block_size: usize) -> KvGeometry {
        self.kv = Some(KvPool::new(c.num_layers, num_blocks, block_size, c.kv_dim(), self.kv_dtype()));
        self.shape = Some(HeadShape { num_heads: c.num_heads, num_kv_heads: c.num_kv_heads, head_dim: c.head_dim, scale: c.attention_scale() });
        self.local_rope = c.sliding_window.map(|w| Rope::with_base(c, w.local_rope_theta));
        self.workspace = None;
        self.config = Some(c.clone());
        self.kv_geometry()
    }

    fn pool(&self) -> Result<&KvPool> {
        self.kv.as_ref().ok_or_else(|| EngineError::Backend("the KV cache is not allocated".into()))
    }
}

impl Backend for CpuBackend {
    type Tensor = AlignedBuffer;
    type Weight = Linear;
    type Vector = Vec<f32>;
    type Logits = Vec<f32>;
    type Step = CpuStep;

    fn describe(&self) -> String {
        format!("cpu ({} threads)", crate::pool::global().threads())
    }

    fn load_linear(&self, t: &TensorView<'_>, rows: usize, cols: usize, bias: Option<Vec<f32>>) -> Result<Linear> {
        let linear = Linear::from_tensor(t, rows, cols)?;
        match bias {
            Some(b) => linear.with_bias(b),
            None => Ok(linear),
        }
    }

    fn refine_input(&self, w: &mut Linear) {
        w.refine_input();
    }

    fn load_vector(&self, values: Vec<f32>) -> Result<Vec<f32>> {
        Ok(values)
    }

    fn weight_bytes(&self, w: &Linear) -> usize {
        w.weight_bytes()
    }

    fn allocate_kv(&mut self, c: &ModelConfig, size: KvSize, block_size: usize) -> Result<KvGeometry> {
        let num_blocks = match size {
            KvSize::Blocks(n) => n,
            KvSize::Bytes(b) => KvPool::blocks_for_budget(b, c.num_layers, block_size.max(1), c.kv_dim(), self.kv_dtype()),
            KvSize::MemoryFraction(_) => return Err(EngineError::Backend("the CPU's KV cache is sized in bytes, not as a fraction of device memory".into())),
        };
        if num_blocks == 0 || block_size == 0 {
            return Err(EngineError::Backend(format!("no room for a KV cache ({num_blocks} blocks of {block_size} tokens)")));
        }
        Ok(self.attach_pool(c, num_blocks, block_size))
    }

    fn kv_geometry(&self) -> KvGeometry {
        match &self.kv {
            Some(kv) => KvGeometry {
                block_size: kv.block_size(),
                num_blocks: kv.num_blocks(),
                bytes_per_block: KvPool::bytes_per_block(kv.num_layers(), kv.block_size(), kv.kv_dim(), kv.dtype()),
            },
            None => KvGeometry { block_size: 0, num_blocks: 0, bytes_per_block: 0 },
        }
    }

    fn tensor(&self, rows: usize, width: usize) -> Result<AlignedBuffer> {
        Ok(AlignedBuffer::zeroed(rows * width))
    }

    fn logits_buffer(&self, rows: usize, vocab: usize) -> Result<Vec<f32>> {
        Ok(vec![0f32; rows * vocab])
    }

    fn reserve_workspace(&mut self, rows: usize, logit_rows: usize) -> Result<()> {
        let Some(config) = self.config.as_ref() else {
            return Ok(()); // no model attached yet: nothing to size
        };
        let mut ws = Workspace::reuse_or_grow(self.workspace.take(), self, config, rows, logit_rows)?;
        touch_pages(&mut ws);
        self.workspace = Some(ws);
        Ok(())
    }

    fn run_step(&mut self, batch: &ForwardBatch, layout: StepLayout, rope: &Rope, _sampling: DeviceSampling<'_>, pass: &mut PassFn<'_, Self>) -> Result<StepLogits> {
        let (rows, logit_rows) = (layout.num_rows(), layout.rows.len());
        let local = self.local_rope.as_ref().map(|r| (r.clone(), r.angles(&layout.positions)));
        let step = CpuStep { angles: rope.angles(&layout.positions), rope: rope.clone(), local, layout };
        let config = self.config.as_ref().ok_or_else(|| EngineError::Backend("the KV cache is not allocated".into()))?;
        let vocab = config.vocab_size;
        let mut ws = Workspace::reuse_or_grow(self.workspace.take(), self, config, rows, logit_rows)?;
        let result = pass(self, &mut ws, &step, rows);
        let logits = result.map(|()| step.layout.split_logits(&ws.logits[..logit_rows * vocab], vocab));
        self.workspace = Some(ws);
        Ok(StepLogits { logits: logits?, sampled: vec![Presampled::No; batch.seqs.len()] })
    }

    fn embed(&self, out: &mut AlignedBuffer, table: &Linear, step: &CpuStep, rows: usize) -> Result<()> {
        let h = table.cols();
        for (r, &id) in step.layout.ids[..rows].iter().enumerate() {
            table.row_f32(id as usize, &mut out[r * h..(r + 1) * h])?;
        }
        Ok(())
    }

    fn add_rms_norm(&self, out: &mut AlignedBuffer, residual: Option<&mut AlignedBuffer>, x: &AlignedBuffer, weight: &Vec<f32>, rows: usize, width: usize, eps: f32) -> Result<()> {
        let n = rows * width;
        match residual {
            Some(r) => {
                let norm = |(out, (r, x)): (&mut [f32], (&mut [f32], &[f32]))| {
                    add_in_place(r, x);
                    rms_norm_into(r, weight, eps, out);
                };
                let (out, r, x) = (&mut out[..n], &mut r[..n], &x[..n]);
                match parallel_chunk(rows, width) {
                    Some(c) => {
                        let mut parts: Vec<_> = out.chunks_mut(c).zip(r.chunks_mut(c).zip(x.chunks(c))).collect();
                        crate::pool::for_each_mut(&mut parts, |_, (o, (r, x))| norm((o, (r, x))));
                    }
                    None => norm((out, (r, x))),
                }
            }
            None => each_chunk(&mut out[..n], &x[..n], &x[..n], rows, width, |o, x, _| rms_norm_into(x, weight, eps, o)),
        }
        Ok(())
    }

    fn linear_many(&self, x: &AlignedBuffer, rows: usize, jobs: &mut [LinearJob<'_, Self>]) -> Result<()> {
        let mut jobs: Vec<MatmulJob<'_>> = jobs.iter_mut().map(|(layer, out)| MatmulJob { layer, out: &mut out[..] }).collect();
        matmul_many(&mut jobs, x, rows, self.precision)
    }

    fn rope(&self, x: &mut AlignedBuffer, step: &CpuStep, rows: usize, heads: usize) -> Result<()> {
        rotate(&step.rope, &mut x[..rows * heads * step.rope.head_dim()], &step.angles, heads);
        Ok(())
    }

    fn rope_local(&self, x: &mut AlignedBuffer, step: &CpuStep, rows: usize, heads: usize) -> Result<()> {
        let (rope, angles) = step.local.as_ref().ok_or_else(|| EngineError::Backend("this model has no sliding-window layers".into()))?;
        rotate(rope, &mut x[..rows * heads * rope.head_dim()], angles, heads);
        Ok(())
    }

    fn kv_write(&mut self, layer: usize, k: &AlignedBuffer, v: &AlignedBuffer, step: &CpuStep, rows: usize) -> Result<()> {
        let kv = self.kv.as_mut().ok_or_else(|| EngineError::Backend("the KV cache is not allocated".into()))?;
        let d = kv.kv_dim();
        for (t, &slot) in step.layout.slots[..rows].iter().enumerate() {
            kv.write(layer, slot as usize, &k[t * d..(t + 1) * d], &v[t * d..(t + 1) * d]);
        }
        Ok(())
    }

    fn attention(&self, layer: usize, out: &mut AlignedBuffer, q: &AlignedBuffer, step: &CpuStep, _rows: usize) -> Result<()> {
        let shape = self.shape.ok_or_else(|| EngineError::Backend("the KV cache is not allocated".into()))?;
        let window = self.config.as_ref().and_then(|c| c.layer_window(layer));
        paged_attention(q, out, self.pool()?, layer, &step.layout, shape, window);
        Ok(())
    }

    /// Fused where it applies ([`crate::model::mlp`]: 16 rows or more, K-quant
    /// projections), else composed.
    fn gated_mlp(&self, out: &mut AlignedBuffer, x: &AlignedBuffer, mlp: &GatedMlp<'_, Self>, rows: usize, scratch: MlpScratch<'_, Self>) -> Result<()> {
        let act: GateFn = match mlp.activation {
            Activation::Silu => silu_mul,
            Activation::GeluTanh => gelu_tanh_mul,
        };
        let layers = MlpLayers { gate: mlp.gate, up: mlp.up, down: mlp.down };
        if gated_mlp_fused(&layers, x, rows, self.precision, act, out)? {
            return Ok(());
        }
        gated_mlp_composed(self, out, x, mlp, rows, scratch)
    }

    fn silu_mul(&self, out: &mut AlignedBuffer, gate: &AlignedBuffer, up: &AlignedBuffer, rows: usize, width: usize) -> Result<()> {
        let n = rows * width;
        each_chunk(&mut out[..n], &gate[..n], &up[..n], rows, width, silu_mul);
        Ok(())
    }

    fn gelu_tanh_mul(&self, out: &mut AlignedBuffer, gate: &AlignedBuffer, up: &AlignedBuffer, rows: usize, width: usize) -> Result<()> {
        let n = rows * width;
        each_chunk(&mut out[..n], &gate[..n], &up[..n], rows, width, gelu_tanh_mul);
        Ok(())
    }

    fn scale(&self, x: &mut AlignedBuffer, rows: usize, width: usize, factor: f32) -> Result<()> {
        x[..rows * width].iter_mut().for_each(|v| *v *= factor);
        Ok(())
    }

    fn logits(&self, out: &mut Vec<f32>, picked: &mut AlignedBuffer, hidden: &AlignedBuffer, head: &Linear, step: &CpuStep) -> Result<()> {
        let h = head.cols();
        let rows = &step.layout.rows;
        for (i, &r) in rows.iter().enumerate() {
            let r = r as usize;
            picked[i * h..(i + 1) * h].copy_from_slice(&hidden[r * h..(r + 1) * h]);
        }
        if rows.is_empty() {
            return Ok(());
        }
        head.forward(&picked[..rows.len() * h], rows.len(), out, self.precision)
    }
}

/// Elements from which an element-wise op is split across the pool
/// (prefill-sized steps; a decode step's few rows stay on one thread).
const PARALLEL_ELEMENTS: usize = 1 << 15;

/// The chunk length (whole rows) to split `rows` rows of `width` into, or
/// `None` when the op is too small to be worth splitting.
fn parallel_chunk(rows: usize, width: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    (threads > 1 && rows > 1 && rows * width >= PARALLEL_ELEMENTS).then(|| rows.div_ceil(threads * 4) * width)
}

/// `op(out, a, b)` over matching whole-row chunks of the three buffers.
fn each_chunk(out: &mut [f32], a: &[f32], b: &[f32], rows: usize, width: usize, op: impl Fn(&mut [f32], &[f32], &[f32]) + Sync) {
    match parallel_chunk(rows, width) {
        Some(c) => {
            let mut parts: Vec<_> = out.chunks_mut(c).zip(a.chunks(c).zip(b.chunks(c))).collect();
            crate::pool::for_each_mut(&mut parts, |_, (o, (a, b))| op(o, a, b));
        }
        None => op(out, a, b),
    }
}

/// RoPE over every row of `x` (`[rows, heads * head_dim]`), rows split across the pool.
fn rotate(rope: &Rope, x: &mut [f32], angles: &RopeAngles, heads: usize) {
    let width = heads * rope.head_dim();
    let rows = x.len() / width.max(1);
    match parallel_chunk(rows, width) {
        Some(c) => {
            let mut parts: Vec<&mut [f32]> = x.chunks_mut(c).collect();
            crate::pool::for_each_mut(&mut parts, |i, part| rope.apply_from(part, angles, heads, i * (c / width)));
        }
        None => rope.apply(x, angles, heads),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        let json = serde_json::json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3, "vocab_size": 100,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0});
        ModelConfig::from_hf_json(&json).unwrap()
    }

    #[test]
    fn the_kv_geometry_follows_the_size_asked_for() {
        let c = config();
        let mut b = CpuBackend::default();
        assert_eq!(b.kv_geometry().num_blocks, 0, "nothing before allocation");
        // 3 layers × 16 tokens × kv_dim 32 × (key + value) × 2 bytes (f16 in fast mode).
        let per_block = 3 * 16 * 32 * 2 * 2;
        let g = b.allocate_kv(&c, KvSize::Blocks(7), 16).unwrap();
        assert_eq!(g, KvGeometry { block_size: 16, num_blocks: 7, bytes_per_block: per_block });
        assert_eq!(g.tokens(), 112);
        let g = b.allocate_kv(&c, KvSize::Bytes(per_block * 5 + 1), 16).unwrap();
        assert_eq!(g.num_blocks, 5);
        assert!(b.allocate_kv(&c, KvSize::Bytes(per_block - 1), 16).is_err(), "a budget below one block is refused");
        assert!(b.allocate_kv(&c, KvSize::MemoryFraction(0.5), 16).is_err(), "the CPU has no device memory fraction");
        b.set_precision(MatmulPrecision::Exact);
        assert_eq!(b.kv_geometry(), KvGeometry { block_size: 16, num_blocks: 5, bytes_per_block: 2 * per_block }, "exact mode keeps f32 rows, same blocks");
        let g = b.allocate_kv(&c, KvSize::Bytes(per_block * 5 + 1), 16).unwrap();
        assert_eq!(g.num_blocks, 2, "an f32 budget buys half the blocks");
        let mut pinned = CpuBackend::new(MatmulPrecision::Fast).with_kv_dtype(Some(KvDtype::F32));
        assert_eq!(pinned.allocate_kv(&c, KvSize::Blocks(3), 16).unwrap().bytes_per_block, 2 * per_block, "an asked-for dtype wins over fast mode's");
        pinned.set_precision(MatmulPrecision::Exact);
        assert_eq!(pinned.kv_geometry().bytes_per_block, 2 * per_block);
    }

    #[test]
    fn the_workspace_is_reused_when_it_fits_and_grows_to_the_largest_step() {
        let c = config();
        let b = CpuBackend::default();
        let ws = Workspace::reuse_or_grow(None, &b, &c, 8, 1).unwrap();
        assert_eq!((ws.capacity, ws.logit_capacity, ws.x.len()), (8, 1, 8 * 64));
        let ptr = ws.x.as_ptr();
        let ws = Workspace::reuse_or_grow(Some(ws), &b, &c, 3, 1).unwrap();
        assert_eq!(ws.x.as_ptr(), ptr, "a smaller step reuses the buffers");
        let ws = Workspace::reuse_or_grow(Some(ws), &b, &c, 2, 4).unwrap();
        assert_eq!((ws.capacity, ws.logit_capacity), (8, 4), "grown to cover both the old and the new step");
        assert_eq!(ws.logits.len(), 4 * 100);
        assert!(ws.q_normed.is_empty(), "no per-head norm buffers for Llama");
    }

    #[test]
    fn reserving_sizes_the_workspace_before_the_first_step_and_never_shrinks_it() {
        let c = config();
        let mut b = CpuBackend::default();
        b.reserve_workspace(64, 4).unwrap();
        assert!(b.workspace.is_none(), "without a model there is nothing to size");
        b.allocate_kv(&c, KvSize::Blocks(2), 16).unwrap();
        b.reserve_workspace(64, 4).unwrap();
        let ws = b.workspace.as_ref().expect("a workspace before any step");
        assert_eq!((ws.capacity, ws.logit_capacity, ws.gate.len(), ws.logits.len()), (64, 4, 64 * c.intermediate_size, 4 * 100));
        b.reserve_workspace(8, 1).unwrap();
        let ws = b.workspace.as_ref().expect("kept");
        assert_eq!((ws.capacity, ws.logit_capacity), (64, 4), "a smaller reservation keeps the larger buffers");
    }
}
