//! Causal attention of a step's rows over the paged KV pool (GQA-aware), on
//! the CPU: one task per (sequence, head, chunk of 16 queries).

use crate::backend::StepLayout;
use crate::kv::KvPool;
use crate::model::SendPtr;
use crate::simd;
use rayon::prelude::*;

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
/// row `t` of the step; `q` and `out` are `[rows, num_heads * head_dim]`.
pub fn paged_attention(q: &[f32], out: &mut [f32], kv: &KvPool, layer: usize, layout: &StepLayout, shape: HeadShape) {
    let tasks: Vec<(usize, usize, usize)> = (0..layout.num_seqs())
        .flat_map(|s| {
            let rows = layout.seq_rows(s);
            (0..shape.num_heads).flat_map(move |h| rows.clone().step_by(QUERY_CHUNK).map(move |first| (s, h, first)))
        })
        .collect();
    let width = shape.num_heads * shape.head_dim;
    assert!(q.len() >= layout.num_rows() * width && out.len() >= layout.num_rows() * width, "attention buffers hold every row");
    let out_ptr = SendPtr(out.as_mut_ptr());
    let keys = kv.keys(layer);
    let values = kv.values(layer);
    tasks.par_iter().for_each(|&(s, h, first)| {
        let mut scratch = Scratch::default();
        let mut acc = vec![0f32; shape.head_dim];
        let last = (first + QUERY_CHUNK).min(layout.seq_rows(s).end);
        for t in first..last {
            let row = t * width + h * shape.head_dim;
            let qh = &q[row..row + shape.head_dim];
            let blocks = KeyBlocks { table: layout.table(s), block_size: layout.block_size, positions: layout.positions[t] + 1 };
            attend_one(qh, blocks, keys, values, h, shape, &mut scratch, &mut acc);
            // SAFETY: (t, h) is owned by exactly this task; row + head_dim <= out.len() (asserted above).
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

/// The cache slots of a sequence's first `positions` positions.
#[derive(Clone, Copy)]
struct KeyBlocks<'a> {
    table: &'a [i32],
    block_size: usize,
    positions: usize,
}

impl KeyBlocks<'_> {
    /// `slot · kv_dim + col` of every position, in order.
    fn fill_starts(self, starts: &mut Vec<usize>, kv_dim: usize, col: usize) {
        starts.clear();
        let mut left = self.positions;
        for &block in self.table {
            if left == 0 {
                break;
            }
            let n = left.min(self.block_size);
            let first = block as usize * self.block_size;
            starts.extend((first..first + n).map(|slot| slot * kv_dim + col));
            left -= n;
        }
    }
}

/// One query head over the positions `blocks` covers.
#[allow(clippy::too_many_arguments)]
fn attend_one(
    qh: &[f32],
    blocks: KeyBlocks<'_>,
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
    blocks.fill_starts(&mut scratch.starts, kv_dim, col);
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
