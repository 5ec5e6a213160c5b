//! A toy byte-level BPE tokenizer for the output-processor tests.
//!
//! Shared by `tests/output_stop.rs` and the unit tests in `src/output/`
//! (both include this file with `#[path]`); as a test target of its own it
//! holds no tests. The vocabulary is three control tokens, the 256 GPT-2 byte
//! characters, then one token per merge: whole words (`hello`, `Ġworld`,
//! `END`, `STOP`), a token with a stop string in its middle (`xSTOPy`), and
//! tokens holding parts of multi-byte characters (`😀` in two halves, `你`
//! split with its last byte glued to `EN`).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use spindle_engine::tokenizer::{GgufTokenizerSpec, Tokenizer, TOKEN_TYPE_CONTROL};

/// `<|endoftext|>` (BOS and pad).
pub const ENDOFTEXT: u32 = 0;
/// `<|im_start|>` (a special, non-stop token).
pub const IM_START: u32 = 1;
/// `<|im_end|>` (the EOS token).
pub const IM_END: u32 = 2;

/// GPT-2's byte-to-character table (the ByteLevel alphabet).
pub fn byte_char(b: u8) -> char {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).expect("valid char")
}

/// The vocabulary spelling of raw bytes.
pub fn spell(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// Merges as pairs of raw byte strings, best first.
fn merges() -> Vec<(Vec<u8>, Vec<u8>)> {
    let emoji = "😀".as_bytes();
    let cjk = "你".as_bytes();
    let pairs: Vec<(&[u8], &[u8])> = vec![
        (b"h", b"e"),
        (b"l", b"l"),
        (b"he", b"ll"),
        (b"hell", b"o"),
        (b" ", b"w"),
        (b"o", b"r"),
        (b" w", b"or"),
        (b"l", b"d"),
        (b" wor", b"ld"),
        (b"E", b"N"),
        (b"EN", b"D"),
        (b"S", b"T"),
        (b"O", b"P"),
        (b"ST", b"OP"),
        (b"x", b"ST"),
        (b"xST", b"OP"),
        (b"xSTOP", b"y"),
        (&emoji[..1], &emoji[1..2]),
        (&emoji[2..3], &emoji[3..]),
        (&cjk[..1], &cjk[1..2]),
        (&cjk[2..], b"EN"),
    ];
    pairs
        .into_iter()
        .map(|(a, b)| (a.to_vec(), b.to_vec()))
        .collect()
}

/// The toy tokenizer (EOS = `<|im_end|>`).
pub fn toy() -> Tokenizer {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    let merges = merges();
    for (a, b) in &merges {
        tokens.push(spell(&[a.as_slice(), b.as_slice()].concat()));
    }
    let mut token_types = vec![1; tokens.len()];
    token_types[..3].fill(TOKEN_TYPE_CONTROL);
    let spec = GgufTokenizerSpec {
        model: "gpt2".into(),
        pre: Some("gpt2".into()),
        tokens,
        merges: merges
            .iter()
            .map(|(a, b)| format!("{} {}", spell(a), spell(b)))
            .collect(),
        token_types,
        bos_id: Some(ENDOFTEXT),
        eos_id: Some(IM_END),
        unk_id: None,
        pad_id: Some(ENDOFTEXT),
        add_bos: false,
        add_eos: false,
        ..GgufTokenizerSpec::default()
    };
    Tokenizer::from_gguf_spec(spec).expect("toy tokenizer builds")
}

/// The id of the token whose text is exactly `bytes`.
pub fn tid(tok: &Tokenizer, bytes: &[u8]) -> u32 {
    tok.token_to_id(&spell(bytes))
        .unwrap_or_else(|| panic!("no toy token for {bytes:?}"))
}

/// Ids of tokens given by their texts, one token each.
pub fn ids(tok: &Tokenizer, pieces: &[&str]) -> Vec<u32> {
    pieces.iter().map(|p| tid(tok, p.as_bytes())).collect()
}
