//! `spindle perplexity` on the test model over public-domain English text
//! (`tests/fixtures/public-domain-english.txt`: the Declaration of
//! Independence, the Gettysburg Address and Lincoln's Second Inaugural): a
//! quality guard for the CPU kernels. The fast path (8-bit activations,
//! integer SIMD) must score within 1% of the exact path (f32 activations,
//! dequantized weights) on the same chunks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

mod common;

/// The perplexity `spindle perplexity` reports with `--precision precision`
/// over chunks of `ctx` tokens.
fn perplexity(model: &str, precision: &str, ctx: usize) -> f64 {
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/public-domain-english.txt");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(["perplexity", "--model", model, "--device", "cpu", "--precision", precision, "--file", text, "--ctx", &ctx.to_string()]);
    let out = common::run_with_deadline(cmd, Duration::from_secs(300));
    assert!(out.status.success(), "perplexity failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let value = stdout.strip_prefix("perplexity: ").and_then(|rest| rest.split_whitespace().next()).unwrap_or_else(|| panic!("no perplexity in {stdout:?}"));
    value.parse().unwrap_or_else(|e| panic!("{value:?}: {e}"))
}

/// Fast mode's perplexity on `model` over chunks of `ctx` tokens within 1%
/// of exact mode's, which must be far better than chance and far from
/// certain on well-known English prose.
fn assert_fast_within_one_percent_of_exact(model: &str, ctx: usize, label: &str) {
    let exact = perplexity(model, "exact", ctx);
    let fast = perplexity(model, "fast", ctx);
    println!("{label}, ctx {ctx}: exact {exact:.4}, fast {fast:.4}");
    assert!((1.5..100.0).contains(&exact), "exact perplexity {exact}");
    let gap = (fast - exact).abs() / exact;
    assert!(gap < 0.01, "fast {fast:.4} vs exact {exact:.4}: {:.2}% apart", gap * 100.0);
}

#[test]
fn the_fast_path_scores_within_one_percent_of_the_exact_path() {
    let model = spindle_testenv::smollm2_gguf();
    assert_fast_within_one_percent_of_exact(model.to_str().unwrap(), 256, "SmolLM2-135M Q4_1");
}

/// Gemma 3's attention and MLP output projections read outliers that one
/// 8-bit scale per 256 values rounds coarsely: with chunks of 512 tokens,
/// fast mode was 3.9% over exact before they refined their activations
/// (0.8% with chunks of 256).
#[test]
#[ignore = "needs the 253 MB Gemma 3 270M file (SPINDLE_GEMMA3_GGUF; scripts/test.sh runs it)"]
fn gemma3_fast_path_scores_within_one_percent_of_the_exact_path() {
    let model = spindle_testenv::required_file("SPINDLE_GEMMA3_GGUF", "the Gemma 3 270M GGUF", "export SPINDLE_GEMMA3_GGUF=$(scripts/fetch-model.sh --name gemma-3-270m | tail -n 1)");
    assert_fast_within_one_percent_of_exact(model.to_str().unwrap(), 512, "Gemma 3 270M Q4_K_M");
}
