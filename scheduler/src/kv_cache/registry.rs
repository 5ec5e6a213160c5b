//! The manager's own record of which sequence holds which blocks.
//!
//! Each [`SeqKv`] that holds blocks carries a private handle (slot and
//! generation) into a slab of [`SeqEntry`]s. The entry's block list is the
//! source of truth for ref counting; `SeqKv::blocks` is a copy the scheduler
//! reads to build block tables. A freed slot's generation is bumped, so a stale
//! handle (a clone of a freed `SeqKv`, or one from another manager) resolves to
//! nothing and can never release someone else's blocks.

use super::hash::{BlockHash, ROOT_HASH};
use super::{BlockId, SeqKv};

/// A handle from a [`SeqKv`] to its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeqHandle {
    slot: u32,
    generation: u32,
}

/// What the manager knows about one sequence holding blocks.
#[derive(Debug, Clone)]
pub(crate) struct SeqEntry {
    /// Blocks held, in position order (one reference each).
    pub(crate) blocks: Vec<BlockId>,
    /// Leading blocks whose content is committed (full and computed).
    pub(crate) committed: usize,
    /// Hash of the last committed block (or [`ROOT_HASH`]).
    pub(crate) chain_hash: BlockHash,
    /// Registration id of the last committed block's content (0 at the root).
    pub(crate) chain_reg: u64,
    /// False once a block failed to register (a conflict on a held entry); no
    /// later block of this sequence is registered, since no lookup could reach it.
    pub(crate) chain_ok: bool,
}

impl SeqEntry {
    /// An entry for a sequence holding `blocks`, of which `committed` are
    /// committed, the last one under `(chain_hash, chain_reg)`.
    pub(crate) fn new(blocks: Vec<BlockId>, committed: usize, chain: (BlockHash, u64)) -> Self {
        Self { blocks, committed, chain_hash: chain.0, chain_reg: chain.1, chain_ok: true }
    }

    /// An entry holding no committed block yet.
    pub(crate) fn fresh() -> Self {
        Self::new(Vec::new(), 0, (ROOT_HASH, 0))
    }
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    entry: Option<SeqEntry>,
}

/// A slab of [`SeqEntry`]s addressed by [`SeqHandle`]s.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    slots: Vec<Slot>,
    vacant: Vec<u32>,
    live: usize,
}

impl Registry {
    fn slot_index(&self, seq: &SeqKv) -> Option<usize> {
        let h = seq.handle?;
        let slot = self.slots.get(h.slot as usize)?;
        (slot.generation == h.generation && slot.entry.is_some()).then_some(h.slot as usize)
    }

    /// The entry of `seq`, if it holds blocks.
    pub(crate) fn get(&self, seq: &SeqKv) -> Option<&SeqEntry> {
        self.slot_index(seq).and_then(|i| self.slots[i].entry.as_ref())
    }

    /// The entry of `seq`, mutably.
    pub(crate) fn get_mut(&mut self, seq: &SeqKv) -> Option<&mut SeqEntry> {
        self.slot_index(seq).and_then(|i| self.slots[i].entry.as_mut())
    }

    /// The entry of `seq`, created (and its handle set) when it has none.
    pub(crate) fn get_or_insert(&mut self, seq: &mut SeqKv) -> &mut SeqEntry {
        let i = match self.slot_index(seq) {
            Some(i) => i,
            None => self.insert(seq, SeqEntry::fresh()),
        };
        self.slots[i].entry.get_or_insert_with(SeqEntry::fresh)
    }

    /// Store `entry` for `seq` in a new slot; returns the slot index.
    pub(crate) fn insert(&mut self, seq: &mut SeqKv, entry: SeqEntry) -> usize {
        let i = match self.vacant.pop() {
            Some(i) => i as usize,
            None => {
                self.slots.push(Slot { generation: 0, entry: None });
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[i];
        slot.entry = Some(entry);
        self.live += 1;
        seq.handle = Some(SeqHandle { slot: i as u32, generation: slot.generation });
        i
    }

    /// Take `seq`'s entry out, invalidating every handle to it.
    pub(crate) fn remove(&mut self, seq: &mut SeqKv) -> Option<SeqEntry> {
        let found = self.slot_index(seq);
        seq.handle = None;
        let i = found?;
        let slot = &mut self.slots[i];
        let entry = slot.entry.take();
        slot.generation = slot.generation.wrapping_add(1);
        self.vacant.push(i as u32);
        self.live -= 1;
        entry
    }

    /// Every live entry.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &SeqEntry> {
        self.slots.iter().filter_map(|s| s.entry.as_ref())
    }

    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.live
    }
}
