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
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Renders `instructions` and `items` as chat-template messages.
pub fn to_chat_messages(
    instructions: Option<&str>,
    items: &[InputItem],
) -> Result<Vec<Value>, ApiError> {
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
    Ok(chat.out.into_iter().map(Value::Object).collect())
}

/// Conversion state.
#[derive(Default)]
struct Chat<'a> {
    out: Vec<Map<String, Value>>,
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
                msg.insert("tool_call_id".into(), Value::String(f.call_id.clone()));
                if let Some(name) = self.call_names.get(f.call_id.as_str()) {
                    msg.insert("name".into(), Value::String((*name).to_owned()));
                }
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

fn message(role: &str, content: String) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("role".into(), Value::String(role.to_owned()));
    m.insert("content".into(), Value::String(content));
    m
}

fn attach_reasoning(msg: &mut Map<String, Value>, reasoning: &mut Option<String>) {
    if let Some(text) = reasoning.take() {
        msg.insert("reasoning_content".into(), Value::String(text));
    }
}

fn push_tool_call(host: &mut Map<String, Value>, call_id: &str, name: &str, arguments: &str) {
    let args = match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(arguments.to_owned()),
    };
    let call = json!({
        "type": "function",
        "id": call_id,
        "function": {"name": name, "arguments": args},
    });
    match host.get_mut("tool_calls") {
        Some(Value::Array(calls)) => calls.push(call),
        _ => {
            host.insert("tool_calls".into(), Value::Array(vec![call]));
        }
    }
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
