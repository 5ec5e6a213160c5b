//! CUDA graphs for decode steps. A step of single-token sequences (at most
//! 256, contexts within 8192 tokens) is padded up to a batch bucket (1, 2,
//! 4, …, 256) and a context bucket (a power of two of blocks), and replays
//! a graph captured once per bucket pair: one launch instead of a dozen per
//! layer. Each batch bucket owns static buffers (activations, index arrays,
//! split-K scratch, logits) that the graph's kernels were captured with; a
//! step copies its inputs into them and launches. Padding rows write no
//! cache slot (slot -1) and attend to one position. Turned off by
//! [`super::CudaSwitches::cuda_graphs`], and for good if a capture fails
//! (the step then runs eagerly, and the log says why).

use super::attention::{GraphAttention, StepAttention};
use super::{CudaBackend, CudaStep, LogitRows};
use crate::backend::{PassFn, StepLayout as Plan, Workspace};
use crate::error::{EngineError, Result};
use crate::model::ops::Rope;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{CudaGraph, CudaSlice};
use spindle_kernels::device::{DecodeShape, Gpu};
use std::collections::HashMap;

/// Batch sizes decode graphs are captured at.
const BATCH_BUCKETS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];
/// The longest context a graphed step attends over.
const MAX_GRAPH_CONTEXT: usize = 8192;

/// Decode graphs and their buffers, per batch bucket.
pub(super) struct DecodeGraphs {
    enabled: bool,
    buckets: Vec<Option<Bucket>>,
}

impl std::fmt::Debug for DecodeGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let captured: usize = self.buckets.iter().flatten().map(|b| b.graphs.len()).sum();
        f.debug_struct("DecodeGraphs").field("enabled", &self.enabled).field("captured", &captured).finish()
    }
}

/// One batch bucket's static buffers (activations and logits in `ws`,
/// inputs and attention tables in `step`) and its graphs by context bucket.
struct Bucket {
    size: usize,
    ws: Workspace<CudaBackend>,
    step: CudaStep,
    graphs: HashMap<usize, OwnedGraph>,
}

/// A captured graph, owned by one model.
struct OwnedGraph(CudaGraph);

// SAFETY: a graph is only touched through its model, which one thread owns
// at a time (`&mut` access); CUDA forbids concurrent use of a graph, not
// moving it between threads, and launching binds the context first.
unsafe impl Send for OwnedGraph {}

impl DecodeGraphs {
    /// Graphs on or off from the start.
    pub(super) fn new(enabled: bool) -> Self {
        Self { enabled, buckets: (0..BATCH_BUCKETS.len()).map(|_| None).collect() }
    }

    /// Graphs captured so far.
    pub(super) fn captured(&self) -> usize {
        self.buckets.iter().flatten().map(|b| b.graphs.len()).sum()
    }

    /// Drops every graph and buffer (they were made for a cache that is gone).
    pub(super) fn reset(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = None);
    }

    /// Turns graphs on or off (off drops every graph and buffer).
    pub(super) fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        if !on {
            self.buckets.iter_mut().for_each(|b| *b = None);
        }
    }
}

/// The bucket index for `n` sequences.
fn batch_bucket(n: usize) -> Option<usize> {
    BATCH_BUCKETS.iter().position(|&b| b >= n)
}

/// Table width (blocks of `block_size`) of [`MAX_GRAPH_CONTEXT`].
fn max_graph_blocks(block_size: usize) -> usize {
    MAX_GRAPH_CONTEXT.div_ceil(block_size)
}

/// Whether `p` (blocks of `block_size`) is a step a decode graph runs: graphs
/// on, and 1 to 256 sequences of one token each within the graphs' context.
fn graph_step(enabled: bool, p: &Plan, block_size: usize) -> bool {
    let n = p.start_pos.len();
    enabled && n > 0 && p.decode_seqs == n && batch_bucket(n).is_some() && p.max_blocks <= max_graph_blocks(block_size)
}

/// The context bucket (blocks per table row) for tables of `max_blocks`
/// blocks of `block_size`: the next power of two, at least 256 tokens'
/// worth, at most [`max_graph_blocks`].
fn context_bucket(max_blocks: usize, block_size: usize) -> usize {
    max_blocks.max(1).next_power_of_two().max(256_usize.div_ceil(block_size)).min(max_graph_blocks(block_size))
}

impl CudaBackend {
    fn max_graph_blocks(&self) -> usize {
        max_graph_blocks(self.block_size)
    }

    /// Whether `p` is a step a decode graph runs.
    pub(super) fn graph_eligible(&self, p: &Plan) -> bool {
        graph_step(self.graphs.enabled, p, self.block_size)
    }

    /// Runs the decode step `p` through its graph (capturing it first if
    /// need be) and hands its logits (rows = the step's tokens) to `finish`.
    /// On a capture failure graphs are turned off and `None` comes back, so
    /// the caller runs the step eagerly.
    pub(super) fn run_graph<R>(&mut self, p: &Plan, rope: &Rope, pass: &mut PassFn<'_, Self>, finish: impl FnOnce(&Gpu, &mut CudaSlice<f32>) -> Result<R>) -> Result<Option<R>> {
        let Some(index) = batch_bucket(p.start_pos.len()) else { return Ok(None) };
        let mut bucket = match self.graphs.buckets[index].take() {
            Some(b) => b,
            None => match self.new_bucket(BATCH_BUCKETS[index]) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!("no memory for a CUDA graph bucket, decode steps run without graphs from now on: {e}");
                    self.graphs.set_enabled(false);
                    return Ok(None);
                }
            },
        };
        let blocks = self.blocks_bucket(p.max_blocks);
        let result = self.replay(&mut bucket, p, rope, blocks, pass);
        let out = match result {
            Ok(true) => finish(&self.gpu, &mut bucket.ws.logits).map(Some),
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        };
        if self.graphs.enabled {
            self.graphs.buckets[index] = Some(bucket);
        }
        out
    }

    /// The context bucket (blocks per table row) for tables of `max_blocks`.
    fn blocks_bucket(&self, max_blocks: usize) -> usize {
        context_bucket(max_blocks, self.block_size)
    }

    /// The decode attention geometry of a bucket of `size` rows at `blocks`.
    fn graph_shape(&self, size: usize, blocks: usize) -> DecodeShape {
        let c = &self.config;
        DecodeShape {
            seqs: size,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: self.block_size,
            max_blocks: blocks,
            max_context: blocks * self.block_size,
        }
    }

    fn new_bucket(&self, size: usize) -> Result<Bucket> {
        let c = &self.config;
        let s = &self.gpu.stream;
        let cap_blocks = self.max_graph_blocks();
        let half = c.head_dim / 2;
        // Scratch for the context bucket that needs the most partials.
        let mut partials = 0;
        let mut blocks = self.blocks_bucket(1);
        loop {
            partials = partials.max(self.graph_shape(size, blocks).scratch_partials());
            if blocks >= cap_blocks {
                break;
            }
            blocks = self.blocks_bucket(blocks * 2);
        }
        let attention = GraphAttention {
            shape: self.graph_shape(size, self.blocks_bucket(1)),
            tables: s.alloc_zeros(size * cap_blocks)?,
            context: s.alloc_zeros(size)?,
            scratch: self.gpu.decode_scratch_for(partials, c.head_dim)?,
            scale: c.attention_scale(),
        };
        let local = match self.local_rope {
            Some(_) => Some((s.alloc_zeros(size * half)?, s.alloc_zeros(size * half)?)),
            None => None,
        };
        let step = CudaStep {
            ids: s.alloc_zeros(size)?,
            slots: s.alloc_zeros(size)?,
            cos: s.alloc_zeros(size * half)?,
            sin: s.alloc_zeros(size * half)?,
            local,
            attention: StepAttention::Graph(attention),
            logit_rows: LogitRows::All(size),
        };
        Ok(Bucket { size, ws: Workspace::new(self, c, size, size)?, step, graphs: HashMap::new() })
    }

    /// Copies `p`'s inputs into the bucket (padded) and launches the graph
    /// for `blocks`. `Ok(false)`: the capture failed and graphs are now off.
    fn replay(&mut self, bucket: &mut Bucket, p: &Plan, rope: &Rope, blocks: usize, pass: &mut PassFn<'_, Self>) -> Result<bool> {
        self.fill(bucket, p, rope, blocks)?;
        if !bucket.graphs.contains_key(&blocks) {
            match self.capture(bucket, blocks, pass) {
                Ok(graph) => {
                    bucket.graphs.insert(blocks, OwnedGraph(graph));
                }
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed, decode steps run without graphs from now on: {e}");
                    self.graphs.set_enabled(false);
                    return Ok(false);
                }
            }
        }
        let graph = bucket.graphs.get(&blocks).ok_or_else(|| EngineError::Backend("decode graph missing after capture".into()))?;
        graph.0.launch()?;
        Ok(true)
    }

    /// The step's inputs, padded to the bucket (see [`Padded`]).
    fn fill(&self, bucket: &mut Bucket, p: &Plan, rope: &Rope, blocks: usize) -> Result<()> {
        let s = &self.gpu.stream;
        let padded = Padded::new(p, bucket.size, blocks);
        let angles = rope.angles(&padded.positions);
        let step = &mut bucket.step;
        s.memcpy_htod(&padded.ids, &mut step.ids)?;
        s.memcpy_htod(&padded.slots, &mut step.slots)?;
        s.memcpy_htod(angles.cos(), &mut step.cos)?;
        s.memcpy_htod(angles.sin(), &mut step.sin)?;
        if let Some((cos, sin)) = &mut step.local {
            self.local_angles(&padded.positions, |a| {
                s.memcpy_htod(a.cos(), cos)?;
                Ok(s.memcpy_htod(a.sin(), sin)?)
            })?;
        }
        if let StepAttention::Graph(a) = &mut step.attention {
            s.memcpy_htod(&padded.tables, &mut a.tables)?;
            s.memcpy_htod(&padded.context, &mut a.context)?;
        }
        Ok(())
    }

    /// The bucket's whole step (layers, final norm, output head) at
    /// `blocks`: the launches a graph records (allocating nothing).
    fn graph_pass(&mut self, bucket: &mut Bucket, blocks: usize, pass: &mut PassFn<'_, Self>) -> Result<()> {
        let shape = self.graph_shape(bucket.size, blocks);
        if let StepAttention::Graph(a) = &mut bucket.step.attention {
            a.shape = shape;
        }
        pass(self, &mut bucket.ws, &bucket.step, bucket.size)
    }

    /// Records [`Self::graph_pass`] into a graph, after running it once
    /// eagerly on the same buffers (so that libraries finish their first-use
    /// set-up outside the capture; the replay rewrites the same cache slots).
    fn capture(&mut self, bucket: &mut Bucket, blocks: usize, pass: &mut PassFn<'_, Self>) -> Result<CudaGraph> {
        self.graph_pass(bucket, blocks, pass)?;
        let stream = self.gpu.stream.clone();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let run = self.graph_pass(bucket, blocks, pass);
        // The capture must end whatever happened inside it.
        let graph = match stream.end_capture(CUgraphInstantiate_flags(0)) {
            Ok(g) => g,
            Err(e) => {
                // cudarc reports a stored error before ending the capture; end it for certain.
                if stream.capture_status().is_ok_and(|s| s != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE) {
                    // SAFETY: our stream, capturing on this thread; the partial graph is discarded.
                    if let Ok(g) = unsafe { cudarc::driver::result::stream::end_capture(stream.cu_stream()) } {
                        // SAFETY: a graph this call owns, never instantiated.
                        let _ = unsafe { cudarc::driver::result::graph::destroy(g) };
                    }
                }
                run?;
                return Err(e.into());
            }
        };
        run?;
        graph.ok_or_else(|| EngineError::Backend("stream capture produced no graph".into()))
    }
}

/// A decode step's host arrays padded to `size` rows and tables `blocks`
/// wide: padding rows have id 0, slot -1 (nothing written), position 0,
/// a table of zeros and a context of 1.
#[derive(Debug, PartialEq)]
struct Padded {
    ids: Vec<u32>,
    slots: Vec<i64>,
    positions: Vec<usize>,
    tables: Vec<i32>,
    context: Vec<i32>,
}

impl Padded {
    fn new(p: &Plan, size: usize, blocks: usize) -> Self {
        let n = p.ids.len();
        let mut ids = p.ids.clone();
        ids.resize(size, 0);
        let mut slots = p.slots.clone();
        slots.resize(size, -1);
        let mut positions = p.positions.clone();
        positions.resize(size, 0);
        let mut tables = vec![0i32; size * blocks];
        for row in 0..n {
            let seq = p.seq_of[row];
            let src = &p.tables[seq * p.max_blocks..(seq + 1) * p.max_blocks];
            tables[row * blocks..row * blocks + p.max_blocks].copy_from_slice(src);
        }
        let mut context: Vec<i32> = p.positions.iter().map(|&pos| (pos + 1) as i32).collect();
        context.resize(size, 1);
        Self { ids, slots, positions, tables, context }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_and_stop_at_256() {
        assert_eq!(batch_bucket(1), Some(0));
        assert_eq!(BATCH_BUCKETS[batch_bucket(3).unwrap_or(0)], 4);
        assert_eq!(BATCH_BUCKETS[batch_bucket(129).unwrap_or(0)], 256);
        assert_eq!(batch_bucket(257), None);
    }

    #[test]
    fn padding_rows_write_nothing_and_attend_to_one_position() {
        let p = Plan::for_test(vec![7, 9], vec![3, 20], vec![35, 330], vec![1, 2, 4, 5], 2);
        let padded = Padded::new(&p, 4, 4);
        assert_eq!(padded.ids, vec![7, 9, 0, 0]);
        assert_eq!(padded.slots, vec![35, 330, -1, -1]);
        assert_eq!(padded.positions, vec![3, 20, 0, 0]);
        assert_eq!(padded.tables, vec![1, 2, 0, 0, 4, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(padded.context, vec![4, 21, 1, 1]);
    }

    /// A decode step of `n` sequences with tables `max_blocks` wide.
    fn decode_step(n: usize, max_blocks: usize) -> Plan {
        Plan::for_test(vec![1; n], vec![0; n], vec![0; n], vec![0; n * max_blocks], max_blocks)
    }

    #[test]
    fn only_enabled_decode_steps_of_1_to_256_sequences_within_the_context_take_a_graph() {
        // 8192 tokens in blocks of 16: 512 blocks at most.
        assert!(graph_step(true, &decode_step(1, 1), 16));
        assert!(graph_step(true, &decode_step(256, 512), 16));
        assert!(!graph_step(false, &decode_step(1, 1), 16), "graphs off");
        assert!(!graph_step(true, &decode_step(0, 1), 16), "an empty step");
        assert!(!graph_step(true, &decode_step(257, 1), 16), "over the largest batch bucket");
        assert!(!graph_step(true, &decode_step(4, 513), 16), "tables past the graphs' context");
        assert!(graph_step(true, &decode_step(4, 256), 32), "256 blocks of 32 is the whole context");
        assert!(!graph_step(true, &decode_step(4, 257), 32));
        let mut prefill = decode_step(2, 1);
        prefill.decode_seqs = 1;
        assert!(!graph_step(true, &prefill, 16), "a sequence with several new tokens");
    }

    #[test]
    fn context_buckets_are_powers_of_two_from_256_tokens_up_to_the_graph_context() {
        // Blocks of 16: at least 16 blocks (256 tokens), at most 512 (8192 tokens).
        assert_eq!(context_bucket(0, 16), 16);
        assert_eq!(context_bucket(3, 16), 16);
        assert_eq!(context_bucket(17, 16), 32);
        assert_eq!(context_bucket(300, 16), 512);
        assert_eq!(context_bucket(512, 16), 512);
        // Blocks of 48 (not a power of two): 6 blocks for 256 tokens, then 8; capped at 171 = ⌈8192 / 48⌉.
        assert_eq!(context_bucket(1, 48), 6);
        assert_eq!(context_bucket(7, 48), 8);
        assert_eq!(context_bucket(150, 48), 171);
        assert_eq!(max_graph_blocks(48), 171);
    }
}
