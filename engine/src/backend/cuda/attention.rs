//! How a step attends on the GPU. Decode sequences (one new token) come
//! first in the step's rows and take split-K decode attention; sequences
//! with several new tokens take the flash-attention prefill kernel over the
//! rest of the rows. Where the prefill kernel cannot run (a head width it
//! does not take, or too little shared memory), every token runs decode
//! attention as its own row with its own causal length.

use super::CudaBackend;
use crate::backend::StepLayout as Plan;
use crate::config::ModelConfig;
use crate::error::Result;
use cudarc::driver::CudaSlice;
use half::bf16;
use spindle_kernels::device::{DecodeKernel, DecodeScratch, DecodeShape, Gpu, PrefillShape};
use std::borrow::Cow;

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
    /// The attention scale (`1 / √head_dim`, or the model's own).
    pub(super) scale: f32,
}

impl StepAttention {
    /// `out` = attention of `q` over `k` / `v` (which hold this step's keys
    /// and values), within `window` positions on a sliding-window layer;
    /// every row written once.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(&self, g: &Gpu, out: &mut CudaSlice<bf16>, q: &CudaSlice<bf16>, k: &CudaSlice<bf16>, v: &CudaSlice<bf16>, window: Option<usize>) -> Result<()> {
        match self {
            Self::Eager(a) => {
                if let Some(d) = &a.decode {
                    g.paged_decode(DecodeKernel::Auto, out, q, k, v, &d.tables, &d.context, d.shape, a.scale, window)?;
                }
                if let Some(f) = &a.prefill {
                    g.paged_prefill(out, q, k, v, &f.tables, &f.q_starts, &f.start_pos, f.shape, a.scale, window)?;
                }
            }
            Self::Graph(a) => g.paged_decode_in(DecodeKernel::Auto, out, q, k, v, &a.tables, &a.context, a.shape, a.scale, window, a.scratch.as_ref())?,
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
    let per_token = per_token_fallback(p, || model.gpu.prefill_supported(c.head_dim));
    let host = HostAttention::new(c, model.block_size, p, per_token);
    let s = &model.gpu.stream;
    let decode = host.decode.map(|d| -> Result<Decode> { Ok(Decode { shape: d.shape, tables: s.clone_htod(d.tables.as_ref())?, context: s.clone_htod(&d.context)? }) });
    let prefill = host.prefill.map(|f| -> Result<Prefill> {
        Ok(Prefill { shape: f.shape, tables: s.clone_htod(f.tables)?, q_starts: s.clone_htod(f.q_starts)?, start_pos: s.clone_htod(f.start_pos)? })
    });
    Ok(Attention { decode: decode.transpose()?, prefill: prefill.transpose()?, scale: c.attention_scale() })
}

/// Whether every token of `p` runs decode attention as its own row: the
/// step has a sequence with several new tokens and the prefill kernel
/// cannot run (`prefill_supported`, asked only then, says no).
fn per_token_fallback(p: &Plan, prefill_supported: impl FnOnce() -> bool) -> bool {
    p.start_pos.len() > p.decode_seqs && !prefill_supported()
}

/// An eager step's attention launches as host arrays, before the upload.
#[derive(Debug, PartialEq)]
struct HostAttention<'a> {
    decode: Option<HostDecode<'a>>,
    prefill: Option<HostPrefill<'a>>,
}

/// Decode attention over rows `0..shape.seqs`.
#[derive(Debug, PartialEq)]
struct HostDecode<'a> {
    shape: DecodeShape,
    /// Each row's block table, `[rows, max_blocks]`.
    tables: Cow<'a, [i32]>,
    /// Each row's context length (its position + 1).
    context: Vec<i32>,
}

/// Prefill attention over the sequences after the decode ones.
#[derive(Debug, PartialEq)]
struct HostPrefill<'a> {
    shape: PrefillShape,
    tables: &'a [i32],
    q_starts: &'a [i32],
    start_pos: &'a [i32],
}

impl<'a> HostAttention<'a> {
    /// `p`'s launches for a model of `c` over blocks of `block_size`: with
    /// `per_token` (see [`per_token_fallback`]) one decode row per token,
    /// else decode rows for the decode sequences and one prefill launch for
    /// the rest.
    fn new(c: &ModelConfig, block_size: usize, p: &'a Plan, per_token: bool) -> Self {
        if per_token {
            let decode = HostDecode::new(c, block_size, p, p.ids.len(), Cow::Owned(per_token_tables(p)));
            return Self { decode: Some(decode), prefill: None };
        }
        // Decode sequences have one token each: rows 0..decode_seqs.
        let rows = p.decode_seqs;
        let decode = (rows > 0).then(|| HostDecode::new(c, block_size, p, rows, Cow::Borrowed(&p.tables[..rows * p.max_blocks])));
        let prefill = (p.start_pos.len() > rows).then(|| HostPrefill::new(c, block_size, p));
        Self { decode, prefill }
    }
}

impl<'a> HostDecode<'a> {
    /// Decode attention over rows `0..rows` of `p`, each attending to its
    /// own position and everything before it through its row of `tables`.
    fn new(c: &ModelConfig, block_size: usize, p: &Plan, rows: usize, tables: Cow<'a, [i32]>) -> Self {
        let context: Vec<i32> = p.positions[..rows].iter().map(|&pos| (pos + 1) as i32).collect();
        let shape = DecodeShape {
            seqs: rows,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size,
            max_blocks: p.max_blocks,
            max_context: context.iter().copied().max().unwrap_or(1) as usize,
        };
        Self { shape, tables, context }
    }
}

impl<'a> HostPrefill<'a> {
    /// Prefill attention over `p`'s sequences after its decode ones.
    fn new(c: &ModelConfig, block_size: usize, p: &'a Plan) -> Self {
        let first = p.decode_seqs;
        let max_new = p.q_starts[first..].windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        let shape = PrefillShape {
            seqs: p.start_pos.len() - first,
            tokens: p.ids.len(),
            max_new,
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size,
            max_blocks: p.max_blocks,
        };
        Self { shape, tables: &p.tables[first * p.max_blocks..], q_starts: &p.q_starts[first..], start_pos: &p.start_pos[first..] }
    }
}

/// Each row's sequence's block table, in row order.
fn per_token_tables(p: &Plan) -> Vec<i32> {
    let mut tables = Vec::with_capacity(p.seq_of.len() * p.max_blocks);
    for &seq in &p.seq_of {
        tables.extend_from_slice(&p.tables[seq * p.max_blocks..(seq + 1) * p.max_blocks]);
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{ForwardBatch, LogitsRequest, SeqInput};
    use std::cell::Cell;

    fn seq(tokens: Vec<u32>, start_pos: usize, table: Vec<u32>) -> SeqInput {
        SeqInput { id: 0, tokens, start_pos, block_table: table.into(), logits: LogitsRequest::None, sampling: None }
    }

    /// The layout of `seqs` (tokens, start, table) on a cache of 8 blocks of 16.
    fn layout(c: &ModelConfig, seqs: Vec<(Vec<u32>, usize, Vec<u32>)>) -> Result<Plan> {
        let tables: Vec<Vec<u32>> = seqs.iter().map(|s| s.2.clone()).collect();
        let batch = ForwardBatch { seqs: seqs.into_iter().map(|(t, p, table)| seq(t, p, table)).collect() };
        let refs: Vec<&[u32]> = tables.iter().map(Vec::as_slice).collect();
        Plan::new(c, 16, 8, &batch, &refs)
    }

    /// Batch order: prefill (3 tokens at 16), decode (at 40), prefill (2 at 0),
    /// decode (at 5). Step order: the two decodes, then the two prefills.
    fn mixed(c: &ModelConfig) -> Result<Plan> {
        layout(c, vec![(vec![1, 2, 3], 16, vec![4, 5]), (vec![7], 40, vec![0, 1, 2]), (vec![8, 9], 0, vec![6]), (vec![10], 5, vec![3])])
    }

    fn decode_shape(seqs: usize, max_context: usize) -> DecodeShape {
        DecodeShape { seqs, heads: 4, kv_heads: 2, head_dim: 16, block_size: 16, max_blocks: 3, max_context }
    }

    #[test]
    fn the_per_token_fallback_is_taken_exactly_when_a_prefill_sequence_meets_an_unsupported_kernel() -> Result<()> {
        let c = super::super::tests::config()?;
        let p = mixed(&c)?;
        assert!(per_token_fallback(&p, || false));
        assert!(!per_token_fallback(&p, || true));
        let prefill_only = layout(&c, vec![(vec![1, 2], 0, vec![0])])?;
        assert!(per_token_fallback(&prefill_only, || false));
        // Decode only: nothing to fall back from, and the device is not asked.
        let decode_only = layout(&c, vec![(vec![1], 3, vec![0]), (vec![2], 20, vec![1, 2])])?;
        let asked = Cell::new(false);
        assert!(!per_token_fallback(&decode_only, || {
            asked.set(true);
            false
        }));
        assert!(!asked.get(), "prefill support is only asked for a step with prefill");
        Ok(())
    }

    #[test]
    fn a_mixed_step_runs_decode_over_the_decode_rows_and_prefill_over_the_rest() -> Result<()> {
        let c = super::super::tests::config()?;
        let p = mixed(&c)?;
        let host = HostAttention::new(&c, 16, &p, false);
        let decode = HostDecode { shape: decode_shape(2, 41), tables: Cow::Borrowed(&[0, 1, 2, 3, 0, 0][..]), context: vec![41, 6] };
        assert_eq!(host.decode, Some(decode));
        let shape = PrefillShape { seqs: 2, tokens: 7, max_new: 3, heads: 4, kv_heads: 2, head_dim: 16, block_size: 16, max_blocks: 3 };
        let prefill = HostPrefill { shape, tables: &[4, 5, 0, 6, 0, 0], q_starts: &[2, 5, 7], start_pos: &[16, 0] };
        assert_eq!(host.prefill, Some(prefill));
        Ok(())
    }

    #[test]
    fn the_fallback_gives_every_token_a_decode_row_with_its_own_table_and_causal_length() -> Result<()> {
        let c = super::super::tests::config()?;
        let p = mixed(&c)?;
        let host = HostAttention::new(&c, 16, &p, true);
        assert_eq!(host.prefill, None, "no prefill launch");
        let tables = vec![0, 1, 2, 3, 0, 0, 4, 5, 0, 4, 5, 0, 4, 5, 0, 6, 0, 0, 6, 0, 0];
        // Rows in step order at positions 40, 5, 16, 17, 18, 0, 1.
        let decode = HostDecode { shape: decode_shape(7, 41), tables: Cow::Owned(tables), context: vec![41, 6, 17, 18, 19, 1, 2] };
        assert_eq!(host.decode, Some(decode));
        Ok(())
    }

    #[test]
    fn steps_of_one_kind_launch_only_that_kind() -> Result<()> {
        let c = super::super::tests::config()?;
        let decode_only = layout(&c, vec![(vec![1], 3, vec![0]), (vec![2], 20, vec![1, 2])])?;
        let host = HostAttention::new(&c, 16, &decode_only, false);
        assert!(host.prefill.is_none());
        assert_eq!(host.decode.map(|d| (d.shape.seqs, d.shape.max_context, d.context)), Some((2, 21, vec![4, 21])));
        let prefill_only = layout(&c, vec![(vec![1, 2], 0, vec![0]), (vec![3, 4, 5, 6], 30, vec![1, 2, 3])])?;
        let host = HostAttention::new(&c, 16, &prefill_only, false);
        assert!(host.decode.is_none());
        assert_eq!(host.prefill.map(|f| (f.shape.seqs, f.shape.tokens, f.shape.max_new, f.q_starts)), Some((2, 6, 4, &[0, 2, 6][..])));
        Ok(())
    }
}
