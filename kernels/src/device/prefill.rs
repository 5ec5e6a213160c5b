//! Launch of the flash-attention prefill kernel (`cuda/prefill.cu`): causal
//! attention of many new tokens per sequence over the paged KV cache, tiled
//! on tensor cores with an online softmax.

use super::{int, need, CudaError, Gpu};
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

/// Query rows per block (`PF_M` in prefill.cu).
pub const PREFILL_TILE: usize = 64;
const PF_N: usize = 64;
const PF_THREADS: u32 = 128;
/// Widest head the prefill kernel takes (a multiple of 16 up to this).
pub const PREFILL_MAX_HEAD_DIM: usize = 256;

/// The geometry of one prefill attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillShape {
    /// Sequences in the batch.
    pub seqs: usize,
    /// All new tokens (rows of `q` and `out`).
    pub tokens: usize,
    /// The most new tokens any sequence has.
    pub max_new: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Width of one head (a multiple of 16, at most [`PREFILL_MAX_HEAD_DIM`]).
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Columns of the block-table matrix (one row per sequence).
    pub max_blocks: usize,
}

impl PrefillShape {
    /// Whether the kernel takes heads of this width.
    pub fn supports_head_dim(head_dim: usize) -> bool {
        head_dim > 0 && head_dim.is_multiple_of(16) && head_dim <= PREFILL_MAX_HEAD_DIM
    }

    /// Dynamic shared memory the kernel needs (mirrors the carve-up in prefill.cu).
    pub fn shared_bytes(&self) -> usize {
        let (m, n, d) = (PREFILL_TILE, PF_N, self.head_dim);
        let q_k_v = (m + 2 * n) * (d + 8) * 2;
        let scores = m * (n + 4) * 4;
        let probs = m * (n + 8) * 2;
        let acc = m * (d + 4) * 4;
        q_k_v + scores + probs + acc + 2 * m * 4
    }

    fn check(&self) -> Result<(), CudaError> {
        let bad = |why: &str| Err(CudaError::Shape(format!("{why}: {self:?}")));
        if !Self::supports_head_dim(self.head_dim) {
            return bad("prefill attention needs head_dim a multiple of 16, at most 256");
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad("heads must be a multiple of kv_heads");
        }
        if self.block_size == 0 || self.max_blocks == 0 {
            return bad("empty block tables");
        }
        Ok(())
    }
}

impl Gpu {
    /// Whether [`Self::paged_prefill`] runs for heads of `head_dim` here: a
    /// width it takes, and its shared memory within the device's opt-in limit.
    pub fn prefill_supported(&self, head_dim: usize) -> bool {
        if !PrefillShape::supports_head_dim(head_dim) {
            return false;
        }
        let shape = PrefillShape { seqs: 1, tokens: 1, max_new: 1, heads: 1, kv_heads: 1, head_dim, block_size: 1, max_blocks: 1 };
        let limit = self.ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
        limit.is_ok_and(|l| usize::try_from(l).is_ok_and(|l| shape.shared_bytes() <= l))
    }

    /// Prefill attention: for each sequence `s`, its new tokens are rows
    /// `q_starts[s]..q_starts[s + 1]` of `q` / `out` (`[tokens, heads,
    /// head_dim]`) at positions `start_pos[s]..`, and each attends causally
    /// to the cached keys and values up to its own position through the
    /// sequence's row of `block_tables` (`[seqs, max_blocks]`). The keys and
    /// values of the new tokens must already be in the cache. With `window`
    /// (a sliding-window layer) a query at position p sees only the keys j
    /// with p − j < window.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_prefill(
        &self,
        out: &mut CudaSlice<bf16>,
        q: &CudaSlice<bf16>,
        k_cache: &CudaSlice<bf16>,
        v_cache: &CudaSlice<bf16>,
        block_tables: &CudaSlice<i32>,
        q_starts: &CudaSlice<i32>,
        start_pos: &CudaSlice<i32>,
        shape: PrefillShape,
        scale: f32,
        window: Option<usize>,
    ) -> Result<(), CudaError> {
        let f = self.function("paged_prefill_bf16")?;
        let window32 = super::attention::window_arg(window)?;
        if shape.seqs == 0 || shape.tokens == 0 || shape.heads == 0 {
            return Ok(());
        }
        shape.check()?;
        if shape.max_new == 0 {
            return Err(CudaError::Shape(format!("max_new must cover the longest sequence: {shape:?}")));
        }
        let rows = shape.tokens * shape.heads * shape.head_dim;
        need(out, rows, "out")?;
        need(q, rows, "q")?;
        need(block_tables, shape.seqs * shape.max_blocks, "block_tables")?;
        need(q_starts, shape.seqs + 1, "q_starts")?;
        need(start_pos, shape.seqs, "start_pos")?;
        need(v_cache, k_cache.len(), "v_cache")?;
        let bytes = shape.shared_bytes();
        let limit = self.ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        if bytes > usize::try_from(limit).unwrap_or(0) {
            return Err(CudaError::Shape(format!("prefill attention needs {bytes} bytes of shared memory, the device allows {limit}")));
        }
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(bytes)?)?;
        if shape.heads > 65_535 || shape.seqs > 65_535 {
            return Err(CudaError::TooLarge(shape.seqs.max(shape.heads)));
        }
        let cfg = LaunchConfig {
            grid_dim: (int(shape.max_new.div_ceil(PREFILL_TILE))? as u32, shape.heads as u32, shape.seqs as u32),
            block_dim: (PF_THREADS, 1, 1),
            shared_mem_bytes: bytes as u32,
        };
        let (max_blocks, heads, kv_heads) = (int(shape.max_blocks)?, int(shape.heads)?, int(shape.kv_heads)?);
        let (head_dim, block_size) = (int(shape.head_dim)?, int(shape.block_size)?);
        let mut launch = self.stream.launch_builder(f);
        launch.arg(out).arg(q).arg(k_cache).arg(v_cache).arg(block_tables).arg(q_starts).arg(start_pos);
        launch.arg(&max_blocks).arg(&heads).arg(&kv_heads).arg(&head_dim).arg(&block_size).arg(&scale).arg(&window32);
        // SAFETY: the argument list matches the kernel; q and out hold tokens
        // rows, the tables seqs rows; q_starts is non-decreasing with
        // q_starts[seqs] <= tokens, every block a sequence's positions reach is
        // in its table and inside the caches (the caller's contract).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}
