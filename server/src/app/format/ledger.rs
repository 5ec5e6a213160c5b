//! Token-exact conversations: each finished turn's tokens (prompt, then the
//! generated ids, EOS left out) are kept for a while, so that the next turn's
//! prompt can reuse them instead of re-tokenizing the conversation's text.
//!
//! Re-tokenizing the text a model generated does not always give back the
//! ids it sampled (a model may write `ab` as `a`,`b`), and every id that
//! differs ends the prefix-cache hit there. When the next turn's rendered
//! text starts with exactly the text of a recorded turn, its prompt is that
//! turn's ids followed by the tokens of the rest, checked by decoding; so an
//! agent loop's prompt is a token-exact extension of the last one, and the
//! KV blocks computed for the generated tokens are hits.
//!
//! A turn is found by `previous_response_id`, or by the id of any of its
//! output items re-sent as input (stateless clients send the reasoning and
//! call items back). The ledger is bounded by entries and by tokens; the
//! oldest go first.

use spindle_engine::tokenizer::Tokenizer;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Most turns kept.
const MAX_ENTRIES: usize = 4096;
/// Most tokens kept over all turns (4 bytes each).
const MAX_TOKENS: usize = 4 << 20;

/// Recent turns' tokens, by response id and by output item id.
#[derive(Debug, Default)]
pub struct TokenLedger {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    turns: HashMap<String, Arc<Turn>>,
    by_item: HashMap<String, String>,
    order: VecDeque<String>,
    tokens: usize,
}

#[derive(Debug)]
struct Turn {
    tokens: Vec<u32>,
    item_ids: Vec<String>,
}

impl TokenLedger {
    /// Records a finished turn: `tokens` (prompt then generated ids) under
    /// `response_id` and each of its output `item_ids`.
    pub fn record(&self, response_id: &str, item_ids: Vec<String>, tokens: Vec<u32>) {
        if tokens.len() > MAX_TOKENS {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else { return };
        inner.remove(response_id);
        while inner.order.len() >= MAX_ENTRIES || inner.tokens + tokens.len() > MAX_TOKENS {
            let Some(oldest) = inner.order.pop_front() else { break };
            inner.remove(&oldest);
        }
        for item in &item_ids {
            inner.by_item.insert(item.clone(), response_id.to_string());
        }
        inner.tokens += tokens.len();
        inner.order.push_back(response_id.to_string());
        inner.turns.insert(response_id.to_string(), Arc::new(Turn { tokens, item_ids }));
    }

    /// The recorded tokens of `response_id`.
    pub fn tokens(&self, response_id: &str) -> Option<Vec<u32>> {
        let inner = self.inner.lock().ok()?;
        inner.turns.get(response_id).map(|t| t.tokens.clone())
    }

    /// The turns to try extending: `previous` when recorded, then the turn
    /// of the last of `item_ids` that is a recorded output item.
    fn candidates(&self, previous: Option<&str>, item_ids: &[&str]) -> Vec<Arc<Turn>> {
        let Ok(inner) = self.inner.lock() else { return Vec::new() };
        let by_previous = previous.and_then(|id| inner.turns.get(id)).cloned();
        let by_item = item_ids.iter().rev().find_map(|item| inner.by_item.get(*item)).and_then(|id| inner.turns.get(id)).cloned();
        let mut out: Vec<Arc<Turn>> = by_previous.into_iter().collect();
        if let Some(turn) = by_item {
            if !out.iter().any(|t| Arc::ptr_eq(t, &turn)) {
                out.push(turn);
            }
        }
        out
    }

    /// Forgets a response (deleted by its owner).
    pub fn forget(&self, response_id: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.remove(response_id);
        }
    }

    /// The prompt ids of `text`: a recorded turn's ids plus the rest's when
    /// `text` extends that turn's text exactly (see the module docs), else
    /// `text` tokenized whole.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        previous: Option<&str>,
        item_ids: &[&str],
    ) -> Result<Vec<u32>, spindle_engine::EngineError> {
        for turn in self.candidates(previous, item_ids) {
            if let Some(ids) = extend(tokenizer, &turn.tokens, text) {
                return Ok(ids);
            }
        }
        tokenizer.encode(text, false)
    }
}

impl Inner {
    fn remove(&mut self, response_id: &str) {
        if let Some(turn) = self.turns.remove(response_id) {
            self.tokens -= turn.tokens.len();
            for item in &turn.item_ids {
                if self.by_item.get(item).is_some_and(|r| r == response_id) {
                    self.by_item.remove(item);
                }
            }
            self.order.retain(|r| r != response_id);
        }
    }
}

/// `prefix` then the ids of the rest of `text`, when `text` starts with
/// `prefix`'s text and the result decodes back to `text` exactly.
fn extend(tokenizer: &Tokenizer, prefix: &[u32], text: &str) -> Option<Vec<u32>> {
    let head = tokenizer.decode(prefix, false).ok()?;
    let rest = text.strip_prefix(head.as_str())?;
    let mut ids = prefix.to_vec();
    ids.extend(tokenizer.encode(rest, false).ok()?);
    (tokenizer.decode(&ids, false).ok()? == text).then_some(ids)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use spindle_engine::tokenizer::SpecialTokens;

    fn tiny_tokenizer() -> Tokenizer {
        let dir = tempfile::tempdir().unwrap();
        let opts = spindle_tools::tiny_model::TinyModelOptions::default();
        spindle_tools::tiny_model::write_tiny_model(&opts, dir.path()).unwrap();
        Tokenizer::from_file(&dir.path().join("tokenizer.json"), SpecialTokens::default()).unwrap()
    }

    /// A word that is one token, spelled as two (as a model may sample it).
    fn split_word(tok: &Tokenizer) -> (String, Vec<u32>) {
        (0..tok.vocab_size() as u32)
            .find_map(|id| {
                let word = tok.decode(&[id], false).ok()?;
                if word.len() < 2 || !word.chars().all(|c| c.is_ascii_lowercase()) {
                    return None;
                }
                let (a, b) = word.split_at(1);
                let mut ids = tok.encode(a, false).ok()?;
                ids.extend(tok.encode(b, false).ok()?);
                (tok.encode(&word, false).ok()? == vec![id] && ids.len() == 2).then_some((word, ids))
            })
            .unwrap()
    }

    #[test]
    fn a_recorded_turn_is_extended_with_its_own_ids_not_retokenized() {
        let tok = tiny_tokenizer();
        let ledger = TokenLedger::default();
        let (word, mut ids) = split_word(&tok);
        let mut prompt = tok.encode("Q: ", false).unwrap();
        prompt.append(&mut ids);
        ledger.record("resp_1", vec!["msg_1".into()], prompt.clone());
        let text = format!("Q: {word} and more");
        let by_response = ledger.encode(&tok, &text, Some("resp_1"), &[]).unwrap();
        assert_eq!(&by_response[..prompt.len()], &prompt[..], "the recorded ids are kept");
        assert_eq!(tok.decode(&by_response, false).unwrap(), text);
        let by_item = ledger.encode(&tok, &text, None, &["msg_0", "msg_1"]).unwrap();
        assert_eq!(by_item, by_response, "found by a re-sent output item");
        let fresh = ledger.encode(&tok, &text, None, &["other"]).unwrap();
        assert_eq!(fresh, tok.encode(&text, false).unwrap());
        assert_ne!(&fresh[..prompt.len()], &prompt[..], "re-tokenizing loses the sampled ids");
        let diverged = ledger.encode(&tok, "Q: x", Some("resp_1"), &[]).unwrap();
        assert_eq!(diverged, tok.encode("Q: x", false).unwrap(), "text that does not extend the turn is tokenized whole");
    }

    #[test]
    fn the_ledger_is_bounded_and_forgets_the_oldest_first() {
        let ledger = TokenLedger::default();
        for i in 0..(MAX_ENTRIES + 3) {
            ledger.record(&format!("r{i}"), vec![format!("i{i}")], vec![1, 2, 3]);
        }
        assert!(ledger.tokens("r0").is_none());
        assert!(ledger.tokens(&format!("r{}", MAX_ENTRIES + 2)).is_some());
        let inner = ledger.inner.lock().unwrap();
        assert_eq!(inner.turns.len(), MAX_ENTRIES);
        assert_eq!(inner.by_item.len(), MAX_ENTRIES);
        assert_eq!(inner.tokens, MAX_ENTRIES * 3);
        drop(inner);
        ledger.record("big", vec![], vec![0; MAX_TOKENS - 10]);
        let inner = ledger.inner.lock().unwrap();
        assert!(inner.tokens <= MAX_TOKENS);
        assert!(inner.turns.contains_key("big"));
    }
}
