//! A bounds-checked little-endian reader over a byte slice.
//!
//! Every read either returns the requested bytes or an
//! [`EngineError::InvalidGguf`] naming what was being read and where; nothing
//! here can panic or index out of bounds.

use crate::error::{EngineError, Result};

/// Reads little-endian primitives from a byte slice, tracking the position.
#[derive(Debug, Clone)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Current byte offset from the start of the buffer.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current position.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes, advancing past them.
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end.and_then(|e| self.buf.get(self.pos..e).map(|s| (e, s))) {
            Some((e, slice)) => {
                self.pos = e;
                Ok(slice)
            }
            None => Err(EngineError::InvalidGguf(format!(
                "truncated file: {what} needs {n} bytes at offset {}, but only {} remain",
                self.pos,
                self.remaining()
            ))),
        }
    }

    /// The next `N` bytes as an array.
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// Read a `u8`.
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(u8::from_le_bytes(self.array(what)?))
    }

    /// Read an `i8`.
    pub(crate) fn i8(&mut self, what: &str) -> Result<i8> {
        Ok(i8::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `u16`.
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `i16`.
    pub(crate) fn i16(&mut self, what: &str) -> Result<i16> {
        Ok(i16::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `u32`.
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `i32`.
    pub(crate) fn i32(&mut self, what: &str) -> Result<i32> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `u64`.
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `i64`.
    pub(crate) fn i64(&mut self, what: &str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `f32`.
    pub(crate) fn f32(&mut self, what: &str) -> Result<f32> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    /// Read a little-endian `f64`.
    pub(crate) fn f64(&mut self, what: &str) -> Result<f64> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    /// Read a GGUF string (u64 length, then that many bytes) as raw bytes.
    ///
    /// The length is checked against the bytes remaining before anything is
    /// allocated, so a corrupt length cannot cause a huge allocation.
    pub(crate) fn string_bytes(&mut self, what: &str) -> Result<&'a [u8]> {
        let at = self.pos;
        let len = self.u64(what)?;
        let remaining = self.remaining();
        match usize::try_from(len).ok().filter(|&l| l <= remaining) {
            Some(l) => self.take(l, what),
            None => Err(EngineError::InvalidGguf(format!(
                "{what} at offset {at} has length {len}, past the end of the file ({remaining} bytes remain)"
            ))),
        }
    }

    /// Read a GGUF string that must be valid UTF-8 (keys, tensor names).
    pub(crate) fn string_strict(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let bytes = self.string_bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            EngineError::InvalidGguf(format!("{what} at offset {at} is not valid UTF-8: {e}"))
        })
    }

    /// Read a count (u64) of items that each take at least `min_item_bytes`
    /// bytes in the file, rejecting counts the remaining bytes cannot hold.
    pub(crate) fn count(&mut self, min_item_bytes: usize, what: &str) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let max = self.remaining() / min_item_bytes.max(1);
        match usize::try_from(n).ok().filter(|&c| c <= max) {
            Some(c) => Ok(c),
            None => Err(EngineError::InvalidGguf(format!(
                "{what} at offset {at} is {n}, but the {} remaining bytes can hold at most {max}",
                self.remaining()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_bounds() {
        let buf = [1u8, 0, 0, 0, 2];
        let mut c = Cursor::new(&buf);
        assert_eq!(c.u32("a").ok(), Some(1));
        assert_eq!(c.remaining(), 1);
        assert!(c.u16("b").is_err());
        assert_eq!(c.u8("c").ok(), Some(2));
        assert!(c.u8("d").is_err());
        assert_eq!(c.pos(), 5);
    }

    #[test]
    fn string_length_past_end() {
        let mut buf = 100u64.to_le_bytes().to_vec();
        buf.extend_from_slice(b"abc");
        assert!(Cursor::new(&buf).string_bytes("s").is_err());
        let mut buf = u64::MAX.to_le_bytes().to_vec();
        buf.extend_from_slice(b"abc");
        assert!(Cursor::new(&buf).string_bytes("s").is_err());
    }

    #[test]
    fn count_is_capped_by_remaining_bytes() {
        let mut buf = 3u64.to_le_bytes().to_vec();
        buf.extend_from_slice(&[0u8; 12]);
        assert_eq!(Cursor::new(&buf).count(4, "n").ok(), Some(3));
        assert!(Cursor::new(&buf).count(5, "n").is_err());
    }
}
