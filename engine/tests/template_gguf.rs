//! Chat-template rendering against `apply_chat_template` output from HF
//! transformers (fixture written by
//! `tools/reference/make_tokenizer_reference.py`).
//!
//! The renderings are checked with the template text stored in the fixture
//! always, and with the one read from the GGUF when `SPINDLE_MODEL_GGUF`
//! points at `SmolLM2-135M-Instruct.Q4_1.gguf`.
#![allow(clippy::unwrap_used, clippy::expect_used)]


use serde_json::Value;
use spindle_engine::chat_template::ChatTemplate;
use spindle_engine::gguf::GgufFile;
use spindle_engine::tokenizer::gguf_chat_template;

const FIXTURE: &str = include_str!("fixtures/tokenizer/smollm2_reference.json");

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).expect("fixture is valid JSON")
}

fn check_renderings(source: &str, fx: &Value) {
    let bos = fx["bos_token"].as_str().unwrap();
    let eos = fx["eos_token"].as_str().unwrap();
    let template = ChatTemplate::new(source, bos, eos).unwrap();
    let cases = fx["chat"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let messages = case["messages"].as_array().unwrap();
        let add_gen = case["add_generation_prompt"].as_bool().unwrap();
        let rendered = template.render(messages, None, add_gen).unwrap();
        assert_eq!(
            rendered,
            case["rendered"].as_str().unwrap(),
            "messages {messages:?} add_gen {add_gen}"
        );
    }
}

#[test]
fn fixture_template_renders_like_transformers() {
    let fx = fixture();
    check_renderings(fx["chat_template"].as_str().unwrap(), &fx);
}

#[test]
fn gguf_template_renders_like_transformers() {
    let file = GgufFile::open(&spindle_testenv::smollm2_gguf()).unwrap();
    let source = gguf_chat_template(&file).expect("GGUF has tokenizer.chat_template");
    let fx = fixture();
    assert_eq!(source, fx["chat_template"].as_str().unwrap());
    check_renderings(&source, &fx);
}
