//! Shared helpers for the engine's integration tests.
#![allow(dead_code, missing_docs)]

use spindle_engine::config::ModelConfig;
use spindle_engine::gguf::GgufFile;
use spindle_engine::model::{LlamaModel, WeightNaming};
use std::path::PathBuf;

pub mod reference;

/// Load SmolLM2's weights from its GGUF.
pub fn load_smollm2(path: &std::path::Path) -> LlamaModel {
    load_gguf(path)
}

/// Load a Llama-family model (Llama, SmolLM2, Qwen2, ...) from a GGUF.
pub fn load_gguf(path: &std::path::Path) -> LlamaModel {
    let file = GgufFile::open(path).expect("open gguf");
    let config = ModelConfig::from_gguf(&file).expect("config");
    LlamaModel::load(config, &file, WeightNaming::Gguf).expect("load")
}

/// Path of a file under the workspace's `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}
