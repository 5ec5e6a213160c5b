//! A small byte-level BPE tokenizer (GPT-2 style) for tiny models.

use serde_json::{json, Map, Value};

use super::TinyModelOptions;

/// The merges, in priority order. Each merged token is added to the vocabulary
/// after the 256 byte tokens, in this order.
pub const MERGES: [(&str, &str); 20] = [
    ("h", "e"),
    ("l", "l"),
    ("Ġ", "t"),
    ("i", "n"),
    ("e", "r"),
    ("o", "n"),
    ("a", "n"),
    ("Ġ", "a"),
    ("r", "e"),
    ("Ġt", "he"),
    ("Ġ", "s"),
    ("in", "g"),
    ("o", "u"),
    ("he", "ll"),
    ("hell", "o"),
    ("Ġ", "w"),
    ("o", "r"),
    ("Ġw", "or"),
    ("l", "d"),
    ("Ġwor", "ld"),
];

/// The special tokens, in id order, right after the merges.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Id of `<|endoftext|>` (also the BOS and pad token).
pub const ENDOFTEXT_ID: u32 = 256 + MERGES.len() as u32;
/// Id of `<|im_start|>`.
pub const IM_START_ID: u32 = ENDOFTEXT_ID + 1;
/// Id of `<|im_end|>` (the EOS token).
pub const IM_END_ID: u32 = ENDOFTEXT_ID + 2;
/// The smallest vocabulary the tokenizer fits in.
pub const MIN_VOCAB: usize = 256 + MERGES.len() + SPECIAL_TOKENS.len();

/// A ChatML chat template.
pub const CHATML_TEMPLATE: &str = r"{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}";

/// GPT-2's byte → printable character table (the ByteLevel alphabet).
pub fn byte_to_char(b: u8) -> char {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// Padding token `i` (special, never produced by the BPE model).
fn reserved(i: usize) -> String {
    format!("<|reserved_{i}|>")
}

/// One `added_tokens` entry.
fn added_token(id: usize, content: &str) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
           "rstrip": false, "normalized": false, "special": true})
}

/// All added tokens: the specials, then reserved padding up to `vocab`.
fn added_tokens(vocab: usize) -> Vec<(usize, String)> {
    let first = ENDOFTEXT_ID as usize;
    let mut v: Vec<(usize, String)> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| (first + i, t.to_string()))
        .collect();
    for (i, id) in (MIN_VOCAB..vocab).enumerate() {
        v.push((id, reserved(i)));
    }
    v
}

/// The `tokenizer.json` document.
pub(super) fn tokenizer_json(o: &TinyModelOptions) -> Value {
    let mut vocab = Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_to_char(b).to_string(), json!(b));
    }
    for (i, (a, b)) in MERGES.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(256 + i));
    }
    let merges: Vec<String> = MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let added: Vec<Value> = added_tokens(o.vocab)
        .iter()
        .map(|(id, t)| added_token(*id, t))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges
        }
    })
}

/// The `tokenizer_config.json` document (ChatML template, BOS/EOS names).
pub(super) fn tokenizer_config_json(o: &TinyModelOptions) -> Value {
    let mut decoder = Map::new();
    for (id, content) in added_tokens(o.vocab) {
        decoder.insert(
            id.to_string(),
            json!({"content": content, "lstrip": false, "normalized": false,
                   "rstrip": false, "single_word": false, "special": true}),
        );
    }
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[2],
        "pad_token": SPECIAL_TOKENS[0],
        "unk_token": null,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "errors": "replace",
        "model_max_length": o.max_position,
        "tokenizer_class": "PreTrainedTokenizerFast"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(0xA0), 'ł');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        let mut all: Vec<char> = (0..=255u8).map(byte_to_char).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }

    #[test]
    fn merges_build_on_known_tokens() {
        let mut known: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
        for (a, b) in MERGES {
            assert!(
                known.iter().any(|k| k == a) && known.iter().any(|k| k == b),
                "{a} {b}"
            );
            known.push(format!("{a}{b}"));
        }
    }
}
