//! [`Decoder`]: a model's weights on a backend with the backend's KV cache,
//! running one [`ForwardBatch`] per call through the one layer loop and
//! sampling a token per sequence that asks.

use super::llama::{LlamaModel, LlamaWeights};
use super::ops::Rope;
use super::MatmulPrecision;
use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, DeviceSampling, KvGeometry, KvSize, StepLayout};
use crate::batch::{BlockTable, ForwardBatch, SeqId, StepOutput};
use crate::error::EngineError;
use std::collections::HashMap;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::runner::{sample_outputs_with, Executor, ExecutorInfo};
use crate::sampling::PenaltyBook;

/// A model running on backend `B` (see the module doc).
pub struct Decoder<B: Backend> {
    weights: LlamaWeights<B>,
    backend: B,
    rope: Rope,
    geometry: KvGeometry,
    device_sampling: bool,
    /// Block tables kept across steps, by sequence (see [`BlockTable`]).
    tables: HashMap<SeqId, Vec<u32>>,
    /// Penalty histories kept across steps, by sequence.
    penalties: PenaltyBook,
}

impl<B: Backend> std::fmt::Debug for Decoder<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").field("device", &self.backend.describe()).field("weights", &self.weights).field("kv", &self.geometry).finish()
    }
}

impl<B: Backend> Decoder<B> {
    /// `weights` on `backend` (which loaded them), with a KV cache of `kv`
    /// in blocks of `block_size` tokens.
    pub fn with_backend(weights: LlamaWeights<B>, mut backend: B, kv: KvSize, block_size: usize) -> Result<Self> {
        let geometry = backend.allocate_kv(weights.config(), kv, block_size)?;
        Ok(Self { rope: Rope::new(weights.config()), weights, backend, geometry, device_sampling: true, tables: HashMap::new(), penalties: PenaltyBook::default() })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        self.weights.config()
    }

    /// The KV cache's shape.
    pub fn kv_geometry(&self) -> KvGeometry {
        self.geometry
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, to change its settings.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Bytes of the weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weights.weight_bytes(&self.backend)
    }

    /// Bytes of weights a decode step streams (the layers and the head).
    pub fn streamed_weight_bytes(&self) -> usize {
        self.weights.streamed_bytes(&self.backend)
    }

    /// Bytes of the layers' matrices (what every token multiplies through).
    pub fn layer_weight_bytes(&self) -> usize {
        self.weights.layer_bytes(&self.backend)
    }

    /// Runs the batch and lets the backend sample on the device where device
    /// sampling is on and it can; the rest get their logits back (nothing is
    /// sampled on the host).
    pub fn forward_step(&mut self, batch: &ForwardBatch) -> Result<crate::backend::StepLogits> {
        let (logits, sampled) = self.run(batch, self.device_sampling)?;
        Ok(crate::backend::StepLogits { logits, sampled })
    }

    /// Let the backend sample on the device where it can (the default), or
    /// always sample on the host from copied logits.
    pub fn set_device_sampling(&mut self, on: bool) {
        self.device_sampling = on;
    }

    /// Runs the batch; returns, per sequence, the requested logits
    /// (flattened `[rows, vocab]`). Nothing is sampled.
    pub fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>> {
        Ok(self.run(batch, false)?.0)
    }

    /// Runs one step: every sequence's new tokens through the model, then
    /// sampling for those that asked.
    ///
    /// The step runs on the calling thread, the caller of the CPU
    /// backend's parallel regions ([`crate::pool`]). It no longer runs on a
    /// rayon worker: that woke rayon's other worker every step, a third
    /// busy thread on two cores that kept preempting the pool's.
    pub fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        let device_sampling = self.device_sampling;
        let (logits, sampled) = self.run(batch, device_sampling)?;
        let penalties = self.penalties.for_batch(batch);
        sample_outputs_with(batch, logits, self.config().vocab_size, sampled, &penalties)
    }

    fn run(&mut self, batch: &ForwardBatch, device_sampling: bool) -> Result<(Vec<Vec<f32>>, Vec<crate::backend::Presampled>)> {
        let g = self.geometry;
        self.update_tables(batch)?;
        self.penalties.update(batch)?;
        let Self { weights, backend, rope, tables, penalties, .. } = self;
        let tables: Vec<&[u32]> = batch
            .seqs
            .iter()
            .map(|s| match &s.block_table {
                BlockTable::Full(t) => t.as_slice(),
                BlockTable::Append(_) => tables.get(&s.id).map_or(&[][..], Vec::as_slice),
            })
            .collect();
        let layout = StepLayout::new(weights.config(), g.block_size, g.num_blocks, batch, &tables)?;
        let counts = penalties.for_batch(batch);
        let sampling = DeviceSampling { enabled: device_sampling, penalties: &counts };
        let weights = &*weights;
        let mut pass = |b: &mut B, ws: &mut crate::backend::Workspace<B>, step: &B::Step, rows: usize| weights.pass(b, ws, step, rows);
        let out = backend.run_step(batch, layout, rope, sampling, &mut pass)?;
        Ok((out.logits, out.sampled))
    }
}

impl<B: Backend> Decoder<B> {
    /// Keeps whole tables and applies appended blocks.
    fn update_tables(&mut self, batch: &ForwardBatch) -> Result<()> {
        for seq in &batch.seqs {
            match &seq.block_table {
                BlockTable::Full(t) => {
                    let kept = self.tables.entry(seq.id).or_default();
                    kept.clear();
                    kept.extend_from_slice(t);
                }
                BlockTable::Append(new) => self
                    .tables
                    .get_mut(&seq.id)
                    .ok_or_else(|| EngineError::InvalidBatch(format!("sequence {} appends blocks to a table this executor does not hold", seq.id)))?
                    .extend_from_slice(new),
            }
        }
        Ok(())
    }

    /// Forgets the tables and penalty histories of `ids`.
    pub fn release(&mut self, ids: &[SeqId]) {
        for id in ids {
            self.tables.remove(id);
        }
        self.penalties.release(ids);
    }

    /// Sequences whose tables are kept.
    pub fn kept_tables(&self) -> usize {
        self.tables.len()
    }

}

impl<B: Backend + 'static> Executor for Decoder<B> {
    fn release(&mut self, ids: &[SeqId]) {
        Decoder::release(self, ids);
    }

    fn execute(&mut self, batch: &ForwardBatch) -> Result<StepOutput> {
        Decoder::execute(self, batch)
    }

    fn reserve(&mut self, rows: usize, logit_rows: usize) -> Result<()> {
        self.backend.reserve_workspace(rows, logit_rows)
    }

    fn context_length(&self) -> usize {
        self.config().context_length
    }

    fn kv_geometry(&self) -> KvGeometry {
        self.geometry
    }

    fn info(&self) -> ExecutorInfo {
        ExecutorInfo { device: self.backend.describe(), weight_bytes: self.weight_bytes() }
    }

    fn telemetry(&self) -> Option<std::sync::Arc<dyn crate::backend::DeviceTelemetry>> {
        self.backend.telemetry()
    }
}

/// The CPU model runner: a [`LlamaModel`] with its KV pool.
pub type ModelRunner = Decoder<CpuBackend>;

impl Decoder<CpuBackend> {
    /// A CPU runner with a pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(model: LlamaModel, num_blocks: usize, block_size: usize) -> Self {
        let (weights, precision) = model.into_parts();
        let mut backend = CpuBackend::new(precision);
        let geometry = backend.attach_pool(weights.config(), num_blocks, block_size);
        Self { rope: Rope::new(weights.config()), weights, backend, geometry, device_sampling: true, tables: HashMap::new(), penalties: PenaltyBook::default() }
    }

    /// Choose fast (8-bit activations, f16 KV cache) or exact (f32) mode.
    /// Where the cache's dtype changes, the pool is replaced by an empty one
    /// with the same block count: every cached key and value is gone, so
    /// the saved block tables are dropped too (call it before any sequence).
    pub fn set_precision(&mut self, precision: MatmulPrecision) {
        let before = self.backend.kv_geometry();
        self.backend.set_precision(precision);
        self.geometry = self.backend.kv_geometry();
        if self.geometry != before {
            self.tables.clear();
        }
    }
}
