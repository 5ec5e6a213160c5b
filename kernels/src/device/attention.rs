//! Launches of the paged-KV kernels (`cuda/attention.cu`): writing new keys
//! and values into their cache slots, and decode attention split along the
//! context (flash-decoding) with a reduction over the splits.

use super::{int, need, CudaError, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

/// Context tokens one decode block handles (`PARTITION` in attention.cu).
pub const DECODE_PARTITION: usize = 256;
/// Widest head the decode kernel takes (`MAX_HEAD_DIM` in attention.cu).
pub const MAX_HEAD_DIM: usize = 256;
const DECODE_THREADS: u32 = 128;
/// Most bytes of split-K partials one launch writes (longer batches are
/// launched in chunks of sequences).
const SCRATCH_BYTES: usize = 256 << 20;
/// gridDim.y limit.
const MAX_GRID_Y: usize = 65_535;

/// Split-K partials of decode attention, reusable across calls of a shape
/// that fits them (see [`Gpu::decode_scratch`]).
#[derive(Debug)]
pub struct DecodeScratch {
    out: CudaSlice<f32>,
    max: CudaSlice<f32>,
    sum: CudaSlice<f32>,
    partials: usize,
    head_dim: usize,
}

/// The geometry of one decode attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Sequences (one query token each).
    pub seqs: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Width of one head (at most [`MAX_HEAD_DIM`]).
    pub head_dim: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Columns of the block-table matrix.
    pub max_blocks: usize,
    /// The longest context among the sequences.
    pub max_context: usize,
}

impl DecodeShape {
    /// Context splits of [`DECODE_PARTITION`] tokens for the longest sequence.
    pub fn partitions(&self) -> usize {
        self.max_context.div_ceil(DECODE_PARTITION).max(1)
    }

    fn check(&self) -> Result<(), CudaError> {
        let bad = |why: &str| Err(CudaError::Shape(format!("{why}: {self:?}")));
        if self.head_dim == 0 || self.head_dim > MAX_HEAD_DIM {
            return bad("head_dim must be 1..=256");
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad("heads must be a multiple of kv_heads");
        }
        if self.block_size == 0 || self.max_blocks * self.block_size < self.max_context {
            return bad("the block tables do not cover the context");
        }
        Ok(())
    }

    /// Split-K partials a call of this shape needs (0 when the context fits
    /// one partition): what [`DecodeScratch`] must hold.
    pub fn scratch_partials(&self) -> usize {
        if self.partitions() > 1 {
            self.chunk() * self.heads * self.partitions()
        } else {
            0
        }
    }

    /// Sequences per launch: within the grid's y limit and, when the context
    /// is split, within [`SCRATCH_BYTES`] of partials.
    fn chunk(&self) -> usize {
        let per_seq = self.heads * self.partitions() * (self.head_dim + 2) * 4;
        let by_scratch = if self.partitions() > 1 { (SCRATCH_BYTES / per_seq.max(1)).max(1) } else { usize::MAX };
        self.seqs.min(MAX_GRID_Y).min(by_scratch).max(1)
    }
}

/// A kernel's `window` argument: 0 for none; a window of 0 tokens is an error.
pub(super) fn window_arg(window: Option<usize>) -> Result<i32, CudaError> {
    match window {
        None => Ok(0),
        Some(0) => Err(CudaError::Shape("a sliding window of 0 tokens".into())),
        Some(w) => int(w),
    }
}

impl Gpu {
    /// `k_cache[slots[t]] = k[t]` and `v_cache[slots[t]] = v[t]` for `tokens`
    /// rows of `kv_dim`; a negative slot skips its token.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_write(
        &self,
        k_cache: &mut CudaSlice<bf16>,
        v_cache: &mut CudaSlice<bf16>,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
        slots: &CudaSlice<i64>,
        tokens: usize,
        kv_dim: usize,
    ) -> Result<(), CudaError> {
        let f = self.function("kv_write_bf16")?;
        if tokens == 0 || kv_dim == 0 {
            return Ok(());
        }
        need(k, tokens * kv_dim, "k")?;
        need(v, tokens * kv_dim, "v")?;
        need(slots, tokens, "slots")?;
        need(v_cache, k_cache.len(), "v_cache")?;
        if !k_cache.len().is_multiple_of(kv_dim) {
            return Err(CudaError::Shape(format!("a cache of {} values does not hold rows of {kv_dim}", k_cache.len())));
        }
        let dim32 = int(kv_dim)?;
        let cfg = LaunchConfig { grid_dim: (int(tokens)? as u32, 1, 1), block_dim: (super::row_block(kv_dim), 1, 1), shared_mem_bytes: 0 };
        let mut launch = self.stream.launch_builder(f);
        launch.arg(k_cache).arg(v_cache).arg(k).arg(v).arg(slots).arg(&dim32);
        // SAFETY: k and v hold tokens * kv_dim values, slots tokens; every
        // non-negative slot is inside the caches (the caller's contract).
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }

    /// Split-K partials for decode attention of `shape` (`None` when the
    /// context fits one partition), for [`Self::paged_decode_in`].
    pub fn decode_scratch(&self, shape: &DecodeShape) -> Result<Option<DecodeScratch>, CudaError> {
        self.decode_scratch_for(shape.scratch_partials(), shape.head_dim)
    }

    /// Scratch of `partials` split-K partials of heads of `head_dim`
    /// (`None` for 0), e.g. the largest [`DecodeShape::scratch_partials`]
    /// of several shapes.
    pub fn decode_scratch_for(&self, partials: usize, head_dim: usize) -> Result<Option<DecodeScratch>, CudaError> {
        if partials == 0 {
            return Ok(None);
        }
        // SAFETY: uninitialized scratch; the decode kernel writes every entry
        // (partitions past a sequence's context included) before the
        // reduction reads the ones it uses.
        let (out, max, sum) = unsafe {
            (self.stream.alloc::<f32>(partials * head_dim)?, self.stream.alloc::<f32>(partials)?, self.stream.alloc::<f32>(partials)?)
        };
        Ok(Some(DecodeScratch { out, max, sum, partials, head_dim }))
    }

    /// [`Self::paged_decode_in`] with scratch allocated for this call.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode(
        &self,
        out: &mut CudaSlice<bf16>,
        q: &CudaSlice<bf16>,
        k_cache: &CudaSlice<bf16>,
        v_cache: &CudaSlice<bf16>,
        block_tables: &CudaSlice<i32>,
        context_lens: &CudaSlice<i32>,
        shape: DecodeShape,
        scale: f32,
        window: Option<usize>,
    ) -> Result<(), CudaError> {
        window_arg(window)?;
        if shape.seqs == 0 || shape.heads == 0 {
            return Ok(());
        }
        shape.check()?;
        let scratch = self.decode_scratch(&shape)?;
        self.paged_decode_in(out, q, k_cache, v_cache, block_tables, context_lens, shape, scale, window, scratch.as_ref())
    }

    /// Decode attention: `out[s, h] = softmax(scale · q[s, h] · K_s) · V_s`
    /// over the first `context_lens[s]` tokens of sequence `s`'s blocks
    /// (`block_tables` is `[seqs, max_blocks]`), GQA by `heads / kv_heads`.
    /// `q` and `out` are `[seqs, heads, head_dim]`. With `window` (a
    /// sliding-window layer) only the last `window` tokens of each context
    /// are attended.
    /// Allocates nothing (it can be captured into a CUDA graph): a split
    /// context needs `scratch` from [`Self::decode_scratch`] for this shape.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_in(
        &self,
        out: &mut CudaSlice<bf16>,
        q: &CudaSlice<bf16>,
        k_cache: &CudaSlice<bf16>,
        v_cache: &CudaSlice<bf16>,
        block_tables: &CudaSlice<i32>,
        context_lens: &CudaSlice<i32>,
        shape: DecodeShape,
        scale: f32,
        window: Option<usize>,
        scratch: Option<&DecodeScratch>,
    ) -> Result<(), CudaError> {
        let window32 = window_arg(window)?;
        let decode = self.function("paged_decode_bf16")?;
        let reduce = self.function("decode_reduce_bf16")?;
        if shape.seqs == 0 || shape.heads == 0 {
            return Ok(());
        }
        shape.check()?;
        let rows = shape.seqs * shape.heads * shape.head_dim;
        need(out, rows, "out")?;
        need(q, rows, "q")?;
        need(block_tables, shape.seqs * shape.max_blocks, "block_tables")?;
        need(context_lens, shape.seqs, "context_lens")?;
        need(v_cache, k_cache.len(), "v_cache")?;
        let parts = shape.partitions();
        let chunk = shape.chunk();
        let (max_blocks, heads, kv_heads) = (int(shape.max_blocks)?, int(shape.heads)?, int(shape.kv_heads)?);
        let (head_dim, block_size, parts32) = (int(shape.head_dim)?, int(shape.block_size)?, int(parts)?);
        let work = match scratch {
            Some(w) if parts > 1 => {
                if w.partials < chunk * shape.heads * parts || w.head_dim < shape.head_dim {
                    return Err(CudaError::Shape(format!("decode scratch of {} partials is too small for {shape:?}", w.partials)));
                }
                Some((&w.out, &w.max, &w.sum))
            }
            None if parts > 1 => return Err(CudaError::Shape(format!("{shape:?} splits the context and needs scratch"))),
            _ => None,
        };
        let null = 0u64;
        for base in (0..shape.seqs).step_by(chunk) {
            let n = chunk.min(shape.seqs - base) as u32;
            let base32 = int(base)?;
            let cfg = LaunchConfig { grid_dim: (heads as u32, n, parts32 as u32), block_dim: (DECODE_THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut launch = self.stream.launch_builder(decode);
            launch.arg(&mut *out);
            match &work {
                Some((o, m, s)) => launch.arg(*o).arg(*m).arg(*s),
                None => launch.arg(&null).arg(&null).arg(&null),
            };
            launch.arg(q).arg(k_cache).arg(v_cache).arg(block_tables).arg(context_lens);
            launch.arg(&max_blocks).arg(&heads).arg(&kv_heads).arg(&head_dim).arg(&block_size).arg(&scale).arg(&base32).arg(&window32);
            // SAFETY: the arguments match the kernel; the lengths were checked
            // above, the tables hold valid block ids and the context lengths
            // are at most max_context (the caller's contract), and the
            // partial buffers hold chunk * heads * parts (* head_dim) values.
            unsafe { launch.launch(cfg) }?;
            if let Some((o, m, s)) = &work {
                let cfg = LaunchConfig { grid_dim: (heads as u32, n, 1), block_dim: (super::row_block(shape.head_dim), 1, 1), shared_mem_bytes: 0 };
                let mut launch = self.stream.launch_builder(reduce);
                launch.arg(&mut *out).arg(*o).arg(*m).arg(*s).arg(context_lens).arg(&heads).arg(&head_dim).arg(&parts32).arg(&base32);
                // SAFETY: as above; the reduction reads what this chunk's decode wrote.
                unsafe { launch.launch(cfg) }?;
            }
        }
        Ok(())
    }
}
