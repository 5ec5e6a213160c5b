//! Causal attention of a step's rows over the paged KV pool (GQA-aware), on
//! the CPU: one task per (sequence, head or the heads of a KV head, chunk
//! of 16 queries).

use crate::backend::StepLayout;
use crate::kv::{KvLayer, KvPool};
use crate::model::SendPtr;
use crate::simd::{self, KvElement};

/// Head geometry.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// The factor attention logits are multiplied by (usually `1/√head_dim`).
    pub scale: f32,
}

const QUERY_CHUNK: usize = 16;

/// `out[t, h] = softmax(q[t, h] · K[first..=pos(t)] · scale) · V[first..=pos(t)]`
/// for every row `t` of the step, where `first` is 0, or with a `window`
/// the first of the last `window` positions (blocks wholly before it are
/// not read); `q` and `out` are `[rows, num_heads * head_dim]`.
///
/// The query heads that share a KV head are taken together where the tasks
/// keep the pool busy or split evenly over it ([`heads_per_task`]), and a
/// task's queries are scored together where no window cuts them
/// ([`attend_chunk`]): each key and value row is then read once for all of
/// them. Every head's arithmetic is the same either way.
/// Rows stored as `f16` are widened exactly as they are read.
pub fn paged_attention(q: &[f32], out: &mut [f32], kv: &KvPool, layer: usize, layout: &StepLayout, shape: HeadShape, window: Option<usize>) {
    match kv.layer(layer) {
        KvLayer::F32 { keys, values } => attention_over(q, out, keys, values, layout, shape, window),
        KvLayer::F16 { keys, values } => attention_over(q, out, keys, values, layout, shape, window),
    }
}

/// [`paged_attention`] over one layer's rows of element type `T`.
fn attention_over<T: KvElement>(q: &[f32], out: &mut [f32], keys: &[T], values: &[T], layout: &StepLayout, shape: HeadShape, window: Option<usize>) {
    let heads_per_task = heads_per_task(layout, shape);
    let tasks: Vec<(usize, usize, usize)> = (0..layout.num_seqs())
        .flat_map(|s| {
            let rows = layout.seq_rows(s);
            (0..shape.num_heads)
                .step_by(heads_per_task)
                .flat_map(move |h| rows.clone().step_by(QUERY_CHUNK).map(move |first| (s, h, first)))
        })
        .collect();
    let width = shape.num_heads * shape.head_dim;
    assert!(q.len() >= layout.num_rows() * width && out.len() >= layout.num_rows() * width, "attention buffers hold every row");
    let out_ptr = SendPtr(out.as_mut_ptr());
    crate::pool::run(tasks.len(), |t| {
        let (s, h, first) = tasks[t];
        let mut scratch = TASK_SCRATCH.with(|cell| cell.take());
        let mut acc = vec![0f32; heads_per_task * shape.head_dim];
        let last = (first + QUERY_CHUNK).min(layout.seq_rows(s).end);
        let write = |t: usize, acc: &[f32]| {
            debug_assert!((first..last).contains(&t) && acc.len() == heads_per_task * shape.head_dim);
            // SAFETY: heads h..h + heads_per_task of row t are owned by exactly this task;
            // they lie inside `out` (asserted above).
            unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), out_ptr.get().add(t * width + h * shape.head_dim), acc.len()) };
        };
        let from_zero = (first..last).all(|t| window.is_none_or(|w| layout.positions[t] < w));
        if from_zero && heads_per_task * (last - first) >= 2 {
            let chunk = QueryChunk { q, width, head: h, heads: heads_per_task, rows: first..last, seq: s };
            attend_chunk(&chunk, layout, keys, values, shape, &mut scratch, &mut acc, write);
        } else {
            for t in first..last {
                let row = t * width + h * shape.head_dim;
                let qh = &q[row..row + heads_per_task * shape.head_dim];
                let positions = layout.positions[t] + 1;
                let first = window.map_or(0, |w| positions.saturating_sub(w));
                let blocks = KeyBlocks { table: layout.table(s), block_size: layout.block_size, first, positions };
                attend(qh, blocks, keys, values, h, shape, &mut scratch, &mut acc);
                write(t, &acc);
            }
        }
        TASK_SCRATCH.with(|cell| cell.replace(scratch));
    });
}

thread_local! {
    /// Each pool thread's [`Scratch`], kept between tasks and steps (its
    /// scores reach hundreds of KB for long prompts: allocating them per
    /// task faulted fresh pages in every time).
    static TASK_SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// All the query heads of a KV head in one task (their scores then take
/// each key row once for all of them, [`attend_chunk`]), unless that leaves
/// fewer than four tasks per thread that the threads cannot share evenly
/// (decode of a few sequences): then one head each. Single-sequence decode
/// of the Qwen2.5 1.5B (two KV heads, two threads) at depth 4056: 12.7 and
/// 12.8 tok/s grouped against 10.0 and 10.5 with a head per task; at depth
/// 512 16.0-16.1 either way.
fn heads_per_task(layout: &StepLayout, shape: HeadShape) -> usize {
    let group = (shape.num_heads / shape.num_kv_heads.max(1)).max(1);
    let chunks: usize = (0..layout.num_seqs()).map(|s| layout.seq_rows(s).len().div_ceil(QUERY_CHUNK)).sum();
    let grouped_tasks = chunks * shape.num_kv_heads;
    let threads = rayon::current_num_threads();
    if shape.num_heads.is_multiple_of(group) && (grouped_tasks >= 4 * threads || grouped_tasks.is_multiple_of(threads)) {
        group
    } else {
        1
    }
}

/// A task's buffers, kept by each pool thread across tasks and steps
/// ([`TASK_SCRATCH`]).
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    starts: Vec<usize>,
    /// [`sum_values_in_blocks`]'s sums, a pass of queries' worth.
    sums: Vec<f32>,
}

/// The cache slots of a sequence's positions `first..positions`.
#[derive(Clone, Copy)]
struct KeyBlocks<'a> {
    table: &'a [i32],
    block_size: usize,
    first: usize,
    positions: usize,
}

impl KeyBlocks<'_> {
    /// `slot · kv_dim + col` of every position, in order.
    fn fill_starts(self, starts: &mut Vec<usize>, kv_dim: usize, col: usize) {
        starts.clear();
        let bs = self.block_size;
        let blocks = self.table.iter().enumerate().skip(self.first / bs);
        for (i, &block) in blocks.take_while(|&(i, _)| i * bs < self.positions) {
            let from = (i * bs).max(self.first);
            let to = ((i + 1) * bs).min(self.positions);
            let slot = |pos: usize| block as usize * bs + (pos - i * bs);
            starts.extend((from..to).map(|pos| slot(pos) * kv_dim + col));
        }
    }
}

/// Query heads `head..head + q.len() / head_dim` (all of one KV head) over
/// the positions `blocks` covers: each head's scores eight keys at a time,
/// each value row added into every head's output.
#[allow(clippy::too_many_arguments)]
fn attend<T: KvElement>(q: &[f32], blocks: KeyBlocks<'_>, keys: &[T], values: &[T], head: usize, shape: HeadShape, scratch: &mut Scratch, acc: &mut [f32]) {
    let d = shape.head_dim;
    let kv_dim = shape.num_kv_heads * d;
    let group = shape.num_heads / shape.num_kv_heads;
    blocks.fill_starts(&mut scratch.starts, kv_dim, (head / group) * d);
    let n = scratch.starts.len();
    let heads = q.len() / d;
    scratch.scores.clear();
    scratch.scores.resize(heads * n, 0.0);
    for (h, qh) in q.chunks_exact(d).enumerate() {
        simd::scaled_dots(&mut scratch.scores[h * n..(h + 1) * n], qh, shape.scale, keys, &scratch.starts);
    }
    for scores in scratch.scores.chunks_exact_mut(n.max(1)) {
        softmax(scores);
    }
    simd::weighted_sum_heads(acc, d, &scratch.scores, n, values, &scratch.starts);
}

/// A task's queries: rows `rows` of sequence `seq`, query heads
/// `head..head + heads` (all of one KV head, or one head), in `q` of rows
/// `width` apart.
struct QueryChunk<'a> {
    q: &'a [f32],
    width: usize,
    head: usize,
    heads: usize,
    rows: std::ops::Range<usize>,
    seq: usize,
}

/// Bytes of scores a pass of [`attend_chunk`] keeps (a few queries' worth,
/// in the L2).
/// (Small in unit tests, so that short sequences take several passes.)
const SCORE_BYTES: usize = if cfg!(test) { 8 << 10 } else { 512 << 10 };

/// [`attend`] for every query of `chunk` whose keys start at position 0,
/// with the same bits: the scores of several queries and heads at a time
/// ([`simd::scaled_dots_many`], each key row read once for up to six
/// query vectors), over the keys of the chunk's last position (a query's
/// later keys are scored and left unread), then each query's softmax and
/// weighted sum over its own positions. `write(t, out)` takes row t's heads.
#[allow(clippy::too_many_arguments)]
fn attend_chunk<T: KvElement>(
    chunk: &QueryChunk<'_>,
    layout: &StepLayout,
    keys: &[T],
    values: &[T],
    shape: HeadShape,
    scratch: &mut Scratch,
    acc: &mut [f32],
    write: impl Fn(usize, &[f32]),
) {
    let d = shape.head_dim;
    let kv_dim = shape.num_kv_heads * d;
    let group = shape.num_heads / shape.num_kv_heads;
    let positions = chunk.rows.clone().map(|t| layout.positions[t] + 1).max().unwrap_or(0);
    let blocks = KeyBlocks { table: layout.table(chunk.seq), block_size: layout.block_size, first: 0, positions };
    blocks.fill_starts(&mut scratch.starts, kv_dim, (chunk.head / group) * d);
    let n = scratch.starts.len();
    let per_pass = (SCORE_BYTES / (4 * chunk.heads * n.max(1))).clamp(1, chunk.rows.len().max(1));
    let rows: Vec<usize> = chunk.rows.clone().collect();
    for pass in rows.chunks(per_pass) {
        let qs: Vec<&[f32]> = pass
            .iter()
            .flat_map(|&t| (0..chunk.heads).map(move |i| t * chunk.width + (chunk.head + i) * d))
            .map(|at| &chunk.q[at..at + d])
            .collect();
        // Every score of the pass is written below: no need to clear them.
        if scratch.scores.len() < qs.len() * n {
            scratch.scores.resize(qs.len() * n, 0.0);
        }
        simd::scaled_dots_many(&mut scratch.scores, n, &qs, shape.scale, keys, &scratch.starts);
        // The query's own keys: the first positions[t] + 1 (never more than n).
        let own = |t: usize| (layout.positions[t] + 1).min(n);
        for (i, &t) in pass.iter().enumerate() {
            for head in scratch.scores[i * chunk.heads * n..(i + 1) * chunk.heads * n].chunks_exact_mut(n.max(1)) {
                softmax(&mut head[..own(t)]);
            }
        }
        if simd::sums_onto_in_registers(d) {
            sum_values_in_blocks(pass, own, chunk.heads, d, n, values, scratch, &write);
            continue;
        }
        for (i, &t) in pass.iter().enumerate() {
            let scores = &scratch.scores[i * chunk.heads * n..(i + 1) * chunk.heads * n];
            simd::weighted_sum_heads(acc, d, scores, n, values, &scratch.starts[..own(t)]);
            write(t, acc);
        }
    }
}

/// Bytes of value rows per block of [`sum_values_in_blocks`] (within the
/// L1; small in unit tests, so that short sequences take several blocks).
const VALUE_BLOCK_BYTES: usize = if cfg!(test) { 1 << 10 } else { 16 << 10 };

/// Each query of `pass` (its softmaxed scores in `scratch.scores`, `n` per
/// head) times its own value rows (`own(t)` of them), `heads` heads of
/// `d`: a block of rows at a time for all the queries (each block read from
/// the L1 by all of them), the sums continued across blocks
/// ([`simd::weighted_sum_heads_onto`]: the bits of one sum per query).
#[allow(clippy::too_many_arguments)]
fn sum_values_in_blocks<T: KvElement>(
    pass: &[usize],
    own: impl Fn(usize) -> usize,
    heads: usize,
    d: usize,
    n: usize,
    values: &[T],
    scratch: &mut Scratch,
    write: &impl Fn(usize, &[f32]),
) {
    let width = heads * d;
    scratch.sums.clear();
    scratch.sums.resize(pass.len() * width, 0.0);
    let longest = pass.iter().map(|&t| own(t)).max().unwrap_or(0);
    let block = (VALUE_BLOCK_BYTES / (d * std::mem::size_of::<T>()).max(1)).max(1);
    for from in (0..longest).step_by(block) {
        for (i, &t) in pass.iter().enumerate() {
            let to = (from + block).min(own(t));
            if to > from {
                let weights = &scratch.scores[i * heads * n + from..];
                simd::weighted_sum_heads_onto(&mut scratch.sums[i * width..(i + 1) * width], d, weights, n, values, &scratch.starts[from..to]);
            }
        }
    }
    for (i, &t) in pass.iter().enumerate() {
        write(t, &scratch.sums[i * width..(i + 1) * width]);
    }
}

/// In-place softmax; 8 lanes wide where the CPU has AVX2, the same bits
/// either way.
fn softmax(scores: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::use_avx2() {
        // SAFETY: AVX2 was detected.
        unsafe { softmax_avx2(scores) };
        return;
    }
    softmax_lanes(scores);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_avx2(scores: &mut [f32]) {
    softmax_lanes(scores);
}

/// [`softmax`] with the maximum and the sum taken in 8 lanes (lane `l` over
/// every eighth score, the lanes summed pairwise, then the rest in order),
/// so every loop vectorizes.
#[inline(always)]
fn softmax_lanes(scores: &mut [f32]) {
    let full = scores.len() / 8 * 8;
    let mut lanes = [f32::NEG_INFINITY; 8];
    for chunk in scores[..full].chunks_exact(8) {
        for (m, &s) in lanes.iter_mut().zip(chunk) {
            *m = if s > *m { s } else { *m };
        }
    }
    let max = lanes.iter().chain(&scores[full..]).fold(f32::NEG_INFINITY, |m, &s| if s > m { s } else { m });
    for s in scores.iter_mut() {
        *s = simd::fast_exp(*s - max);
    }
    let mut sums = [0f32; 8];
    for chunk in scores[..full].chunks_exact(8) {
        for (a, &s) in sums.iter_mut().zip(chunk) {
            *a += s;
        }
    }
    let mut sum = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
    for &s in &scores[full..] {
        sum += s;
    }
    let inv = 1.0 / sum;
    for s in scores.iter_mut() {
        *s *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(first: usize, positions: usize) -> Vec<usize> {
        let mut out = Vec::new();
        KeyBlocks { table: &[5, 2, 9], block_size: 4, first, positions }.fill_starts(&mut out, 1, 0);
        out
    }

    #[test]
    fn key_slots_follow_the_block_table() {
        assert_eq!(starts(0, 5), vec![20, 21, 22, 23, 8], "block 5 whole, then the first slot of block 2");
        assert_eq!(starts(0, 12), vec![20, 21, 22, 23, 8, 9, 10, 11, 36, 37, 38, 39]);
    }

    /// A layout of one sequence whose new rows are at `positions` (16 slots
    /// per block, the blocks in reverse order).
    fn layout(positions: std::ops::Range<usize>, blocks: usize) -> StepLayout {
        let rows = positions.len();
        StepLayout {
            ids: vec![0; rows],
            positions: positions.clone().collect(),
            slots: vec![0; rows],
            tables: (0..blocks as i32).rev().collect(),
            max_blocks: blocks,
            q_starts: vec![0, rows as i32],
            start_pos: vec![positions.start as i32],
            seq_of: vec![0; rows],
            decode_seqs: 0,
            rows: Vec::new(),
            ranges: std::iter::once(0..0).collect(),
            block_size: 16,
        }
    }

    #[test]
    fn chunks_of_queries_give_the_bits_of_each_query_alone() {
        use crate::kv::KvDtype;
        let shape = HeadShape { num_heads: 12, num_kv_heads: 4, head_dim: 16, scale: 0.25 };
        let (kv_dim, width, positions): (usize, usize, usize) = (4 * 16, 12 * 16, 300);
        let blocks = positions.div_ceil(16);
        let value = |i: usize| (((i * 37 + 11) % 101) as f32 - 50.0) / 23.0;
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut kv = KvPool::new(1, blocks, 16, kv_dim, dtype);
            let table: Vec<i32> = (0..blocks as i32).rev().collect();
            for pos in 0..positions {
                let slot = table[pos / 16] as usize * 16 + pos % 16;
                let key: Vec<f32> = (0..kv_dim).map(|i| value(pos * kv_dim + i)).collect();
                let val: Vec<f32> = (0..kv_dim).map(|i| value(pos * kv_dim + i + 7)).collect();
                kv.write(0, slot, &key, &val);
            }
            // 40 queries, the last at the last position: three chunks, some of 16.
            let rows = positions - 40..positions;
            let q: Vec<f32> = (0..rows.len() * width).map(|i| value(i + 3) * 0.5).collect();
            // Together on two threads (the heads of a KV head grouped, whatever
            // this machine's thread count); alone on three: four tasks of a KV
            // head each do not split evenly, so each query takes one head at a
            // time (`attend`).
            let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().expect("a pool of three threads");
            let two = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool of two threads");
            // A window of 280 leaves the first chunk (260..276) whole and cuts
            // the others, which then take one query at a time.
            for window in [None, Some(280)] {
                let mut together = vec![f32::NAN; rows.len() * width];
                two.install(|| paged_attention(&q, &mut together, &kv, 0, &layout(rows.clone(), blocks), shape, window));
                for (i, pos) in rows.clone().enumerate() {
                    let mut alone = vec![f32::NAN; width];
                    let one = layout(pos..pos + 1, blocks);
                    assert_eq!(three.install(|| heads_per_task(&one, shape)), 1, "the reference takes a head at a time");
                    assert_eq!(two.install(|| heads_per_task(&one, shape)), 3, "two threads share four grouped tasks evenly");
                    three.install(|| paged_attention(&q[i * width..(i + 1) * width], &mut alone, &kv, 0, &one, shape, window));
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&together[i * width..(i + 1) * width]), bits(&alone), "{dtype:?}, window {window:?}: query at {pos}");
                }
            }
        }
    }

    #[test]
    fn softmax_sums_to_one_and_is_the_same_on_every_path() {
        for n in [1usize, 5, 8, 13, 64, 130] {
            let scores: Vec<f32> = (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.9).collect();
            let (mut a, mut b) = (scores.clone(), scores.clone());
            softmax(&mut a);
            softmax_lanes(&mut b);
            assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "n {n}");
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, |m, s| m.max(f64::from(s)));
            let total: f64 = scores.iter().map(|&s| (f64::from(s) - max).exp()).sum();
            for (&p, &s) in a.iter().zip(&scores) {
                let want = (f64::from(s) - max).exp() / total;
                assert!((f64::from(p) - want).abs() < 1e-6, "n {n}: {p} vs {want}");
            }
        }
    }

    #[test]
    fn a_window_skips_the_positions_before_it_and_whole_blocks() {
        // Positions 6..11: the last two of block 2, then three of block 9; block 5 is never read.
        assert_eq!(starts(6, 11), vec![10, 11, 36, 37, 38]);
        assert_eq!(starts(8, 9), vec![36], "one position, in the third block");
        assert_eq!(starts(0, 0), Vec::<usize>::new());
    }
}
