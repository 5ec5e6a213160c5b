//! KV cache bookkeeping: a ref-counted block pool with an LRU of cached blocks,
//! a prefix cache over full blocks, and the [`KvCacheManager`] facade the
//! scheduler uses.
//!
//! The engine owns the physical KV memory and takes block tables of
//! [`BlockId`]s; this module decides which block belongs to whom. It holds no
//! tensors and needs no model.
//!
//! Layout:
//! - `block_pool.rs`: ref counts, free list, O(1) intrusive LRU (design notes and
//!   invariants at its top).
//! - `prefix_cache.rs`: chained-hash index with collision-proof content checks.
//! - `hash.rs`: the block hash.
//! - `registry.rs`: which sequence holds which blocks (the source of ref counts).
//! - `manager.rs`: [`KvCacheManager`], tying them together.

mod block_pool;
mod hash;
mod manager;
mod prefix_cache;
mod registry;

pub use hash::{hash_block, BlockHash, BlockHashFn, ROOT_HASH};
pub use manager::KvCacheManager;

/// A block id in the engine's KV pool (`0..num_blocks`).
pub type BlockId = u32;

/// How big the pool is and whether full blocks are shared between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Blocks in the pool (at most `u32::MAX`).
    pub num_blocks: usize,
    /// Token positions per block (0 is treated as 1).
    pub block_size: usize,
    /// Register full blocks and reuse them across requests.
    pub enable_prefix_caching: bool,
}

/// Per-sequence KV state, owned by the scheduler's `Sequence`.
///
/// `blocks` is the sequence's block table, maintained by the manager: read it,
/// don't edit it. The manager keeps its own record of what each sequence holds
/// (reached through a private handle), so ref counts never depend on this copy.
/// Clone it only as a snapshot: passing a clone of a live `SeqKv` to the
/// manager acts on the same sequence.
#[derive(Debug, Default, Clone)]
pub struct SeqKv {
    /// The block table: block `i` holds positions `i*block_size..(i+1)*block_size`.
    pub blocks: Vec<BlockId>,
    handle: Option<registry::SeqHandle>,
    /// Bumped whenever `blocks` changes other than by appending (cleared,
    /// replaced, or a committed block switched to a registered duplicate).
    rewrites: u64,
}

impl SeqKv {
    /// How many times the table changed other than by appending: while it
    /// stays the same, the blocks past a known length are all that is new.
    pub fn rewrites(&self) -> u64 {
        self.rewrites
    }

    /// Replace the table with `new`, counting a rewrite unless `new` only
    /// appends to it.
    fn set_blocks(&mut self, new: &[BlockId]) {
        if !new.starts_with(&self.blocks) {
            self.rewrites += 1;
        }
        self.blocks.clear();
        self.blocks.extend_from_slice(new);
    }

    /// Empty the table (a rewrite if it held anything).
    fn clear_blocks(&mut self) {
        if !self.blocks.is_empty() {
            self.rewrites += 1;
        }
        self.blocks.clear();
    }
}

/// The outcome of a prefix lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixHit {
    /// Leading tokens whose KV is already in the sequence's blocks (a multiple
    /// of the block size, always less than the prompt length).
    pub cached_tokens: usize,
}

/// KV cache errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvCacheError {
    /// Not enough free or evictable blocks for an allocation.
    #[error("out of KV blocks: need {needed}, {available} available")]
    OutOfBlocks {
        /// Blocks the allocation needed.
        needed: usize,
        /// Blocks free or evictable at the time.
        available: usize,
    },
}

/// Where the pool's blocks are right now (a gauge snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvUsage {
    /// Blocks held by at least one sequence.
    pub used: usize,
    /// Blocks on the free list (no content worth keeping).
    pub free: usize,
    /// Cached blocks no sequence holds: reusable by a prefix hit, evictable.
    pub cached_evictable: usize,
    /// Blocks in the pool (`used + free + cached_evictable`).
    pub total: usize,
}

/// Cumulative prefix-cache counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvCacheStats {
    /// Prompt tokens passed to `lookup_prefix`.
    pub prefix_query_tokens: u64,
    /// Of those, tokens found cached.
    pub prefix_hit_tokens: u64,
    /// Cached blocks evicted to satisfy an allocation.
    pub evictions: u64,
}
