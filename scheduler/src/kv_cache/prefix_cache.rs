//! The prefix index: chained block hash -> block, with collision-proof checks.
//!
//! # Design
//!
//! Only full blocks are registered. A registered block stores, besides the hash
//! it is indexed under, exactly what its KV depends on:
//!
//! - its `block_size` token ids,
//! - `parent_reg`: the *registration id* of the block before it (0 for the first
//!   block of a sequence), and
//! - the `salt` (model revision and per-request cache isolation key).
//!
//! Registration ids come from a counter and are never reused, so a
//! `parent_reg` names one registration of one block's content, not a block id
//! that might since have been evicted and refilled with something else.
//!
//! A lookup walks the request's blocks from the start, computing the chained
//! hash; a candidate found under that hash only counts as a hit when its
//! tokens, salt and `parent_reg` (the registration the walk matched one step
//! earlier) all agree. By induction every hit block's whole prefix equals the
//! request's, whatever the hash function does: a collision (or a stale entry
//! whose parent was evicted) is a miss, never wrong KV. The hash only makes the
//! index fast.
//!
//! # Invariants (checked by [`PrefixCache::check`])
//!
//! 1. Every index entry `hash -> b` has the pool's hash field of `b` equal to
//!    `hash`, a nonzero registration id, and `hash == hash_fn(parent_hash,
//!    tokens(b), salt)` from the stored record.
//! 2. The pool has exactly as many hashed blocks as the index has entries (with
//!    1, every hashed block is indexed under its own hash).

use std::collections::HashMap;

use super::block_pool::BlockPool;
use super::hash::{BlockHash, BlockHashFn};
use super::BlockId;

/// What the index holds for one block's content.
#[derive(Debug, Clone, Copy, Default)]
struct Record {
    /// Registration id; 0 when the block is not registered.
    reg: u64,
    parent_hash: BlockHash,
    parent_reg: u64,
    salt: u64,
}

/// The result of looking a block up in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// A block with exactly this content (same tokens, salt and parent).
    Match {
        /// The registered block.
        block: BlockId,
        /// Its registration id (the next block's `parent_reg`).
        reg: u64,
    },
    /// Nothing is registered under this hash.
    Vacant,
    /// Something else is registered under this hash (a collision or a stale
    /// entry whose parent registration is gone).
    Conflict {
        /// The block holding the hash.
        block: BlockId,
    },
}

/// Hash -> block index plus the stored content records that make it safe.
#[derive(Debug)]
pub(crate) struct PrefixCache {
    block_size: usize,
    hash_fn: BlockHashFn,
    index: HashMap<BlockHash, BlockId>,
    records: Vec<Record>,
    tokens: Vec<u32>,
    next_reg: u64,
}

impl PrefixCache {
    /// An empty index for a pool of `num_blocks` blocks of `block_size` tokens.
    pub(crate) fn new(num_blocks: usize, block_size: usize, hash_fn: BlockHashFn) -> Self {
        Self {
            block_size,
            hash_fn,
            index: HashMap::new(),
            records: vec![Record::default(); num_blocks],
            tokens: vec![0; num_blocks * block_size],
            next_reg: 0,
        }
    }

    /// The chained hash of one block.
    pub(crate) fn hash(&self, parent: BlockHash, tokens: &[u32], salt: u64) -> BlockHash {
        (self.hash_fn)(parent, tokens, salt)
    }

    /// Registered blocks.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    fn block_tokens(&self, block: BlockId) -> &[u32] {
        let start = block as usize * self.block_size;
        &self.tokens[start..start + self.block_size]
    }

    /// Look up the block registered under `hash` and check that its content is
    /// `tokens` under `salt` following registration `parent_reg`.
    pub(crate) fn find(&self, hash: BlockHash, parent_reg: u64, salt: u64, tokens: &[u32]) -> Found {
        let Some(&block) = self.index.get(&hash) else {
            return Found::Vacant;
        };
        let r = &self.records[block as usize];
        if r.parent_reg == parent_reg && r.salt == salt && self.block_tokens(block) == tokens {
            Found::Match { block, reg: r.reg }
        } else {
            Found::Conflict { block }
        }
    }

    /// Register `block` (whose KV is now computed) under `hash`, replacing any
    /// previous entry for that hash in the index; the caller handles the
    /// previous holder first. Returns the new registration id.
    pub(crate) fn insert(
        &mut self,
        hash: BlockHash,
        block: BlockId,
        parent: (BlockHash, u64),
        salt: u64,
        tokens: &[u32],
    ) -> u64 {
        self.next_reg += 1;
        let reg = self.next_reg;
        self.records[block as usize] = Record { reg, parent_hash: parent.0, parent_reg: parent.1, salt };
        let start = block as usize * self.block_size;
        self.tokens[start..start + self.block_size].copy_from_slice(tokens);
        self.index.insert(hash, block);
        reg
    }

    /// Unregister `block`, which was registered under `hash`.
    pub(crate) fn remove(&mut self, hash: BlockHash, block: BlockId) {
        if self.index.get(&hash) == Some(&block) {
            self.index.remove(&hash);
        }
        self.records[block as usize] = Record::default();
    }

    /// The registration id of `block` (0 when unregistered).
    pub(crate) fn reg(&self, block: BlockId) -> u64 {
        self.records[block as usize].reg
    }

    /// Check the invariants listed at the top of this file against `pool`.
    pub(crate) fn check(&self, pool: &BlockPool) -> Result<(), String> {
        let n = pool.num_blocks();
        for (&hash, &block) in &self.index {
            if block as usize >= n {
                return Err(format!("index maps {hash:#x} to block {block} outside the pool"));
            }
            if pool.hash(block) != Some(hash) {
                return Err(format!(
                    "index maps {hash:#x} to block {block} whose hash field is {:?}",
                    pool.hash(block)
                ));
            }
            let r = &self.records[block as usize];
            if r.reg == 0 {
                return Err(format!("indexed block {block} has no registration"));
            }
            let recomputed = self.hash(r.parent_hash, self.block_tokens(block), r.salt);
            if recomputed != hash {
                return Err(format!(
                    "block {block} is indexed under {hash:#x} but its stored content hashes to {recomputed:#x}"
                ));
            }
        }
        let mut hashed = 0;
        for b in 0..n as BlockId {
            let has_hash = pool.hash(b).is_some();
            hashed += usize::from(has_hash);
            if has_hash != (self.records[b as usize].reg != 0) {
                return Err(format!("block {b}: hash field {:?} but registration {}", pool.hash(b), self.reg(b)));
            }
        }
        if hashed != self.index.len() {
            return Err(format!("{hashed} blocks carry a hash but the index has {} entries", self.index.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::hash::{hash_block, ROOT_HASH};
    use super::*;

    #[test]
    fn find_checks_content_not_just_hash() {
        let mut pool = BlockPool::new(4);
        let mut pc = PrefixCache::new(4, 2, |_, _, _| 42);
        let Some((b, _)) = pool.take() else { panic!("a block") };
        let h = pc.hash(ROOT_HASH, &[1, 2], 0);
        let reg = pc.insert(h, b, (ROOT_HASH, 0), 0, &[1, 2]);
        pool.set_hash(b, h);
        pc.check(&pool).expect("invariants");
        assert_eq!(pc.find(h, 0, 0, &[1, 2]), Found::Match { block: b, reg });
        assert_eq!(pc.find(h, 0, 0, &[1, 3]), Found::Conflict { block: b });
        assert_eq!(pc.find(h, 0, 9, &[1, 2]), Found::Conflict { block: b });
        assert_eq!(pc.find(h, reg, 0, &[1, 2]), Found::Conflict { block: b });
        assert_eq!(pc.find(7, 0, 0, &[1, 2]), Found::Vacant);
        pc.remove(h, b);
        assert_eq!(pc.len(), 0);
        assert!(pc.check(&pool).is_err(), "pool still says the block is hashed");
    }

    #[test]
    fn check_catches_a_wrong_hash() {
        let mut pool = BlockPool::new(2);
        let mut pc = PrefixCache::new(2, 2, hash_block);
        let Some((b, _)) = pool.take() else { panic!("a block") };
        pc.insert(5, b, (ROOT_HASH, 0), 0, &[1, 2]);
        pool.set_hash(b, 5);
        assert!(pc.check(&pool).is_err());
    }
}
