//! Randomized tests of the KV cache manager: thousands of random admissions
//! (with shared prefixes, forks and preemption-style readmissions), extends,
//! commits, frees and resets over ~32 simulated sequences, with
//! `check_invariants()` after every operation.
//!
//! Besides the manager's own invariants, the test keeps a ground-truth model
//! of what KV each block holds (the exact token prefix and salt the simulated
//! engine wrote into it) and checks that every prefix hit hands out blocks
//! whose content is exactly the request's prefix, that a block is only ever
//! written while one sequence holds it, and that forks of live sequences hit
//! everything those sequences committed.

use spindle_scheduler::kv_cache::{hash_block, BlockHashFn, KvCacheConfig, KvCacheManager, KvUsage, SeqKv};

/// SplitMix64: a tiny seeded PRNG.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn tokens(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n).map(|_| self.below(vocab) as u32).collect()
    }
}

/// One simulated sequence.
struct Sim {
    kv: SeqKv,
    tokens: Vec<u32>,
    salt: u64,
    /// Positions whose KV the simulated engine has written.
    computed: usize,
    /// Positions passed to the last `commit`.
    committed: usize,
}

/// What the simulated engine wrote into each block: (salt, every token up to
/// the end of what was written there). `None` once reallocated.
type Content = Vec<Option<(u64, Vec<u32>)>>;

struct World {
    m: KvCacheManager,
    rng: Rng,
    sims: Vec<Option<Sim>>,
    content: Content,
    prefixes: Vec<Vec<u32>>,
    /// Hash quality is good enough that forks must hit (off for weak hashes).
    strict: bool,
    caching: bool,
}

impl World {
    fn new(seed: u64, cfg: KvCacheConfig, hash_fn: BlockHashFn, strict: bool) -> Self {
        let mut rng = Rng(seed);
        let prefixes = (0..4)
            .map(|i| {
                let n = i * 24 + rng.below(8);
                rng.tokens(n, 50)
            })
            .collect();
        Self {
            m: KvCacheManager::with_hash_fn(cfg, hash_fn),
            rng,
            sims: (0..32).map(|_| None).collect(),
            content: vec![None; cfg.num_blocks],
            prefixes,
            strict,
            caching: cfg.enable_prefix_caching,
        }
    }

    fn check(&self, op: &str) {
        if let Err(e) = self.m.check_invariants() {
            panic!("after {op}: {e}");
        }
        for sim in self.sims.iter().flatten() {
            if let Err(e) = self.m.check_seq(&sim.kv) {
                panic!("after {op}: {e}");
            }
        }
    }

    /// A prompt: a shared prefix, or a fork of a live sequence's computed
    /// tokens, plus a random tail.
    fn prompt(&mut self) -> (Vec<u32>, u64, Option<usize>) {
        let salt = if self.rng.chance(85) { 1 } else { self.rng.range(2, 3) as u64 };
        let live: Vec<usize> = (0..self.sims.len()).filter(|&i| self.sims[i].is_some()).collect();
        if !live.is_empty() && self.rng.chance(25) {
            let parent = live[self.rng.below(live.len())];
            if let Some(p) = &self.sims[parent] {
                let mut t = p.tokens[..p.computed].to_vec();
                let extra = self.rng.range(1, 20);
                t.extend(self.rng.tokens(extra, 50));
                return (t, p.salt, Some(parent));
            }
        }
        let mut t = self.prefixes[self.rng.below(self.prefixes.len())].clone();
        let extra = self.rng.range(1, 40);
        t.extend(self.rng.tokens(extra, 50));
        (t, salt, None)
    }

    /// Admit a new sequence into `slot` and check its prefix hit.
    fn admit(&mut self, slot: usize, tokens: Vec<u32>, salt: u64, parent: Option<usize>) {
        let bs = self.m.block_size();
        let mut kv = SeqKv::default();
        let cached = self.m.lookup_prefix(&mut kv, &tokens, salt).cached_tokens;
        assert_eq!(cached % bs, 0);
        assert!(cached == 0 || cached < tokens.len(), "the last token is never cached");
        assert_eq!(kv.blocks.len(), cached / bs);
        if !self.caching {
            assert_eq!(cached, 0);
        }
        for (j, &b) in kv.blocks.iter().enumerate() {
            let want = (salt, tokens[..(j + 1) * bs].to_vec());
            assert_eq!(self.content[b as usize].as_ref(), Some(&want), "hit block {b} at {j} holds other KV");
        }
        if let (Some(p), true, true) = (parent.and_then(|p| self.sims[p].as_ref()), self.strict, self.caching) {
            // Everything the parent committed (up to the last-token rule) must hit.
            let expect = (p.committed / bs).min((tokens.len() - 1) / bs);
            assert!(kv.blocks.len() >= expect, "fork hit {} blocks, parent committed {expect}", kv.blocks.len());
            assert_eq!(kv.blocks[..expect], p.kv.blocks[..expect]);
        }
        self.sims[slot] = Some(Sim { kv, tokens, salt, computed: cached, committed: cached });
    }

    /// Grow a sequence by 1..=40 positions and let the engine write them.
    fn extend(&mut self, slot: usize) {
        let k = self.rng.range(1, 40);
        let Some(sim) = self.sims[slot].as_mut() else { return };
        let target = sim.computed + k;
        if sim.tokens.len() < target {
            let n = target - sim.tokens.len();
            sim.tokens.extend(self.rng.tokens(n, 50));
        }
        let before = (sim.kv.blocks.clone(), self.m.usage(), self.m.stats());
        let can = self.m.can_allocate(&sim.kv, target);
        let needed = self.m.blocks_needed(&sim.kv, target);
        match self.m.allocate(&mut sim.kv, target) {
            Err(_) => {
                assert!(!can);
                assert_eq!(
                    (sim.kv.blocks.clone(), self.m.usage(), self.m.stats()),
                    before,
                    "failed allocate changed state"
                );
                return;
            }
            Ok(()) => assert!(can),
        }
        // Free blocks go first; only the shortfall evicts cached ones.
        let evicted = self.m.stats().evictions - before.2.evictions;
        assert_eq!(evicted, needed.saturating_sub(before.1.free) as u64, "evicted while free blocks remained");
        let bs = self.m.block_size();
        assert_eq!(sim.kv.blocks.len(), target.div_ceil(bs));
        for &b in &sim.kv.blocks[before.0.len()..] {
            self.content[b as usize] = None;
        }
        // The engine writes positions computed..target.
        let (from, salt) = (sim.computed, sim.salt);
        for j in from / bs..target.div_ceil(bs) {
            let b = sim.kv.blocks[j];
            let end = ((j + 1) * bs).min(target);
            self.content[b as usize] = Some((salt, sim.tokens[..end].to_vec()));
        }
        sim.computed = target;
        let written: Vec<u32> = sim.kv.blocks[from / bs..].to_vec();
        for b in written {
            let holders = self.sims.iter().flatten().filter(|s| s.kv.blocks.contains(&b)).count();
            assert_eq!(holders, 1, "block {b} written while shared");
        }
    }

    fn commit(&mut self, slot: usize) {
        let Some(sim) = self.sims[slot].as_mut() else { return };
        self.m.commit(&mut sim.kv, &sim.tokens, sim.computed, sim.salt);
        sim.committed = sim.computed;
        let bs = self.m.block_size();
        for (j, &b) in sim.kv.blocks.iter().enumerate().take(sim.computed / bs) {
            let want = (sim.salt, sim.tokens[..(j + 1) * bs].to_vec());
            assert_eq!(self.content[b as usize].as_ref(), Some(&want), "committed block {b} at {j} holds other KV");
        }
    }

    fn free(&mut self, slot: usize) -> Option<Sim> {
        let mut sim = self.sims[slot].take()?;
        self.m.free(&mut sim.kv);
        assert!(sim.kv.blocks.is_empty());
        Some(sim)
    }

    fn free_all(&mut self) {
        for slot in 0..self.sims.len() {
            self.free(slot);
        }
        let u = self.m.usage();
        assert_eq!((u.used, u.free + u.cached_evictable, u.total), (0, u.total, self.m.num_blocks()));
        assert_eq!((self.m.num_free_blocks(), self.m.num_holders()), (self.m.num_blocks(), 0));
    }

    /// One random operation.
    fn step(&mut self) -> &'static str {
        let slot = self.rng.below(self.sims.len());
        let live = self.sims[slot].is_some();
        match self.rng.below(100) {
            _ if !live => {
                let (t, salt, parent) = self.prompt();
                self.admit(slot, t, salt, parent);
                "admit"
            }
            0..=39 => {
                self.extend(slot);
                "extend"
            }
            40..=64 => {
                self.commit(slot);
                "commit"
            }
            65..=79 => {
                self.free(slot);
                "free"
            }
            80..=91 => {
                // Preempt and readmit: recompute through the prefix cache.
                if let Some(sim) = self.free(slot) {
                    let bs = self.m.block_size();
                    let tokens = sim.tokens[..sim.computed.max(1)].to_vec();
                    let expect = (sim.committed / bs).min((tokens.len() - 1) / bs);
                    self.admit(slot, tokens, sim.salt, None);
                    if self.strict && self.caching {
                        let got = self.sims[slot].as_ref().map_or(0, |s| s.kv.blocks.len());
                        assert!(got >= expect, "readmission hit {got} blocks, {expect} were committed and just freed");
                    }
                }
                "preempt"
            }
            92..=94 => {
                self.m.reset_prefix_cache();
                "reset"
            }
            _ if self.rng.chance(20) => {
                self.free_all();
                "free all"
            }
            _ => {
                self.extend(slot);
                "extend"
            }
        }
    }
}

fn run(seed: u64, cfg: KvCacheConfig, hash_fn: BlockHashFn, strict: bool, ops: usize) -> KvUsage {
    let mut w = World::new(seed, cfg, hash_fn, strict);
    w.check("start");
    for i in 0..ops {
        let op = w.step();
        w.check(&format!("op {i} ({op}), seed {seed}"));
    }
    w.free_all();
    w.check("final free");
    let s = w.m.stats();
    assert!(s.prefix_hit_tokens <= s.prefix_query_tokens);
    if cfg.enable_prefix_caching {
        assert!(s.prefix_hit_tokens > 0, "seed {seed}: no prefix hit at all");
    }
    w.m.usage()
}

fn cfg(num_blocks: usize, block_size: usize) -> KvCacheConfig {
    KvCacheConfig { num_blocks, block_size, enable_prefix_caching: true }
}

#[test]
fn random_ops_keep_invariants() {
    for seed in 0..6 {
        for (blocks, bs) in [(64, 4), (48, 16), (200, 1), (40, 2), (256, 8)] {
            run(seed, cfg(blocks, bs), hash_block, true, 4000);
        }
    }
}

#[test]
fn random_ops_with_colliding_hashes_never_return_wrong_kv() {
    fn weak(p: u64, t: &[u32], s: u64) -> u64 {
        hash_block(p, t, s) & 0x7
    }
    fn no_parent(_: u64, t: &[u32], s: u64) -> u64 {
        hash_block(0, t, s) & 0xff
    }
    fn constant(_: u64, _: &[u32], _: u64) -> u64 {
        1
    }
    for seed in 0..4 {
        for hash_fn in [weak as BlockHashFn, no_parent, constant] {
            for (blocks, bs) in [(64, 4), (40, 2), (100, 1)] {
                run(seed + 100, cfg(blocks, bs), hash_fn, false, 3000);
            }
        }
    }
}

#[test]
fn random_ops_without_prefix_caching() {
    for seed in 0..3 {
        let cfg = KvCacheConfig { num_blocks: 64, block_size: 4, enable_prefix_caching: false };
        let u = run(seed + 200, cfg, hash_block, true, 3000);
        assert_eq!(u, KvUsage { used: 0, free: 64, cached_evictable: 0, total: 64 });
    }
}
