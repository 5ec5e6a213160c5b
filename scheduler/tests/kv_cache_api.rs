//! Deterministic tests of the KV cache manager's contract.

use spindle_scheduler::kv_cache::{hash_block, KvCacheConfig, KvCacheError, KvCacheManager, KvUsage, SeqKv, ROOT_HASH};

fn cfg(num_blocks: usize, block_size: usize) -> KvCacheConfig {
    KvCacheConfig { num_blocks, block_size, enable_prefix_caching: true }
}

fn mgr(num_blocks: usize, block_size: usize) -> KvCacheManager {
    KvCacheManager::new(cfg(num_blocks, block_size))
}

fn ok(m: &KvCacheManager, seqs: &[&SeqKv]) {
    m.check_invariants().expect("invariants");
    for s in seqs {
        m.check_seq(s).expect("seq matches the record");
    }
}

/// Admit `tokens`, compute all of them and commit; returns the sequence and
/// how many tokens were cached.
fn run(m: &mut KvCacheManager, tokens: &[u32], salt: u64) -> (SeqKv, usize) {
    let mut s = SeqKv::default();
    let hit = m.lookup_prefix(&mut s, tokens, salt);
    m.allocate(&mut s, tokens.len()).expect("fits");
    m.commit(&mut s, tokens, tokens.len(), salt);
    ok(m, &[&s]);
    (s, hit.cached_tokens)
}

/// Look `tokens` up in a new sequence; returns it and the cached token count.
fn lookup(m: &mut KvCacheManager, tokens: &[u32], salt: u64) -> (SeqKv, usize) {
    let mut s = SeqKv::default();
    let hit = m.lookup_prefix(&mut s, tokens, salt);
    ok(m, &[&s]);
    (s, hit.cached_tokens)
}

#[test]
fn a_hit_returns_exactly_the_committed_blocks() {
    let mut m = mgr(16, 4);
    let prompt: Vec<u32> = (0..10).collect();
    let (mut a, cached) = run(&mut m, &prompt, 0);
    assert_eq!((cached, a.blocks.len()), (0, 3));
    let committed = a.blocks[..2].to_vec();

    // A fork while `a` runs shares its blocks.
    let longer: Vec<u32> = (0..20).collect();
    let (mut fork, cached) = lookup(&mut m, &longer, 0);
    assert_eq!((cached, fork.blocks.clone()), (8, committed.clone()));
    m.free(&mut fork);

    m.free(&mut a);
    ok(&m, &[&a]);
    assert!(a.blocks.is_empty());
    let (b, cached) = lookup(&mut m, &longer, 0);
    assert_eq!((cached, b.blocks.clone()), (8, committed.clone()));
    // Exactly two full blocks: the last token must be computed, so one block.
    let (c, cached) = lookup(&mut m, &prompt[..8], 0);
    assert_eq!((cached, c.blocks.clone()), (4, committed[..1].to_vec()));
    ok(&m, &[&b, &c]);
}

#[test]
fn the_last_token_is_never_covered() {
    let mut m = mgr(8, 4);
    let (mut a, _) = run(&mut m, &[1, 2, 3, 4, 5, 6, 7, 8], 0);
    m.free(&mut a);
    assert_eq!(lookup(&mut m, &[1, 2, 3, 4, 5, 6, 7, 8], 0).1, 4);
    assert_eq!(lookup(&mut m, &[1, 2, 3, 4, 5, 6, 7, 8, 9], 0).1, 8);
    assert_eq!(lookup(&mut m, &[1, 2, 3, 4], 0).1, 0);
    assert_eq!(lookup(&mut m, &[1], 0).1, 0);
    assert_eq!(lookup(&mut m, &[], 0).1, 0);
}

#[test]
fn a_different_salt_never_hits() {
    let mut m = mgr(8, 2);
    let (mut a, _) = run(&mut m, &[1, 2, 3, 4, 5], 11);
    m.free(&mut a);
    assert_eq!(lookup(&mut m, &[1, 2, 3, 4, 5], 12).1, 0);
    assert_eq!(lookup(&mut m, &[1, 2, 3, 4, 5], 11).1, 4);
    // The other tenant computes its own copy; both stay cached side by side.
    let (mut b, cached) = run(&mut m, &[1, 2, 3, 4, 5], 12);
    assert_eq!(cached, 0);
    let (a2, _) = lookup(&mut m, &[1, 2, 3, 4, 5], 11);
    assert!(a2.blocks.iter().all(|blk| !b.blocks.contains(blk)));
    m.free(&mut b);
    ok(&m, &[&a2, &b]);
}

#[test]
fn colliding_hashes_never_return_wrong_blocks() {
    let mut m = KvCacheManager::with_hash_fn(cfg(8, 4), |_, _, _| 7);
    let (mut a, _) = run(&mut m, &[1, 2, 3, 4, 5], 0);
    let a_block = a.blocks[0];
    assert_eq!(lookup(&mut m, &[9, 9, 9, 9, 5], 0).1, 0, "same hash, other tokens");
    let (mut hit, cached) = lookup(&mut m, &[1, 2, 3, 4, 9], 0);
    assert_eq!((cached, hit.blocks[0]), (4, a_block));
    m.free(&mut hit);
    // A second block with the same hash collides with the first (held): it
    // stays private and nothing wrong is ever returned.
    let (mut b, _) = run(&mut m, &[9, 9, 9, 9, 5], 0);
    assert_eq!(lookup(&mut m, &[9, 9, 9, 9, 5], 0).1, 0);
    m.free(&mut b);
    // Once `a` is gone its unused entry gives way to the next committer.
    m.free(&mut a);
    let (mut c, _) = run(&mut m, &[9, 9, 9, 9, 6], 0);
    m.free(&mut c);
    assert_eq!(lookup(&mut m, &[1, 2, 3, 4, 5], 0).1, 0);
    assert_eq!(lookup(&mut m, &[9, 9, 9, 9, 5], 0).1, 4);
    ok(&m, &[]);
}

#[test]
fn a_hash_ignoring_the_parent_cannot_splice_prefixes() {
    // Blocks with equal tokens collide whatever came before them.
    let no_parent = |_: u64, t: &[u32], s: u64| hash_block(ROOT_HASH, t, s);
    for free_a_first in [false, true] {
        let mut m = KvCacheManager::with_hash_fn(cfg(16, 4), no_parent);
        let (mut a, _) = run(&mut m, &[1, 1, 1, 1, 2, 2, 2, 2, 0], 0);
        if free_a_first {
            m.free(&mut a);
        }
        let (mut b, cached) = run(&mut m, &[3, 3, 3, 3, 2, 2, 2, 2, 0], 0);
        assert_eq!(cached, 0);
        let b0 = b.blocks[0];
        m.free(&mut b);
        let (c, cached) = lookup(&mut m, &[3, 3, 3, 3, 2, 2, 2, 2, 9], 0);
        let (d, d_cached) = lookup(&mut m, &[1, 1, 1, 1, 2, 2, 2, 2, 9], 0);
        if free_a_first {
            // b's second block replaced a's unused one: b's chain hits fully,
            // a's stops after its first block.
            assert_eq!((cached, c.blocks[0]), (8, b0));
            assert_eq!(d_cached, 4);
        } else {
            // a's second block is held: b's chain stays private past block 0.
            assert_eq!((cached, c.blocks.clone()), (4, vec![b0]));
            assert_eq!((d_cached, d.blocks.clone()), (8, a.blocks[..2].to_vec()));
        }
        ok(&m, &[&a, &c, &d]);
    }
}

#[test]
fn eviction_takes_the_least_recently_used_block() {
    let mut m = mgr(4, 2);
    let mut seqs: Vec<SeqKv> = (1..=4).map(|t| run(&mut m, &[t, t], 0).0).collect();
    let ids: Vec<u32> = seqs.iter().map(|s| s.blocks[0]).collect();
    for i in [1, 0, 3, 2] {
        m.free(&mut seqs[i]);
    }
    assert_eq!(m.usage(), KvUsage { used: 0, free: 0, cached_evictable: 4, total: 4 });
    let mut e = SeqKv::default();
    m.allocate(&mut e, 2).expect("evicts one");
    assert_eq!((e.blocks.clone(), m.stats().evictions), (vec![ids[1]], 1));
    assert_eq!(lookup(&mut m, &[2, 2, 9], 0).1, 0, "evicted");
    // A hit takes the block off the LRU list: the next eviction skips it.
    let (hit, cached) = lookup(&mut m, &[1, 1, 9], 0);
    assert_eq!((cached, hit.blocks.clone()), (2, vec![ids[0]]));
    let mut f = SeqKv::default();
    m.allocate(&mut f, 2).expect("evicts one");
    assert_eq!(f.blocks, vec![ids[3]]);
    ok(&m, &[&e, &f, &hit]);
}

#[test]
fn a_held_block_is_never_evicted() {
    let mut m = mgr(2, 2);
    let (mut a, _) = run(&mut m, &[1, 1], 0);
    let mut b = SeqKv::default();
    m.allocate(&mut b, 2).expect("one free block");
    let mut c = SeqKv::default();
    assert!(!m.can_allocate(&c, 1));
    assert_eq!(m.allocate(&mut c, 1), Err(KvCacheError::OutOfBlocks { needed: 1, available: 0 }));
    m.free(&mut a);
    // Cached but revived by a hit: still not evictable.
    let (mut hit, cached) = lookup(&mut m, &[1, 1, 2], 0);
    assert_eq!(cached, 2);
    assert!(m.allocate(&mut c, 1).is_err());
    m.free(&mut hit);
    m.allocate(&mut c, 1).expect("the cached block is evictable again");
    assert_eq!(m.stats().evictions, 1);
    ok(&m, &[&a, &b, &c, &hit]);
}

#[test]
fn allocate_is_all_or_nothing() {
    let mut m = mgr(4, 2);
    let (mut cached, _) = run(&mut m, &[7, 7], 0);
    m.free(&mut cached);
    let (_held, _) = run(&mut m, &[1, 2, 3], 0); // 2 blocks held
    let mut b = SeqKv::default();
    m.allocate(&mut b, 1).expect("fits");
    let before = (b.blocks.clone(), m.usage(), m.stats());
    assert_eq!(before.1, KvUsage { used: 3, free: 0, cached_evictable: 1, total: 4 });
    let err = m.allocate(&mut b, 6).expect_err("needs 2 more, 1 available");
    assert_eq!(err, KvCacheError::OutOfBlocks { needed: 2, available: 1 });
    assert_eq!(err.to_string(), "out of KV blocks: need 2, 1 available");
    assert_eq!((b.blocks.clone(), m.usage(), m.stats()), before);
    assert_eq!(lookup(&mut m, &[7, 7, 0], 0).1, 2, "nothing was evicted");
    let mut fresh = SeqKv::default();
    assert!(m.allocate(&mut fresh, 100).is_err());
    assert!(fresh.blocks.is_empty());
    ok(&m, &[&b, &fresh]);
}

#[test]
fn freeing_evicts_a_sequence_tail_first() {
    let mut m = mgr(3, 2);
    let (mut a, _) = run(&mut m, &[1, 2, 3, 4, 5, 6], 0);
    let tail = a.blocks[2];
    m.free(&mut a);
    let mut x = SeqKv::default();
    m.allocate(&mut x, 2).expect("evicts one");
    assert_eq!(x.blocks, vec![tail]);
    assert_eq!(lookup(&mut m, &[1, 2, 3, 4, 5, 6, 7], 0).1, 4);
}

#[test]
fn identical_blocks_computed_twice_are_deduplicated() {
    let mut m = mgr(8, 2);
    let prompt = [5, 5, 6, 6, 7];
    let (mut a, mut b) = (SeqKv::default(), SeqKv::default());
    assert_eq!(m.lookup_prefix(&mut a, &prompt, 0).cached_tokens, 0);
    assert_eq!(m.lookup_prefix(&mut b, &prompt, 0).cached_tokens, 0);
    m.allocate(&mut a, 5).expect("fits");
    m.allocate(&mut b, 5).expect("fits");
    assert_eq!(m.usage().used, 6);
    m.commit(&mut a, &prompt, 5, 0);
    m.commit(&mut b, &prompt, 5, 0);
    assert_eq!(b.blocks[..2], a.blocks[..2]);
    assert_ne!(b.blocks[2], a.blocks[2]);
    assert_eq!(m.usage(), KvUsage { used: 4, free: 4, cached_evictable: 0, total: 8 });
    ok(&m, &[&a, &b]);
    m.free(&mut a);
    assert_eq!(m.usage().used, 3, "b still holds the shared blocks");
    m.free(&mut b);
    assert_eq!(m.usage(), KvUsage { used: 0, free: 6, cached_evictable: 2, total: 8 });
    ok(&m, &[&a, &b]);
}

#[test]
fn reset_drops_only_unreferenced_cache_entries() {
    let mut m = mgr(8, 2);
    let (mut a, _) = run(&mut m, &[1, 1, 1], 0);
    let (b, _) = run(&mut m, &[2, 2, 2], 0);
    m.free(&mut a);
    m.reset_prefix_cache();
    assert_eq!(m.usage(), KvUsage { used: 2, free: 6, cached_evictable: 0, total: 8 });
    assert_eq!(lookup(&mut m, &[1, 1, 1], 0).1, 0);
    assert_eq!(lookup(&mut m, &[2, 2, 2], 0).1, 2);
    ok(&m, &[&b]);
}

#[test]
fn stats_count_query_and_hit_tokens() {
    let mut m = mgr(8, 2);
    let (mut a, _) = run(&mut m, &[1, 2, 3, 4, 5], 0);
    m.free(&mut a);
    let _ = lookup(&mut m, &[1, 2, 3, 4, 5], 0);
    let s = m.stats();
    assert_eq!((s.prefix_query_tokens, s.prefix_hit_tokens, s.evictions), (10, 4, 0));
    // A sequence that already holds blocks is not looked up again.
    let (mut held, _) = run(&mut m, &[9, 9, 9], 0);
    assert_eq!(m.lookup_prefix(&mut held, &[1, 2, 3, 4, 5], 0).cached_tokens, 0);
    assert_eq!(m.stats().prefix_query_tokens, 13);
    ok(&m, &[&held]);
}

#[test]
fn double_free_and_stale_clones_are_harmless() {
    let mut m = mgr(4, 2);
    let (mut a, _) = run(&mut m, &[1, 2, 3], 0);
    let mut stale = a.clone();
    m.free(&mut a);
    m.free(&mut a);
    m.free(&mut stale);
    assert!(stale.blocks.is_empty());
    ok(&m, &[&a, &stale]);
    let mut stale2 = stale.clone();
    stale2.blocks = vec![3, 2, 1];
    m.allocate(&mut stale2, 2).expect("fits");
    assert_eq!(stale2.blocks.len(), 1, "a stale table is replaced, not trusted");
    ok(&m, &[&stale2]);
    m.free(&mut stale2);
    assert_eq!((m.num_free_blocks(), m.num_holders()), (4, 0));
}

#[test]
fn without_prefix_caching_nothing_is_shared() {
    let mut m = KvCacheManager::new(KvCacheConfig { num_blocks: 4, block_size: 2, enable_prefix_caching: false });
    let (mut a, _) = run(&mut m, &[1, 2, 3], 0);
    m.free(&mut a);
    assert_eq!(m.usage(), KvUsage { used: 0, free: 4, cached_evictable: 0, total: 4 });
    assert_eq!(lookup(&mut m, &[1, 2, 3], 0).1, 0);
    assert_eq!(m.stats().prefix_query_tokens, 6);
}

#[test]
fn degenerate_sizes_do_not_panic() {
    let mut m = mgr(0, 0);
    assert_eq!((m.block_size(), m.num_blocks()), (1, 0));
    let mut s = SeqKv::default();
    assert_eq!(m.lookup_prefix(&mut s, &[1, 2], 0).cached_tokens, 0);
    assert!(m.allocate(&mut s, 1).is_err());
    m.allocate(&mut s, 0).expect("nothing needed");
    m.commit(&mut s, &[1, 2], 2, 0);
    m.free(&mut s);
    ok(&m, &[&s]);
}
