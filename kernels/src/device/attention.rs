//! Launches of the paged-KV kernels (`cuda/attention.cu`): writing new keys
//! and values into their cache slots, and decode attention split along the
//! context (flash-decoding) with a reduction over the splits.

use super::{int, need, CudaError, Gpu};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::bf16;

/// Context tokens one decode block handles at most (`PARTITION` in
/// attention.cu): the per-head kernel's split.
pub const DECODE_PARTITION: usize = 256;
/// Widest head the decode kernel takes (`MAX_HEAD_DIM` in attention.cu).
pub const MAX_HEAD_DIM: usize = 256;
const DECODE_THREADS: u32 = 128;
/// Most bytes of split-K partials one launch writes (longer batches are
/// launched in chunks of sequences).
const SCRATCH_BYTES: usize = 256 << 20;
/// gridDim.y limit.
const MAX_GRID_Y: usize = 65_535;
/// The grouped kernel's narrowest context split.
const MIN_PARTITION: usize = 32;
/// Blocks a grouped launch aims for (about four per multiprocessor of an
/// H200): below it the context is split finer.
const TARGET_BLOCKS: usize = 512;

/// Query heads per KV head the grouped decode kernel takes (`MAX_GROUP` in
/// attention.cu).
pub const MAX_DECODE_GROUP: usize = 8;

/// Which decode attention kernel a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKernel {
    /// [`Self::Grouped`] where the shape allows it, else [`Self::PerHead`].
    Auto,
    /// One block per query head and context split of [`DECODE_PARTITION`];
    /// takes every shape the call takes.
    PerHead,
    /// One block per KV head for all its query heads, so each cached row is
    /// read once per group, in 16-byte loads (4 tokens ahead per lane), the
    /// context split finer when the batch is small
    /// ([`DecodeShape::grouped_partition`]): `head_dim` a multiple of 8 and
    /// at most [`MAX_DECODE_GROUP`] query heads per KV head.
    Grouped,
}

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
    /// Context splits of [`DECODE_PARTITION`] tokens (the per-head kernel's)
    /// for the longest sequence.
    pub fn partitions(&self) -> usize {
        self.partitions_of(DECODE_PARTITION)
    }

    /// The grouped kernel's context split: [`DECODE_PARTITION`] halved (down
    /// to 32 tokens) while its grid would have fewer than 512 blocks, so a
    /// few sequences still spread over the GPU.
    pub fn grouped_partition(&self) -> usize {
        let seqs = self.seqs.clamp(1, MAX_GRID_Y);
        let mut partition = DECODE_PARTITION;
        while partition > MIN_PARTITION && self.kv_heads * seqs * self.partitions_of(partition) < TARGET_BLOCKS {
            partition /= 2;
        }
        partition
    }

    fn partitions_of(&self, partition: usize) -> usize {
        self.max_context.div_ceil(partition).max(1)
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

    /// Whether [`DecodeKernel::Grouped`] takes this shape.
    pub fn fits_grouped(&self) -> bool {
        self.head_dim.is_multiple_of(8) && self.kv_heads > 0 && self.heads / self.kv_heads <= MAX_DECODE_GROUP
    }

    /// Split-K partials a call of this shape needs on either kernel (0 when
    /// the context fits one partition): what [`DecodeScratch`] must hold.
    pub fn scratch_partials(&self) -> usize {
        self.partials_of(DECODE_PARTITION).max(self.partials_of(self.grouped_partition()))
    }

    fn partials_of(&self, partition: usize) -> usize {
        let parts = self.partitions_of(partition);
        if parts > 1 {
            self.chunk_of(partition) * self.heads * parts
        } else {
            0
        }
    }

    /// Sequences per launch with splits of `partition` tokens: within the
    /// grid's y limit and, when the context is split, within
    /// [`SCRATCH_BYTES`] of partials.
    fn chunk_of(&self, partition: usize) -> usize {
        let parts = self.partitions_of(partition);
        let per_seq = self.heads * parts * (self.head_dim + 2) * 4;
        let by_scratch = if parts > 1 { (SCRATCH_BYTES / per_seq.max(1)).max(1) } else { usize::MAX };
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
        kernel: DecodeKernel,
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
        self.paged_decode_in(kernel, out, q, k_cache, v_cache, block_tables, context_lens, shape, scale, window, scratch.as_ref())
    }

    /// Decode attention: `out[s, h] = softmax(scale · q[s, h] · K_s) · V_s`
    /// over the first `context_lens[s]` tokens of sequence `s`'s blocks
    /// (`block_tables` is `[seqs, max_blocks]`), GQA by `heads / kv_heads`.
    /// `q` and `out` are `[seqs, heads, head_dim]`. With `window` (a
    /// sliding-window layer) only the last `window` tokens of each context
    /// are attended.
    /// Allocates nothing (it can be captured into a CUDA graph): a split
    /// context needs `scratch` from [`Self::decode_scratch`] for this shape.
    /// `kernel` picks the kernel ([`DecodeKernel::Auto`] as the engine does;
    /// [`DecodeKernel::Grouped`] on a shape it does not take is an error).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_in(
        &self,
        kernel: DecodeKernel,
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
        let kernel = match kernel {
            DecodeKernel::Auto if shape.fits_grouped() => DecodeKernel::Grouped,
            DecodeKernel::Auto => DecodeKernel::PerHead,
            DecodeKernel::Grouped if !shape.fits_grouped() => return Err(CudaError::Shape(format!("the grouped decode kernel does not take {shape:?}"))),
            chosen => chosen,
        };
        let grouped = kernel == DecodeKernel::Grouped;
        let (name, partition) = if grouped { ("paged_decode_gqa_bf16", shape.grouped_partition()) } else { ("paged_decode_bf16", DECODE_PARTITION) };
        let decode = self.function(name)?;
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
        let parts = shape.partitions_of(partition);
        let chunk = shape.chunk_of(partition);
        let (max_blocks, heads, kv_heads) = (int(shape.max_blocks)?, int(shape.heads)?, int(shape.kv_heads)?);
        let (head_dim, block_size, parts32, partition32) = (int(shape.head_dim)?, int(shape.block_size)?, int(parts)?, int(partition)?);
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
            let blocks_x = if grouped { kv_heads } else { heads } as u32;
            let cfg = LaunchConfig { grid_dim: (blocks_x, n, parts32 as u32), block_dim: (DECODE_THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut launch = self.stream.launch_builder(decode);
            launch.arg(&mut *out);
            match &work {
                Some((o, m, s)) => launch.arg(*o).arg(*m).arg(*s),
                None => launch.arg(&null).arg(&null).arg(&null),
            };
            launch.arg(q).arg(k_cache).arg(v_cache).arg(block_tables).arg(context_lens);
            launch.arg(&max_blocks).arg(&heads).arg(&kv_heads).arg(&head_dim).arg(&block_size).arg(&scale).arg(&base32).arg(&window32);
            if grouped {
                launch.arg(&partition32);
            }
            // SAFETY: the arguments match the kernel; the lengths were checked
            // above, the tables hold valid block ids and the context lengths
            // are at most max_context (the caller's contract), and the
            // partial buffers hold chunk * heads * parts (* head_dim) values.
            unsafe { launch.launch(cfg) }?;
            if let Some((o, m, s)) = &work {
                let cfg = LaunchConfig { grid_dim: (heads as u32, n, 1), block_dim: (super::row_block(shape.head_dim), 1, 1), shared_mem_bytes: 0 };
                let mut launch = self.stream.launch_builder(reduce);
                launch.arg(&mut *out).arg(*o).arg(*m).arg(*s).arg(context_lens).arg(&heads).arg(&head_dim).arg(&parts32).arg(&base32).arg(&partition32);
                // SAFETY: as above; the reduction reads what this chunk's decode wrote.
                unsafe { launch.launch(cfg) }?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{DecodeShape, DECODE_PARTITION};

    fn shape(seqs: usize, kv_heads: usize, max_context: usize) -> DecodeShape {
        DecodeShape { seqs, heads: kv_heads * 4, kv_heads, head_dim: 128, block_size: 16, max_blocks: max_context.div_ceil(16), max_context }
    }

    #[test]
    fn few_sequences_split_the_context_finer_for_the_grouped_kernel() {
        // Batch 1 of an 8B model at 512 tokens: 8 kv heads x 2 splits of 256
        // would be 16 blocks; splits of 32 give 128.
        assert_eq!(shape(1, 8, 512).grouped_partition(), 32);
        // 64 sequences fill the GPU with whole splits.
        assert_eq!(shape(64, 8, 512).grouped_partition(), DECODE_PARTITION);
        // Long contexts need no finer split: 8 x 128 splits = 1024 blocks.
        assert_eq!(shape(1, 8, 32_768).grouped_partition(), DECODE_PARTITION);
        // In between: 8 x 16 blocks at 256 (128), 8 x 64 at 64 (512).
        assert_eq!(shape(1, 8, 4096).grouped_partition(), 64);
    }

    #[test]
    fn scratch_covers_the_kernel_with_more_splits() {
        // Batch 1 at 512 tokens: the grouped kernel's 16 splits of 32 for
        // each of 32 query heads (the per-head kernel needs 2 x 32).
        assert_eq!(shape(1, 8, 512).scratch_partials(), 32 * 16);
        // 64 sequences at 4096: both kernels split in 16 x 256.
        assert_eq!(shape(64, 8, 4096).scratch_partials(), 64 * 32 * 16);
        // 3 sequences of 2 kv heads (8 query heads) at 300: splits of 32, 10 of them.
        assert_eq!(shape(3, 2, 300).grouped_partition(), 32);
        assert_eq!(shape(3, 2, 300).scratch_partials(), 3 * 8 * 10);
        // One split of either kernel needs no scratch at all.
        assert_eq!(shape(1, 8, 20).scratch_partials(), 0);
    }
}
