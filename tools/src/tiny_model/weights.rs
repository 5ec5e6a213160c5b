//! Deterministic random weights for tiny models, and their safetensors files.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::{TinyArch, TinyDtype, TinyModelOptions};

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// Centred, roughly normal, with this standard deviation.
    Normal(f64),
    /// Around 1.0 (norm weights): `1 + 0.05 * normal`.
    Norm,
    /// Around 0.0 (Gemma's norms, applied as `1 + w`): `0.05 * normal`.
    GemmaNorm,
}

/// One tensor of the model: HF name, shape (outermost first), init.
#[derive(Debug, Clone)]
pub(super) struct TensorSpec {
    pub(super) name: String,
    pub(super) shape: Vec<usize>,
    init: Init,
}

/// splitmix64: the whole generator (tiny, portable, fixed forever).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name, so each tensor's stream depends only on the
/// model seed and its own name (not on how many other tensors there are).
fn fnv1a(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// An approximately standard normal value (Irwin-Hall sum of four uniforms),
/// using only exactly-rounded arithmetic so every platform gets the same bits.
fn normal(state: &mut u64) -> f64 {
    let mut sum = 0.0;
    for _ in 0..4 {
        sum += (splitmix64(state) >> 11) as f64 / (1u64 << 53) as f64;
    }
    (sum - 2.0) * 1.732_050_807_568_877_2
}

/// Standard deviation for a linear layer with `fan_in` inputs:
/// `0.5 / sqrt(fan_in)`, kept within [0.02, 0.1].
fn linear_std(fan_in: usize) -> f64 {
    (0.5 / (fan_in as f64).sqrt()).clamp(0.02, 0.1)
}

/// Every tensor of the model, in HF naming, sorted by name.
pub(super) fn tensor_specs(o: &TinyModelOptions) -> Vec<TensorSpec> {
    let (h, hd) = (o.hidden, o.head_dim());
    let (q, kv) = (o.heads * hd, o.kv_heads * hd);
    let gemma = o.arch == TinyArch::Gemma3;
    let spec = |name: String, shape: Vec<usize>, init| TensorSpec { name, shape, init };
    let norm = |name: String, width: usize| {
        spec(name, vec![width], if gemma { Init::GemmaNorm } else { Init::Norm })
    };
    let linear = |name: String, out: usize, inp: usize| {
        spec(name, vec![out, inp], Init::Normal(linear_std(inp)))
    };
    let mut v = vec![
        spec(
            "model.embed_tokens.weight".into(),
            vec![o.vocab, h],
            // Gemma multiplies embeddings by √hidden; smaller values keep the
            // tied head from simply repeating the input token.
            Init::Normal(if gemma { 0.02 } else { 0.1 }),
        ),
        norm("model.norm.weight".into(), h),
    ];
    if !o.tie_word_embeddings {
        v.push(spec(
            "lm_head.weight".into(),
            vec![o.vocab, h],
            Init::Normal(0.1),
        ));
    }
    for i in 0..o.layers {
        let p = format!("model.layers.{i}");
        v.push(norm(format!("{p}.input_layernorm.weight"), h));
        v.push(norm(format!("{p}.post_attention_layernorm.weight"), h));
        if gemma {
            v.push(norm(format!("{p}.pre_feedforward_layernorm.weight"), h));
            v.push(norm(format!("{p}.post_feedforward_layernorm.weight"), h));
        }
        v.push(linear(format!("{p}.self_attn.q_proj.weight"), q, h));
        v.push(linear(format!("{p}.self_attn.k_proj.weight"), kv, h));
        v.push(linear(format!("{p}.self_attn.v_proj.weight"), kv, h));
        v.push(linear(format!("{p}.self_attn.o_proj.weight"), h, q));
        if o.arch == TinyArch::Qwen2 {
            for (part, width) in [("q", q), ("k", kv), ("v", kv)] {
                v.push(spec(format!("{p}.self_attn.{part}_proj.bias"), vec![width], Init::Normal(0.1)));
            }
        }
        if matches!(o.arch, TinyArch::Qwen3 | TinyArch::Gemma3) {
            v.push(norm(format!("{p}.self_attn.q_norm.weight"), hd));
            v.push(norm(format!("{p}.self_attn.k_norm.weight"), hd));
        }
        v.push(linear(
            format!("{p}.mlp.gate_proj.weight"),
            o.intermediate,
            h,
        ));
        v.push(linear(format!("{p}.mlp.up_proj.weight"), o.intermediate, h));
        v.push(linear(
            format!("{p}.mlp.down_proj.weight"),
            h,
            o.intermediate,
        ));
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// The values of one tensor, as little-endian bytes of `dtype`.
fn tensor_bytes(spec: &TensorSpec, seed: u64, dtype: TinyDtype) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ fnv1a(&spec.name);
    let n: usize = spec.shape.iter().product();
    let mut out = Vec::with_capacity(n * 4);
    for _ in 0..n {
        let x = match spec.init {
            Init::Normal(std) => normal(&mut state) * std,
            Init::Norm => 1.0 + 0.05 * normal(&mut state),
            Init::GemmaNorm => 0.05 * normal(&mut state),
        } as f32;
        match dtype {
            TinyDtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            TinyDtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            TinyDtype::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
        }
    }
    out
}

fn st_dtype(d: TinyDtype) -> Dtype {
    match d {
        TinyDtype::F32 => Dtype::F32,
        TinyDtype::Bf16 => Dtype::BF16,
        TinyDtype::F16 => Dtype::F16,
    }
}

/// Write one safetensors file holding `specs`; returns the data bytes written.
fn write_file(path: &Path, specs: &[TensorSpec], o: &TinyModelOptions) -> Result<usize> {
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| tensor_bytes(s, o.seed, o.dtype))
        .collect();
    let mut views = Vec::with_capacity(specs.len());
    for (s, bytes) in specs.iter().zip(&data) {
        let view = TensorView::new(st_dtype(o.dtype), s.shape.clone(), bytes)
            .with_context(|| format!("building tensor {}", s.name))?;
        views.push((s.name.as_str(), view));
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    let buf = safetensors::serialize(views, Some(meta))
        .with_context(|| format!("serialising {}", path.display()))?;
    std::fs::write(path, buf).with_context(|| format!("writing {}", path.display()))?;
    Ok(data.iter().map(Vec::len).sum())
}

/// Write `model.safetensors`, or `o.shards` shards plus
/// `model.safetensors.index.json`, into `dir`.
pub(super) fn write_weights(o: &TinyModelOptions, dir: &Path) -> Result<()> {
    let specs = tensor_specs(o);
    if o.shards <= 1 {
        write_file(&dir.join("model.safetensors"), &specs, o)?;
        return Ok(());
    }
    let per_shard = specs.len().div_ceil(o.shards);
    let mut weight_map = serde_json::Map::new();
    let mut total = 0usize;
    for (i, chunk) in specs.chunks(per_shard).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, o.shards);
        total += write_file(&dir.join(&file), chunk, o)?;
        for s in chunk {
            weight_map.insert(s.name.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    super::write_json(&dir.join("model.safetensors.index.json"), &index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_sane_moments() {
        let mut s = 1;
        let xs: Vec<f64> = (0..20_000).map(|_| normal(&mut s)).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
    }

    #[test]
    fn tensor_streams_depend_on_name_and_seed() {
        let o = TinyModelOptions::default();
        let specs = tensor_specs(&o);
        let a = tensor_bytes(&specs[0], 1, TinyDtype::F32);
        assert_eq!(a, tensor_bytes(&specs[0], 1, TinyDtype::F32));
        assert_ne!(a, tensor_bytes(&specs[0], 2, TinyDtype::F32));
        let same_shape = specs.iter().skip(1).find(|s| s.shape == specs[0].shape);
        if let Some(other) = same_shape {
            assert_ne!(a, tensor_bytes(other, 1, TinyDtype::F32));
        }
    }
}
