//! Chat Completions and Completions request bodies as Open Responses
//! requests: messages become input items, tools and formats take the
//! Responses shapes, and the fields the Responses API lacks (`stop`, a
//! `max_tokens` below 16) are set on the validated request. One validator
//! and one model-output layer serve every protocol.

use crate::app::http::extract::from_value;
use crate::protocol::error::ApiError;
use crate::protocol::items::{FunctionCallInput, FunctionCallOutputInput, FunctionOutput, InputContent, InputMessage, MessageContent, Role};
use crate::protocol::InputItem;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Most `stop` strings (OpenAI's limit).
const MAX_STOP: usize = 4;

/// Fields the Responses validator checks itself: forwarded as they are.
const PASSTHROUGH: [&str; 15] = [
    "model", "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "user", "parallel_tool_calls", "metadata",
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "prompt_cache_key", "safety_identifier",
];

/// A Chat Completions request body: the fields this server reads (others
/// are ignored).
#[derive(Debug, Default, Deserialize)]
pub struct ChatBody {
    /// The conversation.
    pub messages: Option<Vec<ChatMessage>>,
    /// Function tools.
    pub tools: Option<Vec<ChatTool>>,
    /// `"none"`, `"auto"`, `"required"` or a named function.
    pub tool_choice: Option<ChatToolChoice>,
    /// `text`, `json_object` or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// Becomes `reasoning.effort`.
    pub reasoning_effort: Option<String>,
    /// Attach token log-probabilities.
    pub logprobs: Option<bool>,
    /// Alternatives per token (needs `logprobs`).
    pub top_logprobs: Option<u32>,
    /// Choices (only 1).
    pub n: Option<u64>,
    /// Answer as SSE chunks.
    pub stream: Option<bool>,
    /// `include_usage`.
    pub stream_options: Option<ChatStreamOptions>,
    /// The token cap (preferred name).
    pub max_completion_tokens: Option<u64>,
    /// The token cap (older name).
    pub max_tokens: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Everything else; the [`PASSTHROUGH`] fields go on to the validator.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct ChatStreamOptions {
    /// Send a last chunk with the usage.
    pub include_usage: Option<bool>,
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: Option<String>,
    /// Text or content parts.
    pub content: Option<ChatContent>,
    /// An assistant's tool calls.
    pub tool_calls: Option<Vec<ChatToolCall>>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// Message content: a string or parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ChatPart>),
}

/// A content part (`text` or `image_url`).
#[derive(Debug, Clone, Deserialize)]
pub struct ChatPart {
    /// The part type.
    #[serde(rename = "type")]
    pub kind: String,
    /// A `text` part's text.
    pub text: Option<String>,
    /// An `image_url` part's image.
    pub image_url: Option<ImageUrl>,
}

/// `{url, detail}` of an `image_url` part.
#[derive(Debug, Clone, Deserialize)]
pub struct ImageUrl {
    /// A URL or `data:` URL.
    pub url: Option<String>,
    /// `low`, `high` or `auto`.
    pub detail: Option<String>,
}

/// An assistant message's tool call.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatToolCall {
    /// The call id.
    pub id: Option<String>,
    /// The function called.
    pub function: Option<ChatFunctionCall>,
}

/// `{name, arguments}` of a tool call.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatFunctionCall {
    /// Function name.
    pub name: Option<String>,
    /// Arguments: a JSON string, or (as some clients send them) the object.
    pub arguments: Option<Value>,
}

/// `{type: function, function: {...}}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatTool {
    /// The function.
    pub function: Option<FunctionDef>,
}

/// A function definition, as both APIs spell its fields.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct FunctionDef {
    /// Function name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Strict schema adherence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A Responses function tool: `{type: "function", name, ...}`.
#[derive(Debug, Clone, Serialize)]
pub struct ResponsesTool {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    function: FunctionDef,
}

/// `tool_choice`: a named function, or a mode as sent.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ChatToolChoice {
    /// `{type: function, function: {name}}`.
    Named {
        /// The function.
        function: NamedFunction,
    },
    /// `"auto"`, `"none"`, `"required"` (checked by the validator).
    Other(Value),
}

/// `{name}`.
#[derive(Debug, Clone, Deserialize)]
pub struct NamedFunction {
    /// Function name.
    pub name: String,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// A `json_schema` format's `{name, schema, strict}`.
    pub json_schema: Option<Map<String, Value>>,
}

/// A Completions request body: a raw prompt, and the chat fields that apply.
#[derive(Debug)]
pub struct CompletionsBody {
    /// The fields only Completions has.
    pub own: CompletionsFields,
    /// The fields shared with Chat Completions.
    pub chat: ChatBody,
}

/// The fields only Completions has.
#[derive(Debug, Deserialize)]
pub struct CompletionsFields {
    /// Text, or token ids.
    pub prompt: Option<Prompt>,
    /// Unsupported unless `false`.
    pub echo: Option<Value>,
    /// Unsupported.
    pub suffix: Option<Value>,
    /// Unsupported unless 1.
    pub best_of: Option<Value>,
    /// How many alternatives per token to return (Completions' `logprobs`).
    pub logprobs: Option<u32>,
}

impl CompletionsBody {
    /// Reads a body: its own fields, then the rest as a [`ChatBody`] (read
    /// apart, so that a bad field is named by its path).
    pub fn parse(body: Value) -> Result<Self, ApiError> {
        let Value::Object(mut fields) = body else {
            return Err(ApiError::invalid("body", "The request body must be a JSON object."));
        };
        let own: Map<String, Value> =
            ["prompt", "echo", "suffix", "best_of", "logprobs"].iter().filter_map(|k| fields.remove_entry(*k)).collect();
        Ok(Self { own: from_value(Value::Object(own))?, chat: from_value(Value::Object(fields))? })
    }

    /// Refuses the Completions features this server does not have.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        let fields = [("echo", &self.own.echo), ("suffix", &self.own.suffix), ("best_of", &self.own.best_of)];
        for (field, value) in fields {
            let harmless = |v: &Value| v.is_null() || *v == Value::Bool(false) || v.as_u64() == Some(1);
            if value.as_ref().is_some_and(|v| !harmless(v)) {
                return Err(ApiError::invalid(field, format!("{field} is not supported.")));
            }
        }
        Ok(())
    }

    /// The chat body this request runs as: one placeholder user message
    /// (the prompt bypasses the template), Completions' `logprobs: n` as
    /// `logprobs: true, top_logprobs: n`.
    pub fn into_chat(self) -> ChatBody {
        let mut chat = self.chat;
        chat.messages = Some(vec![ChatMessage {
            role: Some("user".to_owned()),
            content: Some(ChatContent::Text("(raw completion)".to_owned())),
            tool_calls: None,
            tool_call_id: None,
        }]);
        if let Some(n) = self.own.logprobs {
            chat.logprobs = Some(true);
            chat.top_logprobs = Some(n);
        }
        chat
    }
}

/// A Completions `prompt`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text, tokenized with the model's BOS.
    Text(String),
    /// Token ids, taken as they are.
    Ids(Vec<i64>),
    /// A batch of texts (only one is supported).
    Texts(Vec<String>),
}

/// What a Chat Completions body asks for beyond the Responses request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatExtras {
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_completion_tokens` / `max_tokens`.
    pub max_tokens: Option<u32>,
    /// `stop`.
    pub stop: Vec<String>,
    /// `logprobs`.
    pub logprobs: bool,
}

/// The Responses create body a chat body becomes.
#[derive(Debug, Serialize)]
struct ResponsesBody {
    input: Vec<InputItem>,
    store: bool,
    #[serde(flatten)]
    passthrough: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Effort>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<ResponsesTool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ResponsesToolChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextFormat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<u32>,
}

#[derive(Debug, Serialize)]
struct Effort {
    effort: String,
}

#[derive(Debug, Serialize)]
struct TextFormat {
    format: Map<String, Value>,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ResponsesToolChoice {
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        name: String,
    },
    AsSent(Value),
}

/// A Chat Completions body as a Responses create body plus the extras.
pub fn chat_to_responses(body: ChatBody) -> Result<(Value, ChatExtras), ApiError> {
    let messages = body.messages.as_deref().ok_or_else(|| {
        ApiError::invalid_with_code("messages", "missing_required_parameter", "Missing required parameter: 'messages'.")
    })?;
    if body.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("n", "Only n = 1 is supported; send parallel requests for more choices."));
    }
    let logprobs = body.logprobs.unwrap_or(false);
    let top_logprobs = match body.top_logprobs {
        Some(_) if !logprobs => return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true.")),
        Some(n) => Some(n),
        None => logprobs.then_some(0),
    };
    let passthrough = body.other.into_iter().filter(|(k, v)| PASSTHROUGH.contains(&k.as_str()) && !v.is_null()).collect();
    let responses = ResponsesBody {
        input: chat_input(messages)?,
        store: false,
        passthrough,
        reasoning: body.reasoning_effort.map(|effort| Effort { effort }),
        tools: body.tools.map(responses_tools).transpose()?,
        tool_choice: body.tool_choice.map(|choice| match choice {
            ChatToolChoice::Named { function } => ResponsesToolChoice::Function { kind: "function", name: function.name },
            ChatToolChoice::Other(v) => ResponsesToolChoice::AsSent(v),
        }),
        text: body.response_format.map(text_format).transpose()?.map(|format| TextFormat { format }),
        top_logprobs,
    };
    let extras = ChatExtras {
        stream: body.stream.unwrap_or(false),
        include_usage: body.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        max_tokens: max_tokens(body.max_completion_tokens, body.max_tokens)?,
        stop: stop_strings(body.stop)?,
        logprobs,
    };
    let value = serde_json::to_value(responses).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok((value, extras))
}

/// Chat messages as Responses input items.
pub fn chat_input(messages: &[ChatMessage]) -> Result<Vec<InputItem>, ApiError> {
    let mut items = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        message_items(m, i, &mut items)?;
    }
    Ok(items)
}

/// The input items of one chat message.
fn message_items(m: &ChatMessage, i: usize, out: &mut Vec<InputItem>) -> Result<(), ApiError> {
    let param = |field: &str| format!("messages[{i}].{field}");
    let role = m.role.as_deref().ok_or_else(|| ApiError::invalid(param("role"), "Each message needs a 'role'."))?;
    let message = |role: Role, content: MessageContent| InputItem::Message(InputMessage { id: None, role, content, status: None, phase: None });
    match role {
        "system" | "developer" | "user" => {
            let content = m.content.as_ref().ok_or_else(|| ApiError::invalid(param("content"), format!("A {role} message needs 'content'.")))?;
            let role = match role {
                "system" => Role::System,
                "developer" => Role::Developer,
                _ => Role::User,
            };
            out.push(message(role, message_content(content, false, &param("content"))?));
        }
        "assistant" => {
            if let Some(content) = &m.content {
                let content = message_content(content, true, &param("content"))?;
                if !matches!(&content, MessageContent::Text(t) if t.is_empty()) {
                    out.push(message(Role::Assistant, content));
                }
            }
            for (k, call) in m.tool_calls.iter().flatten().enumerate() {
                let function = call.function.as_ref();
                let (Some(id), Some(name)) = (&call.id, function.and_then(|f| f.name.as_ref())) else {
                    return Err(ApiError::invalid(param(&format!("tool_calls[{k}]")), "A tool call needs 'id' and 'function.name'."));
                };
                let arguments = match function.and_then(|f| f.arguments.as_ref()) {
                    Some(Value::String(text)) => text.clone(),
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(other) => other.to_string(),
                };
                out.push(InputItem::FunctionCall(FunctionCallInput { id: None, call_id: id.clone(), name: name.clone(), arguments, status: None }));
            }
        }
        "tool" => {
            let call_id = m.tool_call_id.clone().ok_or_else(|| ApiError::invalid(param("tool_call_id"), "A tool message needs 'tool_call_id'."))?;
            let output = match &m.content {
                Some(c) => match message_content(c, false, &param("content"))? {
                    MessageContent::Text(t) => FunctionOutput::Text(t),
                    MessageContent::Parts(p) => FunctionOutput::Parts(p),
                },
                None => FunctionOutput::Text(String::new()),
            };
            out.push(InputItem::FunctionCallOutput(FunctionCallOutputInput { id: None, call_id, output, status: None }));
        }
        other => return Err(ApiError::invalid(param("role"), format!("Unknown role '{other}'."))),
    }
    Ok(())
}

/// Message content: a string stays one; text parts become `input_text`
/// (or, from the assistant, `output_text`) parts.
fn message_content(content: &ChatContent, assistant: bool, param: &str) -> Result<MessageContent, ApiError> {
    let parts = match content {
        ChatContent::Text(text) => return Ok(MessageContent::Text(text.clone())),
        ChatContent::Parts(parts) => parts,
    };
    let part = |(k, p): (usize, &ChatPart)| match (p.kind.as_str(), &p.text, &p.image_url) {
        ("text", Some(text), _) if assistant => Ok(InputContent::OutputText { text: text.clone(), annotations: Vec::new() }),
        ("text", Some(text), _) => Ok(InputContent::InputText { text: text.clone() }),
        ("image_url", _, image) => Ok(InputContent::InputImage {
            image_url: image.as_ref().and_then(|i| i.url.clone()),
            detail: image.as_ref().and_then(|i| i.detail.clone()),
        }),
        _ => Err(ApiError::invalid(format!("{param}[{k}]"), "Only text and image_url content parts are supported.")),
    };
    parts.iter().enumerate().map(part).collect::<Result<Vec<_>, _>>().map(MessageContent::Parts)
}

/// `[{type: function, function: {...}}]` as Responses function tools.
pub fn responses_tools(tools: Vec<ChatTool>) -> Result<Vec<ResponsesTool>, ApiError> {
    tools
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let function = t.function.ok_or_else(|| ApiError::invalid(format!("tools[{i}].function"), "Each tool needs a 'function'."))?;
            Ok(ResponsesTool { kind: "function", function })
        })
        .collect()
}

/// `response_format` as a Responses `text.format`.
fn text_format(format: ResponseFormat) -> Result<Map<String, Value>, ApiError> {
    let kind = format.kind.unwrap_or_default();
    let mut out = match kind.as_str() {
        "json_schema" => format.json_schema.ok_or_else(|| {
            ApiError::invalid("response_format.json_schema", "A json_schema response_format needs 'json_schema'.")
        })?,
        "json_object" | "text" => Map::new(),
        _ => return Err(ApiError::invalid("response_format.type", "response_format.type must be 'text', 'json_object' or 'json_schema'.")),
    };
    out.insert("type".into(), Value::String(kind));
    Ok(out)
}

/// `max_completion_tokens` (or the older `max_tokens`): at least 1.
fn max_tokens(max_completion_tokens: Option<u64>, max_tokens: Option<u64>) -> Result<Option<u32>, ApiError> {
    let (key, value) = match (max_completion_tokens, max_tokens) {
        (Some(n), _) => ("max_completion_tokens", n),
        (None, Some(n)) => ("max_tokens", n),
        (None, None) => return Ok(None),
    };
    let n = u32::try_from(value).ok().filter(|&n| n >= 1);
    n.map(Some).ok_or_else(|| ApiError::invalid(key, format!("{key} must be a positive integer.")))
}

/// `stop`: a string or up to [`MAX_STOP`] strings.
pub fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let strings = match stop {
        None => return Ok(Vec::new()),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(all)) => all,
    };
    if strings.len() > MAX_STOP {
        return Err(ApiError::invalid("stop", format!("At most {MAX_STOP} stop strings.")));
    }
    Ok(strings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_body(v: Value) -> Result<ChatBody, ApiError> {
        crate::app::http::extract::from_value(v)
    }

    #[test]
    fn messages_tools_and_formats_take_the_responses_shapes() -> Result<(), ApiError> {
        let body = json!({
            "model": "m", "max_tokens": 5, "stop": ["\n\n"], "n": 1, "logprobs": true, "top_logprobs": 2,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
        });
        let (r, extras) = chat_to_responses(chat_body(body)?)?;
        assert_eq!(r["input"][1], json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}));
        assert_eq!(r["input"][2], json!({"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}));
        assert_eq!(r["input"][3], json!({"type": "function_call_output", "call_id": "call_1", "output": "18C"}));
        assert_eq!(r["tools"][0], json!({"type": "function", "name": "get_weather", "parameters": {"type": "object"}}));
        assert_eq!(r["tool_choice"], json!({"type": "function", "name": "get_weather"}));
        assert_eq!(r["text"]["format"], json!({"type": "json_schema", "name": "w", "schema": {"type": "object"}}));
        assert_eq!((r["top_logprobs"].as_u64(), r["store"].as_bool()), (Some(2), Some(false)));
        assert_eq!(extras, ChatExtras { stream: false, include_usage: false, max_tokens: Some(5), stop: vec!["\n\n".into()], logprobs: true });
        Ok(())
    }

    #[test]
    fn unsupported_requests_are_clear_400s() {
        let param = |body: Value| chat_body(body).and_then(chat_to_responses).err().and_then(|e| e.param);
        assert_eq!(param(json!({"model": "m"})).as_deref(), Some("messages"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": "x"}], "n": 2})).as_deref(), Some("n"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})).as_deref(), Some("max_tokens"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]})).as_deref(), Some("stop"));
        assert_eq!(param(json!({"messages": [{"role": "wizard", "content": "x"}]})).as_deref(), Some("messages[0].role"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": 7}]})).as_deref(), Some("messages[0].content"));
        assert_eq!(param(json!({"messages": [{"role": "user", "content": [{"type": "audio"}]}]})).as_deref(), Some("messages[0].content[0]"));
        assert_eq!(param(json!({"messages": [], "stream": "yes"})).as_deref(), Some("stream"));
        assert_eq!(param(json!({"messages": [], "tools": [{"type": "function"}]})).as_deref(), Some("tools[0].function"));
        let completions = |body: Value| CompletionsBody::parse(body).err().and_then(|e| e.param);
        assert_eq!(completions(json!({"prompt": "x", "max_tokens": -1})).as_deref(), Some("max_tokens"));
        assert_eq!(completions(json!({"prompt": {"a": 1}})).as_deref(), Some("prompt"));
    }

    #[test]
    fn tool_call_arguments_sent_as_an_object_are_kept() -> Result<(), ApiError> {
        let body = json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"city": "Paris"}}}]}]});
        let (r, _) = chat_to_responses(chat_body(body)?)?;
        assert_eq!(r["input"][0]["arguments"], json!("{\"city\":\"Paris\"}"));
        Ok(())
    }
}
