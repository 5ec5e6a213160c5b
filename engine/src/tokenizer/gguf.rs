//! Building a byte-level BPE tokenizer from GGUF `tokenizer.ggml.*` metadata.

use std::collections::HashSet;

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::tok_err;
use crate::error::{EngineError, Result};
use crate::gguf::{GgufFile, MetadataValue};

/// `tokenizer.ggml.token_type` value of an ordinary token.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// `tokenizer.ggml.token_type` value of a control token (`<|im_start|>`).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// `tokenizer.ggml.token_type` value of a user-defined token (`<think>`).
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The tokenizer described by a GGUF file's `tokenizer.ggml.*` keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufTokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"`
    /// (SentencePiece with byte fallback).
    pub model: String,
    /// `tokenizer.ggml.pre`, the pre-tokenizer name, e.g. `"smollm"`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs, best first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`, one per token (1 normal, 3 control, 4
    /// user-defined...); may be empty.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: prepend BOS when encoding.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: append EOS when encoding.
    pub add_eos: bool,
    /// `tokenizer.ggml.scores`, one per token (SentencePiece: the merge
    /// order); may be empty for `gpt2`.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece): a space in front
    /// of the text before encoding.
    pub add_space_prefix: bool,
}

/// Llama 3's split regex (`llama-bpe`), as in its `tokenizer.json`.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split regex: like Llama 3's but with single digits.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a GGUF `pre` name splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreKind {
    /// The GPT-2 regex (`'s|'t|... ?\p{L}+| ?\p{N}+|...`).
    Gpt2,
    /// Every digit on its own, then the GPT-2 regex (llama.cpp's `smollm`,
    /// `starcoder`...; HF: `Digits(individual_digits)` + `ByteLevel`).
    Gpt2Digits,
    /// A custom regex split (isolated), then byte-level mapping.
    Regex {
        pattern: &'static str,
        ignore_merges: bool,
    },
}

const GPT2_NAMES: &[&str] = &["default", "gpt2", "gpt-2", "mpt", "olmo", "jais"];
const DIGITS_NAMES: &[&str] = &[
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
];
/// llama.cpp sets `ignore_merges` for these (and so does Llama 3's tokenizer.json).
const LLAMA3_NAMES: &[&str] = &["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"];
const LLAMA3_MERGING_NAMES: &[&str] = &["dbrx", "smaug-bpe"];
const QWEN2_NAMES: &[&str] = &["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"];

fn pre_kind(pre: Option<&str>) -> Result<PreKind> {
    let Some(name) = pre else {
        return Ok(PreKind::Gpt2);
    };
    if GPT2_NAMES.contains(&name) {
        Ok(PreKind::Gpt2)
    } else if DIGITS_NAMES.contains(&name) {
        Ok(PreKind::Gpt2Digits)
    } else if LLAMA3_NAMES.contains(&name) {
        Ok(PreKind::Regex {
            pattern: LLAMA3_SPLIT,
            ignore_merges: true,
        })
    } else if LLAMA3_MERGING_NAMES.contains(&name) {
        Ok(PreKind::Regex {
            pattern: LLAMA3_SPLIT,
            ignore_merges: false,
        })
    } else if QWEN2_NAMES.contains(&name) {
        Ok(PreKind::Regex {
            pattern: QWEN2_SPLIT,
            ignore_merges: false,
        })
    } else {
        let known: Vec<&str> = [
            GPT2_NAMES,
            DIGITS_NAMES,
            LLAMA3_NAMES,
            LLAMA3_MERGING_NAMES,
            QWEN2_NAMES,
        ]
        .concat();
        Err(EngineError::Tokenizer(format!(
            "unsupported GGUF pre-tokenizer `{name}` (tokenizer.ggml.pre); supported: {}",
            known.join(", ")
        )))
    }
}

fn pre_tokenizer(kind: PreKind) -> Result<PreTokenizerWrapper> {
    let byte_level = |use_regex| ByteLevel::new(false, true, use_regex);
    Ok(match kind {
        PreKind::Gpt2 => byte_level(true).into(),
        PreKind::Gpt2Digits => {
            Sequence::new(vec![Digits::new(true).into(), byte_level(true).into()]).into()
        }
        PreKind::Regex { pattern, .. } => {
            let split = Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| tok_err("pre-tokenizer regex", e))?;
            Sequence::new(vec![split.into(), byte_level(false).into()]).into()
        }
    })
}

/// GPT-2's byte-to-character table: printable bytes map to themselves, the
/// rest to U+0100 onwards (space becomes `Ġ`, newline `Ċ`).
pub(super) fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).unwrap_or('\u{FFFD}');
    }
    table
}

fn token_type(spec: &GgufTokenizerSpec, id: usize) -> i32 {
    spec.token_types.get(id).copied().unwrap_or(1)
}

fn check_spec(spec: &GgufTokenizerSpec) -> Result<()> {
    if spec.model != "gpt2" && spec.model != "llama" {
        return Err(EngineError::Tokenizer(format!(
            "unsupported GGUF tokenizer model `{}` (tokenizer.ggml.model); supported: `gpt2` \
             (byte-level BPE), `llama` (SentencePiece)",
            spec.model
        )));
    }
    if spec.tokens.is_empty() {
        return Err(EngineError::Tokenizer(
            "GGUF tokenizer has no tokens".into(),
        ));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != spec.tokens.len() {
        return Err(EngineError::Tokenizer(format!(
            "GGUF has {} token types for {} tokens",
            spec.token_types.len(),
            spec.tokens.len()
        )));
    }
    let ids = [
        ("bos", spec.bos_id),
        ("eos", spec.eos_id),
        ("unk", spec.unk_id),
        ("pad", spec.pad_id),
    ];
    for (name, id) in ids {
        if let Some(id) = id.filter(|&id| id as usize >= spec.tokens.len()) {
            return Err(EngineError::Tokenizer(format!(
                "GGUF {name} token id {id} is outside the vocabulary of {}",
                spec.tokens.len()
            )));
        }
    }
    Ok(())
}

/// The vocabulary as BPE sees it. Normal tokens not already written in the
/// byte-level alphabet are respelled into it; control and user-defined tokens
/// keep their text (they are matched whole, as llama.cpp does).
fn build_vocab(spec: &GgufTokenizerSpec) -> Result<Vocab> {
    let chars = byte_chars();
    let alphabet: HashSet<char> = chars.iter().copied().collect();
    let mut vocab = Vocab::default();
    vocab.reserve(spec.tokens.len());
    let mut duplicates = 0usize;
    for (id, token) in spec.tokens.iter().enumerate() {
        let id32 = u32::try_from(id)
            .map_err(|_| EngineError::Tokenizer("GGUF vocabulary exceeds u32 ids".into()))?;
        let ty = token_type(spec, id);
        let keep = matches!(ty, TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)
            || token.chars().all(|c| alphabet.contains(&c));
        let key = if keep {
            token.clone()
        } else {
            token.bytes().map(|b| chars[b as usize]).collect()
        };
        if vocab.contains_key(&key) {
            duplicates += 1;
            continue;
        }
        vocab.insert(key, id32);
    }
    if duplicates > 0 {
        tracing::warn!(
            duplicates,
            "GGUF vocabulary has duplicate tokens; keeping the first id"
        );
    }
    Ok(vocab)
}

fn parse_merges(merges: &[String]) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    EngineError::Tokenizer(format!("GGUF merge `{m}` is not `left right`"))
                })
        })
        .collect()
}

/// Builds the HF tokenizer (model, pre-tokenizer, decoder, added tokens).
pub(super) fn build_hf_tokenizer(spec: &GgufTokenizerSpec) -> Result<tokenizers::Tokenizer> {
    check_spec(spec)?;
    let mut hf = if spec.model == "llama" { sentencepiece(spec)? } else { byte_level_bpe(spec)? };
    let added = |wanted: i32, special: bool| -> Vec<AddedToken> {
        spec.tokens
            .iter()
            .enumerate()
            .filter(|&(id, _)| token_type(spec, id) == wanted)
            .map(|(_, t)| AddedToken::from(t.clone(), special).normalized(false))
            .collect()
    };
    hf.add_special_tokens(&added(TOKEN_TYPE_CONTROL, true));
    hf.add_tokens(&added(TOKEN_TYPE_USER_DEFINED, false));
    let (model_size, full_size) = (hf.get_vocab_size(false), hf.get_vocab_size(true));
    if full_size != spec.tokens.len() {
        tracing::warn!(
            model_size,
            full_size,
            tokens = spec.tokens.len(),
            "GGUF vocabulary size changed"
        );
    }
    Ok(hf)
}

/// GPT-2 style: a pre-tokenizer split, then byte-level BPE over the merges.
fn byte_level_bpe(spec: &GgufTokenizerSpec) -> Result<tokenizers::Tokenizer> {
    let kind = pre_kind(spec.pre.as_deref())?;
    let ignore_merges = matches!(kind, PreKind::Regex { ignore_merges: true, .. });
    let bpe = BPE::builder()
        .vocab_and_merges(build_vocab(spec)?, parse_merges(&spec.merges)?)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| tok_err("cannot build BPE from GGUF vocabulary", e))?;
    let mut hf = tokenizers::Tokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(pre_tokenizer(kind)?));
    hf.with_decoder(Some(ByteLevel::default()));
    Ok(hf)
}

/// SentencePiece: no pre-tokenizer, spaces as `▁`, merges by score.
fn sentencepiece(spec: &GgufTokenizerSpec) -> Result<tokenizers::Tokenizer> {
    let mut hf = tokenizers::Tokenizer::new(super::spm::spm_model(spec)?);
    hf.with_normalizer(Some(super::spm::spm_normalizer(spec)?));
    hf.with_decoder(Some(super::spm::spm_decoder(spec)?));
    Ok(hf)
}

fn key_err(key: &str, what: &str) -> EngineError {
    EngineError::Tokenizer(format!("GGUF key `{key}` {what}"))
}

fn string_array(file: &GgufFile, key: &str, required: bool) -> Result<Vec<String>> {
    let Some(value) = file.get(key) else {
        return if required {
            Err(key_err(key, "is missing"))
        } else {
            Ok(Vec::new())
        };
    };
    let items = value
        .as_array()
        .ok_or_else(|| key_err(key, "is not an array"))?;
    items
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| key_err(key, "holds a non-string"))
        })
        .collect()
}

fn f32_array(file: &GgufFile, key: &str) -> Result<Vec<f32>> {
    let Some(value) = file.get(key) else {
        return Ok(Vec::new());
    };
    let items = value.as_array().ok_or_else(|| key_err(key, "is not an array"))?;
    items.iter().map(|v| v.as_f64().map(|x| x as f32).ok_or_else(|| key_err(key, "holds a non-number"))).collect()
}

fn optional_id(file: &GgufFile, key: &str) -> Result<Option<u32>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| key_err(key, "is not a valid token id")),
    }
}

fn optional_bool(file: &GgufFile, key: &str) -> Result<Option<bool>> {
    file.get(key)
        .map(|v| v.as_bool().ok_or_else(|| key_err(key, "is not a bool")))
        .transpose()
}

/// Reads the `tokenizer.ggml.*` keys of a GGUF file.
///
/// When `tokenizer.ggml.add_bos_token` is absent, BOS is added for
/// SentencePiece (`llama`) vocabularies and the Llama 3 pre-tokenizers, as
/// llama.cpp does.
pub fn gguf_tokenizer_spec(file: &GgufFile) -> Result<GgufTokenizerSpec> {
    let model_key = "tokenizer.ggml.model";
    let model = file
        .get(model_key)
        .ok_or_else(|| key_err(model_key, "is missing"))?
        .as_str()
        .ok_or_else(|| key_err(model_key, "is not a string"))?
        .to_string();
    let pre = match file.get("tokenizer.ggml.pre") {
        None => None,
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| key_err("tokenizer.ggml.pre", "is not a string"))?
                .to_string(),
        ),
    };
    let types_key = "tokenizer.ggml.token_type";
    let token_types = match file.get(types_key).map(MetadataValue::as_array) {
        None => Vec::new(),
        Some(None) => return Err(key_err(types_key, "is not an array")),
        Some(Some(items)) => items
            .iter()
            .map(|v| v.as_i64().and_then(|n| i32::try_from(n).ok()))
            .collect::<Option<Vec<i32>>>()
            .ok_or_else(|| key_err(types_key, "holds a non-integer"))?,
    };
    let default_bos = model == "llama" || pre.as_deref().is_some_and(|p| LLAMA3_NAMES.contains(&p));
    Ok(GgufTokenizerSpec {
        tokens: string_array(file, "tokenizer.ggml.tokens", true)?,
        merges: string_array(file, "tokenizer.ggml.merges", false)?,
        token_types,
        bos_id: optional_id(file, "tokenizer.ggml.bos_token_id")?,
        eos_id: optional_id(file, "tokenizer.ggml.eos_token_id")?,
        unk_id: optional_id(file, "tokenizer.ggml.unknown_token_id")?,
        pad_id: optional_id(file, "tokenizer.ggml.padding_token_id")?,
        add_bos: optional_bool(file, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_bos),
        add_eos: optional_bool(file, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
        scores: f32_array(file, "tokenizer.ggml.scores")?,
        add_space_prefix: optional_bool(file, "tokenizer.ggml.add_space_prefix")?.unwrap_or(model == "llama"),
        model,
        pre,
    })
}

/// The chat template stored in a GGUF file (`tokenizer.chat_template`).
pub fn gguf_chat_template(file: &GgufFile) -> Option<String> {
    file.get("tokenizer.chat_template")
        .and_then(MetadataValue::as_str)
        .map(str::to_string)
}
