//! Input items → HF chat-template messages (`{"role", "content", ...}`).
//!
//! Rules:
//! - `instructions` (when non-empty) become a leading `system` message.
//! - `developer` messages render as `system` (templates rarely know `developer`).
//! - Text parts (`input_text`, `output_text`, `refusal`) are joined with `\n`.
//! - `input_image`, `input_file`, `input_video` → 400 `unsupported_capability`
//!   naming `input[i].content[j]` (or `input[i].output[j]`): models are text-only.
//! - `function_call` → an assistant message with
//!   `tool_calls: [{"type":"function","id":call_id,"function":{"name","arguments"}}]`;
//!   consecutive calls (and a call right after an assistant message) share one
//!   assistant message. `arguments` is passed as the parsed JSON object when it
//!   parses (HF templates expect a mapping), else as the raw string.
//! - `function_call_output` → `{"role":"tool","tool_call_id","content"}`, plus
//!   `"name"` when an earlier `function_call` with that `call_id` is known.
//! - `reasoning` → `reasoning_content` on the next assistant message (an
//!   assistant message with empty content if none follows).
//! - `item_reference` and `compaction` must be resolved by the server first;
//!   otherwise they are errors (400 `invalid_value` / `unsupported_capability`).
//!
//! Paths in errors index `items` (`input[i]…`).

use super::error::ApiError;
use super::items::{FunctionOutput, InputContent, InputItem, MessageContent, Role};
use super::parse::index_path;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;

/// One chat-template message, HF's `{"role", "content", ...}` (fields in
/// this order, absent ones left out).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The reasoning before an assistant answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant message's calls.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<TemplateToolCall>,
    /// The call a `tool` message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a `tool` message answers, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl TemplateMessage {
    /// A plain message.
    pub fn new(role: &str, content: String) -> Self {
        Self { role: role.to_owned(), content, reasoning_content: None, tool_calls: Vec::new(), tool_call_id: None, name: None }
    }
}

/// `{"type": "function", "id", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateToolCall {
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The call id.
    pub id: String,
    /// What is called.
    pub function: TemplateFunctionCall,
}

/// `{"name", "arguments"}` of a template tool call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateFunctionCall {
    /// Function name.
    pub name: String,
    /// The arguments as a JSON object when they parse as one (HF templates
    /// expect a mapping), else the string as sent.
    pub arguments: Value,
}

/// Renders `instructions` and `items` as chat-template messages.
pub fn to_chat_messages(
    instructions: Option<&str>,
    items: &[InputItem],
) -> Result<Vec<TemplateMessage>, ApiError> {
    let mut chat = Chat::default();
    if let Some(text) = instructions.filter(|t| !t.is_empty()) {
        chat.out.push(message("system", text.to_owned()));
    }
    for (i, item) in items.iter().enumerate() {
        chat.push(item, &index_path("input", i))?;
    }
    if chat.reasoning.is_some() {
        let mut msg = message("assistant", String::new());
        attach_reasoning(&mut msg, &mut chat.reasoning);
        chat.out.push(msg);
    }
    Ok(chat.out)
}

/// Conversion state.
#[derive(Default)]
struct Chat<'a> {
    out: Vec<TemplateMessage>,
    /// Reasoning waiting for the next assistant message.
    reasoning: Option<String>,
    /// Function names by call id, for tool messages.
    call_names: HashMap<&'a str, &'a str>,
    /// Whether the last message can take further `tool_calls`.
    last_is_call_host: bool,
}

impl<'a> Chat<'a> {
    fn push(&mut self, item: &'a InputItem, path: &str) -> Result<(), ApiError> {
        let mut call_host = false;
        match item {
            InputItem::Message(m) => {
                let content = content_text(&m.content, &format!("{path}.content"))?;
                let role = if m.role == Role::Developer {
                    "system"
                } else {
                    m.role.as_str()
                };
                let mut msg = message(role, content);
                if m.role == Role::Assistant {
                    attach_reasoning(&mut msg, &mut self.reasoning);
                    call_host = true;
                }
                self.out.push(msg);
            }
            InputItem::FunctionCall(f) => {
                self.call_names.insert(&f.call_id, &f.name);
                if !self.last_is_call_host {
                    let mut msg = message("assistant", String::new());
                    attach_reasoning(&mut msg, &mut self.reasoning);
                    self.out.push(msg);
                }
                if let Some(host) = self.out.last_mut() {
                    push_tool_call(host, &f.call_id, &f.name, &f.arguments);
                }
                call_host = true;
            }
            InputItem::FunctionCallOutput(f) => {
                let content = output_text(&f.output, &format!("{path}.output"))?;
                let mut msg = message("tool", content);
                msg.tool_call_id = Some(f.call_id.clone());
                msg.name = self.call_names.get(f.call_id.as_str()).map(|name| (*name).to_owned());
                self.out.push(msg);
            }
            InputItem::Reasoning(r) => {
                let parts = r
                    .content
                    .as_deref()
                    .filter(|c| !c.is_empty())
                    .unwrap_or(&r.summary);
                let text = parts
                    .iter()
                    .map(|p| p.text.as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                self.reasoning = Some(match self.reasoning.take() {
                    Some(prev) => format!("{prev}\n{text}"),
                    None => text,
                });
            }
            InputItem::Compaction(_) => {
                return Err(ApiError::unsupported_capability(
                    path,
                    "compaction items are not supported by this server.",
                ));
            }
            InputItem::ItemReference(r) => {
                return Err(ApiError::invalid(
                    format!("{path}.id"),
                    format!("Item reference '{}' could not be resolved.", r.id),
                ));
            }
        }
        self.last_is_call_host = call_host;
        Ok(())
    }
}

fn message(role: &str, content: String) -> TemplateMessage {
    TemplateMessage::new(role, content)
}

fn attach_reasoning(msg: &mut TemplateMessage, reasoning: &mut Option<String>) {
    if let Some(text) = reasoning.take() {
        msg.reasoning_content = Some(text);
    }
}

fn push_tool_call(host: &mut TemplateMessage, call_id: &str, name: &str, arguments: &str) {
    let arguments = match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(arguments.to_owned()),
    };
    let function = TemplateFunctionCall { name: name.to_owned(), arguments };
    host.tool_calls.push(TemplateToolCall { kind: "function", id: call_id.to_owned(), function });
}

/// Joins text parts; non-text parts are `unsupported_capability` at `path[j]`.
fn parts_text(parts: &[InputContent], path: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        match part.text() {
            Some(t) => texts.push(t),
            None => {
                return Err(ApiError::unsupported_capability(
                    index_path(path, j),
                    format!(
                        "This model accepts text only; '{}' content is not supported.",
                        part.type_name()
                    ),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

fn content_text(content: &MessageContent, path: &str) -> Result<String, ApiError> {
    match content {
        MessageContent::Text(t) => Ok(t.clone()),
        MessageContent::Parts(parts) => parts_text(parts, path),
    }
}

fn output_text(output: &FunctionOutput, path: &str) -> Result<String, ApiError> {
    match output {
        FunctionOutput::Text(t) => Ok(t.clone()),
        FunctionOutput::Parts(parts) => parts_text(parts, path),
    }
}
