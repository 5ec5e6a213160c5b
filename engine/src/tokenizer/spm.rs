//! A SentencePiece (`tokenizer.ggml.model = "llama"`) vocabulary as a Hugging
//! Face BPE tokenizer: spaces become `▁`, pieces merge best score first,
//! text no piece covers falls back to `<0xXX>` byte tokens. This is how
//! llama.cpp's SPM tokenizer works (it merges the adjacent pair whose joined
//! piece scores highest, leftmost first) and how Hugging Face converts
//! SentencePiece BPE models (Gemma, Llama 2) to `tokenizer.json`.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::gguf::{GgufTokenizerSpec, TOKEN_TYPE_NORMAL};
use super::tok_err;
use crate::error::{EngineError, Result};

/// SentencePiece's word-boundary mark, standing for a space.
const SPACE_MARK: &str = "\u{2581}";

/// The pairs of normal pieces that join into another normal piece, best
/// first: by the joined piece's score (higher first), then its id, then the
/// left piece's length, so every split of one piece ranks together.
pub(super) fn merges_from_scores(spec: &GgufTokenizerSpec) -> Result<Vec<(String, String)>> {
    if spec.scores.len() != spec.tokens.len() {
        return Err(EngineError::Tokenizer(format!(
            "SentencePiece vocabulary: {} scores for {} tokens (tokenizer.ggml.scores)",
            spec.scores.len(),
            spec.tokens.len()
        )));
    }
    let normal = |id: usize| spec.token_types.get(id).copied().unwrap_or(TOKEN_TYPE_NORMAL) == TOKEN_TYPE_NORMAL;
    let ids: HashMap<&str, usize> = spec.tokens.iter().enumerate().filter(|&(id, _)| normal(id)).map(|(id, t)| (t.as_str(), id)).collect();
    let mut ranked: Vec<(f32, usize, usize)> = Vec::new();
    for (id, piece) in spec.tokens.iter().enumerate().filter(|&(id, _)| normal(id)) {
        for (split, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(split);
            if ids.contains_key(left) && ids.contains_key(right) {
                ranked.push((spec.scores[id], id, split));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    Ok(ranked
        .into_iter()
        .map(|(_, id, split)| {
            let (left, right) = spec.tokens[id].split_at(split);
            (left.to_string(), right.to_string())
        })
        .collect())
}

/// Every token under its own text (first id wins for a repeated text).
fn vocab(spec: &GgufTokenizerSpec) -> Result<Vocab> {
    let mut vocab = Vocab::default();
    vocab.reserve(spec.tokens.len());
    for (id, token) in spec.tokens.iter().enumerate() {
        let id = u32::try_from(id).map_err(|_| EngineError::Tokenizer("GGUF vocabulary exceeds u32 ids".into()))?;
        vocab.entry(token.clone()).or_insert(id);
    }
    Ok(vocab)
}

/// The BPE model with byte fallback over a SentencePiece vocabulary.
pub(super) fn spm_model(spec: &GgufTokenizerSpec) -> Result<BPE> {
    let unk = spec.unk_id.and_then(|id| spec.tokens.get(id as usize)).cloned();
    let mut builder = BPE::builder().vocab_and_merges(vocab(spec)?, merges_from_scores(spec)?).byte_fallback(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk).fuse_unk(true);
    }
    builder.build().map_err(|e| tok_err("cannot build BPE from the SentencePiece vocabulary", e))
}

/// Spaces to `▁`, with one in front when the vocabulary asks for it
/// (`tokenizer.ggml.add_space_prefix`).
pub(super) fn spm_normalizer(spec: &GgufTokenizerSpec) -> Result<NormalizerWrapper> {
    let replace: NormalizerWrapper = Replace::new(" ", SPACE_MARK).map_err(|e| tok_err("space normalizer", e))?.into();
    if !spec.add_space_prefix {
        return Ok(replace);
    }
    Ok(tokenizers::normalizers::Sequence::new(vec![Prepend::new(SPACE_MARK.to_string()).into(), replace]).into())
}

/// `▁` back to spaces, byte tokens back to bytes, and the prefix space dropped.
pub(super) fn spm_decoder(spec: &GgufTokenizerSpec) -> Result<DecoderWrapper> {
    let mut steps: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE_MARK, " ").map_err(|e| tok_err("space decoder", e))?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if spec.add_space_prefix {
        steps.push(Strip::new(' ', 1, 0).into());
    }
    Ok(DecoderSequence::new(steps).into())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::tokenizer::gguf::TOKEN_TYPE_CONTROL;
    use crate::tokenizer::Tokenizer;

    const BYTE: i32 = 6;

    /// A small SentencePiece vocabulary: specials, the 256 byte tokens, and
    /// pieces whose scores fix the merge order.
    fn spec(add_space_prefix: bool) -> GgufTokenizerSpec {
        let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"].iter().map(|s| s.to_string()).collect();
        let mut types = vec![TOKEN_TYPE_CONTROL; tokens.len()];
        let mut scores = vec![-1000.0; tokens.len()];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(BYTE);
            scores.push(0.0);
        }
        let pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "ll", "he", "hell", "hello", "▁w", "or", "▁wor", "ld", "▁world", "lo"];
        for (i, p) in pieces.iter().enumerate() {
            tokens.push(p.to_string());
            types.push(TOKEN_TYPE_NORMAL);
            scores.push(-(i as f32));
        }
        GgufTokenizerSpec {
            model: "llama".into(),
            tokens,
            token_types: types,
            scores,
            bos_id: Some(2),
            eos_id: Some(1),
            unk_id: Some(3),
            pad_id: Some(0),
            add_bos: true,
            add_space_prefix,
            ..GgufTokenizerSpec::default()
        }
    }

    fn id(spec: &GgufTokenizerSpec, piece: &str) -> u32 {
        spec.tokens.iter().position(|t| t == piece).unwrap() as u32
    }

    #[test]
    fn pieces_merge_best_score_first_and_bytes_fall_back() {
        let s = spec(false);
        let tok = Tokenizer::from_gguf_spec(s.clone()).unwrap();
        let ids = tok.encode("hello world!", true).unwrap();
        // "ll" (score -8) merges before "he" (-9) and "lo" (-17): h e ll o → he ll o → hell o → hello.
        let want = vec![2, id(&s, "hello"), id(&s, "▁world"), id(&s, "<0x21>")];
        assert_eq!(ids, want, "BOS, two pieces, and '!' as its byte token");
        assert_eq!(tok.decode(&ids, true).unwrap(), "hello world!");
    }

    #[test]
    fn text_outside_the_vocabulary_round_trips_through_bytes() {
        let tok = Tokenizer::from_gguf_spec(spec(false)).unwrap();
        let text = "héllo ✓";
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.len() > 4, "é and ✓ are spelled in bytes: {ids:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }

    #[test]
    fn control_tokens_are_single_ids_and_the_space_prefix_is_optional() {
        let s = spec(true);
        let tok = Tokenizer::from_gguf_spec(s.clone()).unwrap();
        let ids = tok.encode("<start_of_turn>world", false).unwrap();
        assert_eq!(ids, vec![4, id(&s, "▁world")], "the prefix space joins the first word");
        assert_eq!(tok.decode(&[id(&s, "▁world")], false).unwrap(), "world", "and is dropped again");
    }

    #[test]
    fn scores_must_cover_the_vocabulary() {
        let mut s = spec(false);
        s.scores.pop();
        let err = Tokenizer::from_gguf_spec(s).unwrap_err().to_string();
        assert!(err.contains("scores"), "{err}");
    }
}
