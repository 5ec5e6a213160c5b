//! The GGUF tokenizer against reference ids from HF transformers.
//!
//! For most strings the fixture's `ids` are what transformers gives (and what
//! a llama.cpp-style `smollm` pre-tokenizer gives: the script checks both
//! agree). A few strings with whitespace before a digit carry
//! `transformers_ids` too: transformers' GGUF converter drops the digit split
//! there, and `ids` holds the llama.cpp / HF `tokenizer.json` result.
//!
//! Needs the real model: set `SPINDLE_MODEL_GGUF` to
//! `SmolLM2-135M-Instruct.Q4_1.gguf` (`scripts/test.sh` does); without it
//! the tests fail. The fixture is written by
//! `tools/reference/make_tokenizer_reference.py`.
#![allow(clippy::unwrap_used, clippy::expect_used)]


use serde_json::Value;
use spindle_engine::gguf::GgufFile;
use spindle_engine::tokenizer::{gguf_tokenizer_spec, IncrementalDecoder, Tokenizer};

const FIXTURE: &str = include_str!("fixtures/tokenizer/smollm2_reference.json");

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).expect("fixture is valid JSON")
}

fn load() -> Tokenizer {
    let path = spindle_testenv::smollm2_gguf();
    let file = GgufFile::open(&path).expect("open GGUF");
    let spec = gguf_tokenizer_spec(&file).expect("tokenizer spec");
    assert_eq!(spec.pre.as_deref(), Some("smollm"));
    Tokenizer::from_gguf_spec(spec).expect("build tokenizer")
}

/// (text, reference ids, reference decode) for every fixture case.
fn cases(fx: &Value) -> Vec<(String, Vec<u32>, String)> {
    let cases = fx["encode"].as_array().expect("encode cases");
    assert!(cases.len() >= 20);
    cases
        .iter()
        .map(|c| {
            let ids = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32);
            (
                c["text"].as_str().unwrap().to_string(),
                ids.collect(),
                c["decoded"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn ids_match_reference() {
    let tok = load();
    let fx = fixture();
    assert_eq!(tok.vocab_size() as u64, fx["vocab_size"].as_u64().unwrap());
    let mut failures = Vec::new();
    for (text, expected, _) in cases(&fx) {
        let ids = tok.encode(&text, true).unwrap();
        if ids != expected {
            failures.push(format!("{text:?}\n   got {ids:?}\n  want {expected:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn divergent_cases_follow_llama_cpp_not_transformers_gguf() {
    let tok = load();
    let fx = fixture();
    let divergent: Vec<&Value> = fx["encode"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("transformers_ids").is_some())
        .collect();
    assert!(!divergent.is_empty());
    for case in divergent {
        let ids: Vec<u64> = tok
            .encode(case["text"].as_str().unwrap(), true)
            .unwrap()
            .into_iter()
            .map(u64::from)
            .collect();
        let theirs: Vec<u64> = case["transformers_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_ne!(ids, theirs, "{:?}", case["text"]);
    }
}

#[test]
fn decode_round_trips_and_matches_reference() {
    let tok = load();
    for (text, ids, decoded) in cases(&fixture()) {
        let ours = tok
            .decode(&tok.encode(&text, true).unwrap(), false)
            .unwrap();
        assert_eq!(ours, text);
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            decoded,
            "reference decode of {text:?}"
        );
    }
}

#[test]
fn special_tokens_match_reference() {
    let tok = load();
    let fx = fixture();
    let special = tok.special_tokens();
    assert_eq!(special.bos.as_deref(), fx["bos_token"].as_str());
    assert_eq!(special.eos.as_deref(), fx["eos_token"].as_str());
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_ids(), &[2]);
    assert_eq!(tok.encode("<|im_start|>", false).unwrap(), vec![1]);
    assert!(tok.encode_with("<|im_start|>", false, false).unwrap().len() > 1);
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nhi");
}

#[test]
fn incremental_decoder_reproduces_decode() {
    let tok = load();
    for (text, ids, _) in cases(&fixture()) {
        for skip_special in [false, true] {
            let mut dec = IncrementalDecoder::new(tok.clone(), skip_special);
            let mut out = String::new();
            for &id in &ids {
                let piece = dec.push(id).unwrap();
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "U+FFFD in {piece:?} while decoding {text:?}"
                );
                out.push_str(&piece);
            }
            out.push_str(&dec.finish().unwrap());
            assert_eq!(out, tok.decode(&ids, skip_special).unwrap(), "{text:?}");
        }
    }
}
