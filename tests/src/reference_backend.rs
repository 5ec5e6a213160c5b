//! A deliberately simple [`Backend`]: plain f32 loops, weights dequantized
//! to f32 at load, a KV cache of one `Vec` per layer, attention written out
//! position by position, nothing parallel and nothing fused. It shares no
//! op with the CPU backend, so the same logits from both prove the seam:
//! that the generic layer loop asks every backend for the same math over
//! the same [`StepLayout`] (the loop itself is checked against the numpy
//! reference by `tiny_models_reference.rs` and `engine/tests/smollm2_reference.rs`).

use spindle_engine::backend::{Backend, DeviceSampling, KvGeometry, KvSize, LinearJob, PassFn, Presampled, StepLayout, StepLogits, Workspace};
use spindle_engine::batch::ForwardBatch;
use spindle_engine::config::{ModelConfig, RopeStyle};
use spindle_engine::model::linear::tensor_to_f32;
use spindle_engine::model::ops::Rope;
use spindle_engine::weights::TensorView;
use spindle_engine::{EngineError, Result};

/// A linear layer: `[rows, cols]` f32 and its bias.
pub struct RefLinear {
    w: Vec<f32>,
    bias: Option<Vec<f32>>,
    rows: usize,
    cols: usize,
}

/// One step: its layout and each row's RoPE angles.
pub struct RefStep {
    layout: StepLayout,
    /// Per row, per frequency: (cos, sin).
    angles: Vec<Vec<(f32, f32)>>,
}

/// The reference backend (see the module doc).
#[derive(Default)]
pub struct ReferenceBackend {
    /// Load linear layers without their biases (a broken backend, to show
    /// that a comparison notices).
    pub drop_biases: bool,
    config: Option<ModelConfig>,
    block_size: usize,
    num_blocks: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl ReferenceBackend {
    /// A backend that loads linear layers without their biases.
    pub fn dropping_biases() -> Self {
        Self { drop_biases: true, ..Self::default() }
    }

    fn config(&self) -> Result<&ModelConfig> {
        self.config.as_ref().ok_or_else(|| EngineError::Backend("no KV cache yet".into()))
    }
}

impl Backend for ReferenceBackend {
    type Tensor = Vec<f32>;
    type Weight = RefLinear;
    type Vector = Vec<f32>;
    type Logits = Vec<f32>;
    type Step = RefStep;

    fn describe(&self) -> String {
        "reference (plain f32 loops)".into()
    }

    fn load_linear(&self, t: &TensorView<'_>, rows: usize, cols: usize, bias: Option<Vec<f32>>) -> Result<RefLinear> {
        t.expect_shape(&[rows, cols])?;
        Ok(RefLinear { w: tensor_to_f32(t)?, bias: bias.filter(|_| !self.drop_biases), rows, cols })
    }

    fn load_vector(&self, values: Vec<f32>) -> Result<Vec<f32>> {
        Ok(values)
    }

    fn weight_bytes(&self, w: &RefLinear) -> usize {
        w.w.len() * 4
    }

    fn allocate_kv(&mut self, c: &ModelConfig, size: KvSize, block_size: usize) -> Result<KvGeometry> {
        let KvSize::Blocks(n) = size else { return Err(EngineError::Backend("the reference backend takes a block count".into())) };
        self.keys = vec![vec![0.0; n * block_size * c.kv_dim()]; c.num_layers];
        self.values = self.keys.clone();
        (self.block_size, self.num_blocks, self.config) = (block_size, n, Some(c.clone()));
        Ok(self.kv_geometry())
    }

    fn kv_geometry(&self) -> KvGeometry {
        let kv_dim = self.config.as_ref().map_or(0, ModelConfig::kv_dim);
        KvGeometry { block_size: self.block_size, num_blocks: self.num_blocks, bytes_per_block: 2 * self.keys.len() * self.block_size * kv_dim * 4 }
    }

    fn tensor(&self, rows: usize, width: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; rows * width])
    }

    fn logits_buffer(&self, rows: usize, vocab: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; rows * vocab])
    }

    fn run_step(&mut self, batch: &ForwardBatch, layout: StepLayout, rope: &Rope, _sampling: DeviceSampling<'_>, pass: &mut PassFn<'_, Self>) -> Result<StepLogits> {
        let c = self.config()?.clone();
        let half = c.head_dim / 2;
        let a = rope.angles(&layout.positions);
        let angles = (0..layout.num_rows()).map(|r| (0..half).map(|i| (a.cos()[r * half + i], a.sin()[r * half + i])).collect()).collect();
        let (rows, logit_rows) = (layout.num_rows(), layout.rows.len());
        let step = RefStep { layout, angles };
        // A fresh workspace every step: simplicity over speed.
        let mut ws = Workspace::new(self, &c, rows, logit_rows)?;
        pass(self, &mut ws, &step, rows)?;
        let logits = step.layout.split_logits(&ws.logits, c.vocab_size);
        Ok(StepLogits { logits, sampled: vec![Presampled::No; batch.seqs.len()] })
    }

    fn embed(&self, out: &mut Vec<f32>, table: &RefLinear, step: &RefStep, rows: usize) -> Result<()> {
        for r in 0..rows {
            let id = step.layout.ids[r] as usize;
            for j in 0..table.cols {
                out[r * table.cols + j] = table.w[id * table.cols + j];
            }
        }
        Ok(())
    }

    fn add_rms_norm(&self, out: &mut Vec<f32>, residual: Option<&mut Vec<f32>>, x: &Vec<f32>, weight: &Vec<f32>, rows: usize, width: usize, eps: f32) -> Result<()> {
        let input: Vec<f32> = match residual {
            Some(r) => {
                for i in 0..rows * width {
                    r[i] += x[i];
                }
                r[..rows * width].to_vec()
            }
            None => x[..rows * width].to_vec(),
        };
        for r in 0..rows {
            let row = &input[r * width..(r + 1) * width];
            let mut sum = 0.0f64;
            for v in row {
                sum += f64::from(*v) * f64::from(*v);
            }
            let inv = 1.0 / ((sum / width as f64) as f32 + eps).sqrt();
            for j in 0..width {
                out[r * width + j] = row[j] * inv * weight[j];
            }
        }
        Ok(())
    }

    fn linear_many(&self, x: &Vec<f32>, rows: usize, jobs: &mut [LinearJob<'_, Self>]) -> Result<()> {
        for (w, out) in jobs.iter_mut() {
            for t in 0..rows {
                for r in 0..w.rows {
                    let mut acc = 0.0f64;
                    for k in 0..w.cols {
                        acc += f64::from(w.w[r * w.cols + k]) * f64::from(x[t * w.cols + k]);
                    }
                    let bias = w.bias.as_ref().map_or(0.0, |b| b[r]);
                    out[t * w.rows + r] = acc as f32 + bias;
                }
            }
        }
        Ok(())
    }

    fn rope(&self, x: &mut Vec<f32>, step: &RefStep, rows: usize, heads: usize) -> Result<()> {
        let c = self.config()?;
        let (d, half) = (c.head_dim, c.head_dim / 2);
        for r in 0..rows {
            for h in 0..heads {
                let base = (r * heads + h) * d;
                for (i, &(cos, sin)) in step.angles[r].iter().enumerate() {
                    let (ia, ib) = match c.rope_style {
                        RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
                        RopeStyle::Neox => (base + i, base + i + half),
                    };
                    let (a, b) = (x[ia], x[ib]);
                    x[ia] = a * cos - b * sin;
                    x[ib] = a * sin + b * cos;
                }
            }
        }
        Ok(())
    }

    fn kv_write(&mut self, layer: usize, k: &Vec<f32>, v: &Vec<f32>, step: &RefStep, rows: usize) -> Result<()> {
        let d = self.config()?.kv_dim();
        for r in 0..rows {
            let slot = step.layout.slots[r] as usize;
            self.keys[layer][slot * d..(slot + 1) * d].copy_from_slice(&k[r * d..(r + 1) * d]);
            self.values[layer][slot * d..(slot + 1) * d].copy_from_slice(&v[r * d..(r + 1) * d]);
        }
        Ok(())
    }

    fn attention(&self, layer: usize, out: &mut Vec<f32>, q: &Vec<f32>, step: &RefStep, rows: usize) -> Result<()> {
        let c = self.config()?;
        let (d, kv_dim) = (c.head_dim, c.kv_dim());
        let group = c.num_heads / c.num_kv_heads;
        let scale = 1.0 / (d as f64).sqrt();
        for r in 0..rows {
            let seq = step.layout.seq_of[r];
            let positions = step.layout.positions[r] + 1;
            for h in 0..c.num_heads {
                let qh = &q[(r * c.num_heads + h) * d..(r * c.num_heads + h + 1) * d];
                let col = (h / group) * d;
                let slots: Vec<usize> = (0..positions).map(|p| step.layout.slot(seq, p)).collect();
                let scores: Vec<f64> = slots
                    .iter()
                    .map(|&s| (0..d).map(|i| f64::from(qh[i]) * f64::from(self.keys[layer][s * kv_dim + col + i])).sum::<f64>() * scale)
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for i in 0..d {
                    let v: f64 = slots.iter().zip(&weights).map(|(&s, w)| w * f64::from(self.values[layer][s * kv_dim + col + i])).sum();
                    out[(r * c.num_heads + h) * d + i] = (v / total) as f32;
                }
            }
        }
        Ok(())
    }

    fn silu_mul(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>, rows: usize, width: usize) -> Result<()> {
        for i in 0..rows * width {
            let g = f64::from(gate[i]);
            out[i] = (g / (1.0 + (-g).exp()) * f64::from(up[i])) as f32;
        }
        Ok(())
    }

    fn logits(&self, out: &mut Vec<f32>, picked: &mut Vec<f32>, hidden: &Vec<f32>, head: &RefLinear, step: &RefStep) -> Result<()> {
        let h = head.cols;
        for (i, &r) in step.layout.rows.iter().enumerate() {
            let r = r as usize;
            picked[i * h..(i + 1) * h].copy_from_slice(&hidden[r * h..(r + 1) * h]);
        }
        self.linear(out, picked, head, step.layout.rows.len())
    }
}
