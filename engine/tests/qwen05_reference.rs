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

use common::reference::{check_logits_exact_then_fast, greedy, ids, load_fixture};
use serde_json::Value;
use spindle_engine::model::MatmulPrecision;
use spindle_engine::runner::ModelRunner;

fn fixture() -> Value {
    load_fixture("qwen25_coder_05b_reference.json")
}

fn runner(fx: &Value) -> ModelRunner {
    let path = std::env::var("SPINDLE_QWEN05_GGUF")
        .expect("SPINDLE_QWEN05_GGUF must name qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (scripts/test.sh sets it)");
    let path = std::path::PathBuf::from(path);
    assert_eq!(path.file_name().and_then(|n| n.to_str()), fx["model_file"].as_str(), "the fixture is for another file");
    ModelRunner::new(common::load_gguf(&path), 16, 16)
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
    let case = &fx["greedy"];
    let expected = ids(&case["tokens"]);
    runner.set_precision(MatmulPrecision::Exact);
    let got = greedy(&mut runner, case);
    assert_eq!(&got[..expected.len()], &expected[..], "exact greedy tokens");
    runner.set_precision(MatmulPrecision::Fast);
    let gaps: Vec<f64> = case["top1_top2_gap"].as_array().expect("gaps").iter().map(|g| g.as_f64().expect("g")).collect();
    let safe = gaps.iter().position(|&g| g < 1.0).unwrap_or(gaps.len());
    assert!(safe >= 5, "fixture has too few clear steps to test");
    let got = greedy(&mut runner, case);
    assert_eq!(&got[..safe], &expected[..safe], "fast greedy diverged before the first near-tie (step {safe})");
}
