//! Tokenizers: from `tokenizer.json` or built from GGUF metadata.
//!
//! [`Tokenizer`] wraps a Hugging Face [`tokenizers::Tokenizer`] and adds what
//! the engine needs on top: the BOS/EOS ids, llama.cpp-style BOS/EOS insertion
//! for GGUF vocabularies, and an [`IncrementalDecoder`] for streaming text.
//!
//! * [`Tokenizer::from_file`] loads a `tokenizer.json`; the special tokens come
//!   from `tokenizer_config.json`, read by the caller and passed in as
//!   [`SpecialTokens`].
//! * [`Tokenizer::from_gguf_spec`] builds a byte-level BPE or a SentencePiece
//!   tokenizer from the GGUF `tokenizer.ggml.*` arrays ([`GgufTokenizerSpec`], filled by
//!   [`gguf_tokenizer_spec`]).

mod gguf;
mod incremental;
mod spm;

pub use gguf::{
    gguf_chat_template, gguf_tokenizer_spec, GgufTokenizerSpec, TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_USER_DEFINED,
};
pub use incremental::IncrementalDecoder;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::error::{EngineError, Result};

/// The model's special tokens, by their text.
///
/// For a `tokenizer.json` model these come from `tokenizer_config.json`
/// (`bos_token`, `eos_token`, `unk_token`, `pad_token`); for a GGUF model they
/// are the tokens at the `tokenizer.ggml.*_token_id` ids.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token, e.g. `<|begin_of_text|>`.
    pub bos: Option<String>,
    /// End-of-sequence token, e.g. `<|im_end|>`.
    pub eos: Option<String>,
    /// Unknown token.
    pub unk: Option<String>,
    /// Padding token.
    pub pad: Option<String>,
}

/// A tokenizer: text to ids and back. Cheap to clone (shared inside).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    /// The HF tokenizer. Special tokens in the text are parsed.
    hf: tokenizers::Tokenizer,
    /// A copy that encodes special-token text literally, built on first use.
    literal: OnceLock<tokenizers::Tokenizer>,
    /// Number of ids, added tokens included (costly to ask `hf` for).
    vocab_size: usize,
    special: SpecialTokens,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    unk_id: Option<u32>,
    pad_id: Option<u32>,
    /// BOS id to prepend when encoding with special tokens (GGUF `add_bos`).
    prepend_bos: Option<u32>,
    /// EOS id to append when encoding with special tokens (GGUF `add_eos`).
    append_eos: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.inner.special)
            .field("bos_id", &self.inner.bos_id)
            .field("eos_ids", &self.inner.eos_ids)
            .finish()
    }
}

/// Converts a `tokenizers` error into an engine error.
pub(crate) fn tok_err(context: &str, err: impl std::fmt::Display) -> EngineError {
    EngineError::Tokenizer(format!("{context}: {err}"))
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`.
    ///
    /// `special` names the special tokens (from `tokenizer_config.json`); each
    /// one given must be in the vocabulary. BOS/EOS insertion on encode is left
    /// to the file's own post-processor, as in HF.
    pub fn from_file(path: &Path, special: SpecialTokens) -> Result<Self> {
        let hf = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| tok_err(&format!("cannot load {}", path.display()), e))?;
        Self::from_hf(hf, special)
    }

    /// Wraps an already built HF tokenizer; see [`Tokenizer::from_file`].
    pub fn from_hf(hf: tokenizers::Tokenizer, special: SpecialTokens) -> Result<Self> {
        let lookup = |name: &str, tok: &Option<String>| -> Result<Option<u32>> {
            match tok {
                None => Ok(None),
                Some(t) => hf.token_to_id(t).map(Some).ok_or_else(|| {
                    EngineError::Tokenizer(format!("{name} token `{t}` is not in the vocabulary"))
                }),
            }
        };
        let bos_id = lookup("bos", &special.bos)?;
        let eos_id = lookup("eos", &special.eos)?;
        let unk_id = lookup("unk", &special.unk)?;
        let pad_id = lookup("pad", &special.pad)?;
        Ok(Self::assemble(
            hf, special, bos_id, eos_id, unk_id, pad_id, None, None,
        ))
    }

    /// Builds a tokenizer from GGUF `tokenizer.ggml.*` metadata.
    ///
    /// Only byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is supported.
    /// The pre-tokenizer follows `tokenizer.ggml.pre` the way llama.cpp does:
    /// `gpt2`/`default` (GPT-2 regex), `smollm` and the other starcoder-style
    /// names (single digits, then the GPT-2 regex), `llama-bpe`/`llama3`
    /// (Llama 3 regex), `qwen2` (Qwen2 regex). Control (3) and user-defined
    /// (4) tokens become added tokens, so `<|im_start|>` encodes to one id;
    /// control tokens are special (dropped by `decode(.., skip_special=true)`).
    /// With `add_bos`/`add_eos`, `encode(.., add_special_tokens=true)` adds
    /// them like llama.cpp.
    pub fn from_gguf_spec(spec: GgufTokenizerSpec) -> Result<Self> {
        let hf = gguf::build_hf_tokenizer(&spec)?;
        let token_at = |id: Option<u32>| id.and_then(|id| spec.tokens.get(id as usize).cloned());
        let special = SpecialTokens {
            bos: token_at(spec.bos_id),
            eos: token_at(spec.eos_id),
            unk: token_at(spec.unk_id),
            pad: token_at(spec.pad_id),
        };
        let prepend = if spec.add_bos {
            Some(required(spec.bos_id, "add_bos")?)
        } else {
            None
        };
        let append = if spec.add_eos {
            Some(required(spec.eos_id, "add_eos")?)
        } else {
            None
        };
        Ok(Self::assemble(
            hf,
            special,
            spec.bos_id,
            spec.eos_id,
            spec.unk_id,
            spec.pad_id,
            prepend,
            append,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        hf: tokenizers::Tokenizer,
        special: SpecialTokens,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        unk_id: Option<u32>,
        pad_id: Option<u32>,
        prepend_bos: Option<u32>,
        append_eos: Option<u32>,
    ) -> Self {
        let inner = Inner {
            vocab_size: hf.get_vocab_size(true),
            hf,
            literal: OnceLock::new(),
            special,
            bos_id,
            eos_ids: eos_id.into_iter().collect(),
            unk_id,
            pad_id,
            prepend_bos,
            append_eos,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Adds more end-of-generation ids (e.g. `eos_token_id` lists from
    /// `generation_config.json`, or `<|eot_id|>`). Ids already present are
    /// skipped. Call before cloning, or the shared state is copied.
    pub fn add_eos_ids(&mut self, ids: &[u32]) {
        let inner = Arc::make_mut(&mut self.inner);
        for &id in ids {
            if !inner.eos_ids.contains(&id) {
                inner.eos_ids.push(id);
            }
        }
    }

    /// Encodes `text`, parsing special-token text such as `<|im_start|>` into
    /// single ids (HF behaviour). `add_special_tokens` adds BOS/EOS where the
    /// tokenizer asks for it (GGUF `add_bos`/`add_eos`, or the
    /// `tokenizer.json` post-processor). Text rendered by a chat template
    /// usually already holds the BOS token, so encode it with `false`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_special_tokens, true)
    }

    /// Like [`Tokenizer::encode`]; with `parse_special = false`, special-token
    /// text is encoded as ordinary text (`<|im_start|>` becomes several ids).
    pub fn encode_with(
        &self,
        text: &str,
        add_special_tokens: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        let hf = if parse_special {
            &self.inner.hf
        } else {
            self.literal()
        };
        let enc = hf
            .encode_fast(text, add_special_tokens)
            .map_err(|e| tok_err("encode", e))?;
        let body = enc.get_ids();
        let mut ids = Vec::with_capacity(body.len() + 2);
        if add_special_tokens {
            ids.extend(self.inner.prepend_bos);
        }
        ids.extend_from_slice(body);
        if add_special_tokens {
            ids.extend(self.inner.append_eos);
        }
        Ok(ids)
    }

    fn literal(&self) -> &tokenizers::Tokenizer {
        self.inner.literal.get_or_init(|| {
            let mut copy = self.inner.hf.clone();
            copy.set_encode_special_tokens(true);
            copy
        })
    }

    /// Decodes ids to text; `skip_special` drops special tokens (BOS, EOS,
    /// `<|im_start|>`...). Ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let n = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= n) {
            return Err(EngineError::Tokenizer(format!(
                "token id {bad} is outside the vocabulary of {n}"
            )));
        }
        self.inner
            .hf
            .decode(ids, skip_special)
            .map_err(|e| tok_err("decode", e))
    }

    /// The id of a token given by its vocabulary spelling (e.g. `Ġthe`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.hf.token_to_id(token)
    }

    /// The vocabulary spelling of a token id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.hf.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// The BOS id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.inner.bos_id
    }

    /// Ids that end generation: the EOS id, plus any added by
    /// [`Tokenizer::add_eos_ids`].
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// The unknown-token id, if any.
    pub fn unk_id(&self) -> Option<u32> {
        self.inner.unk_id
    }

    /// The padding id, if any.
    pub fn pad_id(&self) -> Option<u32> {
        self.inner.pad_id
    }

    /// The special tokens by text (`bos_token`/`eos_token` for chat templates).
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.inner.special
    }

    /// Whether `id` is a special added token (skipped by `skip_special`).
    pub fn is_special(&self, id: u32) -> bool {
        let added = self.inner.hf.get_added_vocabulary();
        added
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|t| t.special)
    }

    /// The wrapped Hugging Face tokenizer.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner.hf
    }
}

fn required(id: Option<u32>, flag: &str) -> Result<u32> {
    id.ok_or_else(|| {
        EngineError::Tokenizer(format!("GGUF sets {flag} but has no matching token id"))
    })
}

#[cfg(test)]
pub(crate) mod tests;
