//! Function tools, basic path (issue 4 part 7): the prompt side (tool
//! definitions and tool-call history in the prompt) and the output side (a
//! streaming parser from the model's text to `function_call` items).
//! `tool_choice` is enforced at decode time by a grammar
//! ([`crate::app::format::constrain`]); nothing here changes the prompt with it.
//!
//! # Prompt side
//!
//! When the model's chat template reads `tools` itself
//! ([`ChatTemplate::uses_tools`]), the tools go to the template as HF's
//! `{"type":"function","function":{name, description, parameters}}` and the
//! messages as [`to_chat_messages`] makes them (assistant `tool_calls`, role
//! `tool`; for Mistral templates, which demand 9-character call ids, each
//! `call_id` is mapped to one derived from it). Otherwise the **default format** (Hermes/Qwen 2.5 style) applies:
//!
//! - The tools section below is appended to the first system message (after
//!   `\n\n`), or becomes a new leading system message when there is none:
//!
//!   ```text
//!   # Tools
//!
//!   You may call one or more functions to assist with the user query.
//!
//!   You are provided with function signatures within <tools></tools> XML tags:
//!   <tools>
//!   {"type": "function", "function": {"name": "get_weather", "description": "...", "parameters": {...}}}
//!   </tools>
//!
//!   For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
//!   <tool_call>
//!   {"name": <function-name>, "arguments": <args-json-object>}
//!   </tool_call>
//!   ```
//!
//!   One tool per line, written like Python's `json.dumps` (`", "` and
//!   `": "` separators, non-ASCII kept), keys in a fixed order (`type`,
//!   `function`; `name`, `description`, `parameters`) and the schema's keys
//!   in the order the request sent them, so the same tool list always
//!   renders to the same bytes and the prefix cache keeps its hits across
//!   agent turns.
//! - An assistant turn with tool calls becomes text: its content, then one
//!   `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>` block per
//!   call, separated by `\n` (arguments that are not a JSON object are
//!   written as sent).
//! - Tool results (role `tool`, from `function_call_output`) become a user
//!   turn of `<tool_response>\n…\n</tool_response>` blocks; consecutive
//!   results share one turn, separated by `\n`.
//!
//! The output side, the streaming parser from generated text to
//! `function_call` items, is `tool_parser`.

use crate::app::format::constrain::{TOOL_CALL_CLOSE, TOOL_CALL_OPEN};
use crate::protocol::error::ApiError;
use crate::protocol::request::ValidRequest;
use crate::protocol::chat::TemplateToolCall;
use crate::protocol::{to_chat_messages, FunctionTool, InputItem, TemplateMessage};
use serde::Serialize;
use serde_json::Value;
use spindle_engine::chat_template::ChatTemplate;

/// The default tools section up to the tool list.
const TOOLS_HEAD: &str = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>";

/// The default tools section after the tool list.
const TOOLS_TAIL: &str = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/// Renders the prompt text of a turn: `req`'s instructions and tools with
/// `items` (the history then this turn's input), through the model's chat
/// template or the default tool format (see the module docs). Does not
/// depend on `tool_choice`.
pub fn render_prompt(
    template: &ChatTemplate,
    req: &ValidRequest,
    items: &[InputItem],
) -> Result<String, ApiError> {
    let mut messages = to_chat_messages(req.instructions.as_deref(), items)?;
    let native = template.uses_tools();
    if native && template.source().contains(crate::app::format::constrain::MISTRAL_MARKER) {
        mistral_call_ids(&mut messages);
    }
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(FunctionTool::to_template_tool)
        .collect();
    if !native {
        messages = normalise_history(messages);
        if !req.tools.is_empty() {
            add_tools_section(&mut messages, &tools_section(&req.tools));
        }
    }
    let pass = (native && !tools.is_empty()).then_some(tools.as_slice());
    let messages = serde_json::to_value(messages).map_err(|e| ApiError::internal(e.to_string()))?;
    let messages = messages.as_array().map_or(&[][..], Vec::as_slice);
    template
        .render(messages, pass, true)
        .map_err(|e| ApiError::invalid("input", format!("the chat template failed: {e}")))
}

/// Mistral's templates demand 9-character alphanumeric call ids: each
/// `call_id` becomes one derived from it (the same for a call and its result).
fn mistral_call_ids(messages: &mut [TemplateMessage]) {
    for message in messages.iter_mut() {
        if let Some(id) = &mut message.tool_call_id {
            *id = short_call_id(id);
        }
        for call in &mut message.tool_calls {
            call.id = short_call_id(&call.id);
        }
    }
}

/// Nine base-62 characters from an FNV-1a hash of `id`.
fn short_call_id(id: &str) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (0..9)
        .map(|_| {
            let c = DIGITS[(h % 62) as usize] as char;
            h /= 62;
            c
        })
        .collect()
}

/// The default format's tools section for `tools` (byte-identical for the
/// same list).
pub fn tools_section(tools: &[FunctionTool]) -> String {
    let mut out = String::from(TOOLS_HEAD);
    for tool in tools {
        out.push('\n');
        out.push_str(&py_json(&tool.to_template_tool()));
    }
    out.push_str(TOOLS_TAIL);
    out
}

/// Appends `section` to the first system message, or adds a leading one.
fn add_tools_section(messages: &mut Vec<TemplateMessage>, section: &str) {
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = if first.content.is_empty() { section.to_owned() } else { format!("{}\n\n{section}", first.content) };
        }
        _ => messages.insert(0, TemplateMessage::new("system", section.to_owned())),
    }
}

/// Rewrites tool calls and tool results as text for templates that do not
/// know them (see the module docs).
fn normalise_history(messages: Vec<TemplateMessage>) -> Vec<TemplateMessage> {
    let mut out: Vec<TemplateMessage> = Vec::with_capacity(messages.len());
    let mut last_was_tool = false;
    for mut m in messages {
        match m.role.as_str() {
            "tool" => {
                let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                match out.last_mut() {
                    Some(prev) if last_was_tool => append_content(prev, "\n", &block),
                    _ => out.push(TemplateMessage::new("user", block)),
                }
                last_was_tool = true;
                continue;
            }
            "assistant" => {
                for call in std::mem::take(&mut m.tool_calls) {
                    let sep = if m.content.is_empty() { "" } else { "\n" };
                    append_content(&mut m, sep, &call_block(&call));
                }
            }
            _ => {}
        }
        out.push(m);
        last_was_tool = false;
    }
    out
}

fn append_content(message: &mut TemplateMessage, sep: &str, text: &str) {
    message.content = format!("{}{sep}{text}", message.content);
}

/// `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` for one HF
/// `tool_calls` entry.
fn call_block(call: &TemplateToolCall) -> String {
    let arguments = match &call.function.arguments {
        Value::String(raw) => raw.clone(),
        v => py_json(v),
    };
    format!(
        "{TOOL_CALL_OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{TOOL_CALL_CLOSE}",
        py_json(&call.function.name)
    )
}

/// JSON as Python's `json.dumps(ensure_ascii=False)` writes it.
fn py_json<T: Serialize + ?Sized>(value: &T) -> String {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, PyFormatter);
    if value.serialize(&mut ser).is_err() {
        return serde_json::to_string(value).unwrap_or_default();
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// `", "` between items and `": "` after keys.
struct PyFormatter;

/// `", "` before every item but the first.
fn separator<W: ?Sized + std::io::Write>(writer: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        writer.write_all(b", ")
    }
}

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        separator(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
