//! Constrained decoding: a grammar (llguidance's Lark dialect, with `%json`
//! for JSON Schemas) compiled against the model's tokenizer, and a
//! per-sequence [`Constraint`] that masks the logits before each sample and
//! advances with each sampled token.
//!
//! The [`GrammarCompiler`] is built once per model (it holds the token trie);
//! compiling a grammar checks it (a schema keyword the compiler does not
//! support is an error naming it), so requests are rejected before they are
//! queued. A [`Constraint`] lives with its sequence in the scheduler, which
//! computes each step's [`TokenMask`] (in parallel across the batch), ships
//! it in the plain-data [`crate::batch::ForwardBatch`], and advances the
//! constraint with the token the executor sampled under that mask.

use crate::batch::TokenMask;
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Compiled grammars kept per compiler (agent loops resend the same tools).
const CACHE_CAPACITY: usize = 64;
/// Most bytes of grammar source (the cache's keys) kept.
const CACHE_KEY_BYTES: usize = 8 << 20;

/// Why a grammar could not be built or compiled.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer cannot be turned into a token trie.
    #[error("constrained decoding is unavailable for this tokenizer: {0}")]
    Tokenizer(String),
    /// The grammar (or a JSON Schema in it) does not compile.
    #[error("{0}")]
    Invalid(String),
}

/// Compiles grammars for one model's vocabulary.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    eos: Vec<u32>,
    cache: Arc<Mutex<GrammarCache>>,
}

/// Fresh matchers by grammar source, the oldest evicted first.
#[derive(Default)]
struct GrammarCache {
    matchers: HashMap<String, Matcher>,
    order: VecDeque<String>,
    key_bytes: usize,
}

impl GrammarCache {
    fn get(&self, key: &str) -> Option<Matcher> {
        self.matchers.get(key).map(Matcher::deep_clone)
    }

    fn insert(&mut self, key: String, matcher: &Matcher) {
        if self.matchers.contains_key(&key) || key.len() > CACHE_KEY_BYTES {
            return;
        }
        while self.order.len() >= CACHE_CAPACITY || self.key_bytes + key.len() > CACHE_KEY_BYTES {
            let Some(old) = self.order.pop_front() else { break };
            self.key_bytes -= old.len();
            self.matchers.remove(&old);
        }
        self.key_bytes += key.len();
        self.order.push_back(key.clone());
        self.matchers.insert(key, matcher.deep_clone());
    }
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").field("eos", &self.eos).finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// A compiler for `tokenizer` over a model vocabulary of `vocab_size`
    /// logits (at least the tokenizer's size; padding ids are never allowed).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Self, GrammarError> {
        let tok_err = |e: anyhow::Error| GrammarError::Tokenizer(e.to_string());
        let mut bytes = toktrie_hf_tokenizers::ByteTokenizer::from_tokenizer(tokenizer.hf().clone()).map_err(tok_err)?;
        let eos = tokenizer.eos_ids().to_vec();
        if !eos.is_empty() {
            bytes.set_eos_tokens(&eos);
        }
        let env: TokEnv = bytes.into_tok_env(Some(vocab_size.max(tokenizer.vocab_size()))).map_err(tok_err)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(tok_err)?;
        factory.quiet();
        Ok(Self { factory: Arc::new(factory), eos, cache: Arc::default() })
    }

    /// The exact bytes token `id` stands for (a special token's text; empty
    /// for an id outside the vocabulary).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.factory.tok_env().tok_trie().decode_ext(&[id], true)
    }

    /// Compiles a Lark grammar (llguidance's dialect) into a fresh
    /// constraint; the same source compiles once while it stays among the
    /// last 64 cached.
    pub fn compile_lark(&self, lark: &str) -> Result<Constraint, GrammarError> {
        self.compile(format!("lark:{lark}"), || TopLevelGrammar::from_lark(lark.to_string()))
    }

    /// Compiles a JSON Schema into a fresh constraint (the whole output is
    /// one JSON value); cached like [`Self::compile_lark`].
    pub fn compile_json_schema(&self, schema: serde_json::Value) -> Result<Constraint, GrammarError> {
        self.compile(format!("json:{schema}"), || TopLevelGrammar::from_json_schema(schema.clone()))
    }

    fn compile(&self, key: String, grammar: impl FnOnce() -> TopLevelGrammar) -> Result<Constraint, GrammarError> {
        let cached = self.cache.lock().ok().and_then(|c| c.get(&key));
        let matcher = match cached {
            Some(m) => m,
            None => {
                let parser = self.factory.create_parser(grammar()).map_err(|e| GrammarError::Invalid(e.to_string()))?;
                let matcher = Matcher::new(Ok(parser));
                if let Ok(mut cache) = self.cache.lock() {
                    cache.insert(key, &matcher);
                }
                matcher
            }
        };
        let vocab = self.factory.tok_env().tok_trie().vocab_size();
        Ok(Constraint { matcher, eos: self.eos.clone(), gate: None, vocab })
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    eos: Vec<u32>,
    gate: Option<ThinkGate>,
    /// Mask length (the matcher cannot say once it is in error).
    vocab: usize,
}

/// A thinking model's reasoning is free; the grammar starts after it.
#[derive(Debug, Clone, Copy)]
struct ThinkGate {
    open: u32,
    close: u32,
    phase: GatePhase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GatePhase {
    /// First token: `open` starts a reasoning block, anything else is the answer.
    Undecided,
    /// Inside the reasoning: no mask until `close`.
    Thinking,
    /// The grammar applies.
    Answer,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

/// A constraint shared between a request's owner and the scheduler.
pub type SharedConstraint = Arc<Mutex<Constraint>>;

impl Constraint {
    /// Applies the grammar only to the answer of a thinking model: the
    /// tokens from `open` through `close` are unconstrained (the first token
    /// may be `open` or a token the grammar allows). `starts_inside` when
    /// the prompt already ends with `open`.
    pub fn after_thinking(mut self, open: u32, close: u32, starts_inside: bool) -> Self {
        let phase = if starts_inside { GatePhase::Thinking } else { GatePhase::Undecided };
        self.gate = Some(ThinkGate { open, close, phase });
        self
    }

    /// Shares this constraint (see [`SharedConstraint`]).
    pub fn shared(self) -> SharedConstraint {
        Arc::new(Mutex::new(self))
    }

    /// The tokens allowed next: none once the grammar has finished (the
    /// sequence ends there); only EOS at a dead end (which a correct grammar
    /// never reaches), so the sequence ends instead of failing the batch.
    pub fn allowed(&mut self) -> SimpleVob {
        if self.matcher.is_stopped() && !self.matcher.is_error() {
            // Finished: nothing more to generate (the sequence ends without
            // sampling EOS, which may not even stop it, e.g. with ignore_eos).
            return SimpleVob::alloc(self.vocab);
        }
        match self.matcher.compute_mask_or_eos() {
            Ok(mut mask) if mask.num_set() > 0 => {
                // The trie's EOS is a guess when the tokenizer named none.
                if let Ok(env) = self.matcher.tok_env() {
                    for &e in env.tok_trie().eos_tokens() {
                        if !self.eos.contains(&e) && (e as usize) < mask.len() {
                            mask.disallow_token(e);
                        }
                    }
                }
                mask
            }
            Ok(_) | Err(_) => {
                tracing::warn!("grammar reached a dead end ({:?}); ending the sequence", self.matcher.get_error());
                let mut only_eos = SimpleVob::alloc(self.vocab);
                for &id in &self.eos {
                    if (id as usize) < only_eos.len() {
                        only_eos.allow_token(id);
                    }
                }
                only_eos
            }
        }
    }

    /// Sets the logits of every token the grammar forbids to `-inf`. False
    /// when it allows none (the grammar finished or reached a dead end and
    /// the tokenizer has no EOS): the sequence must end here.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> bool {
        match self.mask_words(logits.len()) {
            Some(words) => {
                TokenMask::from_words(words).apply(logits);
                true
            }
            None => {
                logits.iter_mut().for_each(|l| *l = f32::NEG_INFINITY);
                false
            }
        }
    }

    /// The tokens allowed next over the grammar's whole vocabulary (no bit
    /// set when none is: the sequence must end here).
    pub fn next_mask(&mut self) -> TokenMask {
        self.mask_words(self.vocab).map_or_else(TokenMask::nothing, TokenMask::from_words)
    }

    /// The tokens allowed next as bits over `vocab` ids (bit `t % 32` of
    /// word `t / 32`; ids past the grammar's vocabulary are forbidden), the
    /// mask [`Self::mask_logits`] and [`Self::next_mask`] give. `None` when
    /// no token is allowed.
    pub fn mask_words(&mut self, vocab: usize) -> Option<Vec<u32>> {
        let words = vocab.div_ceil(32);
        let phase = self.gate.map(|g| g.phase);
        if phase == Some(GatePhase::Thinking) {
            // Free text, but the output may not end before the answer the
            // grammar guarantees.
            let mut mask = vec![u32::MAX; words];
            for &id in &self.eos {
                if (id as usize) < vocab {
                    mask[id as usize / 32] &= !(1u32 << (id % 32));
                }
            }
            return Some(mask);
        }
        let mut allowed = self.allowed();
        if let (Some(GatePhase::Undecided), Some(gate)) = (phase, self.gate) {
            if (gate.open as usize) < allowed.len() {
                allowed.allow_token(gate.open);
            }
        }
        if allowed.num_set() == 0 {
            return None;
        }
        let src = allowed.as_slice();
        let mut mask: Vec<u32> = (0..words).map(|w| src.get(w).copied().unwrap_or(0)).collect();
        let tail = vocab % 32;
        if tail != 0 {
            if let Some(last) = mask.last_mut() {
                *last &= (1u32 << tail) - 1;
            }
        }
        // Ids the grammar's vocabulary does not have are forbidden.
        for id in allowed.len().min(vocab)..vocab {
            mask[id / 32] &= !(1u32 << (id % 32));
        }
        Some(mask)
    }

    /// Advances past a sampled token. EOS (or any token) after the grammar
    /// finished is ignored; a token the mask did not allow is an error.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if let Some(gate) = &mut self.gate {
            match gate.phase {
                GatePhase::Undecided if token == gate.open => {
                    gate.phase = GatePhase::Thinking;
                    return Ok(());
                }
                GatePhase::Undecided => gate.phase = GatePhase::Answer,
                GatePhase::Thinking => {
                    if token == gate.close {
                        gate.phase = GatePhase::Answer;
                    }
                    return Ok(());
                }
                GatePhase::Answer => {}
            }
        }
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| GrammarError::Invalid(e.to_string()))
    }

    /// Whether the output so far is a complete sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
