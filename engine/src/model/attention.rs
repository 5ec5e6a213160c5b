//! Causal attention of a batch of sequences over the paged KV pool (GQA-aware).

use super::SendPtr;
use crate::kv::KvPool;
use crate::simd;
use rayon::prelude::*;

/// One sequence's slice of the flattened batch, as attention sees it.
#[derive(Debug)]
pub struct SeqSpan {
    /// Index of the sequence's first new token in the batch.
    pub token_offset: usize,
    /// New tokens in this step.
    pub len: usize,
    /// Position of the first new token.
    pub start_pos: usize,
    /// Pool slot of every position `0..start_pos + len`.
    pub key_slots: Vec<usize>,
}

/// Head geometry.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

const QUERY_CHUNK: usize = 16;

/// `out[t, h] = softmax(q[t, h] · K[..=pos(t)] / √d) · V[..=pos(t)]` for every
/// token `t` of every span; `q` and `out` are `[tokens, num_heads * head_dim]`.
pub fn paged_attention(q: &[f32], out: &mut [f32], kv: &KvPool, layer: usize, spans: &[SeqSpan], shape: HeadShape) {
    let tasks: Vec<(usize, usize, usize)> = spans
        .iter()
        .enumerate()
        .flat_map(|(s, span)| {
            (0..shape.num_heads)
                .flat_map(move |h| (0..span.len.div_ceil(QUERY_CHUNK)).map(move |c| (s, h, c * QUERY_CHUNK)))
        })
        .collect();
    let out_ptr = SendPtr(out.as_mut_ptr());
    let keys = kv.keys(layer);
    let values = kv.values(layer);
    tasks.par_iter().for_each(|&(s, h, first)| {
        let span = &spans[s];
        let mut scratch = Scratch::default();
        let mut acc = vec![0f32; shape.head_dim];
        for i in first..(first + QUERY_CHUNK).min(span.len) {
            let t = span.token_offset + i;
            let row = t * shape.num_heads * shape.head_dim + h * shape.head_dim;
            let qh = &q[row..row + shape.head_dim];
            attend_one(qh, &span.key_slots[..=span.start_pos + i], keys, values, h, shape, &mut scratch, &mut acc);
            // SAFETY: (t, h) is owned by exactly this task; row + head_dim <= out.len().
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), out_ptr.get().add(row), shape.head_dim) };
        }
    });
}

/// Per-task buffers reused across the task's queries.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    starts: Vec<usize>,
}

#[allow(clippy::too_many_arguments)]
fn attend_one(
    qh: &[f32],
    slots: &[usize],
    keys: &[f32],
    values: &[f32],
    head: usize,
    shape: HeadShape,
    scratch: &mut Scratch,
    acc: &mut [f32],
) {
    let kv_dim = shape.num_kv_heads * shape.head_dim;
    let group = shape.num_heads / shape.num_kv_heads;
    let col = (head / group) * shape.head_dim;
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    scratch.starts.clear();
    scratch.starts.extend(slots.iter().map(|&slot| slot * kv_dim + col));
    scratch.scores.clear();
    scratch.scores.extend(scratch.starts.iter().map(|&k| simd::dot(qh, &keys[k..k + shape.head_dim]) * scale));
    let max = scratch.scores.iter().fold(f32::NEG_INFINITY, |m, &s| if s > m { s } else { m });
    for s in scratch.scores.iter_mut() {
        *s = simd::fast_exp(*s - max);
    }
    let inv = 1.0 / scratch.scores.iter().sum::<f32>();
    for s in scratch.scores.iter_mut() {
        *s *= inv;
    }
    simd::weighted_sum(acc, &scratch.scores, values, &scratch.starts);
}
