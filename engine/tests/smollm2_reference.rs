//! SmolLM2-135M-Instruct (GGUF Q4_1) against an independent float64 numpy
//! forward over the same weights (`tools/reference/make_model_reference.py`,
//! fixture `tests/fixtures/smollm2_reference.json`).
//!
//! Tolerances: with `MatmulPrecision::Exact` (f32 activations, dequantized
//! weights) logits agree to 2e-3 absolute and greedy decoding reproduces the
//! reference tokens exactly; with the default `Fast` path (8-bit activations,
//! as llama.cpp does) logits of magnitude ~10-30 agree to 1.0 absolute (seen:
//! 0.45-0.81), with the same top-1 wherever the reference's top-2 gap exceeds
//! 0.5 and ≥ 4 of the top 5 at the last position; fast greedy decoding
//! follows the reference until the first step whose top-2 gap is below 1.0.

mod common;

use serde_json::Value;
use spindle_engine::model::MatmulPrecision;
use spindle_engine::runner::ModelRunner;

use common::reference::{check_logits_exact_then_fast, greedy, ids, load_fixture};

fn fixture() -> Value {
    load_fixture("smollm2_reference.json")
}

#[test]
fn logits_match_the_numpy_reference() {
    let path = spindle_testenv::smollm2_gguf();
    let fx = fixture();
    let mut runner = ModelRunner::new(common::load_smollm2(&path), 16, 16);
    check_logits_exact_then_fast(&mut runner, &fx);
}

#[test]
fn exact_greedy_decoding_reproduces_the_reference_tokens() {
    let path = spindle_testenv::smollm2_gguf();
    let fx = fixture();
    let mut runner = ModelRunner::new(common::load_smollm2(&path), 32, 16);
    runner.set_precision(MatmulPrecision::Exact);
    for case in [&fx["greedy"], &fx["greedy_long"]] {
        let expected = ids(&case["tokens"]);
        let got = greedy(&mut runner, case);
        assert_eq!(&got[..expected.len()], &expected[..], "greedy tokens for {:?}", case["user_message"]);
    }
}

#[test]
fn fast_greedy_decoding_follows_the_reference_until_a_near_tie() {
    let path = spindle_testenv::smollm2_gguf();
    let fx = fixture();
    let mut runner = ModelRunner::new(common::load_smollm2(&path), 32, 16);
    let case = &fx["greedy_long"];
    let expected = ids(&case["tokens"]);
    let gaps: Vec<f64> = case["top1_top2_gap"].as_array().expect("gaps").iter().map(|g| g.as_f64().expect("g")).collect();
    let safe = gaps.iter().position(|&g| g < 1.0).unwrap_or(gaps.len());
    assert!(safe >= 5, "fixture has too few clear steps to test");
    let got = greedy(&mut runner, case);
    assert_eq!(&got[..safe], &expected[..safe], "fast greedy diverged before the first near-tie (step {safe})");
}
