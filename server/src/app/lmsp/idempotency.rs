//! `Idempotency-Key`: the same key with the same body gets the same response
//! from one generation (concurrent duplicates wait for it); the same key with
//! a different body is refused. Bounded: the oldest keys are forgotten first.

use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;

/// Most keys remembered.
const MAX_KEYS: usize = 10_000;

/// A finished request's status and body, shared by every duplicate.
pub type Outcome = (u16, String);

/// What a key lookup found.
pub enum Claim {
    /// First use or a duplicate: await this cell (the first caller fills it).
    Run(Arc<OnceCell<Outcome>>),
    /// The key was used with another body.
    Mismatch,
}

/// Keys and their outcomes.
#[derive(Default)]
pub struct IdempotencyKeys {
    inner: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    map: HashMap<String, ([u8; 32], Arc<OnceCell<Outcome>>)>,
    order: VecDeque<String>,
}

impl IdempotencyKeys {
    /// Claims `key` for `body` (scoped by `scope`, e.g. the caller's credential).
    pub fn claim(&self, scope: &str, key: &str, body: &[u8]) -> Claim {
        let digest: [u8; 32] = Sha256::digest(body).into();
        let full = format!("{scope}\u{0}{key}");
        let Ok(mut keys) = self.inner.lock() else { return Claim::Run(Arc::new(OnceCell::new())) };
        if let Some((hash, cell)) = keys.map.get(&full) {
            return if *hash == digest { Claim::Run(cell.clone()) } else { Claim::Mismatch };
        }
        if keys.order.len() >= MAX_KEYS {
            if let Some(old) = keys.order.pop_front() {
                keys.map.remove(&old);
            }
        }
        let cell = Arc::new(OnceCell::new());
        keys.map.insert(full.clone(), (digest, cell.clone()));
        keys.order.push_back(full);
        Claim::Run(cell)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn same_body_shares_a_cell_and_a_different_body_is_refused() {
        let keys = IdempotencyKeys::default();
        let Claim::Run(a) = keys.claim("s", "k", b"body") else { panic!("first claim runs") };
        let Claim::Run(b) = keys.claim("s", "k", b"body") else { panic!("duplicate shares") };
        assert!(Arc::ptr_eq(&a, &b));
        assert!(matches!(keys.claim("s", "k", b"other"), Claim::Mismatch));
        let Claim::Run(c) = keys.claim("other-scope", "k", b"other") else { panic!("scopes are separate") };
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
