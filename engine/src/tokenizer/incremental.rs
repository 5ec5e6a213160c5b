//! Streaming detokenization that never splits a UTF-8 character.

use super::Tokenizer;
use crate::error::Result;

/// Turns generated ids into text one id at a time.
///
/// Uses the prefix-offset technique of HF text-generation-inference: the ids
/// since the last emission are decoded together with the ids of the previous
/// emission (the prefix), and only the text past the prefix's own decoding is
/// returned. While that text ends in U+FFFD, a byte-level or byte-fallback
/// character is still incomplete and nothing is emitted yet, so a multi-byte
/// character spread over several tokens comes out whole. Decoding with the
/// prefix also keeps context-dependent spacing (SentencePiece `▁`) right.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    tokenizer: Tokenizer,
    skip_special: bool,
    /// Ids from the start of the prefix on (earlier ones are dropped).
    ids: Vec<u32>,
    /// End of the prefix / start of the unemitted ids, as an index into `ids`.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder for `tokenizer`; `skip_special` drops special tokens.
    pub fn new(tokenizer: Tokenizer, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            read_offset: 0,
        }
    }

    /// Adds one id; returns the text it completes (often empty while a
    /// multi-byte character is still incomplete).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = self
            .tokenizer
            .decode(&self.ids[..self.read_offset], self.skip_special)?;
        let full = self.tokenizer.decode(&self.ids, self.skip_special)?;
        if full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let Some(delta) = new_text(&prefix, &full) else {
            return Ok(String::new());
        };
        let delta = delta.to_string();
        // The unemitted ids become the next prefix.
        self.ids.drain(..self.read_offset);
        self.read_offset = self.ids.len();
        Ok(delta)
    }

    /// Flushes whatever is still pending (an incomplete character comes out
    /// as U+FFFD) and resets the decoder.
    pub fn finish(&mut self) -> Result<String> {
        let prefix = self
            .tokenizer
            .decode(&self.ids[..self.read_offset], self.skip_special)?;
        let full = self.tokenizer.decode(&self.ids, self.skip_special)?;
        self.ids.clear();
        self.read_offset = 0;
        Ok(new_text(&prefix, &full).unwrap_or_default().to_string())
    }

    /// Number of ids received but not yet turned into text.
    pub fn pending(&self) -> usize {
        self.ids.len() - self.read_offset
    }
}

/// The text `full` adds past `prefix`, if it is longer and the cut falls on
/// a char boundary (as in TGI, `prefix` is assumed to be a prefix of `full`).
fn new_text<'a>(prefix: &str, full: &'a str) -> Option<&'a str> {
    if full.len() > prefix.len() {
        full.get(prefix.len()..)
    } else {
        None
    }
}
