//! Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0
//! tensors, q/k/v biases, tied embeddings) against the independent float64
//! numpy forward over the same weights (`tools/reference/make_model_reference.py`
//! in GGUF ids mode, fixture `tests/fixtures/qwen25_coder_05b_reference.json`).
//!
//! The prompts are token ids (a chat-rendered question, English, code), so
//! this checks the forward pass only; the tolerances are SmolLM2's (see
//! `smollm2_reference.rs`): exact mode within 2e-3 and the reference's greedy
//! tokens, fast mode within 1.0 and greedy until the first near-tie.
//!
//! The 491 MB file is not the default test model: `scripts/test.sh` fetches
//! it, sets `SPINDLE_QWEN05_GGUF` and runs these with `--ignored`.

mod common;

use common::reference::{fixture_runner, check_greedy, check_logits_exact_then_fast, load_fixture};
use serde_json::Value;
use spindle_engine::runner::ModelRunner;

fn fixture() -> Value {
    load_fixture("qwen25_coder_05b_reference.json")
}

fn runner(fx: &Value) -> ModelRunner {
    fixture_runner("SPINDLE_QWEN05_GGUF", fx, 16)
}

#[test]
#[ignore = "needs the 491 MB Qwen2.5-Coder-0.5B file (SPINDLE_QWEN05_GGUF; scripts/test.sh runs it)"]
fn qwen_logits_match_the_numpy_reference() {
    let fx = fixture();
    let mut runner = runner(&fx);
    check_logits_exact_then_fast(&mut runner, &fx);
}

#[test]
#[ignore = "needs the 491 MB Qwen2.5-Coder-0.5B file (SPINDLE_QWEN05_GGUF; scripts/test.sh runs it)"]
fn qwen_greedy_decoding_reproduces_the_reference_exactly_and_fast_until_a_near_tie() {
    let fx = fixture();
    let mut runner = runner(&fx);
    check_greedy(&mut runner, &fx, 5);
}
