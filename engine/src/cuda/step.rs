//! The layer pass of a step over reusable buffers: the activations of up to
//! `capacity` rows live in a [`Workspace`], the step's index arrays in
//! [`Inputs`], and attention goes through an [`AttentionLaunch`]. Nothing in
//! [`CudaModel::layer_pass`] allocates, so the same pass runs eagerly or
//! under CUDA graph capture.

use super::CudaModel;
use crate::config::ModelConfig;
use crate::error::Result;
use cudarc::driver::CudaSlice;
use half::bf16;
use spindle_kernels::device::Gpu;

/// Activation buffers for steps of up to `capacity` rows.
pub(super) struct Workspace {
    pub(super) capacity: usize,
    x: CudaSlice<bf16>,
    /// The normalized hidden state; after the pass, the final norm's output.
    pub(super) hn: CudaSlice<bf16>,
    q: CudaSlice<bf16>,
    q_normed: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    k_normed: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    o: CudaSlice<bf16>,
    gate: CudaSlice<bf16>,
    up: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
}

impl Workspace {
    /// Buffers for `capacity` rows of `c`'s shapes.
    pub(super) fn new(gpu: &Gpu, c: &ModelConfig, capacity: usize) -> Result<Self> {
        let zeros = |n: usize| gpu.stream.alloc_zeros::<bf16>(capacity.max(1) * n);
        let (h, i) = (c.hidden_size, c.intermediate_size);
        Ok(Self {
            capacity,
            x: zeros(h)?,
            hn: zeros(h)?,
            q: zeros(c.q_dim())?,
            q_normed: zeros(c.q_dim())?,
            k: zeros(c.kv_dim())?,
            k_normed: zeros(c.kv_dim())?,
            v: zeros(c.kv_dim())?,
            attn: zeros(c.q_dim())?,
            o: zeros(h)?,
            gate: zeros(i)?,
            up: zeros(i)?,
            act: zeros(i)?,
        })
    }
}

/// A step's per-row inputs on the device (at least as many rows as the pass runs).
pub(super) struct Inputs {
    pub(super) ids: CudaSlice<u32>,
    /// Cache slot of each row's key and value (negative: not written).
    pub(super) slots: CudaSlice<i64>,
    /// RoPE tables, rows of head_dim / 2.
    pub(super) cos: CudaSlice<f32>,
    pub(super) sin: CudaSlice<f32>,
}

/// Attention over one layer's cache, all rows of the step.
pub(super) trait AttentionLaunch {
    /// `out` = attention of `q` over `k` / `v` (which hold this step's keys and values).
    fn run(&self, g: &Gpu, out: &mut CudaSlice<bf16>, q: &CudaSlice<bf16>, k: &CudaSlice<bf16>, v: &CudaSlice<bf16>) -> Result<()>;
}

impl CudaModel {
    /// Every layer and the final norm for `rows` rows of `inputs`, writing
    /// their keys and values into the cache; the result is `ws.hn`.
    pub(super) fn layer_pass(&mut self, ws: &mut Workspace, inputs: &Inputs, attention: &dyn AttentionLaunch, rows: usize) -> Result<()> {
        let c = &self.config;
        let (t, h, eps) = (rows, c.hidden_size, c.rms_norm_eps);
        let g = &self.gpu;
        let interleaved = self.rope.interleaved();
        g.embedding(&mut ws.x, &self.embed, &inputs.ids, t, h, c.vocab_size as u32)?;
        for (li, layer) in self.layers.iter().enumerate() {
            // The residual add of the previous block is fused into this norm.
            if li == 0 {
                g.add_rmsnorm(&mut ws.hn, None, &ws.x, &layer.attn_norm, t, h, eps)?;
            } else {
                g.add_rmsnorm(&mut ws.hn, Some(&mut ws.x), &ws.o, &layer.attn_norm, t, h, eps)?;
            }
            g.gemm(&mut ws.q, &ws.hn, &layer.wq, t, c.q_dim(), h)?;
            g.gemm(&mut ws.k, &ws.hn, &layer.wk, t, c.kv_dim(), h)?;
            g.gemm(&mut ws.v, &ws.hn, &layer.wv, t, c.kv_dim(), h)?;
            let (q, k) = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => {
                    g.add_rmsnorm(&mut ws.q_normed, None, &ws.q, qn, t * c.num_heads, c.head_dim, eps)?;
                    g.add_rmsnorm(&mut ws.k_normed, None, &ws.k, kn, t * c.num_kv_heads, c.head_dim, eps)?;
                    (&mut ws.q_normed, &mut ws.k_normed)
                }
                _ => (&mut ws.q, &mut ws.k),
            };
            g.rope_table(q, &inputs.cos, &inputs.sin, t, c.num_heads, c.head_dim, interleaved)?;
            g.rope_table(k, &inputs.cos, &inputs.sin, t, c.num_kv_heads, c.head_dim, interleaved)?;
            g.kv_write(&mut self.k_cache[li], &mut self.v_cache[li], k, &ws.v, &inputs.slots, t, c.kv_dim())?;
            attention.run(g, &mut ws.attn, q, &self.k_cache[li], &self.v_cache[li])?;
            g.gemm(&mut ws.o, &ws.attn, &layer.wo, t, h, c.q_dim())?;
            g.add_rmsnorm(&mut ws.hn, Some(&mut ws.x), &ws.o, &layer.ffn_norm, t, h, eps)?;
            g.gemm(&mut ws.gate, &ws.hn, &layer.gate, t, c.intermediate_size, h)?;
            g.gemm(&mut ws.up, &ws.hn, &layer.up, t, c.intermediate_size, h)?;
            g.silu_mul(&mut ws.act, &ws.gate, &ws.up, t * c.intermediate_size)?;
            g.gemm(&mut ws.o, &ws.act, &layer.down, t, h, c.intermediate_size)?;
        }
        g.add_rmsnorm(&mut ws.hn, Some(&mut ws.x), &ws.o, &self.final_norm, t, h, eps)?;
        Ok(())
    }
}
