//! Hugging Face model directories: config.json, safetensors (single or sharded), tokenizer files.
//!
//! [`HfModelDir::open`] reads the small JSON files eagerly and memory-maps the
//! safetensors files; tensors are handed out through
//! [`TensorSource`] as borrowed views of the
//! mapping (F32, F16 and BF16 only).

mod meta;
mod shards;

pub use meta::GenerationDefaults;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::weights::{TensorSource, TensorView};

/// The model's hyper-parameters.
const CONFIG: &str = "config.json";
/// The HF `tokenizers` serialisation.
const TOKENIZER: &str = "tokenizer.json";
/// Special tokens and chat template.
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
/// Newer transformers save the chat template in a file of its own.
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// Sampling defaults and stop ids.
const GENERATION_CONFIG: &str = "generation_config.json";

/// An opened Hugging Face model directory.
#[derive(Debug)]
pub struct HfModelDir {
    dir: PathBuf,
    config: Value,
    weights: shards::ShardSet,
    tokenizer_json: Option<PathBuf>,
    tokenizer_config: Option<Value>,
    chat_templates: Vec<(String, String)>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    generation_config: Option<Value>,
}

/// Read and parse a JSON file; a parse error names the file.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| EngineError::InvalidModelDir(format!("{}: invalid JSON: {e}", path.display())))
}

/// Parse `dir/name` if it exists.
fn read_optional_json(dir: &Path, name: &str) -> Result<Option<Value>> {
    let path = dir.join(name);
    if path.is_file() {
        read_json(&path).map(Some)
    } else {
        Ok(None)
    }
}

impl HfModelDir {
    /// Open `dir`: parse `config.json`, map the safetensors weights, read the
    /// optional tokenizer, tokenizer-config and generation-config files.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(EngineError::InvalidModelDir(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        let config_path = dir.join(CONFIG);
        if !config_path.is_file() {
            return Err(EngineError::InvalidModelDir(format!(
                "{}: missing {CONFIG}",
                dir.display()
            )));
        }
        let config = read_json(&config_path)?;
        if !config.is_object() {
            return Err(EngineError::InvalidModelDir(format!(
                "{}: not a JSON object",
                config_path.display()
            )));
        }
        let weights = shards::ShardSet::open(&dir)?;
        let tokenizer_json = Some(dir.join(TOKENIZER)).filter(|p| p.is_file());
        let tokenizer_config = read_optional_json(&dir, TOKENIZER_CONFIG)?;
        let mut chat_templates = tokenizer_config
            .as_ref()
            .map(meta::chat_templates)
            .unwrap_or_default();
        let template_file = dir.join(CHAT_TEMPLATE_FILE);
        if template_file.is_file() {
            let text =
                std::fs::read_to_string(&template_file).map_err(|source| EngineError::Io {
                    path: template_file.clone(),
                    source,
                })?;
            chat_templates.retain(|(name, _)| name != "default");
            chat_templates.insert(0, ("default".to_string(), text));
        }
        let bos_token = tokenizer_config
            .as_ref()
            .and_then(|c| meta::token_string(c.get("bos_token")));
        let eos_token = tokenizer_config
            .as_ref()
            .and_then(|c| meta::token_string(c.get("eos_token")));
        let generation_config = read_optional_json(&dir, GENERATION_CONFIG)?;
        Ok(Self {
            dir,
            config,
            weights,
            tokenizer_json,
            tokenizer_config,
            chat_templates,
            bos_token,
            eos_token,
            generation_config,
        })
    }

    /// The directory this was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The whole of `config.json`.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// A string field of `config.json`.
    pub fn config_str(&self, key: &str) -> Option<&str> {
        self.config.get(key).and_then(Value::as_str)
    }

    /// A non-negative integer field of `config.json`.
    pub fn config_u64(&self, key: &str) -> Option<u64> {
        self.config.get(key).and_then(Value::as_u64)
    }

    /// A numeric field of `config.json`.
    pub fn config_f64(&self, key: &str) -> Option<f64> {
        self.config.get(key).and_then(Value::as_f64)
    }

    /// A boolean field of `config.json`.
    pub fn config_bool(&self, key: &str) -> Option<bool> {
        self.config.get(key).and_then(Value::as_bool)
    }

    /// The first entry of `config.json`'s `architectures`, e.g. `LlamaForCausalLM`.
    pub fn architecture(&self) -> Option<&str> {
        self.config.get("architectures")?.get(0)?.as_str()
    }

    /// Path of `tokenizer.json`, if the directory has one.
    pub fn tokenizer_json_path(&self) -> Option<PathBuf> {
        self.tokenizer_json.clone()
    }

    /// The whole of `tokenizer_config.json`, if present.
    pub fn tokenizer_config(&self) -> Option<&Value> {
        self.tokenizer_config.as_ref()
    }

    /// The default chat template: `chat_template.jinja` if present, else
    /// `tokenizer_config.json`'s string template or its entry named `default`,
    /// else the first named one.
    pub fn chat_template(&self) -> Option<&str> {
        self.named_chat_template("default")
            .or_else(|| self.chat_templates.first().map(|(_, t)| t.as_str()))
    }

    /// The chat template called `name` (e.g. `tool_use`), if any.
    pub fn named_chat_template(&self, name: &str) -> Option<&str> {
        self.chat_templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// Names of all chat templates found, default first.
    pub fn chat_template_names(&self) -> impl Iterator<Item = &str> {
        self.chat_templates.iter().map(|(n, _)| n.as_str())
    }

    /// `tokenizer_config.json`'s `bos_token` (string or `{content}` form).
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// `tokenizer_config.json`'s `eos_token` (string or `{content}` form).
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The whole of `generation_config.json`, if present.
    pub fn generation_config(&self) -> Option<&Value> {
        self.generation_config.as_ref()
    }

    /// Sampling defaults from `generation_config.json` (all `None` without one).
    pub fn generation_defaults(&self) -> GenerationDefaults {
        self.generation_config
            .as_ref()
            .map(GenerationDefaults::from_json)
            .unwrap_or_default()
    }

    /// Stop token ids: `generation_config.json`'s `eos_token_id` (integer or
    /// list), else `config.json`'s. Empty if neither has one.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        let from_gen = meta::token_ids(
            self.generation_config
                .as_ref()
                .and_then(|g| g.get("eos_token_id")),
        );
        if from_gen.is_empty() {
            meta::token_ids(self.config.get("eos_token_id"))
        } else {
            from_gen
        }
    }

    /// `bos_token_id` from `generation_config.json`, else `config.json`.
    pub fn bos_token_id(&self) -> Option<u32> {
        let gen = self
            .generation_config
            .as_ref()
            .and_then(|g| g.get("bos_token_id"));
        meta::token_ids(gen).first().copied().or_else(|| {
            meta::token_ids(self.config.get("bos_token_id"))
                .first()
                .copied()
        })
    }

    /// All tensor names across all shards, sorted.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.weights.names().iter().map(String::as_str)
    }

    /// The safetensors files that were mapped.
    pub fn safetensors_paths(&self) -> impl Iterator<Item = &Path> {
        self.weights.paths()
    }
}

impl TensorSource for HfModelDir {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.weights.view(name)
    }

    fn contains(&self, name: &str) -> bool {
        self.weights.contains(name)
    }
}
