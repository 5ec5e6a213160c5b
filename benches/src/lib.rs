//! Shared helpers for the benchmarks.

use spindle_engine::config::ModelConfig;
use spindle_engine::gguf::GgufFile;
use spindle_engine::model::{LlamaModel, WeightNaming};
use std::path::PathBuf;

/// The SmolLM2 GGUF from `SPINDLE_MODEL_GGUF` or the model cache, if installed.
pub fn smollm2_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SPINDLE_MODEL_GGUF") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    spindle_engine::models::resolve(spindle_engine::models::DEFAULT_MODEL).ok().map(|l| l.path)
}

/// Load SmolLM2's weights.
pub fn load_smollm2() -> Option<LlamaModel> {
    let Some(path) = smollm2_path() else {
        eprintln!("skipped: SmolLM2 not installed (run scripts/fetch-model.sh or set SPINDLE_MODEL_GGUF)");
        return None;
    };
    let file = GgufFile::open(&path).ok()?;
    let config = ModelConfig::from_gguf(&file).ok()?;
    LlamaModel::load(config, &file, WeightNaming::Gguf).ok()
}
