//! Tests of the Hugging Face model directory loader, on small hand-written
//! safetensors files.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView as StView;
use safetensors::Dtype;
use serde_json::json;
use spindle_engine::gguf::types::GgmlType;
use spindle_engine::hf::HfModelDir;
use spindle_engine::weights::TensorSource;
use spindle_engine::EngineError;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One tensor to write: name, dtype, shape, raw bytes.
struct Spec {
    name: &'static str,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn spec(name: &'static str, dtype: Dtype, shape: Vec<usize>) -> Spec {
    let n: usize = shape.iter().product();
    let size = dtype.bitsize() / 8;
    let data = (0..n * size).map(|i| (i * 7 + name.len()) as u8).collect();
    Spec {
        name,
        dtype,
        shape,
        data,
    }
}

fn write_safetensors(path: &Path, specs: &[Spec]) -> TestResult {
    let mut views = Vec::new();
    for s in specs {
        views.push((s.name, StView::new(s.dtype, s.shape.clone(), &s.data)?));
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    std::fs::write(path, safetensors::serialize(views, Some(meta))?)?;
    Ok(())
}

fn write_json(path: &Path, v: &serde_json::Value) -> TestResult {
    std::fs::write(path, serde_json::to_string_pretty(v)?)?;
    Ok(())
}

fn write_config(dir: &Path) -> TestResult {
    write_json(
        &dir.join("config.json"),
        &json!({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "rms_norm_eps": 1e-5,
                "tie_word_embeddings": false, "eos_token_id": 2, "bos_token_id": 1}),
    )
}

fn basic_specs() -> Vec<Spec> {
    let mut w = spec("w32", Dtype::F32, vec![2, 3]);
    w.data = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    vec![
        w,
        spec("w16", Dtype::F16, vec![4]),
        spec("wbf", Dtype::BF16, vec![3, 2, 2]),
    ]
}

fn expect_invalid_dir(result: Result<HfModelDir, EngineError>, needle: &str) {
    match result {
        Err(EngineError::InvalidModelDir(msg)) => {
            assert!(msg.contains(needle), "`{msg}` should mention `{needle}`")
        }
        other => panic!("expected InvalidModelDir mentioning {needle}, got {other:?}"),
    }
}

#[test]
fn single_file_tensors_and_dtypes() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_config(dir.path())?;
    let specs = basic_specs();
    write_safetensors(&dir.path().join("model.safetensors"), &specs)?;
    let m = HfModelDir::open(dir.path())?;
    assert_eq!(m.architecture(), Some("LlamaForCausalLM"));
    assert_eq!(m.config_u64("hidden_size"), Some(8));
    assert_eq!(m.config_f64("rms_norm_eps"), Some(1e-5));
    assert_eq!(m.config_bool("tie_word_embeddings"), Some(false));
    assert_eq!(m.config()["architectures"][0], "LlamaForCausalLM");
    assert_eq!(
        m.tensor_names().collect::<Vec<_>>(),
        vec!["w16", "w32", "wbf"]
    );
    for (s, dtype) in specs
        .iter()
        .zip([GgmlType::F32, GgmlType::F16, GgmlType::BF16])
    {
        let t = m.tensor(s.name)?;
        assert_eq!(t.name, s.name);
        assert_eq!(t.dtype, dtype);
        assert_eq!(t.shape, s.shape);
        assert_eq!(t.data, &s.data[..]);
        assert!(m.contains(s.name));
    }
    m.tensor("w32")?.expect_shape(&[2, 3])?;
    assert!(!m.contains("nope"));
    assert!(matches!(m.tensor("nope"), Err(EngineError::MissingTensor(n)) if n == "nope"));
    // No optional files.
    assert_eq!(m.tokenizer_json_path(), None);
    assert_eq!(m.chat_template(), None);
    assert_eq!(m.bos_token(), None);
    assert!(m.generation_config().is_none());
    assert_eq!(m.eos_token_ids(), vec![2]);
    assert_eq!(m.bos_token_id(), Some(1));
    Ok(())
}

fn write_sharded(dir: &Path, index: &serde_json::Value) -> TestResult {
    write_config(dir)?;
    let specs = basic_specs();
    let (a, b) = specs.split_at(1);
    write_safetensors(&dir.join("model-00001-of-00002.safetensors"), a)?;
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), b)?;
    write_json(&dir.join("model.safetensors.index.json"), index)
}

fn good_index() -> serde_json::Value {
    json!({"metadata": {"total_size": 40}, "weight_map": {
        "w32": "model-00001-of-00002.safetensors",
        "w16": "model-00002-of-00002.safetensors",
        "wbf": "model-00002-of-00002.safetensors"}})
}

#[test]
fn sharded_with_index() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_sharded(dir.path(), &good_index())?;
    let m = HfModelDir::open(dir.path())?;
    assert_eq!(m.safetensors_paths().count(), 2);
    assert_eq!(m.tensor_names().count(), 3);
    assert_eq!(
        m.tensor("w32")?.data,
        &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])[..]
    );
    assert_eq!(m.tensor("wbf")?.shape, vec![3, 2, 2]);
    Ok(())
}

#[test]
fn index_naming_a_missing_shard() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut index = good_index();
    index["weight_map"]["extra"] = json!("model-00003-of-00003.safetensors");
    write_sharded(dir.path(), &index)?;
    expect_invalid_dir(
        HfModelDir::open(dir.path()),
        "model-00003-of-00003.safetensors",
    );
    Ok(())
}

#[test]
fn index_placing_a_tensor_in_the_wrong_shard() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut index = good_index();
    index["weight_map"]["w32"] = json!("model-00002-of-00002.safetensors");
    write_sharded(dir.path(), &index)?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "w32");
    Ok(())
}

#[test]
fn index_escaping_the_directory() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut index = good_index();
    index["weight_map"]["w32"] = json!("../model-00001-of-00002.safetensors");
    write_sharded(dir.path(), &index)?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "plain relative path");
    Ok(())
}

#[test]
fn missing_config() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_safetensors(&dir.path().join("model.safetensors"), &basic_specs())?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "config.json");
    std::fs::write(dir.path().join("config.json"), "{not json")?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "config.json");
    expect_invalid_dir(
        HfModelDir::open(dir.path().join("nowhere")),
        "not a directory",
    );
    Ok(())
}

#[test]
fn no_safetensors() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_config(dir.path())?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "model.safetensors");
    Ok(())
}

#[test]
fn other_safetensors_names_are_found() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_config(dir.path())?;
    write_safetensors(&dir.path().join("weights.safetensors"), &basic_specs())?;
    assert_eq!(HfModelDir::open(dir.path())?.tensor_names().count(), 3);
    Ok(())
}

#[test]
fn corrupt_or_truncated_safetensors() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_config(dir.path())?;
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage header}")?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "model.safetensors");
    std::fs::write(&path, b"")?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "model.safetensors");
    write_safetensors(&path, &basic_specs())?;
    let full = std::fs::read(&path)?;
    std::fs::write(&path, &full[..full.len() - 3])?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "model.safetensors");
    // A header length far beyond the file.
    let mut huge = full.clone();
    huge[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&path, &huge)?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "model.safetensors");
    Ok(())
}

#[test]
fn unsupported_dtype_is_reported_on_use() -> TestResult {
    let dir = tempfile::tempdir()?;
    write_config(dir.path())?;
    let mut specs = basic_specs();
    specs.push(spec("positions", Dtype::I64, vec![5]));
    write_safetensors(&dir.path().join("model.safetensors"), &specs)?;
    let m = HfModelDir::open(dir.path())?;
    assert!(m.contains("positions"));
    match m.tensor("positions") {
        Err(EngineError::UnsupportedDtype(msg)) => {
            assert!(msg.contains("I64") && msg.contains("positions"), "{msg}")
        }
        other => panic!("expected UnsupportedDtype, got {other:?}"),
    }
    assert!(m.tensor("w16").is_ok());
    Ok(())
}

fn minimal_dir() -> Result<tempfile::TempDir, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    write_config(dir.path())?;
    write_safetensors(&dir.path().join("model.safetensors"), &basic_specs())?;
    Ok(dir)
}

#[test]
fn tokenizer_files_list_templates_and_token_objects() -> TestResult {
    let dir = minimal_dir()?;
    std::fs::write(dir.path().join("tokenizer.json"), "{}")?;
    write_json(
        &dir.path().join("tokenizer_config.json"),
        &json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "DEFAULT"}
            ]
        }),
    )?;
    write_json(
        &dir.path().join("generation_config.json"),
        &json!({"bos_token_id": 5, "eos_token_id": [7, 8], "do_sample": true,
                "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}),
    )?;
    let m = HfModelDir::open(dir.path())?;
    assert_eq!(
        m.tokenizer_json_path(),
        Some(dir.path().join("tokenizer.json"))
    );
    assert_eq!(m.bos_token(), Some("<s>"));
    assert_eq!(m.eos_token(), Some("</s>"));
    assert_eq!(m.chat_template(), Some("DEFAULT"));
    assert_eq!(m.named_chat_template("tool_use"), Some("TOOLS"));
    assert_eq!(
        m.chat_template_names().collect::<Vec<_>>(),
        vec!["tool_use", "default"]
    );
    assert_eq!(m.eos_token_ids(), vec![7, 8]);
    assert_eq!(m.bos_token_id(), Some(5));
    let p = m.generation_defaults().sampling_params();
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.repetition_penalty),
        (0.6, 0.9, 20, 1.1)
    );
    assert!(m
        .tokenizer_config()
        .is_some_and(|c| c.get("eos_token").is_some()));
    Ok(())
}

#[test]
fn string_template_null_tokens_and_template_file() -> TestResult {
    let dir = minimal_dir()?;
    write_json(
        &dir.path().join("tokenizer_config.json"),
        &json!({"bos_token": null, "eos_token": {"content": "<|im_end|>"}, "chat_template": "T1"}),
    )?;
    write_json(
        &dir.path().join("generation_config.json"),
        &json!({"eos_token_id": 3, "do_sample": false, "temperature": 0.7, "top_p": 7.0}),
    )?;
    let m = HfModelDir::open(dir.path())?;
    assert_eq!(m.bos_token(), None);
    assert_eq!(m.eos_token(), Some("<|im_end|>"));
    assert_eq!(m.chat_template(), Some("T1"));
    assert_eq!(m.eos_token_ids(), vec![3]);
    // do_sample: false wins over the temperature given.
    assert!(m.generation_defaults().sampling_params().is_greedy());
    std::fs::write(dir.path().join("chat_template.jinja"), "FROM FILE")?;
    let m = HfModelDir::open(dir.path())?;
    assert_eq!(m.chat_template(), Some("FROM FILE"));
    Ok(())
}

#[test]
fn out_of_range_generation_defaults_are_skipped() -> TestResult {
    let dir = minimal_dir()?;
    write_json(
        &dir.path().join("generation_config.json"),
        &json!({"temperature": 0.8, "top_p": 7.0, "min_p": 0.05, "repetition_penalty": -1}),
    )?;
    let p = HfModelDir::open(dir.path())?
        .generation_defaults()
        .sampling_params();
    assert_eq!(
        (p.temperature, p.top_p, p.min_p, p.repetition_penalty),
        (0.8, 1.0, 0.05, 1.0)
    );
    Ok(())
}

#[test]
fn invalid_side_file_json_names_the_file() -> TestResult {
    let dir = minimal_dir()?;
    std::fs::write(dir.path().join("generation_config.json"), "[1, 2")?;
    expect_invalid_dir(HfModelDir::open(dir.path()), "generation_config.json");
    Ok(())
}
