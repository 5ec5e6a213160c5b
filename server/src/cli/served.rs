//! How `spindle serve` presents its model: the names it answers to, the
//! context length it allows, the chat template it renders with.

use anyhow::Context;
use clap::Args;
use spindle_engine::load::ModelMeta;
use spindle_server::app::ModelInfo;
use std::path::PathBuf;

/// Flags that shape the served model (vLLM's names).
#[derive(Args, Debug, Clone)]
pub struct ServedModelArgs {
    /// Names clients may send as `model` (comma-separated or repeated); the
    /// first is the one responses report. Default: the model file's name.
    #[arg(long = "served-model-name", env = "SPINDLE_SERVED_MODEL_NAME", value_delimiter = ',')]
    pub served_model_names: Vec<String>,
    /// Context length to allow, at most the model's own.
    #[arg(long, env = "SPINDLE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// A Jinja chat template file to render prompts with instead of the model's.
    #[arg(long, env = "SPINDLE_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
}

impl ServedModelArgs {
    /// The server's view of the loaded model, with these flags applied.
    pub fn model_info(&self, meta: ModelMeta, created: i64) -> anyhow::Result<ModelInfo> {
        let context_length = match self.max_model_len {
            Some(len) if len > meta.config.context_length => {
                anyhow::bail!("--max-model-len {len} is longer than the model's context length {}", meta.config.context_length)
            }
            Some(0) => anyhow::bail!("--max-model-len must be positive"),
            Some(len) => len,
            None => meta.config.context_length,
        };
        let template = match &self.chat_template {
            Some(path) => {
                let source = std::fs::read_to_string(path).with_context(|| format!("reading --chat-template {}", path.display()))?;
                meta.template.with_source(&source).with_context(|| format!("--chat-template {}", path.display()))?
            }
            None => meta.template,
        };
        let mut names = self.served_model_names.iter().filter(|n| !n.is_empty()).cloned();
        let name = names.next().unwrap_or(meta.location.name);
        let mut info = ModelInfo::new(name, meta.tokenizer, template, context_length, meta.config.vocab_size, created);
        info.aliases = names.collect();
        Ok(info)
    }
}
