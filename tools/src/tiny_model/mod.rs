//! Tiny random models in Hugging Face layout, for tests and development.
//!
//! [`write_tiny_model`] writes `config.json`, `model.safetensors` (or shards
//! plus an index), a byte-level BPE `tokenizer.json`, `tokenizer_config.json`
//! with a ChatML template, and `generation_config.json`. Everything is a pure
//! function of the options: the same seed gives byte-identical files.

pub mod tokenizer;
mod weights;

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

pub use tokenizer::{ENDOFTEXT_ID, IM_END_ID, IM_START_ID, MIN_VOCAB};

/// Which architecture's config and tensor names to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TinyArch {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen3ForCausalLM` (adds per-head q/k RMS norms).
    Qwen3,
    /// `Qwen2ForCausalLM` (adds q/k/v biases).
    Qwen2,
    /// `Gemma3ForCausalLM` (`gemma3_text`): (1 + w) norms around attention
    /// and MLP, q/k norms, GELU-tanh MLP, scaled embeddings, tied head, and
    /// sliding-window layers: window [`GEMMA3_WINDOW`], every
    /// [`GEMMA3_PATTERN`]-th layer global, listed in `layer_types`.
    Gemma3,
}

/// The tiny Gemma 3's sliding window (positions), short enough that test
/// prompts run past it.
pub const GEMMA3_WINDOW: usize = 6;
/// Every this-many-th layer of the tiny Gemma 3 is global (1-based).
pub const GEMMA3_PATTERN: usize = 2;
/// The tiny Gemma 3's `query_pre_attn_scalar` (unlike its head width, so a
/// loader that ignores it is caught).
pub const GEMMA3_QUERY_PRE_ATTN_SCALAR: usize = 24;
/// The tiny Gemma 3's RoPE base on its sliding-window layers.
pub const GEMMA3_LOCAL_ROPE_THETA: f64 = 10_000.0;

/// Element type of the written weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TinyDtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

impl TinyDtype {
    /// The `torch_dtype` string for config.json.
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
        }
    }
}

/// Shape and content of a tiny model.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyModelOptions {
    /// Architecture.
    pub arch: TinyArch,
    /// Seed for all weights.
    pub seed: u64,
    /// Weight element type.
    pub dtype: TinyDtype,
    /// Transformer blocks.
    pub layers: usize,
    /// Model width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Per-head width; `None` means `hidden / heads`.
    pub head_dim: Option<usize>,
    /// MLP width.
    pub intermediate: usize,
    /// Vocabulary size (at least [`MIN_VOCAB`]; padded with reserved special tokens).
    pub vocab: usize,
    /// `max_position_embeddings`.
    pub max_position: usize,
    /// Share the embedding matrix with the output head (no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Number of safetensors shards; 1 writes a single `model.safetensors`.
    pub shards: usize,
}

impl Default for TinyModelOptions {
    fn default() -> Self {
        Self::new(TinyArch::Llama)
    }
}

impl TinyModelOptions {
    /// The small defaults for `arch`: vocab 320, hidden 64, 2 layers, 4 heads,
    /// 2 kv heads, head_dim 16, intermediate 128, 256 positions, F32, seed 0,
    /// untied (tied for Gemma 3, as HF's default), with the arch's usual
    /// epsilon and RoPE base.
    pub fn new(arch: TinyArch) -> Self {
        let (rms_norm_eps, rope_theta) = match arch {
            TinyArch::Llama => (1e-5, 10_000.0),
            TinyArch::Qwen3 | TinyArch::Qwen2 | TinyArch::Gemma3 => (1e-6, 1_000_000.0),
        };
        Self {
            arch,
            seed: 0,
            dtype: TinyDtype::F32,
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: None,
            intermediate: 128,
            vocab: 320,
            max_position: 256,
            tie_word_embeddings: arch == TinyArch::Gemma3,
            rms_norm_eps,
            rope_theta,
            shards: 1,
        }
    }

    /// The per-head width in effect.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden / self.heads.max(1))
    }

    /// Check the options describe a model that can be built.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.layers > 0 && self.hidden > 0 && self.intermediate > 0,
            "sizes must be > 0"
        );
        ensure!(
            self.heads > 0 && self.kv_heads > 0,
            "head counts must be > 0"
        );
        ensure!(
            self.heads.is_multiple_of(self.kv_heads),
            "heads ({}) must be a multiple of kv-heads ({})",
            self.heads,
            self.kv_heads
        );
        if self.head_dim.is_none() {
            ensure!(
                self.hidden.is_multiple_of(self.heads),
                "hidden ({}) must be a multiple of heads ({}) unless head-dim is given",
                self.hidden,
                self.heads
            );
        }
        let hd = self.head_dim();
        ensure!(
            hd > 0 && hd.is_multiple_of(2),
            "head-dim must be even and > 0 (RoPE), got {hd}"
        );
        ensure!(
            self.vocab >= MIN_VOCAB,
            "vocab must be at least {MIN_VOCAB}, got {}",
            self.vocab
        );
        ensure!(self.max_position > 0, "max-position must be > 0");
        ensure!(self.shards >= 1, "shards must be >= 1");
        let tensors = weights::tensor_specs(self).len();
        ensure!(
            self.shards <= tensors,
            "shards ({}) exceeds the {tensors} tensors",
            self.shards
        );
        Ok(())
    }
}

/// Write `value` as pretty JSON (plus a trailing newline) to `path`.
fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The `config.json` document.
fn config_json(o: &TinyModelOptions) -> Value {
    let (arch, model_type) = match o.arch {
        TinyArch::Llama => ("LlamaForCausalLM", "llama"),
        TinyArch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        TinyArch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        TinyArch::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
    };
    let mut c = json!({
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": o.hidden,
        "intermediate_size": o.intermediate,
        "num_hidden_layers": o.layers,
        "num_attention_heads": o.heads,
        "num_key_value_heads": o.kv_heads,
        "head_dim": o.head_dim(),
        "hidden_act": "silu",
        "rms_norm_eps": o.rms_norm_eps,
        "rope_theta": o.rope_theta,
        "rope_scaling": null,
        "max_position_embeddings": o.max_position,
        "vocab_size": o.vocab,
        "tie_word_embeddings": o.tie_word_embeddings,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "torch_dtype": o.dtype.torch_name(),
        "transformers_version": "4.51.0"
    });
    let extra = match o.arch {
        TinyArch::Llama => json!({"mlp_bias": false, "pretraining_tp": 1}),
        TinyArch::Qwen3 | TinyArch::Qwen2 => json!({"use_sliding_window": false, "sliding_window": null,
                                  "max_window_layers": o.layers}),
        TinyArch::Gemma3 => gemma3_config(o),
    };
    if let (Some(c), Value::Object(extra)) = (c.as_object_mut(), extra) {
        c.extend(extra);
        if o.arch == TinyArch::Gemma3 {
            c.remove("hidden_act");
        }
    }
    c
}

/// Gemma 3's own config keys, as transformers 4.5x writes them (the layer
/// pattern only as `layer_types`, as newer configs have it).
fn gemma3_config(o: &TinyModelOptions) -> Value {
    let layer_types: Vec<&str> = (0..o.layers)
        .map(|i| if (i + 1).is_multiple_of(GEMMA3_PATTERN) { "full_attention" } else { "sliding_attention" })
        .collect();
    json!({
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": GEMMA3_QUERY_PRE_ATTN_SCALAR,
        "sliding_window": GEMMA3_WINDOW,
        "layer_types": layer_types,
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA,
        "attn_logit_softcapping": null,
        "final_logit_softcapping": null
    })
}

/// The `generation_config.json` document.
fn generation_config_json() -> Value {
    json!({
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
        "do_sample": true,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
        "transformers_version": "4.51.0"
    })
}

/// Remove weight files an earlier run may have left (another shard count).
fn remove_stale_weights(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let sharded =
            name.starts_with("model-") && name.contains("-of-") && name.ends_with(".safetensors");
        if sharded || name == "model.safetensors" || name == "model.safetensors.index.json" {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Write a tiny random model described by `opts` into `dir` (created if
/// needed; earlier weight files there are replaced), then check the
/// tokenizer loads.
pub fn write_tiny_model(opts: &TinyModelOptions, dir: &Path) -> Result<()> {
    opts.validate()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    remove_stale_weights(dir)?;
    write_json(&dir.join("config.json"), &config_json(opts))?;
    write_json(
        &dir.join("generation_config.json"),
        &generation_config_json(),
    )?;
    write_json(
        &dir.join("tokenizer.json"),
        &tokenizer::tokenizer_json(opts),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &tokenizer::tokenizer_config_json(opts),
    )?;
    weights::write_weights(opts, dir)?;
    let tok_path = dir.join("tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| anyhow::anyhow!("{} does not load: {e}", tok_path.display()))?;
    let size = tok.get_vocab_size(true);
    if size != opts.vocab {
        bail!("tokenizer has {size} tokens, config says {}", opts.vocab);
    }
    Ok(())
}
