//! Gemma 3 270M (GGUF Q4_K_M: Q5_0, Q4_K, Q6_K and Q8_0 tensors; scaled
//! embeddings, q/k norms, pre- and post-norms, GELU-tanh MLP, five
//! sliding-window layers of 512 positions with RoPE base 10 000 between
//! global ones with base 10⁶) against the independent float64 numpy
//! forward over the same weights (`tools/reference/make_model_reference.py`
//! in GGUF ids mode, fixture `tests/fixtures/gemma3_270m_reference.json`).
//! One prompt is longer than the window, so the local layers' masking is
//! part of what is compared. Tolerances are SmolLM2's (see
//! `smollm2_reference.rs`); fast mode meets them because the attention and
//! MLP output projections, whose inputs have outliers, refine their 8-bit
//! activations (`Backend::refine_input`).
//!
//! The 253 MB file is not the default test model: `scripts/test.sh` fetches
//! it, sets `SPINDLE_GEMMA3_GGUF` and runs these with `--ignored`.

mod common;

use common::reference::{fixture_runner, all_logits, check_greedy, check_logits_exact_then_fast, ids, load_fixture};
use serde_json::Value;
use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput};
use spindle_engine::runner::ModelRunner;

fn fixture() -> Value {
    load_fixture("gemma3_270m_reference.json")
}

fn runner(fx: &Value) -> ModelRunner {
    fixture_runner("SPINDLE_GEMMA3_GGUF", fx, 64)
}

#[test]
#[ignore = "needs the 253 MB Gemma 3 270M file (SPINDLE_GEMMA3_GGUF; scripts/test.sh runs it)"]
fn gemma3_logits_match_the_numpy_reference() {
    let fx = fixture();
    let longest = fx["prompts"].as_array().expect("prompts").iter().map(|p| ids(&p["ids"]).len()).max().unwrap_or(0);
    assert!(longest > 512, "one prompt must reach past the 512-position window (longest: {longest})");
    let mut runner = runner(&fx);
    check_logits_exact_then_fast(&mut runner, &fx);
}

#[test]
#[ignore = "needs the 253 MB Gemma 3 270M file (SPINDLE_GEMMA3_GGUF; scripts/test.sh runs it)"]
fn gemma3_greedy_decoding_reproduces_the_reference_exactly_and_fast_until_a_near_tie() {
    let fx = fixture();
    let mut runner = runner(&fx);
    check_greedy(&mut runner, &fx, 3);
}

/// Runs `tokens[from..to]` of a sequence whose earlier tokens are cached in
/// `table`, returning every new position's logits.
fn chunk(runner: &mut ModelRunner, tokens: &[u32], from: usize, to: usize, table: &[u32]) -> Vec<f32> {
    let seq = SeqInput { id: 7, tokens: tokens[from..to].to_vec(), start_pos: from, block_table: table.to_vec().into(), logits: LogitsRequest::All, sampling: None };
    runner.execute(&ForwardBatch { seqs: vec![seq] }).expect("forward").seqs.remove(0).logits
}

#[test]
#[ignore = "needs the 253 MB Gemma 3 270M file (SPINDLE_GEMMA3_GGUF; scripts/test.sh runs it)"]
fn the_sliding_window_masks_alike_in_prefill_chunked_prefill_and_decode() {
    let fx = fixture();
    let mut runner = runner(&fx);
    let long = fx["prompts"].as_array().expect("prompts").iter().map(|p| ids(&p["ids"])).max_by_key(Vec::len).expect("a prompt");
    let n = long.len();
    assert!(n > 530, "the prompt must reach past the window");
    let whole = all_logits(&mut runner, &long);
    let vocab = whole.len() / n;
    // The same tokens as chunks that cross the window's edge, then decode steps.
    let table: Vec<u32> = (0..n.div_ceil(16) as u32).collect();
    let cuts = [0, 200, 505, n - 8];
    let mut pieces = Vec::new();
    for w in cuts.windows(2) {
        pieces.push(chunk(&mut runner, &long, w[0], w[1], &table));
    }
    for pos in n - 8..n {
        pieces.push(chunk(&mut runner, &long, pos, pos + 1, &table));
    }
    let stepped: Vec<f32> = pieces.concat();
    assert_eq!(stepped.len(), whole.len());
    let worst = whole.iter().zip(&stepped).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert_eq!(worst, 0.0, "chunked prefill and decode give other logits than one prefill (max diff {worst})");
    let last = &whole[(n - 1) * vocab..];
    assert!(last.iter().all(|v| v.is_finite()), "finite logits at position {n}");
}
