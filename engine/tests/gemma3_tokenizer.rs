//! Gemma 3's SentencePiece vocabulary (262,144 tokens, byte fallback, merges
//! by score) built from GGUF metadata, against llama.cpp's own tokenizer on
//! the same file: `tests/fixtures/tokenizer/gemma3_llamacpp.json`, written by
//! `tools/reference/make_llamacpp_tokenizer_reference.py` from llama-server's
//! `/tokenize` (BOS added, special-token text parsed).
//!
//! The 253 MB file is not the default test model: `scripts/test.sh` fetches
//! it, sets `SPINDLE_GEMMA3_GGUF` and runs these with `--ignored`.

use spindle_engine::gguf::GgufFile;
use spindle_engine::tokenizer::{gguf_tokenizer_spec, Tokenizer};

fn tokenizer() -> Tokenizer {
    let path = std::env::var("SPINDLE_GEMMA3_GGUF").expect("SPINDLE_GEMMA3_GGUF must name gemma-3-270m-q4_k_m.gguf (scripts/test.sh sets it)");
    let file = GgufFile::open(std::path::Path::new(&path)).expect("the Gemma 3 GGUF opens");
    Tokenizer::from_gguf_spec(gguf_tokenizer_spec(&file).expect("tokenizer keys")).expect("the SentencePiece tokenizer builds")
}

fn fixture() -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer/gemma3_llamacpp.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture JSON")
}

#[test]
#[ignore = "needs the 253 MB Gemma 3 270M file (SPINDLE_GEMMA3_GGUF; scripts/test.sh runs it)"]
fn gemma3_ids_match_llama_cpp_and_decode_back() {
    let tok = tokenizer();
    assert_eq!(tok.vocab_size(), 262_144);
    let fx = fixture();
    let cases = fx["cases"].as_array().expect("cases");
    assert!(cases.len() >= 15, "the fixture covers many kinds of text");
    let mut wrong = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want: Vec<u32> = case["ids"].as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect();
        let got = tok.encode(text, true).expect("encodes");
        if got != want {
            wrong.push(format!("{text:?}\n  llama.cpp {want:?}\n  spindle   {got:?}"));
        }
        // Every piece decodes back to the text (BOS and turn markers are
        // skipped; a literal `▁` reads back as the space it stands for, in
        // llama.cpp too).
        if !text.contains("<start_of_turn>") && !text.contains('\u{2581}') {
            assert_eq!(tok.decode(&got, true).expect("decodes"), text, "round trip of {text:?}");
        }
    }
    assert!(wrong.is_empty(), "{} of {} strings tokenized differently:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
}
