//! [`KvCacheManager`]: the one door to the block pool and the prefix cache.
//!
//! # Design
//!
//! Every change to who holds which block goes through the manager, which keeps
//! its own record per sequence (`registry.rs`); a block's ref count is the
//! number of sequences holding it, and [`KvCacheManager::check_invariants`]
//! recounts that from the record.
//!
//! A sequence's life: `lookup_prefix` (at admission: take refs on the longest
//! cached run of full blocks, never covering the last prompt token) ->
//! `allocate` (grow the block table; all-or-nothing) -> the engine computes KV
//! -> `commit` (hash and register the blocks that became full) -> ... ->
//! `free` (drop refs, tail first, so a sequence's tail is evicted before its
//! prefix).
//!
//! **Duplicates are deduplicated.** When `commit` finds an identical block
//! already registered (same tokens, salt and parent: typically two requests
//! with the same prompt prefilled in the same step), the sequence switches to
//! the registered block (taking a ref) and its own copy goes back to the free
//! list, so `SeqKv::blocks[i]` can change at a committed index. The content
//! there is identical and the engine reads block tables afresh each step, so
//! this is safe; it saves memory and guarantees that every committed block of
//! a live sequence is reachable by a later lookup (a fork always hits).
//!
//! **Conflicts.** When the hash is taken by a block with other content (a hash
//! collision, or a stale entry whose parent was evicted): an unreferenced
//! holder is dropped from the index (to the free list) and ours registered; a
//! referenced one is left alone, our block stays private, and the sequence
//! stops registering later blocks (no lookup could reach them anyway).
//!
//! With prefix caching off, lookups always miss (queries are still counted),
//! `commit` does nothing and every freed block goes to the free list.

use super::block_pool::BlockPool;
use super::hash::{hash_block, BlockHash, BlockHashFn, ROOT_HASH};
use super::prefix_cache::{Found, PrefixCache};
use super::registry::{Registry, SeqEntry};
use super::{BlockId, KvCacheConfig, KvCacheError, KvCacheStats, KvUsage, PrefixHit, SeqKv};

/// Block allocation and prefix caching for all sequences (see the module docs).
#[derive(Debug)]
pub struct KvCacheManager {
    block_size: usize,
    enable_prefix_caching: bool,
    pool: BlockPool,
    prefix: PrefixCache,
    seqs: Registry,
    stats: KvCacheStats,
}

impl KvCacheManager {
    /// A manager with every block free, hashing blocks with [`hash_block`].
    pub fn new(cfg: KvCacheConfig) -> Self {
        Self::with_hash_fn(cfg, hash_block)
    }

    /// A manager hashing blocks with `hash_fn` (tests force collisions with a
    /// weak one; correctness never depends on the hash, only speed does).
    pub fn with_hash_fn(cfg: KvCacheConfig, hash_fn: BlockHashFn) -> Self {
        let block_size = cfg.block_size.max(1);
        let pool = BlockPool::new(cfg.num_blocks);
        let prefix = PrefixCache::new(pool.num_blocks(), block_size, hash_fn);
        Self {
            block_size,
            enable_prefix_caching: cfg.enable_prefix_caching,
            pool,
            prefix,
            seqs: Registry::default(),
            stats: KvCacheStats::default(),
        }
    }

    /// Token positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    /// For a sequence with no blocks yet: take refs on the longest cached run
    /// of full blocks matching `tokens` (chained hashes under `salt`), never
    /// covering the last token (at least one token must be computed to get
    /// logits), put them in `seq.blocks`, return how many tokens are cached.
    /// Counts queries and hits in [`Self::stats`]. A sequence that already
    /// holds blocks is left alone (0 cached, nothing counted).
    pub fn lookup_prefix(&mut self, seq: &mut SeqKv, tokens: &[u32], salt: u64) -> PrefixHit {
        if self.seqs.get(seq).is_some() {
            return PrefixHit::default();
        }
        seq.clear_blocks();
        seq.handle = None;
        self.stats.prefix_query_tokens += tokens.len() as u64;
        if !self.enable_prefix_caching {
            return PrefixHit::default();
        }
        let (blocks, chain) = self.match_prefix(tokens, salt);
        if blocks.is_empty() {
            return PrefixHit::default();
        }
        for &b in &blocks {
            self.pool.acquire(b);
        }
        let cached_tokens = blocks.len() * self.block_size;
        self.stats.prefix_hit_tokens += cached_tokens as u64;
        seq.set_blocks(&blocks);
        let committed = blocks.len();
        self.seqs.insert(seq, SeqEntry::new(blocks, committed, chain));
        PrefixHit { cached_tokens }
    }

    /// The registered blocks matching the full blocks of `tokens` before its
    /// last token, and the chain state after the last of them.
    fn match_prefix(&self, tokens: &[u32], salt: u64) -> (Vec<BlockId>, (BlockHash, u64)) {
        let max_blocks = tokens.len().saturating_sub(1) / self.block_size;
        let mut chain = (ROOT_HASH, 0);
        let mut hits = Vec::new();
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = self.prefix.hash(chain.0, chunk, salt);
            match self.prefix.find(hash, chain.1, salt, chunk) {
                Found::Match { block, reg } => {
                    hits.push(block);
                    chain = (hash, reg);
                }
                Found::Vacant | Found::Conflict { .. } => break,
            }
        }
        (hits, chain)
    }

    /// Blocks `seq` needs beyond those it holds to cover `num_tokens` positions.
    pub fn blocks_needed(&self, seq: &SeqKv, num_tokens: usize) -> usize {
        let have = self.seqs.get(seq).map_or(0, |e| e.blocks.len());
        num_tokens.div_ceil(self.block_size).saturating_sub(have)
    }

    /// Make `seq.blocks` cover `num_tokens` positions, allocating (and evicting
    /// LRU cached blocks) as needed; all-or-nothing: on `OutOfBlocks` nothing
    /// changes. Never shrinks.
    pub fn allocate(&mut self, seq: &mut SeqKv, num_tokens: usize) -> Result<(), KvCacheError> {
        if self.seqs.get(seq).is_none() {
            // A fresh sequence, or a stale handle: it holds nothing.
            seq.clear_blocks();
            seq.handle = None;
        }
        let needed = self.blocks_needed(seq, num_tokens);
        let available = self.pool.num_available();
        if needed > available {
            return Err(KvCacheError::OutOfBlocks { needed, available });
        }
        if needed > 0 {
            let mut fresh = Vec::with_capacity(needed);
            while fresh.len() < needed {
                let Some(b) = self.take_block() else { break };
                fresh.push(b);
            }
            if fresh.len() < needed {
                // Unreachable (availability was checked), but stay all-or-nothing.
                for &b in &fresh {
                    self.pool.release(b);
                }
                return Err(KvCacheError::OutOfBlocks { needed, available: fresh.len() });
            }
            self.seqs.get_or_insert(seq).blocks.extend_from_slice(&fresh);
        }
        self.sync(seq);
        Ok(())
    }

    /// Whether `seq` can grow to `num_tokens` positions right now (see
    /// [`Self::blocks_needed`] for how many blocks that takes).
    pub fn can_allocate(&self, seq: &SeqKv, num_tokens: usize) -> bool {
        self.blocks_needed(seq, num_tokens) <= self.pool.num_available()
    }

    /// A block for a new owner, dropping an evicted block from the index.
    fn take_block(&mut self) -> Option<BlockId> {
        let (block, evicted) = self.pool.take()?;
        if let Some(hash) = evicted {
            self.prefix.remove(hash, block);
            self.stats.evictions += 1;
        }
        Some(block)
    }

    /// Copy the manager's record of `seq`'s blocks into `seq.blocks` when they
    /// differ (a cheap check: length and last block).
    fn sync(&self, seq: &mut SeqKv) {
        match self.seqs.get(seq) {
            Some(e) => {
                if seq.blocks.len() != e.blocks.len() || seq.blocks.last() != e.blocks.last() {
                    seq.set_blocks(&e.blocks);
                }
            }
            None => {
                seq.clear_blocks();
                seq.handle = None;
            }
        }
    }

    /// After the engine computed KV for positions `< computed_tokens` of
    /// `tokens`: hash and register every newly full block (if prefix caching is
    /// on). If an identical block is already registered, `seq` switches to it
    /// and its own copy is freed (see the module docs: `seq.blocks` may change
    /// at committed indices). Pass the same `salt` as to `lookup_prefix`.
    pub fn commit(&mut self, seq: &mut SeqKv, tokens: &[u32], computed_tokens: usize, salt: u64) {
        if !self.enable_prefix_caching {
            return;
        }
        let bs = self.block_size;
        let Some(entry) = self.seqs.get_mut(seq) else { return };
        let full = (computed_tokens.min(tokens.len()) / bs).min(entry.blocks.len());
        let mut changed = false;
        for (i, chunk) in tokens.chunks_exact(bs).enumerate().take(full).skip(entry.committed) {
            changed |= commit_block(&mut self.pool, &mut self.prefix, entry, i, chunk, salt);
        }
        if changed {
            if let Some(e) = self.seqs.get(seq) {
                seq.set_blocks(&e.blocks);
            }
        }
    }

    /// Drop a sequence's refs (preemption, finish, abort), tail first, so its
    /// prefix stays cached longer. Registered blocks nobody else holds become
    /// cached and evictable (LRU, most recently freed last); the rest go to the
    /// free list. `seq.blocks` is emptied. Freeing twice is harmless.
    pub fn free(&mut self, seq: &mut SeqKv) {
        if let Some(entry) = self.seqs.remove(seq) {
            for &b in entry.blocks.iter().rev() {
                self.pool.release(b);
            }
        }
        seq.clear_blocks();
    }

    /// Blocks an allocation can get now: the free list plus evictable cached.
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_available()
    }

    /// Sequences currently holding blocks (0 once everything is freed).
    pub fn num_holders(&self) -> usize {
        self.seqs.len()
    }

    /// Where the blocks are right now.
    pub fn usage(&self) -> KvUsage {
        let total = self.pool.num_blocks();
        let (free, cached_evictable) = (self.pool.num_free(), self.pool.num_cached());
        KvUsage { used: total - free - cached_evictable, free, cached_evictable, total }
    }

    /// Cumulative prefix-cache counters.
    pub fn stats(&self) -> KvCacheStats {
        self.stats
    }

    /// Drop every cached block no sequence holds (they go to the free list).
    /// Blocks held by running sequences stay registered.
    pub fn reset_prefix_cache(&mut self) {
        while let Some((block, hash)) = self.pool.evict_lru() {
            self.prefix.remove(hash, block);
        }
    }

    /// Check every invariant: the pool's (place vs ref count, free and LRU
    /// lists well formed, no duplicates, counts add up), the index's (every
    /// hash maps to a block whose hash field and stored tokens hash to it,
    /// index and hash fields agree), and the manager's (each block's ref count
    /// equals the number of sequences holding it, no sequence holds a block
    /// twice, committed blocks of an unbroken chain are registered and the
    /// chain state names the last of them).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check()?;
        self.prefix.check(&self.pool)?;
        let n = self.pool.num_blocks();
        let mut holders = vec![0u32; n];
        for entry in self.seqs.iter() {
            self.check_entry(entry)?;
            for &b in &entry.blocks {
                holders[b as usize] += 1;
            }
        }
        for (b, &count) in holders.iter().enumerate() {
            let refs = self.pool.ref_count(b as BlockId);
            if refs != count {
                return Err(format!("block {b} has ref count {refs} but {count} sequences hold it"));
            }
        }
        Ok(())
    }

    fn check_entry(&self, e: &SeqEntry) -> Result<(), String> {
        let n = self.pool.num_blocks();
        if e.blocks.is_empty() || e.committed > e.blocks.len() {
            return Err(format!("sequence record with {} blocks, {} committed", e.blocks.len(), e.committed));
        }
        let mut sorted = e.blocks.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) || sorted.last().is_some_and(|&b| b as usize >= n) {
            return Err(format!("sequence holds a block twice or out of range: {:?}", e.blocks));
        }
        if !self.enable_prefix_caching || !e.chain_ok {
            return Ok(());
        }
        if let Some(&b) = e.blocks[..e.committed].iter().find(|&&b| self.pool.hash(b).is_none()) {
            return Err(format!("committed block {b} of an unbroken chain is not registered"));
        }
        let expected = match e.committed.checked_sub(1).map(|i| e.blocks[i]) {
            Some(last) => (self.pool.hash(last).unwrap_or(ROOT_HASH), self.prefix.reg(last)),
            None => (ROOT_HASH, 0),
        };
        if (e.chain_hash, e.chain_reg) != expected {
            return Err(format!(
                "sequence chain state {:?} != last committed block's {expected:?}",
                (e.chain_hash, e.chain_reg)
            ));
        }
        Ok(())
    }

    /// Check that `seq.blocks` is exactly the manager's record for it (empty
    /// when the manager knows of no blocks for it).
    pub fn check_seq(&self, seq: &SeqKv) -> Result<(), String> {
        match self.seqs.get(seq) {
            Some(e) if e.blocks != seq.blocks => Err(format!("seq.blocks {:?} != record {:?}", seq.blocks, e.blocks)),
            None if !seq.blocks.is_empty() => {
                Err(format!("seq.blocks {:?} but the manager holds none for it", seq.blocks))
            }
            _ => Ok(()),
        }
    }
}

/// Commit block `i` (`chunk` holds its tokens) of the sequence `entry`.
/// Returns whether the sequence's block table changed (a dedupe).
fn commit_block(
    pool: &mut BlockPool,
    prefix: &mut PrefixCache,
    entry: &mut SeqEntry,
    i: usize,
    chunk: &[u32],
    salt: u64,
) -> bool {
    entry.committed = i + 1;
    if !entry.chain_ok {
        return false;
    }
    let parent = (entry.chain_hash, entry.chain_reg);
    let hash = prefix.hash(parent.0, chunk, salt);
    let ours = entry.blocks[i];
    let mut found = prefix.find(hash, parent.1, salt, chunk);
    if let Found::Conflict { block } = found {
        if pool.ref_count(block) == 0 {
            // An unused stale or colliding entry: drop it so ours takes the hash.
            prefix.remove(hash, block);
            pool.uncache(block);
            found = Found::Vacant;
        }
    }
    match found {
        Found::Match { block, reg } => {
            (entry.chain_hash, entry.chain_reg) = (hash, reg);
            if block == ours {
                return false;
            }
            pool.acquire(block);
            pool.release(ours);
            entry.blocks[i] = block;
            true
        }
        Found::Vacant => {
            let reg = prefix.insert(hash, ours, parent, salt, chunk);
            pool.set_hash(ours, hash);
            (entry.chain_hash, entry.chain_reg) = (hash, reg);
            false
        }
        Found::Conflict { .. } => {
            entry.chain_ok = false;
            false
        }
    }
}
