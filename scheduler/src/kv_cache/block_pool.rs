//! The block pool: ref counts, a free list and an O(1) LRU of cached blocks.
//!
//! # Design
//!
//! Blocks are ids `0..n`. Every block is in exactly one of three places:
//!
//! - **Free**: on `free` (a LIFO stack). Ref count 0, no content hash.
//! - **Cached**: on the LRU list. Ref count 0, has a content hash (it is
//!   registered in the prefix index), so a later prefix hit can revive it.
//! - **Held**: ref count > 0 (one per sequence holding it). On no list. May or
//!   may not have a content hash.
//!
//! The LRU list is intrusive: `prev`/`next` arrays indexed by block id with
//! [`NIL`] as the end marker, so unlinking a block on a prefix hit, appending on
//! release and popping the oldest on eviction are all O(1), with no map walks.
//! The most recently released block is at the tail; eviction takes the head.
//!
//! [`BlockPool::take`] prefers the free list and only then evicts the least
//! recently used cached block, handing back the evicted hash so the caller can
//! drop it from the prefix index. A held block (ref count > 0) is never on the
//! LRU list, so it can never be evicted.
//!
//! # Invariants (checked by [`BlockPool::check`])
//!
//! 1. `place[b] == Held` iff `ref_cnt[b] > 0`.
//! 2. Free blocks: on `free` exactly once, no hash.
//! 3. Cached blocks: on the LRU list exactly once, have a hash; the list's
//!    `prev`/`next` links agree, `head`/`tail` are its ends, it has `lru_len`
//!    nodes and no cycle.
//! 4. free + cached + held == n.
//!
//! Block ids passed in come only from this pool (the manager's per-sequence
//! records), so indexing by them is in bounds by construction.

use super::hash::BlockHash;
use super::BlockId;

/// End-of-list marker in the intrusive LRU links.
const NIL: u32 = u32::MAX;

/// Which of the three places a block is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Free,
    Cached,
    Held,
}

/// Ref-counted blocks with a free list and an LRU list of cached blocks.
#[derive(Debug)]
pub(crate) struct BlockPool {
    ref_cnt: Vec<u32>,
    hash: Vec<Option<BlockHash>>,
    place: Vec<Place>,
    prev: Vec<u32>,
    next: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    lru_len: usize,
    free: Vec<BlockId>,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks (at most `u32::MAX`; more is clamped).
    pub(crate) fn new(num_blocks: usize) -> Self {
        let n = num_blocks.min(NIL as usize);
        Self {
            ref_cnt: vec![0; n],
            hash: vec![None; n],
            place: vec![Place::Free; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            lru_head: NIL,
            lru_tail: NIL,
            lru_len: 0,
            // Reversed so the first allocations hand out low ids.
            free: (0..n as u32).rev().collect(),
        }
    }

    /// Blocks in the pool.
    pub(crate) fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks on the free list.
    pub(crate) fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Cached, unreferenced (evictable) blocks.
    pub(crate) fn num_cached(&self) -> usize {
        self.lru_len
    }

    /// Blocks [`Self::take`] can hand out right now: free plus evictable.
    pub(crate) fn num_available(&self) -> usize {
        self.free.len() + self.lru_len
    }

    /// The ref count of `block`.
    pub(crate) fn ref_count(&self, block: BlockId) -> u32 {
        self.ref_cnt[block as usize]
    }

    /// The content hash `block` is registered under, if any.
    pub(crate) fn hash(&self, block: BlockId) -> Option<BlockHash> {
        self.hash[block as usize]
    }

    /// Record that a held block is now registered under `hash`.
    pub(crate) fn set_hash(&mut self, block: BlockId, hash: BlockHash) {
        self.hash[block as usize] = Some(hash);
    }

    /// Take a block for a new owner (ref count 1): the free list first, else the
    /// least recently used cached block. Also returns the evicted block's hash,
    /// which the caller must remove from the prefix index. `None` when nothing is
    /// free or evictable.
    pub(crate) fn take(&mut self) -> Option<(BlockId, Option<BlockHash>)> {
        let evicted = if self.free.is_empty() { self.evict_lru().map(|(_, h)| h) } else { None };
        let block = self.free.pop()?;
        let i = block as usize;
        self.place[i] = Place::Held;
        self.ref_cnt[i] = 1;
        Some((block, evicted))
    }

    /// Add a reference to a held or cached block (a prefix hit, a dedupe).
    /// A cached block leaves the LRU list. A free block is not acquirable: it
    /// holds no content anyone could want (the call is ignored).
    pub(crate) fn acquire(&mut self, block: BlockId) {
        let i = block as usize;
        match self.place[i] {
            Place::Free => {}
            Place::Cached => {
                self.unlink(block);
                self.place[i] = Place::Held;
                self.ref_cnt[i] = 1;
            }
            Place::Held => self.ref_cnt[i] += 1,
        }
    }

    /// Drop one reference. At zero a block with a hash goes to the LRU tail
    /// (most recently used), one without to the free list.
    pub(crate) fn release(&mut self, block: BlockId) {
        let i = block as usize;
        if self.place[i] != Place::Held {
            return;
        }
        self.ref_cnt[i] -= 1;
        if self.ref_cnt[i] > 0 {
            return;
        }
        if self.hash[i].is_some() {
            self.place[i] = Place::Cached;
            self.push_tail(block);
        } else {
            self.place[i] = Place::Free;
            self.free.push(block);
        }
    }

    /// Move the least recently used cached block to the free list, clearing
    /// its hash; returns it and the hash it had. `None` when nothing is cached.
    pub(crate) fn evict_lru(&mut self) -> Option<(BlockId, BlockHash)> {
        let block = self.lru_head;
        if block == NIL {
            return None;
        }
        self.uncache(block).map(|h| (block, h))
    }

    /// Move one cached block to the free list, clearing its hash; returns the
    /// hash it had. `None` (and no change) when the block is not cached.
    pub(crate) fn uncache(&mut self, block: BlockId) -> Option<BlockHash> {
        let i = block as usize;
        if self.place[i] != Place::Cached {
            return None;
        }
        self.unlink(block);
        self.place[i] = Place::Free;
        self.free.push(block);
        self.hash[i].take()
    }

    fn push_tail(&mut self, block: BlockId) {
        let i = block as usize;
        self.prev[i] = self.lru_tail;
        self.next[i] = NIL;
        if self.lru_tail == NIL {
            self.lru_head = block;
        } else {
            self.next[self.lru_tail as usize] = block;
        }
        self.lru_tail = block;
        self.lru_len += 1;
    }

    fn unlink(&mut self, block: BlockId) {
        let i = block as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.lru_head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.lru_tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.lru_len -= 1;
    }

    /// The cached blocks from least to most recently used (tests).
    #[cfg(test)]
    pub(crate) fn lru_order(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.lru_len);
        let mut b = self.lru_head;
        while b != NIL && out.len() <= self.num_blocks() {
            out.push(b);
            b = self.next[b as usize];
        }
        out
    }

    /// Check the invariants listed at the top of this file.
    pub(crate) fn check(&self) -> Result<(), String> {
        let n = self.num_blocks();
        if [self.hash.len(), self.place.len(), self.prev.len(), self.next.len()].iter().any(|&l| l != n) {
            return Err("block pool arrays differ in length".into());
        }
        let mut held = 0;
        for b in 0..n {
            let is_held = self.place[b] == Place::Held;
            if is_held != (self.ref_cnt[b] > 0) {
                return Err(format!("block {b}: place {:?} with ref count {}", self.place[b], self.ref_cnt[b]));
            }
            held += usize::from(is_held);
        }
        self.check_free_list()?;
        self.check_lru()?;
        if self.free.len() + self.lru_len + held != n {
            return Err(format!("free {} + cached {} + held {held} != {n} blocks", self.free.len(), self.lru_len));
        }
        Ok(())
    }

    fn check_free_list(&self) -> Result<(), String> {
        let mut seen = vec![false; self.num_blocks()];
        for &b in &self.free {
            let i = b as usize;
            if i >= seen.len() || seen[i] {
                return Err(format!("free list has block {b} out of range or twice"));
            }
            seen[i] = true;
            if self.place[i] != Place::Free || self.hash[i].is_some() {
                return Err(format!("block {b} on the free list is {:?} with hash {:?}", self.place[i], self.hash[i]));
            }
        }
        let free_places = self.place.iter().filter(|&&p| p == Place::Free).count();
        if free_places != self.free.len() {
            return Err(format!("{free_places} blocks marked free but {} on the free list", self.free.len()));
        }
        Ok(())
    }

    fn check_lru(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let (mut count, mut prev, mut b) = (0usize, NIL, self.lru_head);
        while b != NIL {
            let i = b as usize;
            if i >= n || count >= n {
                return Err(format!("LRU list runs out of range or cycles at block {b}"));
            }
            if self.place[i] != Place::Cached || self.hash[i].is_none() || self.prev[i] != prev {
                return Err(format!(
                    "LRU block {b}: {:?}, hash {:?}, prev link {}",
                    self.place[i], self.hash[i], self.prev[i]
                ));
            }
            count += 1;
            prev = b;
            b = self.next[i];
        }
        if prev != self.lru_tail || count != self.lru_len {
            return Err(format!(
                "LRU walk found {count} blocks ending at {prev}; expected {} ending at {}",
                self.lru_len, self.lru_tail
            ));
        }
        let cached_places = self.place.iter().filter(|&&p| p == Place::Cached).count();
        if cached_places != count {
            return Err(format!("{cached_places} blocks marked cached but {count} on the LRU list"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(p: &mut BlockPool) -> BlockId {
        p.take().expect("a block").0
    }

    #[test]
    fn takes_free_blocks_before_evicting() {
        let mut p = BlockPool::new(3);
        let (a, b) = (take(&mut p), take(&mut p));
        p.set_hash(a, 10);
        p.release(a); // cached
        p.release(b); // free (no hash)
        p.check().expect("invariants");
        assert_eq!((p.num_free(), p.num_cached(), p.num_available()), (2, 1, 3));
        let (c, ev) = p.take().expect("block");
        assert_ne!(c, a);
        assert_eq!(ev, None);
        let (_, ev) = p.take().expect("block");
        assert_eq!(ev, None);
        let (d, ev) = p.take().expect("block");
        assert_eq!((d, ev), (a, Some(10)));
        assert!(p.take().is_none());
        p.check().expect("invariants");
    }

    #[test]
    fn lru_order_and_unlink() {
        let mut p = BlockPool::new(4);
        let ids: Vec<_> = (0..4).map(|_| take(&mut p)).collect();
        for (k, &b) in ids.iter().enumerate() {
            p.set_hash(b, k as u64 + 1);
            p.release(b);
        }
        assert_eq!(p.lru_order(), ids);
        p.acquire(ids[1]); // revive the middle one
        p.acquire(ids[0]); // and the head
        p.acquire(ids[3]); // and the tail
        p.check().expect("invariants");
        assert_eq!(p.lru_order(), vec![ids[2]]);
        p.release(ids[0]);
        p.release(ids[3]);
        assert_eq!(p.lru_order(), vec![ids[2], ids[0], ids[3]]);
        assert_eq!(p.evict_lru(), Some((ids[2], 3)));
        assert_eq!(p.uncache(ids[3]), Some(4));
        assert_eq!(p.uncache(ids[1]), None, "held blocks are not uncached");
        p.check().expect("invariants");
        assert_eq!(p.lru_order(), vec![ids[0]]);
    }

    #[test]
    fn held_blocks_are_never_evicted() {
        let mut p = BlockPool::new(2);
        let a = take(&mut p);
        p.set_hash(a, 1);
        p.acquire(a);
        p.release(a);
        assert_eq!(p.ref_count(a), 1);
        let _b = take(&mut p);
        assert!(p.take().is_none());
        assert_eq!(p.evict_lru(), None);
        p.check().expect("invariants");
    }
}
