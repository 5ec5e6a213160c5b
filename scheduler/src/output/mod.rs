//! Per-sequence output processing: generated ids to text deltas, with stops.
//!
//! An [`OutputProcessor`] owns one sequence's [`IncrementalDecoder`] and its
//! [`StopConditions`]. Each generated id goes through [`OutputProcessor::push`],
//! which returns the text that may be shown now and, once the sequence is
//! done, why it stopped.
//!
//! # Design notes and invariants
//!
//! * **Stop ids** (EOS, `<|im_end|>`...) end generation before decoding: their
//!   text is never emitted. They do count as generated tokens (as in vLLM's
//!   usage numbers), so they also count towards `max_tokens`.
//! * **Hold-back.** Decoded text goes into `held`. After each push, `held` is
//!   only the longest suffix of the generated text that is a proper prefix of
//!   some stop string (empty when none is); everything before it is released.
//!   So `held` is always shorter than the longest stop string, and a stop
//!   string can only start inside `held + delta`: any earlier start would have
//!   made a longer held suffix. Each push searches `held + delta` only, never
//!   the whole text. Cuts are made on `char` boundaries; the decoder itself
//!   never splits a multi-byte character across deltas.
//! * **Which stop string wins.** When several occur, the one whose occurrence
//!   *ends* first wins (ties: the one starting first, i.e. the longer). This is
//!   the first stop a character-by-character stream would complete, so the
//!   result does not depend on how the text is split into tokens.
//! * **[`OutputProcessor::finish`] flushes.** A push that ends the sequence
//!   returns only the text released as usual. What is still held (a possible
//!   stop-string start that can no longer complete after a stop id or
//!   `max_tokens`, and an incomplete character, as U+FFFD like a full decode)
//!   comes from `finish`, which the caller invokes once at the end whatever
//!   the reason (also for context length or abort). After a stop string
//!   nothing is held: the text after it, and the stop string itself (unless
//!   `include_stop_str_in_output`), are dropped.
//! * All deltas plus the `finish` text concatenate to
//!   [`OutputProcessor::text`], which equals the full decode of the generated
//!   ids up to the stop, with the stop string and anything after it cut off.
//! * A stop string is seen when the decoder releases its text: the decoder
//!   holds a whole delta back while it ends in an incomplete character, so a
//!   stop string right before a token such as `Ġð` (space + an emoji's first
//!   byte) is found one token later. The emitted text is the same.

use spindle_engine::tokenizer::{IncrementalDecoder, Tokenizer};
use spindle_engine::EngineError;

/// When a sequence stops, and what of the stop is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopConditions {
    /// Ids that end generation (EOS, `<|im_end|>`...). They are not emitted.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation, matched across token boundaries and from
    /// any position inside a token. Empty strings are ignored.
    pub stop_strings: Vec<String>,
    /// Most generated tokens; the token that reaches it is still emitted.
    /// A value of 0 behaves like 1 (the first token always counts).
    pub max_tokens: usize,
    /// Emit the matched stop string too (text after it is still dropped).
    pub include_stop_str_in_output: bool,
    /// Leave special tokens (`<|im_start|>`...) out of the text.
    pub skip_special_tokens: bool,
}

impl Default for StopConditions {
    /// No stops, no token limit, special tokens skipped.
    fn default() -> Self {
        Self {
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            max_tokens: usize::MAX,
            include_stop_str_in_output: false,
            skip_special_tokens: true,
        }
    }
}

impl StopConditions {
    /// Stops at the tokenizer's end-of-generation ids, after `max_tokens`;
    /// the rest as in [`StopConditions::default`].
    pub fn for_tokenizer(tokenizer: &Tokenizer, max_tokens: usize) -> Self {
        Self {
            stop_token_ids: tokenizer.eos_ids().to_vec(),
            max_tokens,
            ..Self::default()
        }
    }
}

/// Why a sequence stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token id (EOS or another id in `stop_token_ids`).
    Eos,
    /// This stop string was generated.
    StopString(String),
    /// `max_tokens` tokens were generated.
    MaxTokens,
}

/// What one generated token produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenOutput {
    /// Text that may be shown now (often empty while text is held back).
    pub text_delta: String,
    /// Set when the sequence is done; then call [`OutputProcessor::finish`]
    /// for the text still held back.
    pub finished: Option<StopReason>,
}

/// Turns one sequence's generated ids into text deltas, applying its stops.
#[derive(Debug, Clone)]
pub struct OutputProcessor {
    decoder: IncrementalDecoder,
    stop_token_ids: Vec<u32>,
    /// Non-empty stop strings.
    stop_strings: Vec<String>,
    /// Byte length of the longest stop string (0 when there are none).
    max_stop_len: usize,
    max_tokens: usize,
    include_stop: bool,
    /// Decoded text not yet emitted: a possible start of a stop string.
    held: String,
    /// All text emitted so far.
    emitted: String,
    /// Tokens pushed while running (stop ids included).
    tokens: usize,
    state: State,
    /// Whether the held text and the decoder were flushed (no more text).
    flushed: bool,
}

/// Whether the processor still accepts tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Running,
    Stopped(StopReason),
    /// [`OutputProcessor::finish`] was called before any stop.
    Closed,
}

impl OutputProcessor {
    /// A processor for one sequence.
    pub fn new(tokenizer: Tokenizer, stop: StopConditions) -> Self {
        let stop_strings: Vec<String> = stop
            .stop_strings
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        let max_stop_len = stop_strings.iter().map(String::len).max().unwrap_or(0);
        Self {
            decoder: IncrementalDecoder::new(tokenizer, stop.skip_special_tokens),
            stop_token_ids: stop.stop_token_ids,
            stop_strings,
            max_stop_len,
            max_tokens: stop.max_tokens,
            include_stop: stop.include_stop_str_in_output,
            held: String::new(),
            emitted: String::new(),
            tokens: 0,
            state: State::Running,
            flushed: false,
        }
    }

    /// Takes one generated token.
    ///
    /// When the result has `finished` set, call [`OutputProcessor::finish`]
    /// for the held-back rest. Once the sequence is done (a stop, or
    /// `finish`), further tokens are ignored: not counted, no text, and
    /// `finished` repeats the stop reason (`None` after `finish` without a
    /// stop). Errors come from the tokenizer (an id outside the vocabulary).
    pub fn push(&mut self, token: u32) -> Result<TokenOutput, EngineError> {
        match &self.state {
            State::Running => {}
            State::Stopped(reason) => {
                return Ok(TokenOutput {
                    text_delta: String::new(),
                    finished: Some(reason.clone()),
                })
            }
            State::Closed => return Ok(TokenOutput::default()),
        }
        self.tokens += 1;
        let (text, finished) = if self.stop_token_ids.contains(&token) {
            (String::new(), Some(StopReason::Eos))
        } else {
            let delta = self.decoder.push(token)?;
            let (text, found) = self.absorb(&delta, false);
            if found.is_some() {
                // Nothing is held after a stop string: no flush needed.
                self.flushed = true;
            }
            let at_max = self.tokens >= self.max_tokens;
            (text, found.or(at_max.then_some(StopReason::MaxTokens)))
        };
        if let Some(reason) = &finished {
            self.state = State::Stopped(reason.clone());
        }
        self.emitted.push_str(&text);
        Ok(TokenOutput {
            text_delta: text,
            finished,
        })
    }

    /// Ends the sequence and returns the text still held back, with any
    /// incomplete character as U+FFFD. Call it once at the end whatever the
    /// reason: after a push reported a stop (stop id, `max_tokens`), or when
    /// the caller stops the sequence itself (context length, abort). A stop
    /// string completed by the flushed text is still cut off. Later calls
    /// return an empty string.
    pub fn finish(&mut self) -> Result<String, EngineError> {
        if self.flushed {
            return Ok(String::new());
        }
        let rest = self.decoder.finish()?;
        let (text, found) = self.absorb(&rest, true);
        self.flushed = true;
        self.emitted.push_str(&text);
        if self.state == State::Running {
            self.state = match found {
                Some(reason) => State::Stopped(reason),
                None => State::Closed,
            };
        }
        Ok(text)
    }

    /// Tokens generated so far, stop ids included; tokens pushed after the
    /// sequence is done are not counted.
    pub fn output_token_count(&self) -> usize {
        self.tokens
    }

    /// All text emitted so far (the concatenation of every delta).
    pub fn text(&self) -> &str {
        &self.emitted
    }

    /// Why the sequence stopped, if it did.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        match &self.state {
            State::Stopped(reason) => Some(reason),
            _ => None,
        }
    }

    /// Whether the sequence is done (stopped or finished).
    pub fn is_finished(&self) -> bool {
        self.state != State::Running
    }

    /// Adds decoded text; returns what can be released and the stop string
    /// it completed, if any. With `at_end`, nothing is held back.
    fn absorb(&mut self, delta: &str, at_end: bool) -> (String, Option<StopReason>) {
        self.held.push_str(delta);
        if let Some((start, idx)) = earliest_stop(&self.held, &self.stop_strings) {
            let stop = &self.stop_strings[idx];
            let cut = if self.include_stop {
                start + stop.len()
            } else {
                start
            };
            self.held.truncate(cut);
            let text = std::mem::take(&mut self.held);
            return (text, Some(StopReason::StopString(stop.clone())));
        }
        let keep_from = if at_end {
            self.held.len()
        } else {
            holdback_start(&self.held, &self.stop_strings, self.max_stop_len)
        };
        let kept = self.held.split_off(keep_from);
        (std::mem::replace(&mut self.held, kept), None)
    }
}

/// The stop string occurrence in `text` that ends first (ties: starts
/// first), as (byte start, index into `stops`).
fn earliest_stop(text: &str, stops: &[String]) -> Option<(usize, usize)> {
    stops
        .iter()
        .enumerate()
        .filter_map(|(i, s)| text.find(s.as_str()).map(|start| (start, i)))
        .min_by_key(|&(start, i)| (start + stops[i].len(), start))
}

/// Where the held-back tail of `text` starts: the start of its longest suffix
/// that is a proper prefix of some stop string, or `text.len()` if none is.
/// Only the last `max_stop_len - 1` bytes are looked at.
fn holdback_start(text: &str, stops: &[String], max_stop_len: usize) -> usize {
    let lowest = text.len().saturating_sub(max_stop_len.saturating_sub(1));
    (lowest..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .find(|&i| {
            let tail = &text[i..];
            stops
                .iter()
                .any(|s| s.len() > tail.len() && s.starts_with(tail))
        })
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests;
