//! The physical paged KV pool and a minimal block allocator.
//!
//! The pool is `num_blocks` blocks of `block_size` token slots per layer, each
//! slot holding one key row and one value row of `kv_dim` f32s. The engine owns
//! the memory but not the policy: which blocks a sequence uses arrives in its
//! block table. The scheduler crate brings the real allocator (ref counts,
//! prefix cache); [`BlockAllocator`] here is the minimal one tests and the CLI use.

use crate::error::{EngineError, Result};

/// Keys and values for all layers, in fixed-size blocks.
#[derive(Debug)]
pub struct KvPool {
    block_size: usize,
    num_blocks: usize,
    kv_dim: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvPool {
    /// Allocate a zeroed pool.
    pub fn new(num_layers: usize, num_blocks: usize, block_size: usize, kv_dim: usize) -> Self {
        let per_layer = num_blocks * block_size * kv_dim;
        Self {
            block_size,
            num_blocks,
            kv_dim,
            keys: (0..num_layers).map(|_| vec![0f32; per_layer]).collect(),
            values: (0..num_layers).map(|_| vec![0f32; per_layer]).collect(),
        }
    }

    /// How many blocks a memory budget buys for a model's geometry.
    pub fn blocks_for_budget(bytes: usize, num_layers: usize, block_size: usize, kv_dim: usize) -> usize {
        let per_block = 2 * num_layers * block_size * kv_dim * std::mem::size_of::<f32>();
        bytes / per_block.max(1)
    }

    /// Layers.
    pub fn num_layers(&self) -> usize {
        self.keys.len()
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

    /// Store one token's key and value rows for `layer` at `slot`.
    pub fn write(&mut self, layer: usize, slot: usize, key: &[f32], value: &[f32]) {
        let d = self.kv_dim;
        self.keys[layer][slot * d..(slot + 1) * d].copy_from_slice(key);
        self.values[layer][slot * d..(slot + 1) * d].copy_from_slice(value);
    }

    /// All key rows of `layer` (`[slots, kv_dim]`).
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// All value rows of `layer` (`[slots, kv_dim]`).
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
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
        let pool = KvPool::new(1, 4, 2, 3);
        assert_eq!(pool.slot(&[3, 1], 0).ok(), Some(6));
        assert_eq!(pool.slot(&[3, 1], 3).ok(), Some(3));
        assert!(pool.slot(&[3, 1], 4).is_err());
        assert!(pool.slot(&[9], 0).is_err());
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
