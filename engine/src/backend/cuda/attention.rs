//! How a step attends on the GPU. Decode sequences (one new token) come
//! first in the step's rows and take split-K decode attention; sequences
//! with several new tokens take the flash-attention prefill kernel over the
//! rest of the rows. Where the prefill kernel cannot run (a head width it
//! does not take, or too little shared memory), every token runs decode
//! attention as its own row with its own causal length.

use super::CudaBackend;
use crate::backend::StepLayout as Plan;
use crate::error::Result;
use cudarc::driver::CudaSlice;
use half::bf16;
use spindle_kernels::device::{DecodeScratch, DecodeShape, Gpu, PrefillShape};

/// How a step attends: eager launches with their own index arrays, or a
/// decode graph bucket's static ones.
pub(crate) enum StepAttention {
    /// An eager step's launches.
    Eager(Attention),
    /// A graph bucket's decode attention.
    Graph(GraphAttention),
}

/// One step's attention launches, their index arrays on the device.
pub(crate) struct Attention {
    decode: Option<Decode>,
    prefill: Option<Prefill>,
    scale: f32,
}

/// Decode attention over a graph bucket's static tables (the shape is set
/// per context bucket before each capture).
pub(crate) struct GraphAttention {
    /// The decode geometry of the current context bucket.
    pub(super) shape: DecodeShape,
    /// Block tables, `[size, max graph blocks]`.
    pub(super) tables: CudaSlice<i32>,
    /// Each row's context length.
    pub(super) context: CudaSlice<i32>,
    /// Split-K partials for the largest context bucket.
    pub(super) scratch: Option<DecodeScratch>,
    /// `1 / √head_dim`.
    pub(super) scale: f32,
}

impl StepAttention {
    /// `out` = attention of `q` over `k` / `v` (which hold this step's keys
    /// and values); every row written once.
    pub(crate) fn run(&self, g: &Gpu, out: &mut CudaSlice<bf16>, q: &CudaSlice<bf16>, k: &CudaSlice<bf16>, v: &CudaSlice<bf16>) -> Result<()> {
        match self {
            Self::Eager(a) => {
                if let Some(d) = &a.decode {
                    g.paged_decode(out, q, k, v, &d.tables, &d.context, d.shape, a.scale)?;
                }
                if let Some(f) = &a.prefill {
                    g.paged_prefill(out, q, k, v, &f.tables, &f.q_starts, &f.start_pos, f.shape, a.scale)?;
                }
            }
            Self::Graph(a) => g.paged_decode_in(out, q, k, v, &a.tables, &a.context, a.shape, a.scale, a.scratch.as_ref())?,
        }
        Ok(())
    }
}

struct Decode {
    shape: DecodeShape,
    tables: CudaSlice<i32>,
    context: CudaSlice<i32>,
}

struct Prefill {
    shape: PrefillShape,
    tables: CudaSlice<i32>,
    q_starts: CudaSlice<i32>,
    start_pos: CudaSlice<i32>,
}

/// The launches for `p`'s step.
pub(super) fn plan(model: &CudaBackend, p: &Plan) -> Result<StepAttention> {
    Ok(StepAttention::Eager(eager(model, p)?))
}

fn eager(model: &CudaBackend, p: &Plan) -> Result<Attention> {
    let c = &model.config;
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    let seqs = p.start_pos.len();
    let prefill_seqs = seqs - p.decode_seqs;
    if prefill_seqs > 0 && !model.gpu.prefill_supported(c.head_dim) {
        // Every token its own decode row.
        let rows: Vec<usize> = (0..p.ids.len()).collect();
        let tables = per_token_tables(p, &rows);
        return Ok(Attention { decode: Some(decode(model, p, &rows, &tables)?), prefill: None, scale });
    }
    // Decode sequences have one token each: rows 0..decode_seqs.
    let rows: Vec<usize> = (0..p.decode_seqs).collect();
    let decode = if rows.is_empty() { None } else { Some(decode(model, p, &rows, &p.tables[..p.decode_seqs * p.max_blocks])?) };
    let prefill = if prefill_seqs == 0 {
        None
    } else {
        let first = p.decode_seqs;
        let max_new = p.q_starts[first..].windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        let shape = PrefillShape {
            seqs: prefill_seqs,
            tokens: p.ids.len(),
            max_new,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: model.block_size,
            max_blocks: p.max_blocks,
        };
        let s = &model.gpu.stream;
        Some(Prefill {
            shape,
            tables: s.clone_htod(&p.tables[first * p.max_blocks..])?,
            q_starts: s.clone_htod(&p.q_starts[first..])?,
            start_pos: s.clone_htod(&p.start_pos[first..])?,
        })
    };
    Ok(Attention { decode, prefill, scale })
}

/// Each row's sequence's block table, in row order.
fn per_token_tables(p: &Plan, rows: &[usize]) -> Vec<i32> {
    let mut tables = Vec::with_capacity(rows.len() * p.max_blocks);
    for &row in rows {
        let seq = p.seq_of[row];
        tables.extend_from_slice(&p.tables[seq * p.max_blocks..(seq + 1) * p.max_blocks]);
    }
    tables
}

/// Decode attention over rows `0..rows.len()` (`rows` is that prefix), each
/// attending to its own position and everything before it.
fn decode(model: &CudaBackend, p: &Plan, rows: &[usize], tables: &[i32]) -> Result<Decode> {
    let c = &model.config;
    let context: Vec<i32> = rows.iter().map(|&r| (p.positions[r] + 1) as i32).collect();
    let shape = DecodeShape {
        seqs: rows.len(),
        heads: c.num_heads,
        kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        block_size: model.block_size,
        max_blocks: p.max_blocks,
        max_context: context.iter().copied().max().unwrap_or(1) as usize,
    };
    let s = &model.gpu.stream;
    Ok(Decode { shape, tables: s.clone_htod(tables)?, context: s.clone_htod(&context)? })
}
