//! Checks of Spindle's logits and greedy tokens against a reference fixture
//! written by `tools/reference/make_model_reference.py` (an independent
//! numpy forward over the same GGUF weights).

use serde_json::Value;
use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput};
use spindle_engine::generate::{generate, GenerateRequest};
use spindle_engine::kv::BlockAllocator;
use spindle_engine::model::MatmulPrecision;
use spindle_engine::runner::ModelRunner;
use spindle_engine::sampling::SamplingParams;

/// A fixture under `tests/fixtures`, parsed.
pub fn load_fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(super::fixture(name)).expect("fixture");
    serde_json::from_str(&text).expect("json")
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Every position's logits of `prompt` (flattened `[len, vocab]`).
pub fn all_logits(runner: &mut ModelRunner, prompt: &[u32]) -> Vec<f32> {
    let mut alloc = BlockAllocator::new(runner.kv_geometry().num_blocks);
    let mut table = Vec::new();
    alloc.ensure(&mut table, prompt.len(), runner.kv_geometry().block_size).expect("blocks");
    let seq = SeqInput { id: 0, tokens: prompt.to_vec(), start_pos: 0, block_table: table.into(), logits: LogitsRequest::All, sampling: None };
    runner.execute(&ForwardBatch { seqs: vec![seq] }).expect("forward").seqs.remove(0).logits
}

/// The `k` largest entries' indices, largest first.
pub fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
    idx.truncate(k);
    idx
}

/// How far logits may be from the reference's: its top 20 (what sampling
/// sees) and a stride over the whole vocabulary (mostly the far tail).
#[derive(Clone, Copy)]
pub struct Tolerance {
    /// Bound on the top-20 logits.
    pub top: f32,
    /// Bound on the strided logits.
    pub tail: f32,
}

/// Logits of every position of `p`'s prompt against the reference: the
/// top-20 and strided last-position logits within `tol`, the same top-1 and
/// ≥ 4 of the top 5, and the same top-1 wherever the reference's top-2 gap
/// exceeds 0.5.
pub fn check_prompt(runner: &mut ModelRunner, p: &Value, tol: Tolerance, label: &str) {
    let prompt = ids(&p["ids"]);
    let logits = all_logits(runner, &prompt);
    let vocab = logits.len() / prompt.len();
    let last = &logits[(prompt.len() - 1) * vocab..];
    let stride = p["logits_strided"]["stride"].as_u64().expect("stride") as usize;
    let mut tail = 0f32;
    for (i, v) in p["logits_strided"]["values"].as_array().expect("values").iter().enumerate() {
        tail = tail.max((last[i * stride] - v.as_f64().expect("f") as f32).abs());
    }
    let mut top = 0f32;
    for pair in p["top20"].as_array().expect("top20") {
        let (id, v) = (pair[0].as_u64().expect("id") as usize, pair[1].as_f64().expect("v") as f32);
        top = top.max((last[id] - v).abs());
    }
    assert!(top <= tol.top, "{label} {}: max |top-20 logit - reference| = {top} > {}", p["name"], tol.top);
    assert!(tail <= tol.tail, "{label} {}: max |strided logit - reference| = {tail} > {}", p["name"], tol.tail);
    let ref_top5: Vec<u32> = p["top20"].as_array().expect("top20")[..5].iter().map(|x| x[0].as_u64().expect("id") as u32).collect();
    let ours = top_k(last, 5);
    assert_eq!(ours[0], ref_top5[0], "{label}: top-1 differs");
    let common = ours.iter().filter(|t| ref_top5.contains(t)).count();
    assert!(common >= 4, "{label}: top-5 {ours:?} vs reference {ref_top5:?}");
    let per_pos = p["top5_per_position"].as_array().expect("per position");
    let gaps = p["top5_logits_per_position"].as_array().expect("per position logits");
    for (pos, (top5, l5)) in per_pos.iter().zip(gaps).enumerate() {
        let gap = l5[0].as_f64().expect("l") - l5[1].as_f64().expect("l");
        if gap > 0.5 {
            let ours = top_k(&logits[pos * vocab..(pos + 1) * vocab], 1)[0];
            assert_eq!(ours as u64, top5[0].as_u64().expect("id"), "{label}: top-1 at position {pos}");
        }
    }
    println!("{label} {}: max abs logit error {:.4} (top 20: {top:.4})", p["name"], top.max(tail));
}

/// Exact matmuls: within 2e-3 everywhere (SmolLM2's threshold).
pub const EXACT: Tolerance = Tolerance { top: 2e-3, tail: 2e-3 };
/// Fast (8-bit activation) matmuls: within 1.0 everywhere (SmolLM2's).
pub const FAST: Tolerance = Tolerance { top: 1.0, tail: 1.0 };

/// Every prompt of the fixture with exact matmuls and then with fast ones,
/// within [`EXACT`] and [`FAST`].
pub fn check_logits_exact_then_fast(runner: &mut ModelRunner, fx: &Value) {
    check_logits(runner, fx, EXACT, FAST);
}

/// Every prompt of the fixture with exact matmuls within `exact`, then with
/// fast ones within `fast`.
pub fn check_logits(runner: &mut ModelRunner, fx: &Value, exact: Tolerance, fast: Tolerance) {
    runner.set_precision(MatmulPrecision::Exact);
    for p in fx["prompts"].as_array().expect("prompts") {
        check_prompt(runner, p, exact, "exact");
    }
    runner.set_precision(MatmulPrecision::Fast);
    for p in fx["prompts"].as_array().expect("prompts") {
        check_prompt(runner, p, fast, "fast");
    }
}

/// Greedy tokens for a fixture's greedy case.
pub fn greedy(runner: &mut ModelRunner, case: &Value) -> Vec<u32> {
    let mut alloc = BlockAllocator::new(runner.kv_geometry().num_blocks);
    let req = GenerateRequest {
        prompt: ids(&case["prompt_ids"]),
        max_tokens: case["max_new_tokens"].as_u64().expect("n") as usize,
        sampling: SamplingParams::default(),
        stop_tokens: vec![],
        prefill_chunk: 16,
    };
    let mut out = Vec::new();
    generate(runner, &mut alloc, &req, &mut |t| {
        out.push(t.token);
        true
    })
    .expect("generate");
    out
}


/// The fixture's greedy case: exact mode gives every reference token; fast
/// mode gives them until the first step whose reference top-2 gap is under
/// 1.0 (8-bit-activation noise decides near-ties), which must leave at
/// least `min_clear` steps to test.
pub fn check_greedy(runner: &mut ModelRunner, fx: &Value, min_clear: usize) {
    let case = &fx["greedy"];
    let expected = ids(&case["tokens"]);
    runner.set_precision(MatmulPrecision::Exact);
    let got = greedy(runner, case);
    assert_eq!(&got[..expected.len()], &expected[..], "exact greedy tokens");
    runner.set_precision(MatmulPrecision::Fast);
    let gaps: Vec<f64> = case["top1_top2_gap"].as_array().expect("gaps").iter().map(|g| g.as_f64().expect("g")).collect();
    let safe = gaps.iter().position(|&g| g < 1.0).unwrap_or(gaps.len());
    assert!(safe >= min_clear, "fixture has too few clear steps to test");
    let got = greedy(runner, case);
    assert_eq!(&got[..safe], &expected[..safe], "fast greedy diverged before the first near-tie (step {safe})");
}

/// A runner of `blocks` 16-token blocks over the GGUF that environment
/// variable `var` names (`scripts/test.sh` sets it), which must be the file
/// the fixture `fx` was made from.
pub fn fixture_runner(var: &str, fx: &Value, blocks: usize) -> ModelRunner {
    let path = std::env::var(var).unwrap_or_else(|_| panic!("{var} must name {} (scripts/test.sh sets it)", fx["model_file"]));
    let path = std::path::PathBuf::from(path);
    assert_eq!(path.file_name().and_then(|n| n.to_str()), fx["model_file"].as_str(), "the fixture is for another file");
    ModelRunner::new(super::load_gguf(&path), blocks, 16)
}
