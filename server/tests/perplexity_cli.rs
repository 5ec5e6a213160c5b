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

/// The perplexity `spindle perplexity` reports with `--precision precision`.
fn perplexity(model: &str, precision: &str) -> f64 {
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/public-domain-english.txt");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(["perplexity", "--model", model, "--device", "cpu", "--precision", precision, "--file", text, "--ctx", "256"]);
    let out = common::run_with_deadline(cmd, Duration::from_secs(300));
    assert!(out.status.success(), "perplexity failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let value = stdout.strip_prefix("perplexity: ").and_then(|rest| rest.split_whitespace().next()).unwrap_or_else(|| panic!("no perplexity in {stdout:?}"));
    value.parse().unwrap_or_else(|e| panic!("{value:?}: {e}"))
}

#[test]
fn the_fast_path_scores_within_one_percent_of_the_exact_path() {
    let model = spindle_testenv::smollm2_gguf();
    let model = model.to_str().unwrap();
    let exact = perplexity(model, "exact");
    let fast = perplexity(model, "fast");
    println!("SmolLM2-135M Q4_1, ctx 256: exact {exact:.4}, fast {fast:.4}");
    // A 135M model on well-known English prose: far better than chance,
    // far from certain.
    assert!((1.5..100.0).contains(&exact), "exact perplexity {exact}");
    let gap = (fast - exact).abs() / exact;
    assert!(gap < 0.01, "fast {fast:.4} vs exact {exact:.4}: {:.2}% apart", gap * 100.0);
}
