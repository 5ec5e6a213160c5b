//! Shared helpers for the benchmarks.

pub mod ceiling;

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

/// Five tools as an agent would declare them.
pub fn five_tools() -> serde_json::Value {
    let object = |props: serde_json::Value, required: serde_json::Value| serde_json::json!({"type": "object", "properties": props, "required": required, "additionalProperties": false});
    serde_json::json!([
        {"type": "function", "name": "get_weather", "parameters": object(serde_json::json!({"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}), serde_json::json!(["city"]))},
        {"type": "function", "name": "search_web", "parameters": object(serde_json::json!({"query": {"type": "string"}, "max_results": {"type": "integer"}}), serde_json::json!(["query"]))},
        {"type": "function", "name": "send_email", "parameters": object(serde_json::json!({"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}}), serde_json::json!(["to", "subject", "body"]))},
        {"type": "function", "name": "create_event", "parameters": object(serde_json::json!({"title": {"type": "string"}, "date": {"type": "string"}, "attendees": {"type": "array", "items": {"type": "string"}}}), serde_json::json!(["title", "date"]))},
        {"type": "function", "name": "convert_currency", "parameters": object(serde_json::json!({"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}}), serde_json::json!(["amount", "from", "to"]))},
    ])
}


/// The constraint a Responses request body's fields (`tools`, `tool_choice`,
/// `text`...) imply, as the server would build it; `None` when unconstrained.
pub fn request_constraint(
    compiler: &spindle_engine::grammar::GrammarCompiler,
    fields: &serde_json::Value,
) -> Option<spindle_engine::grammar::SharedConstraint> {
    use spindle_server::app::format::constrain::{constraint_for, CallFormat};
    let mut body = serde_json::json!({"input": "x"});
    for (k, v) in fields.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let req = spindle_server::protocol::validate(body, &spindle_server::protocol::RequestLimits::default()).ok()?;
    constraint_for(Some(compiler), CallFormat::Hermes(None), &req).ok().flatten()
}
