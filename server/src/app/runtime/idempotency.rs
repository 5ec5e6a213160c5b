//! `Idempotency-Key`: the same key with the same body gets the same response
//! from one generation (concurrent duplicates wait for it); the same key with
//! a different body is refused. Bounded: the oldest keys are forgotten first.

use crate::protocol::error::ApiError;
use crate::protocol::ErrorKind;
use axum::http::{header, HeaderMap};
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

/// The request's `Idempotency-Key` header, if any.
pub fn header_key(headers: &HeaderMap) -> Option<String> {
    headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Runs `work` once for `key` and this `body` (scoped by `namespace` and the
/// caller's credential): duplicates get the first run's outcome; a key of
/// the wrong length is a 400 and a reused key with another body a 422.
pub async fn run_once<F, Fut>(
    keys: &IdempotencyKeys,
    namespace: &str,
    headers: &HeaderMap,
    key: &str,
    body: &[u8],
    work: F,
) -> Result<Outcome, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Outcome>,
{
    if key.is_empty() || key.len() > 255 {
        return Err(ApiError::invalid("Idempotency-Key", "The Idempotency-Key header must be 1–255 characters."));
    }
    let credential = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    match keys.claim(&format!("{namespace}{credential}"), key, body) {
        Claim::Mismatch => Err(ApiError::new(422, ErrorKind::InvalidRequest, "This Idempotency-Key was already used with a different request body.")
            .with_code("idempotency_key_reused")),
        Claim::Run(cell) => Ok(cell.get_or_init(work).await.clone()),
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
