//! Block content hashing for the prefix cache.
//!
//! A full block's key is `hash(parent_hash, block_tokens, salt)`, chained from
//! [`ROOT_HASH`] for the first block, so a block's key depends on every token
//! before it. The function is our own xxHash64-style single-lane mix: fast,
//! unseeded and therefore stable across runs and machines.
//!
//! Correctness never depends on hash quality: the prefix cache also stores each
//! registered block's tokens, salt and parent registration, and compares them on
//! every hit, so a collision is only ever a miss (see `prefix_cache.rs`).

/// A chained block hash.
pub type BlockHash = u64;

/// A block hash function: `(parent hash, the block's token ids, salt) -> hash`.
///
/// [`hash_block`] is the default; [`super::KvCacheManager::with_hash_fn`] takes
/// another one so tests can force collisions.
pub type BlockHashFn = fn(BlockHash, &[u32], u64) -> BlockHash;

/// The parent hash of a sequence's first block.
pub const ROOT_HASH: BlockHash = 0;

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

#[inline]
fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2)).rotate_left(31).wrapping_mul(P1)
}

#[inline]
fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^= h >> 32;
    h
}

/// The default block hash: mixes the parent hash, the salt, the token count
/// and the tokens (two per 64-bit round), then avalanches.
pub fn hash_block(parent: BlockHash, tokens: &[u32], salt: u64) -> BlockHash {
    let mut h = round(P5, parent);
    h = round(h, salt);
    h = round(h, tokens.len() as u64);
    let mut pairs = tokens.chunks_exact(2);
    for pair in &mut pairs {
        if let [a, b] = pair {
            h = round(h, u64::from(*a) | (u64::from(*b) << 32));
        }
    }
    if let [last] = pairs.remainder() {
        h = round(h, u64::from(*last) ^ P4);
    }
    avalanche(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_sensitive() {
        let a = hash_block(ROOT_HASH, &[1, 2, 3, 4], 0);
        assert_eq!(a, hash_block(ROOT_HASH, &[1, 2, 3, 4], 0));
        assert_ne!(a, hash_block(ROOT_HASH, &[1, 2, 3, 5], 0));
        assert_ne!(a, hash_block(ROOT_HASH, &[2, 1, 3, 4], 0));
        assert_ne!(a, hash_block(ROOT_HASH, &[1, 2, 3, 4], 1));
        assert_ne!(a, hash_block(a, &[1, 2, 3, 4], 0));
        assert_ne!(hash_block(ROOT_HASH, &[1, 2, 3], 0), hash_block(ROOT_HASH, &[1, 2, 3, 0], 0));
        assert_ne!(hash_block(ROOT_HASH, &[], 0), hash_block(ROOT_HASH, &[0], 0));
    }

    #[test]
    fn pinned_value() {
        // The hash is part of nothing persistent, but it must not vary between
        // runs: pin one value so an accidental change to the mix is noticed.
        let h = hash_block(ROOT_HASH, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], 7);
        assert_eq!(h, 11_288_156_093_277_407_097);
    }
}
