//! `spindle models`: what the model cache holds.

use spindle_engine::models::{cache_root, list_cached, ModelFormat};

/// Print one line per cached model.
pub fn run() -> anyhow::Result<()> {
    let models = list_cached();
    if models.is_empty() {
        println!("no models in {} (scripts/fetch-model.sh installs the default)", cache_root().join("models").display());
    }
    for m in models {
        let format = match m.format {
            ModelFormat::Gguf => "gguf",
            ModelFormat::HfDir => "hf",
        };
        let size = std::fs::metadata(&m.path).map(|md| md.len()).unwrap_or(0);
        println!("{:<28} {:<5} {:>8.1} MB  {}", m.name, format, size as f64 / 1e6, m.path.display());
    }
    Ok(())
}
