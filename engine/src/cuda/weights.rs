//! Uploading a model's weights to the GPU as bf16 (any file type is first
//! converted to f32 on the host, one tensor at a time).

use crate::config::{ArchFamily, ModelConfig};
use crate::error::{EngineError, Result};
use crate::model::linear::tensor_to_f32;
use crate::model::llama::Part;
use crate::model::WeightNaming;
use crate::weights::TensorSource;
use cudarc::driver::CudaSlice;
use half::bf16;
use spindle_kernels::device::Gpu;

/// One layer's weights on the GPU (matrices `[out, in]`).
pub(super) struct GpuLayer {
    pub attn_norm: CudaSlice<bf16>,
    pub wq: CudaSlice<bf16>,
    pub wk: CudaSlice<bf16>,
    pub wv: CudaSlice<bf16>,
    pub wo: CudaSlice<bf16>,
    pub q_norm: Option<CudaSlice<bf16>>,
    pub k_norm: Option<CudaSlice<bf16>>,
    pub ffn_norm: CudaSlice<bf16>,
    pub gate: CudaSlice<bf16>,
    pub up: CudaSlice<bf16>,
    pub down: CudaSlice<bf16>,
}

impl GpuLayer {
    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        let norms = self.q_norm.as_ref().map_or(0, CudaSlice::len) + self.k_norm.as_ref().map_or(0, CudaSlice::len);
        let mats = [&self.attn_norm, &self.wq, &self.wk, &self.wv, &self.wo, &self.ffn_norm, &self.gate, &self.up, &self.down];
        (mats.iter().map(|m| m.len()).sum::<usize>() + norms) * std::mem::size_of::<bf16>()
    }
}

/// Everything but the KV cache.
pub(super) struct Uploaded {
    pub embed: CudaSlice<bf16>,
    pub lm_head: Option<CudaSlice<bf16>>,
    pub final_norm: CudaSlice<bf16>,
    pub layers: Vec<GpuLayer>,
}

struct Uploader<'a> {
    gpu: &'a Gpu,
    src: &'a dyn TensorSource,
}

impl Uploader<'_> {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<CudaSlice<bf16>> {
        let t = self.src.tensor(name)?;
        let numel: usize = shape.iter().product();
        if t.numel() != numel {
            return Err(EngineError::InvalidConfig(format!("{name}: {} values, expected {shape:?}", t.numel())));
        }
        let host: Vec<bf16> = tensor_to_f32(&t)?.into_iter().map(bf16::from_f32).collect();
        Ok(self.gpu.stream.clone_htod(&host)?)
    }
}

/// Uploads every weight `config` calls for.
pub(super) fn upload(gpu: &Gpu, config: &ModelConfig, src: &dyn TensorSource, naming: WeightNaming) -> Result<Uploaded> {
    let up = Uploader { gpu, src };
    let c = config;
    let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let n = |p| naming.layer(i, p, "weight");
        let qk_norm = c.family == ArchFamily::Qwen3;
        layers.push(GpuLayer {
            attn_norm: up.tensor(&n(Part::AttnNorm), &[h])?,
            wq: up.tensor(&n(Part::Q), &[q, h])?,
            wk: up.tensor(&n(Part::K), &[kv, h])?,
            wv: up.tensor(&n(Part::V), &[kv, h])?,
            wo: up.tensor(&n(Part::O), &[h, q])?,
            q_norm: if qk_norm { Some(up.tensor(&n(Part::QNorm), &[c.head_dim])?) } else { None },
            k_norm: if qk_norm { Some(up.tensor(&n(Part::KNorm), &[c.head_dim])?) } else { None },
            ffn_norm: up.tensor(&n(Part::FfnNorm), &[h])?,
            gate: up.tensor(&n(Part::Gate), &[ff, h])?,
            up: up.tensor(&n(Part::Up), &[ff, h])?,
            down: up.tensor(&n(Part::Down), &[h, ff])?,
        });
    }
    let head = naming.global("head");
    let lm_head = if src.contains(head) {
        Some(up.tensor(head, &[c.vocab_size, h])?)
    } else if c.tie_word_embeddings || naming == WeightNaming::Gguf {
        None
    } else {
        return Err(EngineError::MissingTensor(head.to_string()));
    };
    Ok(Uploaded {
        embed: up.tensor(naming.global("embed"), &[c.vocab_size, h])?,
        lm_head,
        final_norm: up.tensor(naming.global("norm"), &[h])?,
        layers,
    })
}

/// Random weights with `config`'s shapes (uniform in ±`scale`, norms 1),
/// made on the host from `seed`: for benchmarks of real architectures'
/// shapes without a file.
pub(super) fn random(gpu: &Gpu, config: &ModelConfig, seed: u64) -> Result<Uploaded> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut fill = |n: usize, scale: f32| -> Result<CudaSlice<bf16>> {
        let host: Vec<bf16> = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bf16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
            })
            .collect();
        Ok(gpu.stream.clone_htod(&host)?)
    };
    let ones = |n: usize| -> Result<CudaSlice<bf16>> { Ok(gpu.stream.clone_htod(&vec![bf16::ONE; n])?) };
    let c = config;
    let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let w = 1.0 / (h as f32).sqrt();
    let mut layers = Vec::with_capacity(c.num_layers);
    for _ in 0..c.num_layers {
        let qk_norm = c.family == ArchFamily::Qwen3;
        layers.push(GpuLayer {
            attn_norm: ones(h)?,
            wq: fill(q * h, w)?,
            wk: fill(kv * h, w)?,
            wv: fill(kv * h, w)?,
            wo: fill(h * q, w)?,
            q_norm: if qk_norm { Some(ones(c.head_dim)?) } else { None },
            k_norm: if qk_norm { Some(ones(c.head_dim)?) } else { None },
            ffn_norm: ones(h)?,
            gate: fill(ff * h, w)?,
            up: fill(ff * h, w)?,
            down: fill(h * ff, 1.0 / (ff as f32).sqrt())?,
        });
    }
    Ok(Uploaded {
        embed: fill(c.vocab_size * h, 1.0)?,
        lm_head: if c.tie_word_embeddings { None } else { Some(fill(c.vocab_size * h, w)?) },
        final_norm: ones(h)?,
        layers,
    })
}
