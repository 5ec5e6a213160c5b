//! Input items (`ItemParam`, digest §4a): serde types in their canonical wire
//! form, and the lenient, field-path-reporting parser the request validator
//! uses (it accepts messages without `type`, string or array content, and
//! items carrying server `id`/`status`, as the spec's clients send them).

use super::error::ApiError;
use super::parse::{enum_index, index_path, missing, wrong_type, Obj};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest string input, message text or tool output (10 MiB), in characters.
pub const MAX_TEXT_CHARS: usize = 10_485_760;
/// The longest `image_url` (20 MiB), in characters.
pub const MAX_IMAGE_URL_CHARS: usize = 20_971_520;
/// The longest base64 `file_data` (32 MiB), in characters.
pub const MAX_FILE_DATA_CHARS: usize = 33_554_432;
/// The longest `call_id` or function `name`.
pub const MAX_NAME_CHARS: usize = 64;

/// One input item, discriminated by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputItem {
    /// A message from the user, system, developer or assistant.
    Message(InputMessage),
    /// A function call the model made earlier.
    FunctionCall(FunctionCallInput),
    /// The result of a function call, from the client.
    FunctionCallOutput(FunctionCallOutputInput),
    /// Reasoning the model produced earlier.
    Reasoning(ReasoningInput),
    /// An opaque compacted window (2026-04-24).
    Compaction(CompactionInput),
    /// A reference to an item by id, to be resolved by the server.
    ItemReference(ItemReference),
}

impl InputItem {
    /// Bytes of text a chat template writes out verbatim for this item (the
    /// text of user, system and developer messages and of function outputs,
    /// trimmed): a lower bound on what it adds to a prompt. Assistant text
    /// is left out (templates may strip parts of it).
    pub fn verbatim_text_len(&self) -> usize {
        self.verbatim_texts().iter().map(|t| t.len()).sum()
    }

    /// The texts [`Self::verbatim_text_len`] counts, each trimmed.
    pub fn verbatim_texts(&self) -> Vec<&str> {
        let (text, parts_of) = match self {
            Self::Message(m) if m.role != Role::Assistant => match &m.content {
                MessageContent::Text(t) => (Some(t), None),
                MessageContent::Parts(p) => (None, Some(p)),
            },
            Self::FunctionCallOutput(o) => match &o.output {
                FunctionOutput::Text(t) => (Some(t), None),
                FunctionOutput::Parts(p) => (None, Some(p)),
            },
            _ => (None, None),
        };
        match (text, parts_of) {
            (Some(t), _) => vec![t.trim()],
            (None, Some(p)) => p.iter().filter_map(InputContent::text).map(str::trim).collect(),
            (None, None) => Vec::new(),
        }
    }

    /// The item's id, when it has one (an output item re-sent as input
    /// keeps the id it was given).
    pub fn item_id(&self) -> Option<&str> {
        match self {
            Self::Message(m) => m.id.as_deref(),
            Self::FunctionCall(c) => c.id.as_deref(),
            Self::Reasoning(r) => r.id.as_deref(),
            Self::FunctionCallOutput(o) => o.id.as_deref(),
            Self::Compaction(c) => c.id.as_deref(),
            Self::ItemReference(r) => Some(&r.id),
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The end user.
    User,
    /// The model.
    Assistant,
    /// System guidance.
    System,
    /// Developer guidance (rendered as `system` for chat templates).
    Developer,
}

impl Role {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::System => "system",
            Self::Developer => "developer",
        }
    }
}

/// An assistant message's phase (2026-04-24).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Intermediate commentary.
    Commentary,
    /// The final answer.
    FinalAnswer,
}

/// A message input item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputMessage {
    /// Item id, when the client resends a server item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Author.
    pub role: Role,
    /// A plain string or content parts.
    pub content: MessageContent,
    /// Free-form status the client sent, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Assistant phase, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
}

/// Message content: a string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<InputContent>),
}

/// A content part of an input message or function output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputContent {
    /// `input_text{text}`.
    InputText {
        /// The text.
        text: String,
    },
    /// `output_text{text, annotations}` (assistant messages sent back).
    OutputText {
        /// The text.
        text: String,
        /// Annotations as sent (not interpreted).
        #[serde(default)]
        annotations: Vec<Value>,
    },
    /// `refusal{refusal}` (assistant messages sent back).
    Refusal {
        /// The refusal text.
        refusal: String,
    },
    /// `input_image{image_url, detail}`.
    InputImage {
        /// A URL or `data:` URL.
        #[serde(default)]
        image_url: Option<String>,
        /// `low` | `high` | `auto`.
        #[serde(default)]
        detail: Option<String>,
    },
    /// `input_file{filename, file_data, file_url}`.
    InputFile {
        /// File name.
        #[serde(default)]
        filename: Option<String>,
        /// Base64 data.
        #[serde(default)]
        file_data: Option<String>,
        /// URL.
        #[serde(default)]
        file_url: Option<String>,
    },
    /// `input_video{video_url}` (function outputs only).
    InputVideo {
        /// URL.
        video_url: String,
    },
}

impl InputContent {
    /// The text of a text-like part (`input_text`, `output_text`, `refusal`).
    pub fn text(&self) -> Option<&str> {
        match self {
            Self::InputText { text } | Self::OutputText { text, .. } => Some(text),
            Self::Refusal { refusal } => Some(refusal),
            _ => None,
        }
    }

    /// The wire `type` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::InputText { .. } => "input_text",
            Self::OutputText { .. } => "output_text",
            Self::Refusal { .. } => "refusal",
            Self::InputImage { .. } => "input_image",
            Self::InputFile { .. } => "input_file",
            Self::InputVideo { .. } => "input_video",
        }
    }
}

/// A `function_call` input item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallInput {
    /// Item id, if resent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The call id that ties the output to this call.
    pub call_id: String,
    /// Function name.
    pub name: String,
    /// Arguments as a JSON string.
    pub arguments: String,
    /// Status, if resent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A function's output: a string or content parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FunctionOutput {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<InputContent>),
}

/// A `function_call_output` input item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallOutputInput {
    /// Item id, if resent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The call this answers.
    pub call_id: String,
    /// The result.
    pub output: FunctionOutput,
    /// Status, if resent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A `reasoning` input item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasoningInput {
    /// Item id, if resent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Summary texts (`summary_text` parts).
    pub summary: Vec<TextPart>,
    /// Raw reasoning (`reasoning_text` parts), when the client resends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<TextPart>>,
    /// Opaque provider data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
}

/// A `{type, text}` part (`summary_text` or `reasoning_text`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextPart {
    /// `summary_text` or `reasoning_text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
}

/// A `compaction` input item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionInput {
    /// Item id, if resent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Opaque compacted context.
    pub encrypted_content: String,
}

/// An `item_reference` input item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemReference {
    /// The referenced item's id.
    pub id: String,
}

/// Parses `input`: a string (one user message) or an array of items, at most
/// `max_items` of them.
pub fn parse_input(value: &Value, max_items: usize) -> Result<Vec<InputItem>, ApiError> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => {
            super::parse::check_len("input", s, 0, MAX_TEXT_CHARS)?;
            Ok(vec![InputItem::Message(InputMessage {
                id: None,
                role: Role::User,
                content: MessageContent::Text(s.clone()),
                status: None,
                phase: None,
            })])
        }
        Value::Array(items) => {
            if items.len() > max_items {
                return Err(ApiError::invalid_with_code(
                    "input",
                    super::error::codes::ARRAY_ABOVE_MAX_LENGTH,
                    format!(
                        "Invalid 'input': array too long. Expected at most {max_items} items, but got {}.",
                        items.len()
                    ),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| parse_item(v, &index_path("input", i)))
                .collect()
        }
        other => Err(wrong_type("input", "a string or an array of items", other)),
    }
}

/// Parses one input item at `path`.
pub fn parse_item(value: &Value, path: &str) -> Result<InputItem, ApiError> {
    let o = Obj::new(value, path)?;
    let kind = match o.opt_str("type")? {
        Some(t) => t,
        None if o.get("role").is_some() => "message",
        None if o.get("id").is_some() => "item_reference",
        None => return Err(missing(&o.path_of("type"))),
    };
    match kind {
        "message" => parse_message(&o).map(InputItem::Message),
        "function_call" => parse_function_call(&o).map(InputItem::FunctionCall),
        "function_call_output" => parse_function_output(&o).map(InputItem::FunctionCallOutput),
        "reasoning" => parse_reasoning(&o).map(InputItem::Reasoning),
        "compaction" => Ok(InputItem::Compaction(CompactionInput {
            id: o.opt_string("id", 0, usize::MAX)?,
            encrypted_content: o.req_string("encrypted_content", 0, MAX_TEXT_CHARS)?,
        })),
        "item_reference" => Ok(InputItem::ItemReference(ItemReference {
            id: o.req_string("id", 1, usize::MAX)?,
        })),
        other => {
            let path = o.path_of("type");
            Err(ApiError::invalid(
                &path,
                format!("Invalid value for '{path}': unknown item type '{other}'."),
            ))
        }
    }
}

fn parse_message(o: &Obj<'_>) -> Result<InputMessage, ApiError> {
    const ROLES: [Role; 4] = [Role::User, Role::Assistant, Role::System, Role::Developer];
    let role = o
        .opt_enum("role", &["user", "assistant", "system", "developer"])?
        .map(|i| ROLES[i])
        .ok_or_else(|| missing(&o.path_of("role")))?;
    let content_path = o.path_of("content");
    let content = match o.get("content") {
        None => return Err(missing(&content_path)),
        Some(Value::String(s)) => {
            super::parse::check_len(&content_path, s, 0, MAX_TEXT_CHARS)?;
            MessageContent::Text(s.clone())
        }
        Some(Value::Array(parts)) => MessageContent::Parts(parse_parts(parts, &content_path)?),
        Some(other) => return Err(wrong_type(&content_path, "a string or an array", other)),
    };
    let phase = o
        .opt_enum("phase", &["commentary", "final_answer"])?
        .map(|i| {
            if i == 0 {
                Phase::Commentary
            } else {
                Phase::FinalAnswer
            }
        });
    Ok(InputMessage {
        id: o.opt_string("id", 0, usize::MAX)?,
        role,
        content,
        status: o.opt_string("status", 0, usize::MAX)?,
        phase,
    })
}

fn parse_parts(parts: &[Value], path: &str) -> Result<Vec<InputContent>, ApiError> {
    parts
        .iter()
        .enumerate()
        .map(|(i, v)| parse_part(v, &index_path(path, i)))
        .collect()
}

/// Parses one content part at `path`.
fn parse_part(value: &Value, path: &str) -> Result<InputContent, ApiError> {
    const TYPES: [&str; 6] = [
        "input_text",
        "output_text",
        "refusal",
        "input_image",
        "input_file",
        "input_video",
    ];
    let o = Obj::new(value, path)?;
    let kind = o
        .opt_enum("type", &TYPES)?
        .ok_or_else(|| missing(&o.path_of("type")))?;
    Ok(match TYPES[kind] {
        "input_text" => InputContent::InputText {
            text: o.req_string("text", 0, MAX_TEXT_CHARS)?,
        },
        "output_text" => InputContent::OutputText {
            text: o.req_string("text", 0, MAX_TEXT_CHARS)?,
            annotations: o.opt_array("annotations")?.cloned().unwrap_or_default(),
        },
        "refusal" => InputContent::Refusal {
            refusal: o.req_string("refusal", 0, MAX_TEXT_CHARS)?,
        },
        "input_image" => {
            if let Some(i) = o.opt_str("detail")? {
                enum_index(&o.path_of("detail"), i, &["low", "high", "auto"])?;
            }
            InputContent::InputImage {
                image_url: o.opt_string("image_url", 0, MAX_IMAGE_URL_CHARS)?,
                detail: o.opt_string("detail", 0, 8)?,
            }
        }
        "input_file" => InputContent::InputFile {
            filename: o.opt_string("filename", 0, usize::MAX)?,
            file_data: o.opt_string("file_data", 0, MAX_FILE_DATA_CHARS)?,
            file_url: o.opt_string("file_url", 0, usize::MAX)?,
        },
        _ => InputContent::InputVideo {
            video_url: o.req_string("video_url", 0, usize::MAX)?,
        },
    })
}

/// Whether `name` matches `^[a-zA-Z0-9_-]+$`.
pub(crate) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A function name at `key` of `o`: 1–64 characters of `[a-zA-Z0-9_-]`.
pub(crate) fn req_function_name(o: &Obj<'_>, key: &str) -> Result<String, ApiError> {
    let name = o.req_string(key, 1, MAX_NAME_CHARS)?;
    if !is_valid_name(&name) {
        let path = o.path_of(key);
        return Err(ApiError::invalid(
            &path,
            format!("Invalid '{path}': '{name}' does not match the pattern '^[a-zA-Z0-9_-]+$'."),
        ));
    }
    Ok(name)
}

fn parse_function_call(o: &Obj<'_>) -> Result<FunctionCallInput, ApiError> {
    Ok(FunctionCallInput {
        id: o.opt_string("id", 0, usize::MAX)?,
        call_id: o.req_string("call_id", 1, MAX_NAME_CHARS)?,
        name: req_function_name(o, "name")?,
        arguments: o.req_string("arguments", 0, MAX_TEXT_CHARS)?,
        status: o.opt_string("status", 0, usize::MAX)?,
    })
}

fn parse_function_output(o: &Obj<'_>) -> Result<FunctionCallOutputInput, ApiError> {
    let path = o.path_of("output");
    let output = match o.get("output") {
        None => return Err(missing(&path)),
        Some(Value::String(s)) => {
            super::parse::check_len(&path, s, 0, MAX_TEXT_CHARS)?;
            FunctionOutput::Text(s.clone())
        }
        Some(Value::Array(parts)) => FunctionOutput::Parts(parse_parts(parts, &path)?),
        Some(other) => return Err(wrong_type(&path, "a string or an array", other)),
    };
    Ok(FunctionCallOutputInput {
        id: o.opt_string("id", 0, usize::MAX)?,
        call_id: o.req_string("call_id", 1, MAX_NAME_CHARS)?,
        output,
        status: o.opt_string("status", 0, usize::MAX)?,
    })
}

fn parse_reasoning(o: &Obj<'_>) -> Result<ReasoningInput, ApiError> {
    let summary = match o.opt_array("summary")? {
        Some(parts) => parse_text_parts(parts, &o.path_of("summary"), "summary_text")?,
        None => return Err(missing(&o.path_of("summary"))),
    };
    let content = match o.opt_array("content")? {
        Some(parts) => Some(parse_text_parts(
            parts,
            &o.path_of("content"),
            "reasoning_text",
        )?),
        None => None,
    };
    Ok(ReasoningInput {
        id: o.opt_string("id", 0, usize::MAX)?,
        summary,
        content,
        encrypted_content: o.opt_string("encrypted_content", 0, MAX_TEXT_CHARS)?,
    })
}

fn parse_text_parts(parts: &[Value], path: &str, kind: &str) -> Result<Vec<TextPart>, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (i, v) in parts.iter().enumerate() {
        let o = Obj::new(v, &index_path(path, i))?;
        let found = o.opt_enum("type", &[kind])?;
        if found.is_none() {
            return Err(missing(&o.path_of("type")));
        }
        out.push(TextPart {
            kind: kind.to_owned(),
            text: o.req_string("text", 0, MAX_TEXT_CHARS)?,
        });
    }
    Ok(out)
}
