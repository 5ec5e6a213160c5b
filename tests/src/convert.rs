//! Format converters used by the equivalence tests: GGUF → HF directory
//! (every tensor dequantized to f32) and HF directory → GGUF (F32 tensors).
//!
//! Both follow llama.cpp's `convert_hf_to_gguf.py` conventions:
//!
//! * tensor names: `blk.N.attn_q.weight` ↔ `model.layers.N.self_attn.q_proj.weight`, …
//! * for `general.architecture = "llama"` only, the rows of the q and k
//!   projections are permuted so that llama.cpp's interleaved-pair RoPE
//!   (dims `(2i, 2i+1)`) computes what HF's `rotate_half` RoPE (dims
//!   `(i, i + d/2)`) computes on the original rows. HF → GGUF is
//!   `w.reshape(n_head, 2, head_dim/2, cols).swapaxes(1, 2).reshape(rows, cols)`
//!   ([`permute_llama_qk_rows`]); GGUF → HF is its inverse
//!   ([`unpermute_llama_qk_rows`]). K uses the number of KV heads.
//! * hyper-parameters: `llama.embedding_length` ↔ `hidden_size`, … (see
//!   [`gguf_to_hf_dir`] and [`hf_to_gguf_file`]).
//!
//! These are test tools: they hold the whole model in memory as f32.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, ensure, Context, Result};
use safetensors::tensor::TensorView as StView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{json, Value};
use spindle_engine::gguf::types::GgmlType;
use spindle_engine::gguf::{GgufFile, GgufWriter, MetadataValue};
use spindle_engine::quant::dequantize_tensor;
use spindle_engine::weights::TensorSource;

/// Per-layer tensor names: (GGUF part, HF part).
const LAYER_PARTS: [(&str, &str); 11] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// Whole-model tensor names: (GGUF, HF).
const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// GGUF architecture name ↔ HF `architectures[0]` / `model_type`.
const ARCHS: [(&str, &str, &str); 3] = [
    ("llama", "LlamaForCausalLM", "llama"),
    ("qwen2", "Qwen2ForCausalLM", "qwen2"),
    ("qwen3", "Qwen3ForCausalLM", "qwen3"),
];

/// The HF name of a GGUF tensor, or `None` if it is not one the converter knows.
pub fn gguf_name_to_hf(name: &str) -> Option<String> {
    if let Some((_, hf)) = GLOBAL_NAMES.iter().find(|(g, _)| *g == name) {
        return Some((*hf).to_owned());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let (_, hf) = LAYER_PARTS.iter().find(|(g, _)| *g == part)?;
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// The GGUF name of an HF tensor, or `None` if it is not one the converter knows.
pub fn hf_name_to_gguf(name: &str) -> Option<String> {
    if let Some((g, _)) = GLOBAL_NAMES.iter().find(|(_, h)| *h == name) {
        return Some((*g).to_owned());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let (g, _) = LAYER_PARTS.iter().find(|(_, h)| *h == part)?;
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// Check a `[rows, cols]` matrix splits into `n_head` heads of even width.
fn head_split(len: usize, rows: usize, cols: usize, n_head: usize) -> Result<usize> {
    ensure!(len == rows * cols, "matrix of {len} values is not {rows}x{cols}");
    ensure!(
        n_head > 0 && rows.is_multiple_of(2 * n_head),
        "{rows} rows do not split into {n_head} heads of even width"
    );
    Ok(rows / n_head / 2)
}

/// HF → GGUF row order for a llama q/k projection (`[rows, cols]`, row-major):
/// `w.reshape(n_head, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)`,
/// i.e. GGUF row `h*hd + 2i + j` is HF row `h*hd + j*half + i`.
pub fn permute_llama_qk_rows(w: &[f32], rows: usize, cols: usize, n_head: usize) -> Result<Vec<f32>> {
    let half = head_split(w.len(), rows, cols, n_head)?;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let dst = h * 2 * half + 2 * i + j;
                let src = h * 2 * half + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    Ok(out)
}

/// GGUF → HF row order: the inverse of [`permute_llama_qk_rows`].
pub fn unpermute_llama_qk_rows(w: &[f32], rows: usize, cols: usize, n_head: usize) -> Result<Vec<f32>> {
    let half = head_split(w.len(), rows, cols, n_head)?;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let gguf_row = h * 2 * half + 2 * i + j;
                let hf_row = h * 2 * half + j * half + i;
                out[hf_row * cols..(hf_row + 1) * cols]
                    .copy_from_slice(&w[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    Ok(out)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn meta_u64(file: &GgufFile, key: &str) -> Result<u64> {
    file.get_u64(key).with_context(|| format!("GGUF metadata `{key}`"))
}

/// Convert a llama/qwen2/qwen3 GGUF into an HF directory at `out` (created
/// if needed): `config.json` from the `{arch}.*` metadata, and
/// `model.safetensors` with every tensor dequantized to f32 under its HF
/// name (llama q/k rows un-permuted). No tokenizer files are written.
pub fn gguf_to_hf_dir(gguf: &Path, out: &Path) -> Result<()> {
    let file = GgufFile::open(gguf).with_context(|| format!("opening {}", gguf.display()))?;
    let arch = file.get_str("general.architecture")?.to_owned();
    let (hf_arch, model_type) = ARCHS
        .iter()
        .find(|(g, _, _)| *g == arch)
        .map(|(_, h, m)| (*h, *m))
        .ok_or_else(|| anyhow!("GGUF architecture `{arch}` has no HF counterpart here"))?;
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = meta_u64(&file, &key("embedding_length"))?;
    let n_head = meta_u64(&file, &key("attention.head_count"))?;
    let n_kv_head = file.get_u64(&key("attention.head_count_kv")).unwrap_or(n_head);
    let head_dim = match file.get_u64(&key("attention.key_length")) {
        Ok(v) => v,
        Err(_) => hidden / n_head.max(1),
    };
    let vocab = match file.get_u64(&key("vocab_size")) {
        Ok(v) => v,
        Err(_) => file.get_array("tokenizer.ggml.tokens")?.len() as u64,
    };
    let tied = !file.contains("output.weight");
    let mut config = json!({
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": meta_u64(&file, &key("feed_forward_length"))?,
        "num_hidden_layers": meta_u64(&file, &key("block_count"))?,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": file.get_f64(&key("attention.layer_norm_rms_epsilon"))?,
        "rope_theta": file.get_f64(&key("rope.freq_base")).unwrap_or(10_000.0),
        "rope_scaling": null,
        "max_position_embeddings": meta_u64(&file, &key("context_length"))?,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    });
    for (gguf_key, hf_key) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Ok(id) = file.get_u64(gguf_key) {
            config[hf_key] = json!(id);
        }
    }
    if let Ok(kind) = file.get_str(&key("rope.scaling.type")) {
        ensure!(kind == "llama3", "rope scaling `{kind}` is not converted");
        let f = |k: &str, d: f64| file.get_f64(&key(&format!("rope.scaling.{k}"))).unwrap_or(d);
        config["rope_scaling"] = json!({
            "rope_type": "llama3",
            "factor": f("factor", 8.0),
            "low_freq_factor": f("low_freq_factor", 1.0),
            "high_freq_factor": f("high_freq_factor", 4.0),
            "original_max_position_embeddings": f("original_context_length", 8192.0),
        });
    }

    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for info in file.tensor_infos() {
        if info.name == "rope_freqs.weight" {
            // llama.cpp's baked llama3 frequencies: the config carries them instead.
            continue;
        }
        let hf_name = gguf_name_to_hf(&info.name)
            .ok_or_else(|| anyhow!("no HF name for GGUF tensor `{}`", info.name))?;
        let view = file.tensor(&info.name)?;
        let mut values = dequantize_tensor(&view)
            .with_context(|| format!("dequantizing `{}`", info.name))?;
        let is_q = info.name.ends_with(".attn_q.weight");
        let is_k = info.name.ends_with(".attn_k.weight");
        if arch == "llama" && (is_q || is_k) {
            let [rows, cols] = info.shape[..] else {
                bail!("`{}` has shape {:?}, expected 2-D", info.name, info.shape);
            };
            let heads = if is_q { n_head } else { n_kv_head } as usize;
            values = unpermute_llama_qk_rows(&values, rows, cols, heads)?;
        }
        tensors.push((hf_name, info.shape.clone(), f32_bytes(&values)));
    }

    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut text = serde_json::to_string_pretty(&config)?;
    text.push('\n');
    std::fs::write(out.join("config.json"), text)?;
    let views = tensors
        .iter()
        .map(|(name, shape, data)| Ok((name.as_str(), StView::new(Dtype::F32, shape.clone(), data)?)))
        .collect::<Result<Vec<_>>>()?;
    let path = out.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One safetensors tensor as f32 (F32, BF16 and F16 are accepted).
fn safetensor_f32(view: &StView<'_>, name: &str) -> Result<Vec<f32>> {
    let data = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => bail!("tensor `{name}` has dtype {other:?}; only F32/BF16/F16 are converted"),
    })
}

fn cfg_u64(cfg: &Value, k: &str) -> Result<u64> {
    cfg[k].as_u64().ok_or_else(|| anyhow!("config.json: missing integer `{k}`"))
}

fn u32_meta(v: u64) -> Result<MetadataValue> {
    Ok(MetadataValue::U32(u32::try_from(v).context("value does not fit in u32")?))
}

/// GGUF tokenizer metadata (`tokenizer.ggml.*`, model `gpt2`) from an HF
/// byte-level BPE `tokenizer.json`: tokens by id, merges, token types
/// (added special tokens are CONTROL = 3, the rest NORMAL = 1).
fn tokenizer_metadata(dir: &Path, cfg: &Value, w: &mut GgufWriter) -> Result<()> {
    let path = dir.join("tokenizer.json");
    let tok: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    let model = &tok["model"];
    ensure!(model["type"] == "BPE", "{}: only BPE tokenizers are converted", path.display());
    let vocab_size = cfg_u64(cfg, "vocab_size")? as usize;
    let mut tokens: Vec<Option<String>> = vec![None; vocab_size];
    let mut types = vec![1i32; vocab_size];
    let vocab = model["vocab"].as_object().ok_or_else(|| anyhow!("tokenizer.json: no model.vocab"))?;
    let mut place = |id: u64, text: &str| -> Result<()> {
        let slot = tokens
            .get_mut(id as usize)
            .ok_or_else(|| anyhow!("token id {id} is outside the vocabulary of {vocab_size}"))?;
        *slot = Some(text.to_owned());
        Ok(())
    };
    for (text, id) in vocab {
        place(id.as_u64().ok_or_else(|| anyhow!("bad id for `{text}`"))?, text)?;
    }
    for added in tok["added_tokens"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let id = added["id"].as_u64().ok_or_else(|| anyhow!("added token without id"))?;
        let text = added["content"].as_str().ok_or_else(|| anyhow!("added token without content"))?;
        place(id, text)?;
        if added["special"].as_bool().unwrap_or(false) {
            if let Some(t) = types.get_mut(id as usize) {
                *t = 3;
            }
        }
    }
    let tokens = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.map(MetadataValue::String).ok_or_else(|| anyhow!("no token with id {i}")))
        .collect::<Result<Vec<_>>>()?;
    let merges = model["merges"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(p) => match (p.first().and_then(Value::as_str), p.get(1).and_then(Value::as_str)) {
                (Some(a), Some(b)) => Ok(format!("{a} {b}")),
                _ => Err(anyhow!("bad merge {m}")),
            },
            _ => Err(anyhow!("bad merge {m}")),
        })
        .map(|m| m.map(MetadataValue::String))
        .collect::<Result<Vec<_>>>()?;
    w.add_metadata("tokenizer.ggml.model", MetadataValue::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.pre", MetadataValue::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.tokens", MetadataValue::Array(tokens));
    w.add_metadata(
        "tokenizer.ggml.token_type",
        MetadataValue::Array(types.into_iter().map(MetadataValue::I32).collect()),
    );
    w.add_metadata("tokenizer.ggml.merges", MetadataValue::Array(merges));
    w.add_metadata("tokenizer.ggml.add_bos_token", MetadataValue::Bool(false));
    for (hf_key, gguf_key) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
    ] {
        if let Some(id) = cfg[hf_key].as_u64() {
            w.add_metadata(gguf_key, u32_meta(id)?);
        }
    }
    let tc_path = dir.join("tokenizer_config.json");
    if tc_path.is_file() {
        let tc: Value = serde_json::from_str(&std::fs::read_to_string(&tc_path)?)?;
        if let Some(t) = tc["chat_template"].as_str() {
            w.add_metadata("tokenizer.chat_template", MetadataValue::String(t.to_owned()));
        }
    }
    Ok(())
}

/// Convert a single-file HF Llama/Qwen2/Qwen3 directory (`config.json`,
/// `model.safetensors`, optional byte-level BPE `tokenizer.json`) to a GGUF
/// v3 file at `out`: `general.architecture` and the `{arch}.*` keys from
/// config.json, every tensor as F32 under its GGUF name (llama q/k rows
/// permuted the llama.cpp way), and `tokenizer.ggml.*` metadata when the
/// directory has a tokenizer.
pub fn hf_to_gguf_file(dir: &Path, out: &Path) -> Result<()> {
    hf_to_gguf(dir, out, true)
}

/// As [`hf_to_gguf_file`]; `permute_llama_qk = false` leaves the llama q/k
/// rows in HF order, which makes a deliberately *wrong* GGUF (tests use it
/// to show that the equivalence check notices a missing permutation).
pub fn hf_to_gguf(dir: &Path, out: &Path, permute_llama_qk: bool) -> Result<()> {
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("config.json")).context("reading config.json")?,
    )?;
    let hf_arch = cfg["architectures"][0].as_str().unwrap_or_default();
    let arch = ARCHS
        .iter()
        .find(|(_, h, m)| *h == hf_arch || cfg["model_type"] == *m)
        .map(|(g, _, _)| *g)
        .ok_or_else(|| anyhow!("HF architecture `{hf_arch}` has no GGUF counterpart here"))?;
    ensure!(cfg["rope_scaling"].is_null(), "rope scaling is not converted");
    let hidden = cfg_u64(&cfg, "hidden_size")?;
    let n_head = cfg_u64(&cfg, "num_attention_heads")?;
    let n_kv_head = cfg["num_key_value_heads"].as_u64().unwrap_or(n_head);
    let head_dim = cfg["head_dim"].as_u64().unwrap_or(hidden / n_head.max(1));
    let vocab = cfg_u64(&cfg, "vocab_size")?;

    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetadataValue::String(arch.into()));
    w.add_metadata("general.name", MetadataValue::String("converted by spindle-tests".into()));
    let key = |k: &str| format!("{arch}.{k}");
    for (k, v) in [
        ("block_count", cfg_u64(&cfg, "num_hidden_layers")?),
        ("context_length", cfg_u64(&cfg, "max_position_embeddings")?),
        ("embedding_length", hidden),
        ("feed_forward_length", cfg_u64(&cfg, "intermediate_size")?),
        ("attention.head_count", n_head),
        ("attention.head_count_kv", n_kv_head),
        ("attention.key_length", head_dim),
        ("attention.value_length", head_dim),
        ("rope.dimension_count", head_dim),
        ("vocab_size", vocab),
    ] {
        w.add_metadata(&key(k), u32_meta(v)?);
    }
    let eps = cfg["rms_norm_eps"].as_f64().ok_or_else(|| anyhow!("config.json: no rms_norm_eps"))?;
    w.add_metadata(&key("attention.layer_norm_rms_epsilon"), MetadataValue::F32(eps as f32));
    let theta = cfg["rope_theta"].as_f64().unwrap_or(10_000.0);
    w.add_metadata(&key("rope.freq_base"), MetadataValue::F32(theta as f32));
    if dir.join("tokenizer.json").is_file() {
        tokenizer_metadata(dir, &cfg, &mut w)?;
    }

    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let mut names: Vec<String> = st.names().into_iter().map(|n| n.to_string()).collect();
    names.sort();
    let tied = cfg["tie_word_embeddings"].as_bool().unwrap_or(false);
    for name in names {
        if tied && name == "lm_head.weight" {
            continue;
        }
        let view = st.tensor(&name)?;
        let gguf_name = hf_name_to_gguf(&name).ok_or_else(|| anyhow!("no GGUF name for HF tensor `{name}`"))?;
        let mut values = safetensor_f32(&view, &name)?;
        let shape = view.shape().to_vec();
        let is_q = name.ends_with(".self_attn.q_proj.weight");
        let is_k = name.ends_with(".self_attn.k_proj.weight");
        if arch == "llama" && permute_llama_qk && (is_q || is_k) {
            let [rows, cols] = shape[..] else {
                bail!("`{name}` has shape {shape:?}, expected 2-D");
            };
            let heads = if is_q { n_head } else { n_kv_head } as usize;
            values = permute_llama_qk_rows(&values, rows, cols, heads)?;
        }
        w.add_tensor(&gguf_name, GgmlType::F32, &shape, f32_bytes(&values))?;
    }
    w.write_to(out)?;
    Ok(())
}

/// Tensors by name: shape (outermost first) and f32 values.
pub type F32Tensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Read every tensor of a single-file safetensors model as f32, by name.
pub fn read_safetensors_f32(path: &Path) -> Result<F32Tensors> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let values = safetensor_f32(&view, &name)?;
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_round_trips_and_matches_the_numpy_formula() -> Result<()> {
        // 2 heads of width 4, 1 column: HF rows 0..8.
        let hf: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let g = permute_llama_qk_rows(&hf, 8, 1, 2)?;
        // reshape(2, 2, 2, 1).swapaxes(1, 2): head 0 = [0, 2, 1, 3], head 1 = [4, 6, 5, 7].
        assert_eq!(g, vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        assert_eq!(unpermute_llama_qk_rows(&g, 8, 1, 2)?, hf);
        let wide: Vec<f32> = (0..48).map(|x| x as f32).collect();
        let p = permute_llama_qk_rows(&wide, 12, 4, 3)?;
        assert_ne!(p, wide);
        assert_eq!(unpermute_llama_qk_rows(&p, 12, 4, 3)?, wide);
        assert!(permute_llama_qk_rows(&wide, 12, 4, 5).is_err());
        Ok(())
    }

    #[test]
    fn names_map_both_ways() {
        for (g, h) in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("blk.3.attn_k.weight", "model.layers.3.self_attn.k_proj.weight"),
            ("blk.0.attn_q.bias", "model.layers.0.self_attn.q_proj.bias"),
            ("blk.11.ffn_norm.weight", "model.layers.11.post_attention_layernorm.weight"),
            ("blk.1.attn_k_norm.weight", "model.layers.1.self_attn.k_norm.weight"),
        ] {
            assert_eq!(gguf_name_to_hf(g).as_deref(), Some(h));
            assert_eq!(hf_name_to_gguf(h).as_deref(), Some(g));
        }
        assert_eq!(gguf_name_to_hf("blk.0.mystery.weight"), None);
        assert_eq!(hf_name_to_gguf("model.layers.x.mlp.up_proj.weight"), None);
    }
}
