//! Per-token log-probabilities of the answer, as `output_text.logprobs`
//! (and, mapped from there, Chat Completions' `logprobs.content` and
//! Completions' parallel arrays): each generated token's text, bytes and
//! log-probability, with the most likely alternatives asked for.
//!
//! A token's text is its own decoding, so a token that holds part of a
//! multi-byte character reads as U+FFFD; its bytes are that text's.

use crate::protocol::output::{LogProb, TopLogProb};
use spindle_engine::tokenizer::Tokenizer;
use spindle_scheduler::request::GeneratedToken;

/// `token`'s entry: its text, log-probability and alternatives.
pub fn of_token(tokenizer: &Tokenizer, token: &GeneratedToken) -> LogProb {
    let (text, bytes) = text_and_bytes(tokenizer, token.id);
    let top_logprobs = token
        .top_logprobs
        .iter()
        .map(|&(id, logprob)| {
            let (token, bytes) = text_and_bytes(tokenizer, id);
            TopLogProb { token, logprob: f64::from(logprob), bytes }
        })
        .collect();
    LogProb { token: text, logprob: f64::from(token.logprob), bytes, top_logprobs }
}

fn text_and_bytes(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tokenizer.decode(&[id], false).unwrap_or_default();
    let bytes = text.as_bytes().to_vec();
    (text, bytes)
}
