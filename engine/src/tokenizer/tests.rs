//! Unit tests on a toy byte-level vocabulary (the real-model checks live in
//! `engine/tests/tokenizer_gguf.rs`).
#![allow(clippy::unwrap_used)]

use super::gguf::byte_chars;
use super::*;
use crate::gguf::{GgufFile, GgufWriter, MetadataValue};

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const MERGES: [&str; 10] = [
    "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2",
];

/// Three control tokens, the 256 byte characters, then one token per merge.
fn toy_spec(pre: &str) -> GgufTokenizerSpec {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    tokens.extend(byte_chars().iter().map(|c| c.to_string()));
    tokens.extend(MERGES.iter().map(|m| m.replace(' ', "")));
    tokens.push("<think>".into());
    let mut token_types = vec![1; tokens.len()];
    token_types[..3].fill(TOKEN_TYPE_CONTROL);
    *token_types.last_mut().unwrap() = TOKEN_TYPE_USER_DEFINED;
    GgufTokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        merges: MERGES.iter().map(|m| m.to_string()).collect(),
        token_types,
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: None,
        pad_id: Some(0),
        add_bos: false,
        add_eos: false,
        ..GgufTokenizerSpec::default()
    }
}

pub(crate) fn toy(pre: &str) -> Tokenizer {
    Tokenizer::from_gguf_spec(toy_spec(pre)).unwrap()
}

#[test]
fn encodes_with_merges_and_round_trips() {
    let tok = toy("gpt2");
    let ids = tok.encode("hello world", false).unwrap();
    let expected = vec![
        tok.token_to_id("hello").unwrap(),
        tok.token_to_id("Ġworld").unwrap(),
    ];
    assert_eq!(ids, expected);
    assert_eq!(tok.decode(&ids, false).unwrap(), "hello world");
    assert_eq!(tok.vocab_size(), 3 + 256 + MERGES.len() + 1);
    assert_eq!(tok.id_to_token(ids[1]).as_deref(), Some("Ġworld"));
}

#[test]
fn control_tokens_are_single_special_ids() {
    let tok = toy("gpt2");
    let hello = tok.token_to_id("hello").unwrap();
    let ids = tok.encode("<|im_start|>hello<|im_end|>", false).unwrap();
    assert_eq!(ids, vec![1, hello, 2]);
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>hello<|im_end|>"
    );
    assert_eq!(tok.decode(&ids, true).unwrap(), "hello");
    assert!(tok.is_special(1) && !tok.is_special(hello));

    let literal = tok.encode_with("<|im_start|>hello", false, false).unwrap();
    assert!(literal.len() > 2 && !literal.contains(&1));
    assert_eq!(tok.decode(&literal, false).unwrap(), "<|im_start|>hello");
}

#[test]
fn user_defined_tokens_are_single_non_special_ids() {
    let tok = toy("gpt2");
    let think = tok.token_to_id("<think>").unwrap();
    assert_eq!(tok.encode("<think>", false).unwrap(), vec![think]);
    assert!(!tok.is_special(think));
    assert_eq!(tok.decode(&[think], true).unwrap(), "<think>");
}

#[test]
fn smollm_splits_digits_but_gpt2_does_not() {
    let twelve = toy("gpt2").token_to_id("12").unwrap();
    assert_eq!(toy("gpt2").encode("12", false).unwrap(), vec![twelve]);
    let split = toy("smollm").encode("12", false).unwrap();
    assert_eq!(split.len(), 2);
    assert_eq!(toy("smollm").decode(&split, false).unwrap(), "12");
}

#[test]
fn regex_pre_tokenizers_build_and_round_trip() {
    for pre in ["llama-bpe", "llama3", "qwen2", "dbrx"] {
        let tok = toy(pre);
        let text = "hello world, it's 12345!\n\n  x";
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "pre={pre}");
    }
}

#[test]
fn unknown_pre_tokenizer_is_a_clear_error() {
    let err = Tokenizer::from_gguf_spec(toy_spec("no-such-pre")).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, crate::EngineError::Tokenizer(_)));
    assert!(
        msg.contains("no-such-pre") && msg.contains("tokenizer.ggml.pre"),
        "{msg}"
    );
}

#[test]
fn unsupported_model_and_bad_ids_are_errors() {
    let mut spec = toy_spec("gpt2");
    spec.model = "bert".into();
    let err = Tokenizer::from_gguf_spec(spec).unwrap_err().to_string();
    assert!(err.contains("bert") && err.contains("supported: `gpt2`"), "{err}");
    let mut spec = toy_spec("gpt2");
    spec.bos_id = Some(1_000_000);
    assert!(Tokenizer::from_gguf_spec(spec).is_err());
    let tok = toy("gpt2");
    assert!(tok.decode(&[1_000_000], false).is_err());
}

#[test]
fn add_bos_and_eos_follow_the_spec() {
    let mut spec = toy_spec("gpt2");
    spec.add_bos = true;
    spec.add_eos = true;
    let tok = Tokenizer::from_gguf_spec(spec).unwrap();
    let hello = tok.token_to_id("hello").unwrap();
    assert_eq!(tok.encode("hello", true).unwrap(), vec![1, hello, 2]);
    assert_eq!(tok.encode("hello", false).unwrap(), vec![hello]);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids(), &[2]);
    assert_eq!(tok.pad_id(), Some(0));
    assert_eq!(tok.special_tokens().bos.as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.special_tokens().eos.as_deref(), Some("<|im_end|>"));
}

#[test]
fn extra_eos_ids_are_deduplicated() {
    let mut tok = toy("gpt2");
    tok.add_eos_ids(&[0, 2, 0]);
    assert_eq!(tok.eos_ids(), &[2, 0]);
}

#[test]
fn incremental_decoder_never_splits_characters() {
    let tok = toy("gpt2");
    let text = "hé 😀 hello world ✓";
    let ids = tok.encode(text, false).unwrap();
    let mut dec = IncrementalDecoder::new(tok.clone(), false);
    let mut out = String::new();
    let mut empty_steps = 0;
    for &id in &ids {
        let piece = dec.push(id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "split character in {piece:?}");
        empty_steps += usize::from(piece.is_empty());
        out.push_str(&piece);
    }
    out.push_str(&dec.finish().unwrap());
    assert_eq!(out, text);
    assert_eq!(out, tok.decode(&ids, false).unwrap());
    // é (2 bytes), 😀 (4) and ✓ (3) are byte tokens here: 1 + 3 + 2 waits.
    assert_eq!(empty_steps, 6);
}

#[test]
fn incremental_decoder_flushes_incomplete_bytes_on_finish() {
    let tok = toy("gpt2");
    let ids = tok.encode("😀", false).unwrap();
    let mut dec = IncrementalDecoder::new(tok, true);
    assert_eq!(dec.push(ids[0]).unwrap(), "");
    assert_eq!(dec.push(ids[1]).unwrap(), "");
    assert_eq!(dec.pending(), 2);
    assert_eq!(dec.finish().unwrap(), "\u{FFFD}");
    assert_eq!(dec.pending(), 0);
}

#[test]
fn incremental_decoder_skips_special_tokens() {
    let tok = toy("gpt2");
    let ids = tok.encode("<|im_start|>hello<|im_end|>", false).unwrap();
    let mut dec = IncrementalDecoder::new(tok, true);
    let out: String = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
    assert_eq!(out + &dec.finish().unwrap(), "hello");
}

fn strings(items: &[String]) -> MetadataValue {
    MetadataValue::Array(items.iter().cloned().map(MetadataValue::String).collect())
}

#[test]
fn spec_is_read_from_gguf_metadata() {
    let spec = toy_spec("smollm");
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.model", MetadataValue::String("gpt2".into()))
        .add_metadata("tokenizer.ggml.pre", MetadataValue::String("smollm".into()))
        .add_metadata("tokenizer.ggml.tokens", strings(&spec.tokens))
        .add_metadata("tokenizer.ggml.merges", strings(&spec.merges))
        .add_metadata(
            "tokenizer.ggml.token_type",
            MetadataValue::Array(
                spec.token_types
                    .iter()
                    .map(|&t| MetadataValue::I32(t))
                    .collect(),
            ),
        )
        .add_metadata("tokenizer.ggml.bos_token_id", MetadataValue::U32(1))
        .add_metadata("tokenizer.ggml.eos_token_id", MetadataValue::U32(2))
        .add_metadata("tokenizer.ggml.padding_token_id", MetadataValue::U32(0))
        .add_metadata("tokenizer.ggml.add_bos_token", MetadataValue::Bool(false))
        .add_metadata(
            "tokenizer.chat_template",
            MetadataValue::String("{{ x }}".into()),
        );
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(gguf_tokenizer_spec(&file).unwrap(), spec);
    assert_eq!(gguf_chat_template(&file).as_deref(), Some("{{ x }}"));
}

#[test]
fn missing_tokens_key_is_an_error() {
    let mut w = GgufWriter::new();
    w.add_metadata("tokenizer.ggml.model", MetadataValue::String("gpt2".into()));
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let msg = gguf_tokenizer_spec(&file).unwrap_err().to_string();
    assert!(msg.contains("tokenizer.ggml.tokens"), "{msg}");
}

#[test]
fn from_file_resolves_special_tokens() {
    let toy = toy("smollm");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    toy.hf().save(&path, false).unwrap();
    let special = SpecialTokens {
        bos: Some("<|im_start|>".into()),
        eos: Some("<|im_end|>".into()),
        ..Default::default()
    };
    let tok = Tokenizer::from_file(&path, special.clone()).unwrap();
    assert_eq!((tok.bos_id(), tok.eos_ids()), (Some(1), &[2u32][..]));
    assert_eq!(tok.special_tokens(), &special);
    let text = "<|im_start|>hello 12 é";
    assert_eq!(
        tok.encode(text, true).unwrap(),
        toy.encode(text, true).unwrap()
    );

    let bad = SpecialTokens {
        eos: Some("<nope>".into()),
        ..Default::default()
    };
    assert!(Tokenizer::from_file(&path, bad)
        .unwrap_err()
        .to_string()
        .contains("<nope>"));
    let missing = dir.path().join("missing.json");
    assert!(Tokenizer::from_file(&missing, SpecialTokens::default()).is_err());
}
