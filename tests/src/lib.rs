//! Helpers shared by the end-to-end tests: format converters
//! ([`convert`]), locating the real model, running a prompt through a model
//! and comparing logits.

pub mod convert;
pub mod reference_backend;

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use sha2::{Digest, Sha256};
use spindle_engine::batch::{ForwardBatch, LogitsRequest, SeqInput};
use spindle_engine::kv::BlockAllocator;
use spindle_engine::model::LlamaModel;
use spindle_engine::runner::ModelRunner;

/// The real SmolLM2 GGUF named by `SPINDLE_MODEL_GGUF`, or `None` after
/// printing `skipped: <why>` (tests then return early).
pub fn smollm2_gguf() -> Option<PathBuf> {
    match std::env::var_os("SPINDLE_MODEL_GGUF").map(PathBuf::from) {
        Some(p) if p.is_file() => Some(p),
        Some(p) => {
            println!(
                "skipped: SPINDLE_MODEL_GGUF={} is not a file (run scripts/fetch-model.sh)",
                p.display()
            );
            None
        }
        None => {
            println!("skipped: SPINDLE_MODEL_GGUF is not set (scripts/test.sh sets it after fetching the model)");
            None
        }
    }
}

/// Path of a file under `tests/fixtures`.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

/// Lower-case hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}

/// Logits for every position of `prompt` (`[len, vocab]` row-major), from a
/// fresh prefill in one forward pass.
pub fn prompt_logits(runner: &mut ModelRunner, prompt: &[u32]) -> Result<Vec<f32>> {
    let mut alloc = BlockAllocator::new(runner.kv_geometry().num_blocks);
    let mut table = Vec::new();
    alloc.ensure(&mut table, prompt.len(), runner.kv_geometry().block_size)?;
    let seq = SeqInput {
        id: 0,
        tokens: prompt.to_vec(),
        start_pos: 0,
        block_table: table.into(),
        logits: LogitsRequest::All,
        sampling: None,
    };
    let mut out = runner.execute(&ForwardBatch { seqs: vec![seq] })?;
    let logits = out.seqs.pop().map(|s| s.logits).unwrap_or_default();
    let vocab = runner.config().vocab_size;
    ensure!(
        logits.len() == prompt.len() * vocab,
        "got {} logits for {} tokens of vocab {vocab}",
        logits.len(),
        prompt.len()
    );
    Ok(logits)
}

/// A runner over `model` whose KV pool fits `max_tokens` tokens, in exact
/// mode (f32 matmuls and an f32 KV cache: what the references compute).
pub fn runner_for(mut model: LlamaModel, max_tokens: usize) -> ModelRunner {
    model.set_precision(spindle_engine::model::MatmulPrecision::Exact);
    let block = 16;
    ModelRunner::new(model, max_tokens.div_ceil(block).max(1), block)
}

/// Index of the largest value (the first one on ties).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// The gap between the largest and second-largest value of a row.
pub fn top2_gap(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// How two `[positions, vocab]` logit matrices compare.
#[derive(Debug, Clone, PartialEq)]
pub struct LogitsComparison {
    /// max |a - b| over every entry.
    pub max_abs_diff: f32,
    /// Largest |logit| seen in `a` (for scale).
    pub max_abs_logit: f32,
    /// Positions whose argmax differs.
    pub argmax_mismatches: Vec<usize>,
    /// Smallest top-1/top-2 gap of `a` over all positions.
    pub min_top2_gap: f32,
}

/// Compare two `[positions, vocab]` logit matrices entry by entry.
pub fn compare_logits(a: &[f32], b: &[f32], vocab: usize) -> Result<LogitsComparison> {
    ensure!(a.len() == b.len(), "logit matrices differ in size: {} vs {}", a.len(), b.len());
    ensure!(vocab > 0 && a.len().is_multiple_of(vocab), "{} logits are not rows of {vocab}", a.len());
    let mut c = LogitsComparison {
        max_abs_diff: 0.0,
        max_abs_logit: 0.0,
        argmax_mismatches: Vec::new(),
        min_top2_gap: f32::INFINITY,
    };
    for (pos, (ra, rb)) in a.chunks_exact(vocab).zip(b.chunks_exact(vocab)).enumerate() {
        for (x, y) in ra.iter().zip(rb) {
            ensure!(x.is_finite() && y.is_finite(), "non-finite logit at position {pos}");
            c.max_abs_diff = c.max_abs_diff.max((x - y).abs());
            c.max_abs_logit = c.max_abs_logit.max(x.abs());
        }
        if argmax(ra) != argmax(rb) {
            c.argmax_mismatches.push(pos);
        }
        c.min_top2_gap = c.min_top2_gap.min(top2_gap(ra));
    }
    Ok(c)
}
