//! Loading a whole model — weights, tokenizer, chat template, stop tokens —
//! from a GGUF file or an HF directory, by path or cached name.

use crate::chat_template::{ChatTemplate, GEMMA_TURN_TEMPLATE};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::gguf::GgufFile;
use crate::hf::HfModelDir;
use crate::model::{LlamaModel, WeightNaming};
use crate::models::{resolve, ModelFormat, ModelLocation};
use crate::tokenizer::{gguf_chat_template, gguf_tokenizer_spec, SpecialTokens, Tokenizer};

/// Everything needed to turn a conversation into tokens and back.
#[derive(Debug)]
pub struct LoadedModel {
    /// Where it came from and its served name.
    pub location: ModelLocation,
    /// The weights.
    pub model: LlamaModel,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template (the model's own, or the ChatML default).
    pub template: ChatTemplate,
    /// Token ids that end generation.
    pub stop_tokens: Vec<u32>,
}

/// Load progress: `done` of `total` layers.
pub type ProgressFn<'a> = &'a mut dyn FnMut(usize, usize);

/// Everything but the weights: what a backend that loads the weights itself
/// (the GPU) needs besides them.
#[derive(Debug)]
pub struct ModelMeta {
    /// Where it came from and its served name.
    pub location: ModelLocation,
    /// The hyper-parameters.
    pub config: ModelConfig,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template (the model's own, or the ChatML default).
    pub template: ChatTemplate,
}

/// Load by path or cached name.
pub fn load_model(name_or_path: &str, progress: ProgressFn<'_>) -> Result<LoadedModel> {
    let location = resolve(name_or_path)?;
    match location.format {
        ModelFormat::Gguf => {
            let mut file = GgufFile::open(&location.path)?;
            let meta = gguf_meta(location, &file)?;
            crate::open::move_to_huge_pages(&mut file);
            let model = LlamaModel::load_with_progress(meta.config.clone(), &file, WeightNaming::Gguf, progress)?;
            Ok(with_weights(meta, model))
        }
        ModelFormat::HfDir => {
            let dir = HfModelDir::open(&location.path)?;
            let meta = hf_meta(location, &dir)?;
            let model = LlamaModel::load_with_progress(meta.config.clone(), &dir, WeightNaming::Hf, progress)?;
            Ok(with_weights(meta, model))
        }
    }
}

/// Load everything but the weights, by path or cached name.
pub fn load_meta(name_or_path: &str) -> Result<ModelMeta> {
    let location = resolve(name_or_path)?;
    match location.format {
        ModelFormat::Gguf => {
            let file = GgufFile::open(&location.path)?;
            gguf_meta(location, &file)
        }
        ModelFormat::HfDir => {
            let dir = HfModelDir::open(&location.path)?;
            hf_meta(location, &dir)
        }
    }
}

fn with_weights(meta: ModelMeta, model: LlamaModel) -> LoadedModel {
    let stop_tokens = meta.tokenizer.eos_ids().to_vec();
    LoadedModel { location: meta.location, model, tokenizer: meta.tokenizer, template: meta.template, stop_tokens }
}

/// Everything but the weights from an opened file or directory.
pub fn load_meta_from(location: ModelLocation, src: &dyn MetaSource) -> Result<ModelMeta> {
    src.meta(location)
}

/// A model container that carries its config, tokenizer and template.
pub trait MetaSource {
    /// Its metadata, served under `location`.
    fn meta(&self, location: ModelLocation) -> Result<ModelMeta>;
}

impl MetaSource for GgufFile {
    fn meta(&self, location: ModelLocation) -> Result<ModelMeta> {
        gguf_meta(location, self)
    }
}

impl MetaSource for HfModelDir {
    fn meta(&self, location: ModelLocation) -> Result<ModelMeta> {
        hf_meta(location, self)
    }
}

fn gguf_meta(location: ModelLocation, file: &GgufFile) -> Result<ModelMeta> {
    let config = ModelConfig::from_gguf(file)?;
    let mut tokenizer = Tokenizer::from_gguf_spec(gguf_tokenizer_spec(file)?)?;
    // Gemma ends a turn with `<end_of_turn>`, not EOS (llama.cpp stops there too).
    if let Some(end_of_turn) = tokenizer.token_to_id(GEMMA_END_OF_TURN) {
        tokenizer.add_eos_ids(&[end_of_turn]);
    }
    let template = make_template(gguf_chat_template(file).as_deref(), &tokenizer)?;
    Ok(ModelMeta { location, config, tokenizer, template })
}

fn hf_meta(location: ModelLocation, dir: &HfModelDir) -> Result<ModelMeta> {
    let config = ModelConfig::from_hf_json(dir.config())?;
    let tok_path = dir
        .tokenizer_json_path()
        .ok_or_else(|| EngineError::InvalidModelDir(format!("{} has no tokenizer.json", location.path.display())))?;
    let special = SpecialTokens {
        bos: dir.bos_token().map(str::to_string),
        eos: dir.eos_token().map(str::to_string),
        ..SpecialTokens::default()
    };
    let mut tokenizer = Tokenizer::from_file(&tok_path, special)?;
    tokenizer.add_eos_ids(&dir.eos_token_ids());
    let template = make_template(dir.chat_template(), &tokenizer)?;
    Ok(ModelMeta { location, config, tokenizer, template })
}

/// The control token that ends a Gemma turn.
const GEMMA_END_OF_TURN: &str = "<end_of_turn>";

fn make_template(source: Option<&str>, tok: &Tokenizer) -> Result<ChatTemplate> {
    let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).unwrap_or_default();
    let bos = tok.special_tokens().bos.clone().unwrap_or_else(|| name(tok.bos_id()));
    let eos = tok.special_tokens().eos.clone().unwrap_or_else(|| name(tok.eos_ids().first().copied()));
    match source {
        Some(src) => ChatTemplate::new(src, &bos, &eos),
        None if tok.token_to_id(GEMMA_END_OF_TURN).is_some() => ChatTemplate::new(GEMMA_TURN_TEMPLATE, &bos, &eos),
        None => Ok(ChatTemplate::chatml_with_tokens(&bos, &eos)),
    }
}

impl LoadedModel {
    /// Render a single user message with the chat template and tokenize it.
    pub fn chat_prompt(&self, user_message: &str) -> Result<Vec<u32>> {
        chat_prompt(&self.template, &self.tokenizer, user_message)
    }
}

/// A single user message through `template`, tokenized.
pub fn chat_prompt(template: &ChatTemplate, tokenizer: &Tokenizer, user_message: &str) -> Result<Vec<u32>> {
    let messages = [serde_json::json!({"role": "user", "content": user_message})];
    let text = template.render(&messages, None, true)?;
    tokenizer.encode(&text, false)
}
