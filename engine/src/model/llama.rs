//! The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3).

use super::attention::{paged_attention, HeadShape, SeqSpan};
use super::linear::{matmul_many, tensor_to_f32, Linear, MatmulJob, MatmulPrecision};
use super::ops::{add_in_place, rms_norm, rms_norm_into, silu_mul, Rope};
use crate::batch::{ForwardBatch, LogitsRequest};
use crate::config::{ArchFamily, ModelConfig};
use crate::error::{EngineError, Result};
use crate::kv::KvPool;
use crate::weights::TensorSource;

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

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A loaded Llama-family model. Holds weights only: no per-request state.
#[derive(Debug)]
pub struct LlamaModel {
    config: ModelConfig,
    embed: Linear,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Option<Linear>,
    rope: Rope,
    precision: MatmulPrecision,
}

struct Loader<'a> {
    src: &'a dyn TensorSource,
    naming: WeightNaming,
}

impl Loader<'_> {
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.src.tensor(name)?;
        t.expect_shape(&[len])?;
        tensor_to_f32(&t)
    }

    fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear> {
        Linear::from_tensor(&self.src.tensor(name)?, rows, cols)
    }

    fn layer(&self, i: usize, c: &ModelConfig) -> Result<Layer> {
        let n = |p| self.naming.layer(i, p, "weight");
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let qk_norm = c.family == ArchFamily::Qwen3;
        let mut wq = self.linear(&n(Part::Q), q, h)?;
        let mut wk = self.linear(&n(Part::K), kv, h)?;
        let mut wv = self.linear(&n(Part::V), kv, h)?;
        if c.family == ArchFamily::Qwen2 {
            let b = |p| self.naming.layer(i, p, "bias");
            wq = wq.with_bias(self.vector(&b(Part::Q), q)?)?;
            wk = wk.with_bias(self.vector(&b(Part::K), kv)?)?;
            wv = wv.with_bias(self.vector(&b(Part::V), kv)?)?;
        }
        Ok(Layer {
            attn_norm: self.vector(&n(Part::AttnNorm), h)?,
            wq,
            wk,
            wv,
            wo: self.linear(&n(Part::O), h, q)?,
            q_norm: if qk_norm { Some(self.vector(&n(Part::QNorm), c.head_dim)?) } else { None },
            k_norm: if qk_norm { Some(self.vector(&n(Part::KNorm), c.head_dim)?) } else { None },
            ffn_norm: self.vector(&n(Part::FfnNorm), h)?,
            gate: self.linear(&n(Part::Gate), ff, h)?,
            up: self.linear(&n(Part::Up), ff, h)?,
            down: self.linear(&n(Part::Down), h, ff)?,
        })
    }
}

/// Per-forward scratch buffers, `[tokens, width]` each.
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl LlamaModel {
    /// Load every weight the config calls for from `src`.
    pub fn load(config: ModelConfig, src: &dyn TensorSource, naming: WeightNaming) -> Result<Self> {
        Self::load_with_progress(config, src, naming, &mut |_, _| {})
    }

    /// As [`LlamaModel::load`], calling `progress(done, total)` after each layer.
    pub fn load_with_progress(
        config: ModelConfig,
        src: &dyn TensorSource,
        naming: WeightNaming,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let loader = Loader { src, naming };
        let embed = loader.linear(naming.global("embed"), config.vocab_size, config.hidden_size)?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            layers.push(loader.layer(i, &config)?);
            progress(i + 1, config.num_layers);
        }
        let head_name = naming.global("head");
        let lm_head = if src.contains(head_name) {
            Some(loader.linear(head_name, config.vocab_size, config.hidden_size)?)
        } else if config.tie_word_embeddings || naming == WeightNaming::Gguf {
            None
        } else {
            return Err(EngineError::MissingTensor(head_name.to_string()));
        };
        Ok(Self {
            final_norm: loader.vector(naming.global("norm"), config.hidden_size)?,
            rope: Rope::new(&config),
            config,
            embed,
            layers,
            lm_head,
            precision: MatmulPrecision::Fast,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Choose fast (8-bit activations) or exact (f32) quantized matmuls.
    pub fn set_precision(&mut self, precision: MatmulPrecision) {
        self.precision = precision;
    }

    /// Bytes held by the weights.
    pub fn weight_bytes(&self) -> usize {
        let l: usize = self
            .layers
            .iter()
            .map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down].iter().map(|w| w.weight_bytes()).sum::<usize>())
            .sum();
        l + self.embed.weight_bytes() + self.lm_head.as_ref().map_or(0, Linear::weight_bytes)
    }

    /// Run the batch; returns, per sequence, the requested logits (flattened).
    pub fn forward(&self, batch: &ForwardBatch, kv: &mut KvPool) -> Result<Vec<Vec<f32>>> {
        let spans = self.plan(batch, kv)?;
        let c = &self.config;
        let total = batch.num_tokens();
        let positions: Vec<usize> =
            batch.seqs.iter().flat_map(|s| (0..s.tokens.len()).map(move |i| s.start_pos + i)).collect();
        let angles = self.rope.angles(&positions);
        let mut s = Scratch::new(c, total);
        for (t, tok) in batch.seqs.iter().flat_map(|s| s.tokens.iter()).enumerate() {
            self.embed.row_f32(*tok as usize, &mut s.x[t * c.hidden_size..(t + 1) * c.hidden_size])?;
        }
        for (li, layer) in self.layers.iter().enumerate() {
            self.attention_block(li, layer, &mut s, total, &spans, &angles, kv)?;
            self.mlp_block(layer, &mut s, total)?;
        }
        self.logits(batch, &spans, &s.x)
    }

    fn plan(&self, batch: &ForwardBatch, kv: &KvPool) -> Result<Vec<SeqSpan>> {
        let mut offset = 0;
        let mut spans = Vec::with_capacity(batch.seqs.len());
        for (i, seq) in batch.seqs.iter().enumerate() {
            if seq.tokens.is_empty() {
                return Err(EngineError::InvalidBatch(format!("sequence {i} has no new tokens")));
            }
            let end = seq.start_pos + seq.tokens.len();
            if end > self.config.context_length {
                return Err(EngineError::ContextLengthExceeded { len: end, max: self.config.context_length });
            }
            if let Some(bad) = seq.tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
                return Err(EngineError::InvalidBatch(format!("token id {bad} is outside the vocabulary")));
            }
            let key_slots = (0..end).map(|p| kv.slot(&seq.block_table, p)).collect::<Result<Vec<_>>>()?;
            spans.push(SeqSpan { token_offset: offset, len: seq.tokens.len(), start_pos: seq.start_pos, key_slots });
            offset += seq.tokens.len();
        }
        Ok(spans)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_block(
        &self,
        li: usize,
        layer: &Layer,
        s: &mut Scratch,
        n: usize,
        spans: &[SeqSpan],
        angles: &super::ops::RopeAngles,
        kv: &mut KvPool,
    ) -> Result<()> {
        let c = &self.config;
        let p = self.precision;
        rms_norm_into(&s.x, &layer.attn_norm, c.rms_norm_eps, &mut s.h);
        let mut qkv = [
            MatmulJob { layer: &layer.wq, out: &mut s.q },
            MatmulJob { layer: &layer.wk, out: &mut s.k },
            MatmulJob { layer: &layer.wv, out: &mut s.v },
        ];
        matmul_many(&mut qkv, &s.h, n, p)?;
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            rms_norm(&mut s.q, qn, c.rms_norm_eps);
            rms_norm(&mut s.k, kn, c.rms_norm_eps);
        }
        self.rope.apply(&mut s.q, angles, c.num_heads);
        self.rope.apply(&mut s.k, angles, c.num_kv_heads);
        let d = c.kv_dim();
        for span in spans {
            for i in 0..span.len {
                let t = span.token_offset + i;
                let slot = span.key_slots[span.start_pos + i];
                kv.write(li, slot, &s.k[t * d..(t + 1) * d], &s.v[t * d..(t + 1) * d]);
            }
        }
        let shape = HeadShape { num_heads: c.num_heads, num_kv_heads: c.num_kv_heads, head_dim: c.head_dim };
        paged_attention(&s.q, &mut s.attn, kv, li, spans, shape);
        layer.wo.forward(&s.attn, n, &mut s.o, p)?;
        add_in_place(&mut s.x, &s.o);
        Ok(())
    }

    fn mlp_block(&self, layer: &Layer, s: &mut Scratch, n: usize) -> Result<()> {
        let p = self.precision;
        rms_norm_into(&s.x, &layer.ffn_norm, self.config.rms_norm_eps, &mut s.h);
        let mut gate_up =
            [MatmulJob { layer: &layer.gate, out: &mut s.gate }, MatmulJob { layer: &layer.up, out: &mut s.up }];
        matmul_many(&mut gate_up, &s.h, n, p)?;
        silu_mul(&mut s.gate, &s.up);
        layer.down.forward(&s.gate, n, &mut s.o, p)?;
        add_in_place(&mut s.x, &s.o);
        Ok(())
    }

    fn logits(&self, batch: &ForwardBatch, spans: &[SeqSpan], x: &[f32]) -> Result<Vec<Vec<f32>>> {
        let h = self.config.hidden_size;
        let vocab = self.config.vocab_size;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let ranges: Vec<std::ops::Range<usize>> = batch
            .seqs
            .iter()
            .zip(spans)
            .map(|(seq, span)| match seq.logits {
                LogitsRequest::None if seq.sampling.is_none() => 0..0,
                LogitsRequest::All => 0..span.len,
                _ => span.len - 1..span.len,
            })
            .collect();
        let mut hidden = Vec::new();
        for (r, span) in ranges.iter().zip(spans) {
            hidden.extend_from_slice(&x[(span.token_offset + r.start) * h..(span.token_offset + r.end) * h]);
        }
        rms_norm(&mut hidden, &self.final_norm, self.config.rms_norm_eps);
        let rows = hidden.len() / h;
        let mut logits = vec![0f32; rows * vocab];
        if rows > 0 {
            head.forward(&hidden, rows, &mut logits, self.precision)?;
        }
        let mut out = Vec::with_capacity(spans.len());
        let mut at = 0;
        for r in &ranges {
            out.push(logits[at * vocab..(at + r.len()) * vocab].to_vec());
            at += r.len();
        }
        Ok(out)
    }
}

impl Scratch {
    fn new(c: &ModelConfig, n: usize) -> Self {
        let z = |w: usize| vec![0f32; n * w];
        Self {
            x: z(c.hidden_size),
            h: z(c.hidden_size),
            q: z(c.q_dim()),
            k: z(c.kv_dim()),
            v: z(c.kv_dim()),
            attn: z(c.q_dim()),
            o: z(c.hidden_size),
            gate: z(c.intermediate_size),
            up: z(c.intermediate_size),
        }
    }
}
