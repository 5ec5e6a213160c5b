//! The physical paged KV pool and a minimal block allocator.
//!
//! The pool is `num_blocks` blocks of `block_size` token slots per layer, each
//! slot holding one key row and one value row of `kv_dim` values, stored as
//! `f32` or as `f16` ([`KvDtype`]). The engine owns the memory but not the
//! policy: which blocks a sequence uses arrives in its block table. The
//! scheduler crate brings the real allocator (ref counts, prefix cache);
//! [`BlockAllocator`] here is the minimal one tests and the CLI use.

use crate::error::{EngineError, Result};
use crate::simd::narrow_to_f16;
use half::f16;

/// How a pool stores its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// Full precision (exact mode: what the numpy reference computes).
    F32,
    /// Half the bytes to stream per token (fast mode, as llama.cpp's default
    /// cache): rounded to nearest, outliers saturated at ±65504.
    F16,
}

impl KvDtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

/// One layer's keys and values (`[slots, kv_dim]` each), in the pool's dtype.
#[derive(Debug, Clone, Copy)]
pub enum KvLayer<'a> {
    /// Full-precision rows.
    F32 {
        /// Key rows.
        keys: &'a [f32],
        /// Value rows.
        values: &'a [f32],
    },
    /// Half-precision rows.
    F16 {
        /// Key rows.
        keys: &'a [f16],
        /// Value rows.
        values: &'a [f16],
    },
}

/// All layers' rows of one kind.
#[derive(Debug)]
enum Rows {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>),
}

impl Rows {
    fn zeroed(dtype: KvDtype, layers: usize, per_layer: usize) -> Self {
        match dtype {
            KvDtype::F32 => Rows::F32((0..layers).map(|_| vec![0f32; per_layer]).collect()),
            KvDtype::F16 => Rows::F16((0..layers).map(|_| vec![f16::ZERO; per_layer]).collect()),
        }
    }

    fn layers(&self) -> usize {
        match self {
            Rows::F32(l) => l.len(),
            Rows::F16(l) => l.len(),
        }
    }

    fn store(&mut self, layer: usize, at: std::ops::Range<usize>, row: &[f32]) {
        match self {
            Rows::F32(l) => l[layer][at].copy_from_slice(row),
            Rows::F16(l) => narrow_to_f16(&mut l[layer][at], row),
        }
    }
}

/// Keys and values for all layers, in fixed-size blocks.
#[derive(Debug)]
pub struct KvPool {
    block_size: usize,
    num_blocks: usize,
    kv_dim: usize,
    dtype: KvDtype,
    keys: Rows,
    values: Rows,
}

impl KvPool {
    /// Allocate a zeroed pool.
    pub fn new(num_layers: usize, num_blocks: usize, block_size: usize, kv_dim: usize, dtype: KvDtype) -> Self {
        let per_layer = num_blocks * block_size * kv_dim;
        Self {
            block_size,
            num_blocks,
            kv_dim,
            dtype,
            keys: Rows::zeroed(dtype, num_layers, per_layer),
            values: Rows::zeroed(dtype, num_layers, per_layer),
        }
    }

    /// Bytes of one block across all layers, keys and values.
    pub fn bytes_per_block(num_layers: usize, block_size: usize, kv_dim: usize, dtype: KvDtype) -> usize {
        2 * num_layers * block_size * kv_dim * dtype.bytes()
    }

    /// How many blocks a memory budget buys for a model's geometry.
    pub fn blocks_for_budget(bytes: usize, num_layers: usize, block_size: usize, kv_dim: usize, dtype: KvDtype) -> usize {
        bytes / Self::bytes_per_block(num_layers, block_size, kv_dim, dtype).max(1)
    }

    /// Layers.
    pub fn num_layers(&self) -> usize {
        self.keys.layers()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Width of one key (or value) row.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// How the rows are stored.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// The flat slot index of position `pos` under `block_table`.
    pub fn slot(&self, block_table: &[u32], pos: usize) -> Result<usize> {
        let block = *block_table.get(pos / self.block_size).ok_or_else(|| {
            EngineError::InvalidBatch(format!("block table of {} blocks does not cover position {pos}", block_table.len()))
        })? as usize;
        if block >= self.num_blocks {
            return Err(EngineError::InvalidBatch(format!("block {block} is outside the pool of {}", self.num_blocks)));
        }
        Ok(block * self.block_size + pos % self.block_size)
    }

    /// Store one token's key and value rows for `layer` at `slot` (narrowed
    /// to the pool's dtype).
    pub fn write(&mut self, layer: usize, slot: usize, key: &[f32], value: &[f32]) {
        let d = self.kv_dim;
        self.keys.store(layer, slot * d..(slot + 1) * d, key);
        self.values.store(layer, slot * d..(slot + 1) * d, value);
    }

    /// All key and value rows of `layer`.
    pub fn layer(&self, layer: usize) -> KvLayer<'_> {
        match (&self.keys, &self.values) {
            (Rows::F32(k), Rows::F32(v)) => KvLayer::F32 { keys: &k[layer], values: &v[layer] },
            (Rows::F16(k), Rows::F16(v)) => KvLayer::F16 { keys: &k[layer], values: &v[layer] },
            _ => unreachable!("keys and values are allocated with one dtype"),
        }
    }
}

/// A free list of block ids (no sharing, no caching).
#[derive(Debug)]
pub struct BlockAllocator {
    free: Vec<u32>,
}

impl BlockAllocator {
    /// All `num_blocks` blocks free.
    pub fn new(num_blocks: usize) -> Self {
        Self { free: (0..num_blocks as u32).rev().collect() }
    }

    /// Free blocks left.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Grow `table` so it covers `tokens` positions of `block_size`.
    pub fn ensure(&mut self, table: &mut Vec<u32>, tokens: usize, block_size: usize) -> Result<()> {
        let needed = tokens.div_ceil(block_size);
        while table.len() < needed {
            let b = self.free.pop().ok_or_else(|| {
                EngineError::InvalidBatch(format!("KV pool exhausted: {tokens} tokens need {needed} blocks"))
            })?;
            table.push(b);
        }
        Ok(())
    }

    /// Return a sequence's blocks.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.free.append(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_block_table() {
        let pool = KvPool::new(1, 4, 2, 3, KvDtype::F32);
        assert_eq!(pool.slot(&[3, 1], 0).ok(), Some(6));
        assert_eq!(pool.slot(&[3, 1], 3).ok(), Some(3));
        assert!(pool.slot(&[3, 1], 4).is_err());
        assert!(pool.slot(&[9], 0).is_err());
    }

    #[test]
    fn an_f16_pool_is_half_the_bytes_and_stores_rounded_rows() {
        assert_eq!(KvPool::bytes_per_block(2, 16, 8, KvDtype::F16) * 2, KvPool::bytes_per_block(2, 16, 8, KvDtype::F32));
        assert_eq!(KvPool::blocks_for_budget(1 << 20, 2, 16, 8, KvDtype::F16), 2 * KvPool::blocks_for_budget(1 << 20, 2, 16, 8, KvDtype::F32));
        let mut pool = KvPool::new(2, 2, 2, 3, KvDtype::F16);
        pool.write(1, 3, &[1.0, 1e6, 0.1], &[-2.0, 0.5, -1e6]);
        let KvLayer::F16 { keys, values } = pool.layer(1) else { panic!("an f16 pool gives f16 rows") };
        let k: Vec<f32> = keys[9..12].iter().map(|v| v.to_f32()).collect();
        assert_eq!(k, [1.0, 65504.0, f16::from_f32(0.1).to_f32()]);
        assert_eq!(values[9..12].iter().map(|v| v.to_f32()).collect::<Vec<_>>(), [-2.0, 0.5, -65504.0]);
        let KvLayer::F16 { keys, .. } = pool.layer(0) else { panic!("f16") };
        assert!(keys.iter().all(|v| v.to_f32() == 0.0), "other layers untouched");
    }

    #[test]
    fn allocator_grows_and_releases() {
        let mut a = BlockAllocator::new(3);
        let mut t = Vec::new();
        a.ensure(&mut t, 5, 2).expect("fits");
        assert_eq!((t.len(), a.available()), (3, 0));
        assert!(a.ensure(&mut t, 7, 2).is_err());
        a.release(&mut t);
        assert_eq!(a.available(), 3);
    }
}
