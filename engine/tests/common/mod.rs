//! Shared helpers for the engine's integration tests.
#![allow(dead_code, missing_docs)]

use spindle_engine::config::ModelConfig;
use spindle_engine::gguf::GgufFile;
use spindle_engine::model::{LlamaModel, WeightNaming};
use std::path::PathBuf;

/// The real SmolLM2 GGUF, or `None` (after printing why) when it is not installed.
pub fn smollm2_path() -> Option<PathBuf> {
    match std::env::var_os("SPINDLE_MODEL_GGUF") {
        Some(p) if PathBuf::from(&p).is_file() => Some(PathBuf::from(p)),
        Some(p) => {
            println!("skipped: SPINDLE_MODEL_GGUF={} is not a file (run scripts/fetch-model.sh)", PathBuf::from(p).display());
            None
        }
        None => {
            println!("skipped: SPINDLE_MODEL_GGUF not set (scripts/test.sh sets it after fetching the model)");
            None
        }
    }
}

/// Load SmolLM2's weights from its GGUF.
pub fn load_smollm2(path: &std::path::Path) -> LlamaModel {
    let file = GgufFile::open(path).expect("open gguf");
    let config = ModelConfig::from_gguf(&file).expect("config");
    LlamaModel::load(config, &file, WeightNaming::Gguf).expect("load")
}

/// Path of a file under the workspace's `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}
