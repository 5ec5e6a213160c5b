//! Sealing of compaction items: `encrypted_content` is ChaCha20-Poly1305
//! (AEAD) under a server key, bound to the model name, so it round-trips as
//! input but clients can neither read nor forge it.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use std::path::Path;

const PREFIX: &str = "spindle.v1.";
const NONCE_BYTES: usize = 12;

/// A sealed value did not open.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// Not produced by this server's key, altered, or for another model.
    #[error("the encrypted content was not produced by this server (or was altered)")]
    Invalid,
    /// The key file could not be read or written.
    #[error("compaction key file {path}: {source}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Seals and opens with one server key.
#[derive(Clone)]
pub struct Sealer {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// A fresh random key (items sealed with it die with the process).
    pub fn random() -> Self {
        Self { cipher: ChaCha20Poly1305::new(&ChaCha20Poly1305::generate_key(&mut OsRng)) }
    }

    /// The key in `path` (32 bytes), created (mode 0600) when missing, so
    /// compaction items survive restarts.
    pub fn load_or_create(path: &Path) -> Result<Self, SealError> {
        let err = |source| SealError::KeyFile { path: path.display().to_string(), source };
        let key = match std::fs::read(path) {
            Ok(bytes) if bytes.len() == 32 => *Key::from_slice(&bytes),
            Ok(_) => return Err(err(std::io::Error::new(std::io::ErrorKind::InvalidData, "expected 32 bytes"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = ChaCha20Poly1305::generate_key(&mut OsRng);
                write_private(path, key.as_slice()).map_err(err)?;
                key
            }
            Err(e) => return Err(err(e)),
        };
        Ok(Self { cipher: ChaCha20Poly1305::new(&key) })
    }

    /// Seals `plaintext`, bound to `context` (authenticated, not encrypted).
    pub fn seal(&self, plaintext: &[u8], context: &[u8]) -> String {
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        // Encryption with a fresh nonce cannot fail for inputs this small.
        let sealed = self.cipher.encrypt(&nonce, Payload { msg: plaintext, aad: context }).unwrap_or_default();
        let mut out = String::with_capacity(PREFIX.len() + 2 * (NONCE_BYTES + sealed.len()));
        out.push_str(PREFIX);
        for b in nonce.iter().chain(&sealed) {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    /// Opens what [`Sealer::seal`] made with the same key and `context`.
    pub fn open(&self, token: &str, context: &[u8]) -> Result<Vec<u8>, SealError> {
        let hex = token.strip_prefix(PREFIX).ok_or(SealError::Invalid)?;
        let bytes = decode_hex(hex).ok_or(SealError::Invalid)?;
        if bytes.len() < NONCE_BYTES + 16 {
            return Err(SealError::Invalid);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_BYTES);
        self.cipher.decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: context }).map_err(|_| SealError::Invalid)
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()).collect()
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_forgery_other_keys_and_other_contexts() {
        let sealer = Sealer::random();
        let token = sealer.seal(b"summary", b"model-a");
        assert_eq!(sealer.open(&token, b"model-a").unwrap(), b"summary");
        assert!(!token.contains("summary"));
        assert!(sealer.open(&token, b"model-b").is_err());
        assert!(Sealer::random().open(&token, b"model-a").is_err());
        let mut flipped = token.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert!(sealer.open(std::str::from_utf8(&flipped).unwrap(), b"model-a").is_err());
        for bad in ["", "spindle.v1.", "spindle.v1.zz", "other", "spindle.v1.00"] {
            assert!(sealer.open(bad, b"model-a").is_err(), "{bad}");
        }
    }

    #[test]
    fn the_key_file_persists_across_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("compaction.key");
        let token = Sealer::load_or_create(&path).unwrap().seal(b"x", b"m");
        assert_eq!(Sealer::load_or_create(&path).unwrap().open(&token, b"m").unwrap(), b"x");
        std::fs::write(&path, b"short").unwrap();
        assert!(Sealer::load_or_create(&path).is_err());
    }
}
