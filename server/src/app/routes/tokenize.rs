//! `POST /tokenize` and `POST /detokenize`, shaped as vLLM's: the prompt ids
//! the server would run for a text or for chat messages, and the text of
//! token ids. Chat messages are rendered exactly as `/v1/responses` renders
//! them (the same validation, template, tools section and tokenization), so a
//! client can see, and a test can check, the prompt a request will get.

use crate::app::access::auth::Tenant;
use crate::app::routes::chat::request::{chat_input, responses_tools, ChatMessage, ChatTool};
use crate::app::http::extract::from_value;
use crate::app::runtime::start::{check_model, validate_for};
use crate::app::runtime::state::AppState;
use crate::app::runtime::turn;
use crate::protocol::error::ApiError;
use crate::app::http::extract::JsonBody;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// The body of `POST /tokenize`: exactly one of `prompt` and `messages`.
#[derive(Debug, Deserialize)]
pub struct TokenizeBody {
    model: Option<String>,
    /// Plain text, tokenized as it is.
    prompt: Option<String>,
    /// Chat messages, rendered with the chat template: Chat Completions
    /// messages (as vLLM takes them: assistant `tool_calls` with `content`
    /// null, `tool` results), or Open Responses input items.
    messages: Option<Vec<Value>>,
    /// Tools, for chat messages, in the Chat Completions or Responses shape.
    tools: Option<Value>,
    /// Special tokens around a plain `prompt` (vLLM's default: true).
    add_special_tokens: Option<bool>,
    /// Only `true` (the default) is supported: the prompt ends where the
    /// assistant's answer begins, as for a generation request.
    add_generation_prompt: Option<bool>,
}

/// The answer of `POST /tokenize`.
#[derive(Debug, Serialize)]
pub struct Tokenized {
    count: usize,
    max_model_len: usize,
    tokens: Vec<u32>,
}

/// The answer of `POST /detokenize`.
#[derive(Debug, Serialize)]
pub struct Detokenized {
    /// The decoded text.
    pub prompt: String,
}

/// The body of `POST /detokenize`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<i64>,
}

/// POST /tokenize.
pub async fn tokenize(State(state): State<Arc<AppState>>, Extension(tenant): Extension<Tenant>, JsonBody(b): JsonBody<TokenizeBody>) -> Response {
    off_thread(state, move |st| tokenize_body(st, b, &tenant)).await
}

/// POST /detokenize.
pub async fn detokenize(State(state): State<Arc<AppState>>, JsonBody(b): JsonBody<DetokenizeBody>) -> Response {
    off_thread(state, move |st| detokenize_body(st, b)).await
}

/// Runs tokenizer work off the async threads and answers with its JSON.
async fn off_thread<T: Serialize + Send + 'static>(state: Arc<AppState>, work: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static) -> Response {
    let result = tokio::task::spawn_blocking(move || work(&state)).await.map_err(|e| ApiError::internal(e.to_string()));
    match result.and_then(|r| r) {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn tokenize_body(state: &AppState, b: TokenizeBody, tenant: &Tenant) -> Result<Tokenized, ApiError> {
    check_model(state, b.model.as_deref())?;
    let tokens = match (b.prompt, b.messages) {
        (Some(prompt), None) => {
            let special = b.add_special_tokens.unwrap_or(true);
            state.model.tokenizer.encode(&prompt, special).map_err(|e| ApiError::internal(format!("tokenizer: {e}")))?
        }
        (None, Some(messages)) => {
            if b.add_generation_prompt == Some(false) {
                return Err(ApiError::invalid("add_generation_prompt", "Only true is supported: the prompt ends where the answer begins."));
            }
            chat_prompt(state, messages, b.tools, tenant)?
        }
        _ => return Err(ApiError::invalid("prompt", "Send exactly one of 'prompt' (text) and 'messages' (chat messages).")),
    };
    Ok(Tokenized { count: tokens.len(), max_model_len: state.model.context_length, tokens })
}

/// The prompt ids `/v1/responses` would run for these messages as its `input`
/// (compaction items open only for the tenant that made them).
fn chat_prompt(state: &AppState, messages: Vec<Value>, tools: Option<Value>, tenant: &Tenant) -> Result<Vec<u32>, ApiError> {
    let (input, tools) = as_responses_input(messages, tools)?;
    let request = ResponsesInput { model: state.model.name.clone(), input, store: false, tools };
    let req = validate_for(state, json_of(&request)?).map_err(|e| e.renamed_param("input", "messages"))?;
    Ok(turn::prepare(state, &req, Vec::new(), tenant)?.prompt)
}

/// The Responses body whose prompt `/tokenize` renders.
#[derive(Serialize)]
struct ResponsesInput {
    model: String,
    input: Value,
    store: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Value>,
}

/// Messages without a `type` are Chat Completions messages and go through
/// the Chat Completions converter (as `/v1/chat/completions` takes them), and
/// so do tools with a `function` object; anything else is Responses input.
fn as_responses_input(messages: Vec<Value>, tools: Option<Value>) -> Result<(Value, Option<Value>), ApiError> {
    let chat_messages = messages.iter().all(|m| m.get("type").is_none());
    let chat_tools = tools.as_ref().and_then(Value::as_array).is_some_and(|t| t.iter().any(|t| t.get("function").is_some()));
    let input = match chat_messages {
        true => {
            let chat: Vec<ChatMessage> = from_value(Value::Array(messages)).map_err(|e| prefixed(e, "messages"))?;
            json_of(&chat_input(&chat)?)?
        }
        false => Value::Array(messages),
    };
    let tools = match tools {
        Some(t) if chat_tools => {
            let chat: Vec<ChatTool> = from_value(t).map_err(|e| prefixed(e, "tools"))?;
            Some(json_of(&responses_tools(chat)?)?)
        }
        other => other,
    };
    Ok((input, tools))
}

fn json_of<T: Serialize>(v: &T) -> Result<Value, ApiError> {
    serde_json::to_value(v).map_err(|e| ApiError::internal(e.to_string()))
}

/// A shape error inside `root` names its full path (`messages[0].role`).
fn prefixed(mut e: ApiError, root: &str) -> ApiError {
    e.param = Some(format!("{root}{}", e.param.as_deref().unwrap_or("")));
    e
}

fn detokenize_body(state: &AppState, b: DetokenizeBody) -> Result<Detokenized, ApiError> {
    check_model(state, b.model.as_deref())?;
    let vocab = state.model.tokenizer.vocab_size();
    let ids = b
        .tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| u32::try_from(t).ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
            ApiError::invalid(format!("tokens[{i}]"), format!("Token id {t} is not in the vocabulary (0..{vocab})."))
        }))
        .collect::<Result<Vec<u32>, _>>()?;
    let prompt = state.model.tokenizer.decode(&ids, false).map_err(|e| ApiError::internal(format!("tokenizer: {e}")))?;
    Ok(Detokenized { prompt })
}
