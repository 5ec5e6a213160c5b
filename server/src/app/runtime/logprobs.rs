//! Per-token log-probabilities of the answer, as `output_text.logprobs`
//! (and, mapped from there, Chat Completions' `logprobs.content` and
//! Completions' parallel arrays): each generated token's text, bytes and
//! log-probability, with the most likely alternatives asked for.
//!
//! A token's bytes are exactly what it stands for in the vocabulary (from
//! the grammar compiler's token table), so a token holding part of a
//! multi-byte character has those bytes, and its text reads them lossily
//! (U+FFFD). Without the table (no grammar compiler) the token's own
//! decoding is used.

use crate::protocol::output::{LogProb, TopLogProb};
use crate::app::runtime::state::ModelInfo;
use spindle_scheduler::request::GeneratedToken;

/// `token`'s entry: its text, log-probability and alternatives.
pub fn of_token(model: &ModelInfo, token: &GeneratedToken) -> LogProb {
    let (text, bytes) = text_and_bytes(model, token.id);
    let top_logprobs = token
        .top_logprobs
        .iter()
        .map(|&(id, logprob)| {
            let (token, bytes) = text_and_bytes(model, id);
            TopLogProb { token, logprob: f64::from(logprob), bytes }
        })
        .collect();
    LogProb { token: text, logprob: f64::from(token.logprob), bytes, top_logprobs }
}

/// A token's text and bytes: its vocabulary bytes when the grammar
/// compiler's table is there, else its own decoding.
fn text_and_bytes(model: &ModelInfo, id: u32) -> (String, Vec<u8>) {
    match &model.grammar {
        Some(grammar) => {
            let bytes = grammar.token_bytes(id);
            (String::from_utf8_lossy(&bytes).into_owned(), bytes)
        }
        None => {
            let text = model.tokenizer.decode(&[id], false).unwrap_or_default();
            let bytes = text.as_bytes().to_vec();
            (text, bytes)
        }
    }
}
