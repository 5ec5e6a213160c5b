//! The model hyper-parameters the forward pass needs, read from GGUF metadata
//! or an HF `config.json`.

use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::weights::TensorSource;
use serde_json::Value;

/// Which family of the Llama-style decoder a model belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchFamily {
    /// Llama 2/3, SmolLM2, Mistral (no biases, no q/k norm).
    Llama,
    /// Qwen2: biases on q/k/v projections.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k before RoPE.
    Qwen3,
    /// Gemma 3 (text): scaled embeddings, q/k norms, norms before and after
    /// attention and MLP, GELU-tanh gated MLP, sliding-window layers with
    /// their own RoPE base between global ones.
    Gemma3,
}

/// Local attention: most layers see only the last `size` positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer attends to (its own included).
    pub size: usize,
    /// Every `pattern`-th layer (1-based) is global; the others are local.
    pub pattern: usize,
    /// RoPE base frequency of the local layers.
    pub local_rope_theta: f32,
}

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) · up` (GeGLU, tanh approximation).
    GeluTanh,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama.cpp's "normal" mode, used for GGUF llama
    /// whose q/k rows the converter permuted.
    Interleaved,
    /// Halves (i, i + d/2): HF's rotate_half, GGUF qwen2/qwen3.
    Neox,
}

/// Llama 3 style frequency scaling of RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    /// Context-extension factor.
    pub factor: f32,
    /// Low-frequency factor.
    pub low_freq_factor: f32,
    /// High-frequency factor.
    pub high_freq_factor: f32,
    /// The context length the model was pre-trained with.
    pub original_max_position_embeddings: usize,
}

/// Hyper-parameters of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture family.
    pub family: ArchFamily,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (GQA).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// Optional Llama 3 RoPE scaling.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// RoPE pairing for this weight layout.
    pub rope_style: RopeStyle,
    /// Maximum context length.
    pub context_length: usize,
    /// Whether the output projection reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// Local attention layers, if the model has them (Gemma 3).
    pub sliding_window: Option<SlidingWindow>,
    /// Attention logits are scaled by `1/√query_pre_attn_scalar` (default:
    /// the head width).
    pub query_pre_attn_scalar: Option<f32>,
}

impl ModelConfig {
    /// Read the config from GGUF metadata (`general.architecture` and its keys).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let arch = file.get_str("general.architecture")?.to_string();
        let (family, rope_style) = match arch.as_str() {
            "llama" | "mistral" => (ArchFamily::Llama, RopeStyle::Interleaved),
            "qwen2" => (ArchFamily::Qwen2, RopeStyle::Neox),
            "qwen3" => (ArchFamily::Qwen3, RopeStyle::Neox),
            "gemma3" => (ArchFamily::Gemma3, RopeStyle::Neox),
            other => return Err(EngineError::UnsupportedArchitecture(other.to_string())),
        };
        let key = |k: &str| format!("{arch}.{k}");
        // llama.cpp's Gemma 3: every 6th layer global, local RoPE base 10 000.
        let sliding_window = match (family, file.get_u64(&key("attention.sliding_window"))) {
            (ArchFamily::Gemma3, Ok(size)) => Some(SlidingWindow {
                size: size as usize,
                pattern: file.get_u64(&key("attention.sliding_window_pattern")).map_or(6, |p| p as usize),
                local_rope_theta: file.get_f64(&key("rope.freq_base_swa")).unwrap_or(10_000.0) as f32,
            }),
            _ => None,
        };
        let usize_key = |k: &str| -> Result<usize> { Ok(file.get_u64(&key(k))? as usize) };
        let hidden_size = usize_key("embedding_length")?;
        let num_heads = usize_key("attention.head_count")?;
        let num_kv_heads = usize_key("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = match file.get_u64(&key("attention.key_length")) {
            Ok(v) => v as usize,
            Err(_) => hidden_size / num_heads.max(1),
        };
        let vocab_size = match file.get_u64(&key("vocab_size")) {
            Ok(v) => v as usize,
            Err(_) => file
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len())
                .ok_or_else(|| EngineError::InvalidConfig("no vocab size in GGUF".into()))?,
        };
        let rope_scaling = gguf_rope_scaling(file, &arch)?;
        let config = Self {
            family,
            vocab_size,
            hidden_size,
            intermediate_size: usize_key("feed_forward_length")?,
            num_layers: usize_key("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: file.get_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            rope_theta: file.get_f64(&key("rope.freq_base")).unwrap_or(10000.0) as f32,
            rope_scaling,
            rope_style,
            context_length: usize_key("context_length")?,
            tie_word_embeddings: !file.contains("output.weight"),
            sliding_window,
            query_pre_attn_scalar: None,
        };
        config.validate()
    }

    /// Read the config from an HF `config.json` value.
    pub fn from_hf_json(cfg: &Value) -> Result<Self> {
        let arch = cfg["architectures"]
            .get(0)
            .and_then(Value::as_str)
            .or_else(|| cfg["model_type"].as_str())
            .ok_or_else(|| EngineError::InvalidConfig("config.json has no `architectures`".into()))?;
        let family = match arch {
            "LlamaForCausalLM" | "MistralForCausalLM" | "llama" | "mistral" => ArchFamily::Llama,
            "Qwen2ForCausalLM" | "qwen2" => ArchFamily::Qwen2,
            "Qwen3ForCausalLM" | "qwen3" => ArchFamily::Qwen3,
            "Gemma3ForCausalLM" | "gemma3_text" => ArchFamily::Gemma3,
            other => return Err(EngineError::UnsupportedArchitecture(other.to_string())),
        };
        let get = |k: &str| -> Result<usize> {
            cfg[k]
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| EngineError::InvalidConfig(format!("config.json: missing integer `{k}`")))
        };
        let hidden_size = get("hidden_size")?;
        let num_heads = get("num_attention_heads")?;
        let head_dim = match cfg["head_dim"].as_u64() {
            Some(v) => v as usize,
            None => hidden_size / num_heads.max(1),
        };
        let config = Self {
            family,
            vocab_size: get("vocab_size")?,
            hidden_size,
            intermediate_size: get("intermediate_size")?,
            num_layers: get("num_hidden_layers")?,
            num_heads,
            num_kv_heads: get("num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            rms_norm_eps: cfg["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
            rope_theta: cfg["rope_theta"]
                .as_f64()
                .or_else(|| cfg["rope_parameters"]["rope_theta"].as_f64())
                .or_else(|| cfg["rope_parameters"]["full_attention"]["rope_theta"].as_f64())
                .unwrap_or(10000.0) as f32,
            rope_scaling: if family == ArchFamily::Gemma3 { gemma_rope_scaling(cfg)? } else { hf_rope_scaling(cfg)? },
            rope_style: RopeStyle::Neox,
            context_length: get("max_position_embeddings")?,
            tie_word_embeddings: cfg["tie_word_embeddings"].as_bool().unwrap_or(family == ArchFamily::Gemma3),
            sliding_window: hf_sliding_window(cfg, family)?,
            query_pre_attn_scalar: cfg["query_pre_attn_scalar"].as_f64().map(|v| v as f32),
        };
        config.validate()
    }

    /// Check the values are consistent (non-zero, heads divide evenly...).
    pub fn validate(self) -> Result<Self> {
        let bad = |m: String| Err(EngineError::InvalidConfig(m));
        if self.hidden_size == 0 || self.num_heads == 0 || self.num_kv_heads == 0 || self.head_dim == 0 {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        if self.num_layers == 0 || self.vocab_size == 0 || self.intermediate_size == 0 {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} kv heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} is odd", self.head_dim));
        }
        if let Some(w) = self.sliding_window.filter(|w| w.size == 0 || w.pattern == 0) {
            return bad(format!("sliding window {w:?} has a zero size or pattern"));
        }
        Ok(self)
    }

    /// The attention window of `layer`: `Some(positions)` for a local
    /// layer, `None` for one that sees the whole context.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.sliding_window.filter(|w| !(layer + 1).is_multiple_of(w.pattern)).map(|w| w.size)
    }

    /// The factor the token embeddings are multiplied by (Gemma: √hidden).
    pub fn embedding_scale(&self) -> Option<f32> {
        (self.family == ArchFamily::Gemma3).then(|| (self.hidden_size as f32).sqrt())
    }

    /// The factor attention logits are multiplied by.
    pub fn attention_scale(&self) -> f32 {
        1.0 / self.query_pre_attn_scalar.unwrap_or(self.head_dim as f32).sqrt()
    }

    /// The MLP's gate activation.
    pub fn activation(&self) -> Activation {
        if self.family == ArchFamily::Gemma3 {
            Activation::GeluTanh
        } else {
            Activation::Silu
        }
    }

    /// Whether q and k are RMS-normalized per head before RoPE.
    pub fn qk_norm(&self) -> bool {
        matches!(self.family, ArchFamily::Qwen3 | ArchFamily::Gemma3)
    }

    /// Whether attention and MLP outputs are RMS-normalized before their
    /// residual add (Gemma's "sandwich" norms).
    pub fn post_norms(&self) -> bool {
        self.family == ArchFamily::Gemma3
    }

    /// Whether the attention and MLP output projections refine their 8-bit
    /// activations (see `Backend::refine_input`): Gemma's inputs there carry
    /// outliers that one scale per 256 values rounds coarsely (on Gemma 3
    /// 270M fast-mode perplexity was 3.9% over exact without it, 0.5% with
    /// it; Qwen2.5's is within 0.2% as it is).
    pub fn refines_output_projections(&self) -> bool {
        self.family == ArchFamily::Gemma3
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

fn hf_sliding_window(cfg: &Value, family: ArchFamily) -> Result<Option<SlidingWindow>> {
    if family != ArchFamily::Gemma3 {
        return Ok(None);
    }
    let lists_local_layers = cfg["layer_types"].as_array().is_some_and(|t| t.iter().any(|t| t == "sliding_attention"));
    let Some(size) = cfg["sliding_window"].as_u64() else {
        return match lists_local_layers {
            true => Err(EngineError::InvalidConfig("layer_types lists sliding-window layers but sliding_window is missing".into())),
            false => Ok(None),
        };
    };
    let pattern = match (cfg["sliding_window_pattern"].as_u64(), cfg["layer_types"].as_array()) {
        (Some(p), Some(types)) if pattern_of_layer_types(types).ok() != Some(p as usize) => {
            return Err(EngineError::InvalidConfig(format!("sliding_window_pattern {p} disagrees with layer_types")))
        }
        (Some(p), _) => p as usize,
        (None, Some(types)) if Some(types.len() as u64) != cfg["num_hidden_layers"].as_u64() => {
            return Err(EngineError::InvalidConfig(format!("layer_types lists {} layers, the model has {}", types.len(), cfg["num_hidden_layers"])))
        }
        (None, Some(types)) => pattern_of_layer_types(types)?,
        // Gemma 3's own: five local layers, then one global.
        (None, None) => 6,
    };
    let local_rope_theta = cfg["rope_local_base_freq"]
        .as_f64()
        .or_else(|| cfg["rope_parameters"]["sliding_attention"]["rope_theta"].as_f64())
        .unwrap_or(10_000.0) as f32;
    Ok(Some(SlidingWindow { size: size as usize, pattern, local_rope_theta }))
}

/// The global-layer period of a `layer_types` list (newer HF configs):
/// layer `i` (0-based) is global exactly when `(i + 1) % pattern == 0`.
/// Lists that follow no such period are refused rather than misread.
fn pattern_of_layer_types(types: &[Value]) -> Result<usize> {
    let global: Vec<bool> = types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(true),
            Some("sliding_attention") => Ok(false),
            _ => Err(EngineError::InvalidConfig(format!("layer_types: unknown layer type {t}"))),
        })
        .collect::<Result<_>>()?;
    let pattern = global.iter().position(|&g| g).map_or(global.len() + 1, |i| i + 1);
    if global.iter().enumerate().any(|(i, &g)| g != (i + 1).is_multiple_of(pattern)) {
        return Err(EngineError::InvalidConfig(format!(
            "layer_types: global layers {:?} do not repeat every {pattern} layers (not supported)",
            global.iter().enumerate().filter(|(_, &g)| g).map(|(i, _)| i).collect::<Vec<_>>()
        )));
    }
    Ok(pattern)
}

/// Gemma 3 scales only its global layers' RoPE (linear, in 4B and up),
/// which Spindle does not implement: such a config is refused. transformers
/// 5 nests the settings per layer type under `rope_parameters`.
fn gemma_rope_scaling(cfg: &Value) -> Result<Option<Llama3RopeScaling>> {
    let global = if cfg["rope_parameters"]["full_attention"].is_object() { &cfg["rope_parameters"]["full_attention"] } else { &cfg["rope_scaling"] };
    match global["rope_type"].as_str().or_else(|| global["type"].as_str()) {
        None | Some("default") => Ok(None),
        Some(other) => Err(EngineError::InvalidConfig(format!("Gemma 3 with `{other}` RoPE scaling is not supported"))),
    }
}

fn gguf_rope_scaling(file: &GgufFile, arch: &str) -> Result<Option<Llama3RopeScaling>> {
    // llama.cpp bakes llama3 scaling into a `rope_freqs.weight` tensor; Spindle
    // computes the same factors from metadata when they are present.
    let Ok(kind) = file.get_str(&format!("{arch}.rope.scaling.type")) else {
        return Ok(None);
    };
    if kind != "llama3" {
        return Err(EngineError::InvalidConfig(format!("unsupported rope scaling `{kind}`")));
    }
    let f = |k: &str, d: f64| file.get_f64(&format!("{arch}.rope.scaling.{k}")).unwrap_or(d) as f32;
    Ok(Some(Llama3RopeScaling {
        factor: f("factor", 8.0),
        low_freq_factor: f("low_freq_factor", 1.0),
        high_freq_factor: f("high_freq_factor", 4.0),
        original_max_position_embeddings: f("original_context_length", 8192.0) as usize,
    }))
}

fn hf_rope_scaling(cfg: &Value) -> Result<Option<Llama3RopeScaling>> {
    // transformers 5 writes `rope_parameters` (with rope_type "default" when unscaled).
    let rs = if cfg["rope_scaling"].is_null() { &cfg["rope_parameters"] } else { &cfg["rope_scaling"] };
    if rs.is_null() {
        return Ok(None);
    }
    let kind = rs["rope_type"].as_str().or_else(|| rs["type"].as_str()).unwrap_or("");
    if kind == "default" {
        return Ok(None);
    }
    if kind != "llama3" {
        return Err(EngineError::InvalidConfig(format!("unsupported rope_scaling type `{kind}`")));
    }
    let f = |k: &str, d: f64| rs[k].as_f64().unwrap_or(d) as f32;
    Ok(Some(Llama3RopeScaling {
        factor: f("factor", 8.0),
        low_freq_factor: f("low_freq_factor", 1.0),
        high_freq_factor: f("high_freq_factor", 4.0),
        original_max_position_embeddings: f("original_max_position_embeddings", 8192.0) as usize,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tiny() -> Value {
        json!({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "vocab_size": 320, "max_position_embeddings": 256,
               "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true})
    }

    #[test]
    fn reads_hf_config() {
        let c = ModelConfig::from_hf_json(&tiny()).expect("valid");
        assert_eq!(c.family, ArchFamily::Qwen3);
        assert_eq!((c.q_dim(), c.kv_dim()), (64, 32));
        assert_eq!(c.rope_style, RopeStyle::Neox);
    }

    fn gemma3(rope: Value) -> Value {
        let mut cfg = json!({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 640, "intermediate_size": 2048,
               "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
               "vocab_size": 262144, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
               "query_pre_attn_scalar": 256, "sliding_window": 512});
        for (k, v) in rope.as_object().expect("object") {
            cfg[k] = v.clone();
        }
        cfg
    }

    #[test]
    fn gemma3_layer_types_set_the_pattern_and_irregular_ones_are_refused() {
        let types = |t: &[&str]| gemma3(json!({"rope_theta": 1e6, "layer_types": t, "num_hidden_layers": t.len()}));
        let every_third = ModelConfig::from_hf_json(&types(&["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]))
            .expect("periodic layer types load");
        assert_eq!(every_third.sliding_window.map(|w| w.pattern), Some(3));
        let windows: Vec<Option<usize>> = (0..4).map(|l| every_third.layer_window(l)).collect();
        assert_eq!(windows, [Some(512), Some(512), None, Some(512)]);
        let irregular = types(&["full_attention", "sliding_attention", "full_attention", "full_attention"]);
        let err = ModelConfig::from_hf_json(&irregular).expect_err("irregular layer types are refused");
        assert!(err.to_string().contains("do not repeat"), "{err}");
        let unknown = types(&["sliding_attention", "chunked_attention"]);
        assert!(ModelConfig::from_hf_json(&unknown).is_err(), "unknown layer types are refused");
        let mut short = types(&["sliding_attention", "full_attention"]);
        short["num_hidden_layers"] = json!(4);
        assert!(ModelConfig::from_hf_json(&short).is_err(), "a list of the wrong length is refused");
        let mut both = types(&["sliding_attention", "full_attention"]);
        both["sliding_window_pattern"] = json!(6);
        assert!(ModelConfig::from_hf_json(&both).is_err(), "a pattern that disagrees with layer_types is refused");
        let mut no_window = types(&["sliding_attention", "full_attention"]);
        no_window.as_object_mut().expect("object").remove("sliding_window");
        assert!(ModelConfig::from_hf_json(&no_window).is_err(), "local layers without a window size are refused");
    }

    #[test]
    fn reads_gemma3_hf_configs_of_transformers_4_and_5() {
        let v4 = gemma3(json!({"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": null, "sliding_window_pattern": 6}));
        let v5 = gemma3(json!({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}));
        for cfg in [v4, v5] {
            let c = ModelConfig::from_hf_json(&cfg).expect("valid");
            assert_eq!((c.family, c.rope_theta, c.tie_word_embeddings), (ArchFamily::Gemma3, 1e6, true));
            assert_eq!(c.sliding_window, Some(SlidingWindow { size: 512, pattern: 6, local_rope_theta: 1e4 }));
            let windows: Vec<Option<usize>> = (0..7).map(|l| c.layer_window(l)).collect();
            assert_eq!(windows, [Some(512), Some(512), Some(512), Some(512), Some(512), None, Some(512)], "every sixth layer is global");
            assert_eq!((c.attention_scale(), c.embedding_scale()), (1.0 / 16.0, Some(640f32.sqrt())));
            assert_eq!((c.activation(), c.qk_norm(), c.post_norms()), (Activation::GeluTanh, true, true));
        }
        let scaled = gemma3(json!({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}));
        assert!(matches!(ModelConfig::from_hf_json(&scaled), Err(EngineError::InvalidConfig(m)) if m.contains("linear")));
        let llama = ModelConfig::from_hf_json(&tiny()).expect("valid");
        assert_eq!((llama.sliding_window, llama.layer_window(5), llama.embedding_scale()), (None, None, None), "others are unchanged");
        assert_eq!((llama.activation(), llama.post_norms(), llama.attention_scale()), (Activation::Silu, false, 0.25));
    }

    #[test]
    fn rejects_unknown_architecture_and_bad_heads() {
        let mut cfg = tiny();
        cfg["architectures"] = json!(["GPT2LMHeadModel"]);
        assert!(matches!(ModelConfig::from_hf_json(&cfg), Err(EngineError::UnsupportedArchitecture(a)) if a == "GPT2LMHeadModel"));
        let mut cfg = tiny();
        cfg["num_key_value_heads"] = json!(3);
        assert!(matches!(ModelConfig::from_hf_json(&cfg), Err(EngineError::InvalidConfig(_))));
        let mut cfg = tiny();
        cfg["hidden_size"] = json!("big");
        assert!(matches!(ModelConfig::from_hf_json(&cfg), Err(EngineError::InvalidConfig(m)) if m.contains("hidden_size")));
    }
}
