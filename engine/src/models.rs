//! Finding models: by path, or by name in the model cache
//! (`$SPINDLE_HOME/models/<name>/`, default `~/.cache/spindle`).

use crate::error::{EngineError, Result};
use std::path::{Path, PathBuf};

/// The on-disk format of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A single GGUF file.
    Gguf,
    /// An HF directory (config.json + safetensors + tokenizer files).
    HfDir,
}

/// A model located on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLocation {
    /// The name it is served under (cache directory name or file stem).
    pub name: String,
    /// The GGUF file or the HF directory.
    pub path: PathBuf,
    /// Its format.
    pub format: ModelFormat,
}

/// The cache root: `$SPINDLE_HOME`, else `$HOME/.cache/spindle`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("SPINDLE_HOME") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("spindle")
}

/// The default model's cache name.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// Resolve a path or a cached model name.
pub fn resolve(name_or_path: &str) -> Result<ModelLocation> {
    let p = Path::new(name_or_path);
    if p.exists() {
        let name = p.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        return locate_in(p, &name);
    }
    let dir = cache_root().join("models").join(name_or_path);
    if !name_or_path.contains(['/', '\\']) && dir.is_dir() {
        return locate_in(&dir, name_or_path);
    }
    Err(EngineError::ModelNotFound(format!(
        "{name_or_path}` (looked in {}; `scripts/fetch-model.sh` installs the default model",
        dir.display()
    )))
}

fn locate_in(p: &Path, name: &str) -> Result<ModelLocation> {
    let name = name.to_string();
    if p.is_file() {
        return Ok(ModelLocation { name, path: p.to_path_buf(), format: ModelFormat::Gguf });
    }
    if p.join("config.json").is_file() {
        return Ok(ModelLocation { name, path: p.to_path_buf(), format: ModelFormat::HfDir });
    }
    let ggufs: Vec<PathBuf> = std::fs::read_dir(p)
        .map_err(|source| EngineError::Io { path: p.to_path_buf(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|f| f.extension().is_some_and(|x| x == "gguf"))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(ModelLocation { name, path: one.clone(), format: ModelFormat::Gguf }),
        [] => Err(EngineError::InvalidModelDir(format!("{} has neither config.json nor a .gguf file", p.display()))),
        _ => Err(EngineError::InvalidModelDir(format!("{} has several .gguf files; name one", p.display()))),
    }
}

/// Every model in the cache, sorted by name.
pub fn list_cached() -> Vec<ModelLocation> {
    let dir = cache_root().join("models");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut out: Vec<ModelLocation> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| locate_in(&e.path(), &e.file_name().to_string_lossy()).ok())
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_gguf_in_a_directory_and_rejects_unknown_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("m.gguf"), b"x").expect("write");
        let loc = locate_in(dir.path(), "m").expect("found");
        assert_eq!(loc.format, ModelFormat::Gguf);
        assert!(matches!(resolve("no-such-model-xyz"), Err(EngineError::ModelNotFound(_))));
        std::fs::write(dir.path().join("n.gguf"), b"x").expect("write");
        assert!(locate_in(dir.path(), "m").is_err());
    }
}
