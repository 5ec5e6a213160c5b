//! The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3,
//! Gemma 3):
//! its weights over any [`Backend`], loaded once from GGUF or HF names, and
//! the one copy of its layer loop ([`LlamaWeights::pass`]).

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, GatedMlp, Workspace};
use crate::config::{ArchFamily, ModelConfig};
use crate::error::{EngineError, Result};
use crate::model::linear::tensor_to_f32;
use crate::model::MatmulPrecision;
use crate::gguf::types::GgmlType;
use crate::weights::{TensorSource, TensorView};

/// Which tensor-name scheme the weights use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightNaming {
    /// llama.cpp names (`blk.0.attn_q.weight`).
    Gguf,
    /// Hugging Face names (`model.layers.0.self_attn.q_proj.weight`).
    Hf,
}

/// The parts of a layer, named independently of the file format.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QNorm,
    KNorm,
    FfnNorm,
    /// Gemma's norm before the MLP (HF names it apart from Llama's).
    PreFfnNorm,
    /// Gemma's norm of the attention output.
    PostAttnNorm,
    /// Gemma's norm of the MLP output.
    PostFfnNorm,
    Gate,
    Up,
    Down,
}

impl WeightNaming {
    pub(crate) fn layer(self, i: usize, part: Part, suffix: &str) -> String {
        let (g, h) = match part {
            Part::AttnNorm => ("attn_norm", "input_layernorm"),
            Part::Q => ("attn_q", "self_attn.q_proj"),
            Part::K => ("attn_k", "self_attn.k_proj"),
            Part::V => ("attn_v", "self_attn.v_proj"),
            Part::O => ("attn_output", "self_attn.o_proj"),
            Part::QNorm => ("attn_q_norm", "self_attn.q_norm"),
            Part::KNorm => ("attn_k_norm", "self_attn.k_norm"),
            Part::FfnNorm => ("ffn_norm", "post_attention_layernorm"),
            Part::PreFfnNorm => ("ffn_norm", "pre_feedforward_layernorm"),
            Part::PostAttnNorm => ("post_attention_norm", "post_attention_layernorm"),
            Part::PostFfnNorm => ("post_ffw_norm", "post_feedforward_layernorm"),
            Part::Gate => ("ffn_gate", "mlp.gate_proj"),
            Part::Up => ("ffn_up", "mlp.up_proj"),
            Part::Down => ("ffn_down", "mlp.down_proj"),
        };
        match self {
            Self::Gguf => format!("blk.{i}.{g}.{suffix}"),
            Self::Hf => format!("model.layers.{i}.{h}.{suffix}"),
        }
    }

    pub(crate) fn global(self, name: &str) -> &'static str {
        match (self, name) {
            (Self::Gguf, "embed") => "token_embd.weight",
            (Self::Gguf, "norm") => "output_norm.weight",
            (Self::Gguf, _) => "output.weight",
            (Self::Hf, "embed") => "model.embed_tokens.weight",
            (Self::Hf, "norm") => "model.norm.weight",
            (Self::Hf, _) => "lm_head.weight",
        }
    }
}

/// One layer's weights on backend `B`.
pub struct LlamaLayer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    wo: B::Weight,
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    ffn_norm: B::Vector,
    post_attn_norm: Option<B::Vector>,
    post_ffn_norm: Option<B::Vector>,
    gate: B::Weight,
    up: B::Weight,
    down: B::Weight,
}

/// A Llama-family model's weights on backend `B` (no per-request state).
pub struct LlamaWeights<B: Backend> {
    config: ModelConfig,
    embed: B::Weight,
    layers: Vec<LlamaLayer<B>>,
    final_norm: B::Vector,
    lm_head: Option<B::Weight>,
}

impl<B: Backend> std::fmt::Debug for LlamaWeights<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaWeights").field("config", &self.config).field("layers", &self.layers.len()).finish_non_exhaustive()
    }
}

/// Where a loader's tensors come from: a file, or made up on the spot.
trait Tensors {
    /// Calls `f` with the tensor `name` (of `shape`, for made-up ones).
    fn with(&self, name: &str, shape: &[usize], f: &mut dyn FnMut(&TensorView<'_>) -> Result<()>) -> Result<()>;
    /// Whether a tensor called `name` exists.
    fn contains(&self, name: &str) -> bool;
}

impl Tensors for &dyn TensorSource {
    fn with(&self, name: &str, _shape: &[usize], f: &mut dyn FnMut(&TensorView<'_>) -> Result<()>) -> Result<()> {
        f(&self.tensor(name)?)
    }

    fn contains(&self, name: &str) -> bool {
        TensorSource::contains(*self, name)
    }
}

/// Random weights for benchmarks of real architectures' shapes without a
/// file: matrices uniform in ±1/√cols (the embedding ±1), norms 1, biases 0.
struct RandomTensors {
    state: std::cell::Cell<u64>,
    tied: bool,
}

/// Values per independently seeded stretch of random weights (filled in
/// parallel).
const RANDOM_CHUNK: usize = 1 << 20;

impl RandomTensors {
    /// A fresh seed per tensor (xorshift64 over the state).
    fn next_seed(&self) -> u64 {
        let mut x = self.state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state.set(x);
        x
    }
}

/// Uniform values in [-scale, scale) as little-endian f32 bytes: one
/// xorshift64 stream per chunk of [`RANDOM_CHUNK`] values, seeded from
/// `seed` and the chunk's index, so the result does not depend on threads.
fn random_f32_bytes(n: usize, seed: u64, scale: f32) -> Vec<u8> {
    use rayon::prelude::*;
    let mut bytes = vec![0u8; n * 4];
    bytes.par_chunks_mut(RANDOM_CHUNK * 4).enumerate().for_each(|(i, chunk)| {
        let mut x = (seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1;
        for value in chunk.chunks_exact_mut(4) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
            value.copy_from_slice(&v.to_le_bytes());
        }
    });
    bytes
}

impl Tensors for RandomTensors {
    fn with(&self, name: &str, shape: &[usize], f: &mut dyn FnMut(&TensorView<'_>) -> Result<()>) -> Result<()> {
        let n: usize = shape.iter().product();
        let constant = |v: f32| -> Vec<u8> { v.to_le_bytes().repeat(n) };
        let bytes = match shape {
            _ if name.ends_with("bias") => constant(0.0),
            [_] => constant(1.0),
            _ if name.starts_with("token_embd") => random_f32_bytes(n, self.next_seed(), 1.0),
            [_, cols] => random_f32_bytes(n, self.next_seed(), 1.0 / (*cols as f32).sqrt()),
            _ => return Err(EngineError::InvalidConfig(format!("{name}: no random weights of shape {shape:?}"))),
        };
        f(&TensorView { name: name.to_string(), dtype: GgmlType::F32, shape: shape.to_vec(), data: &bytes, shared: None })
    }

    fn contains(&self, name: &str) -> bool {
        !(self.tied && name == WeightNaming::Gguf.global("head"))
    }
}

struct Loader<'a, B: Backend, T: Tensors> {
    backend: &'a B,
    src: T,
    naming: WeightNaming,
    /// Added to every norm weight: 1 for Gemma's HF `(1 + w)` norms
    /// (llama.cpp's converter already added it to GGUF files).
    norm_shift: f32,
}

impl<B: Backend, T: Tensors> Loader<'_, B, T> {
    fn values(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.src.with(name, &[len], &mut |t| {
            t.expect_shape(&[len])?;
            out = tensor_to_f32(t)?;
            Ok(())
        })?;
        Ok(out)
    }

    fn norm(&self, name: &str, len: usize) -> Result<B::Vector> {
        let mut values = self.values(name, len)?;
        if self.norm_shift != 0.0 {
            values.iter_mut().for_each(|v| *v += self.norm_shift);
        }
        self.backend.load_vector(values)
    }

    fn linear(&self, name: &str, rows: usize, cols: usize, bias: Option<Vec<f32>>) -> Result<B::Weight> {
        let mut bias = bias;
        let mut out = None;
        self.src.with(name, &[rows, cols], &mut |t| {
            out = Some(self.backend.load_linear(t, rows, cols, bias.take())?);
            Ok(())
        })?;
        out.ok_or_else(|| EngineError::MissingTensor(name.to_string()))
    }

    fn layer(&self, i: usize, c: &ModelConfig) -> Result<LlamaLayer<B>> {
        let n = |p| self.naming.layer(i, p, "weight");
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let qk_norm = c.qk_norm();
        let bias = |p: Part, len: usize| -> Result<Option<Vec<f32>>> {
            if c.family == ArchFamily::Qwen2 {
                Ok(Some(self.values(&self.naming.layer(i, p, "bias"), len)?))
            } else {
                Ok(None)
            }
        };
        let optional_norm = |wanted: bool, p: Part, len: usize| -> Result<Option<B::Vector>> { if wanted { Some(self.norm(&n(p), len)).transpose() } else { Ok(None) } };
        let ffn_norm = if c.post_norms() { Part::PreFfnNorm } else { Part::FfnNorm };
        let mut wo = self.linear(&n(Part::O), h, q, None)?;
        let mut down = self.linear(&n(Part::Down), h, ff, None)?;
        if c.refines_output_projections() {
            self.backend.refine_input(&mut wo);
            self.backend.refine_input(&mut down);
        }
        Ok(LlamaLayer {
            attn_norm: self.norm(&n(Part::AttnNorm), h)?,
            wq: self.linear(&n(Part::Q), q, h, bias(Part::Q, q)?)?,
            wk: self.linear(&n(Part::K), kv, h, bias(Part::K, kv)?)?,
            wv: self.linear(&n(Part::V), kv, h, bias(Part::V, kv)?)?,
            wo,
            q_norm: optional_norm(qk_norm, Part::QNorm, c.head_dim)?,
            k_norm: optional_norm(qk_norm, Part::KNorm, c.head_dim)?,
            ffn_norm: self.norm(&n(ffn_norm), h)?,
            post_attn_norm: optional_norm(c.post_norms(), Part::PostAttnNorm, h)?,
            post_ffn_norm: optional_norm(c.post_norms(), Part::PostFfnNorm, h)?,
            gate: self.linear(&n(Part::Gate), ff, h, None)?,
            up: self.linear(&n(Part::Up), ff, h, None)?,
            down,
        })
    }
}

impl<B: Backend> LlamaWeights<B> {
    /// Loads every weight `config` calls for from `src` onto `backend`,
    /// calling `progress(done, total)` after each layer.
    pub fn load(backend: &B, config: ModelConfig, src: &dyn TensorSource, naming: WeightNaming, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let norm_shift = if naming == WeightNaming::Hf && config.family == ArchFamily::Gemma3 { 1.0 } else { 0.0 };
        Self::load_from(Loader { backend, src, naming, norm_shift }, config, progress)
    }

    /// Random weights of `config`'s shapes from `seed` (see
    /// [`RandomTensors`]), made one tensor at a time: for benchmarks of
    /// real architectures without a file.
    pub fn random(backend: &B, config: ModelConfig, seed: u64) -> Result<Self> {
        let src = RandomTensors { state: std::cell::Cell::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1), tied: config.tie_word_embeddings };
        Self::load_from(Loader { backend, src, naming: WeightNaming::Gguf, norm_shift: 0.0 }, config, &mut |_, _| {})
    }

    fn load_from<T: Tensors>(loader: Loader<'_, B, T>, config: ModelConfig, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let naming = loader.naming;
        let embed = loader.linear(naming.global("embed"), config.vocab_size, config.hidden_size, None)?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            layers.push(loader.layer(i, &config)?);
            progress(i + 1, config.num_layers);
        }
        let head_name = naming.global("head");
        let lm_head = if loader.src.contains(head_name) {
            Some(loader.linear(head_name, config.vocab_size, config.hidden_size, None)?)
        } else if config.tie_word_embeddings || naming == WeightNaming::Gguf {
            None
        } else {
            return Err(EngineError::MissingTensor(head_name.to_string()));
        };
        Ok(Self { final_norm: loader.norm(naming.global("norm"), config.hidden_size)?, config, embed, layers, lm_head })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Bytes of the matrices on the device (embedding and head included).
    pub fn weight_bytes(&self, b: &B) -> usize {
        self.layer_bytes(b) + b.weight_bytes(&self.embed) + self.lm_head.as_ref().map_or(0, |h| b.weight_bytes(h))
    }

    /// Bytes of the layers' matrices (what every token multiplies through).
    pub fn layer_bytes(&self, b: &B) -> usize {
        self.layers
            .iter()
            .map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down].iter().map(|w| b.weight_bytes(w)).sum::<usize>())
            .sum()
    }

    /// Bytes a decode step streams: the layers and the output head.
    pub fn streamed_bytes(&self, b: &B) -> usize {
        self.layer_bytes(b) + b.weight_bytes(self.lm_head.as_ref().unwrap_or(&self.embed))
    }

    /// The one layer loop: the step's `rows` rows from their embeddings
    /// through every layer and the final norm, then the wanted rows'
    /// logits into `ws.logits`. Writes the rows' keys and values into the
    /// backend's cache. Allocates nothing.
    pub fn pass(&self, b: &mut B, ws: &mut Workspace<B>, step: &B::Step, rows: usize) -> Result<()> {
        let c = &self.config;
        let (t, h, eps) = (rows, c.hidden_size, c.rms_norm_eps);
        b.embed(&mut ws.x, &self.embed, step, t)?;
        if let Some(factor) = c.embedding_scale() {
            b.scale(&mut ws.x, t, h, factor)?;
        }
        // A block's output joins the residual stream through its post-norm
        // (`ws.post`) where the model has one, else as it is (`ws.o`).
        let post = c.post_norms();
        for (li, layer) in self.layers.iter().enumerate() {
            // The residual add of the previous block is fused into this norm.
            if li == 0 {
                b.add_rms_norm(&mut ws.hn, None, &ws.x, &layer.attn_norm, t, h, eps)?;
            } else {
                b.add_rms_norm(&mut ws.hn, Some(&mut ws.x), if post { &ws.post } else { &ws.o }, &layer.attn_norm, t, h, eps)?;
            }
            b.linear_many(&ws.hn, t, &mut [(&layer.wq, &mut ws.q), (&layer.wk, &mut ws.k), (&layer.wv, &mut ws.v)])?;
            let (q, k) = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => {
                    b.add_rms_norm(&mut ws.q_normed, None, &ws.q, qn, t * c.num_heads, c.head_dim, eps)?;
                    b.add_rms_norm(&mut ws.k_normed, None, &ws.k, kn, t * c.num_kv_heads, c.head_dim, eps)?;
                    (&mut ws.q_normed, &mut ws.k_normed)
                }
                _ => (&mut ws.q, &mut ws.k),
            };
            if c.layer_window(li).is_some() {
                b.rope_local(q, step, t, c.num_heads)?;
                b.rope_local(k, step, t, c.num_kv_heads)?;
            } else {
                b.rope(q, step, t, c.num_heads)?;
                b.rope(k, step, t, c.num_kv_heads)?;
            }
            b.kv_write(li, k, &ws.v, step, t)?;
            b.attention(li, &mut ws.attn, q, step, t)?;
            b.linear(&mut ws.o, &ws.attn, &layer.wo, t)?;
            if let Some(norm) = &layer.post_attn_norm {
                b.add_rms_norm(&mut ws.post, None, &ws.o, norm, t, h, eps)?;
            }
            b.add_rms_norm(&mut ws.hn, Some(&mut ws.x), if post { &ws.post } else { &ws.o }, &layer.ffn_norm, t, h, eps)?;
            let mlp = GatedMlp { gate: &layer.gate, up: &layer.up, down: &layer.down, activation: c.activation(), width: c.intermediate_size };
            b.gated_mlp(&mut ws.o, &ws.hn, &mlp, t, [&mut ws.gate, &mut ws.up, &mut ws.act])?;
            if let Some(norm) = &layer.post_ffn_norm {
                b.add_rms_norm(&mut ws.post, None, &ws.o, norm, t, h, eps)?;
            }
        }
        b.add_rms_norm(&mut ws.hn, Some(&mut ws.x), if post { &ws.post } else { &ws.o }, &self.final_norm, t, h, eps)?;
        b.logits(&mut ws.logits, &mut ws.picked, &ws.hn, self.lm_head.as_ref().unwrap_or(&self.embed), step)
    }
}

/// A Llama-family model loaded for the CPU (weights only; a
/// [`crate::runner::ModelRunner`] adds the KV pool and runs it).
#[derive(Debug)]
pub struct LlamaModel {
    weights: LlamaWeights<CpuBackend>,
    precision: MatmulPrecision,
}

impl LlamaModel {
    /// Load every weight the config calls for from `src`.
    pub fn load(config: ModelConfig, src: &dyn TensorSource, naming: WeightNaming) -> Result<Self> {
        Self::load_with_progress(config, src, naming, &mut |_, _| {})
    }

    /// As [`LlamaModel::load`], calling `progress(done, total)` after each layer.
    pub fn load_with_progress(config: ModelConfig, src: &dyn TensorSource, naming: WeightNaming, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let weights = LlamaWeights::load(&CpuBackend::default(), config, src, naming, progress)?;
        Ok(Self { weights, precision: MatmulPrecision::Fast })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        self.weights.config()
    }

    /// Choose fast (8-bit activations) or exact (f32) quantized matmuls.
    pub fn set_precision(&mut self, precision: MatmulPrecision) {
        self.precision = precision;
    }

    /// Bytes held by the weights.
    pub fn weight_bytes(&self) -> usize {
        self.weights.weight_bytes(&CpuBackend::default())
    }

    /// The weights and the precision chosen.
    pub fn into_parts(self) -> (LlamaWeights<CpuBackend>, MatmulPrecision) {
        (self.weights, self.precision)
    }
}

#[cfg(test)]
mod tests {
    use super::random_f32_bytes;

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    #[test]
    fn random_weights_are_bounded_varied_and_reproducible() {
        let n = super::RANDOM_CHUNK * 2 + 5;
        let a = floats(&random_f32_bytes(n, 7, 0.5));
        assert_eq!(a.len(), n);
        assert!(a.iter().all(|v| (-0.5..0.5).contains(v)), "a value outside [-0.5, 0.5)");
        let mean = a.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        // Chunks are seeded apart: the second chunk does not repeat the first.
        assert_ne!(a[..16], a[super::RANDOM_CHUNK..super::RANDOM_CHUNK + 16]);
        assert_eq!(a, floats(&random_f32_bytes(n, 7, 0.5)));
        assert_ne!(a[..16], floats(&random_f32_bytes(16, 8, 0.5))[..]);
    }
}
