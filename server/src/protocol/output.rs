//! Output items (`ItemField`, digest §4b) and output content parts, as they
//! appear in `response.output` and in streaming events' `item`/`part`.

use super::items::{
    CompactionInput, FunctionCallInput, FunctionCallOutputInput, FunctionOutput, InputContent,
    InputItem, InputMessage, MessageContent, Phase, ReasoningInput, Role, TextPart,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An item's lifecycle status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Being sampled.
    InProgress,
    /// Finished.
    Completed,
    /// Cut short (e.g. the token budget ran out).
    Incomplete,
}

/// A token's log-probability: `{token, logprob, bytes, top_logprobs}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogProb {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f64,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogProb>,
}

/// An alternative token: `{token, logprob, bytes}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogProb {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f64,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// An output content part (the `ContentPart` union, the kinds Spindle uses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputContent {
    /// `output_text{text, annotations, logprobs}`; both arrays always sent.
    OutputText {
        /// The text.
        text: String,
        /// Citations (always `[]` here).
        #[serde(default)]
        annotations: Vec<Value>,
        /// Per-token log-probabilities (`[]` unless asked for).
        #[serde(default)]
        logprobs: Vec<LogProb>,
    },
    /// `refusal{refusal}`.
    Refusal {
        /// The refusal text.
        refusal: String,
    },
    /// `reasoning_text{text}`: raw reasoning.
    ReasoningText {
        /// The text.
        text: String,
    },
    /// `summary_text{text}`: a reasoning summary.
    SummaryText {
        /// The text.
        text: String,
    },
}

impl OutputContent {
    /// An empty `output_text` part, as `content_part.added` carries it.
    pub fn empty_text() -> Self {
        Self::OutputText {
            text: String::new(),
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }

    /// The part's text.
    pub fn text(&self) -> &str {
        match self {
            Self::OutputText { text, .. }
            | Self::ReasoningText { text }
            | Self::SummaryText { text } => text,
            Self::Refusal { refusal } => refusal,
        }
    }
}

/// An output item, discriminated by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// An assistant message.
    Message(OutputMessage),
    /// A call of a client-side function.
    FunctionCall(FunctionCallItem),
    /// A function's result (in echoed trajectories).
    FunctionCallOutput(FunctionCallOutputItem),
    /// Reasoning.
    Reasoning(ReasoningItem),
    /// A compacted window.
    Compaction(CompactionItem),
}

/// `message`: `{type, id, status, role, content}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputMessage {
    /// `msg_…`.
    pub id: String,
    /// Lifecycle status.
    pub status: ItemStatus,
    /// Author (always `assistant` for generated messages).
    pub role: Role,
    /// Content parts.
    pub content: Vec<OutputContent>,
    /// Phase, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
}

/// `function_call`: `{type, id, call_id, name, arguments, status}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCallItem {
    /// `fc_…`.
    pub id: String,
    /// `call_…`: what the client's `function_call_output` refers to.
    pub call_id: String,
    /// Function name.
    pub name: String,
    /// Arguments as a JSON string.
    pub arguments: String,
    /// Lifecycle status.
    pub status: ItemStatus,
}

/// `function_call_output`: `{type, id, call_id, output, status}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallOutputItem {
    /// Item id.
    pub id: String,
    /// The call answered.
    pub call_id: String,
    /// The result.
    pub output: FunctionOutput,
    /// Lifecycle status.
    pub status: ItemStatus,
}

/// `reasoning`: `{type, id, summary, content, encrypted_content?, status}`.
/// `status` is not in the schema but the prose requires it on every item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasoningItem {
    /// `rs_…`.
    pub id: String,
    /// Summary parts (`summary_text`).
    pub summary: Vec<OutputContent>,
    /// Raw reasoning parts (`reasoning_text`).
    #[serde(default)]
    pub content: Vec<OutputContent>,
    /// Opaque provider data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
    /// Lifecycle status.
    pub status: ItemStatus,
}

/// `compaction`: `{type, id, encrypted_content}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionItem {
    /// `cmp_…`.
    pub id: String,
    /// Opaque compacted context.
    pub encrypted_content: String,
}

impl OutputItem {
    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            Self::Message(m) => &m.id,
            Self::FunctionCall(f) => &f.id,
            Self::FunctionCallOutput(f) => &f.id,
            Self::Reasoning(r) => &r.id,
            Self::Compaction(c) => &c.id,
        }
    }

    /// The item as input for a later turn (`previous_response_id` chains):
    /// ids are kept; message parts become `output_text`/`refusal`.
    pub fn to_input(&self) -> InputItem {
        match self {
            Self::Message(m) => InputItem::Message(InputMessage {
                id: Some(m.id.clone()),
                role: m.role,
                content: MessageContent::Parts(m.content.iter().map(content_to_input).collect()),
                status: Some(status_name(m.status).to_owned()),
                phase: m.phase,
            }),
            Self::FunctionCall(f) => InputItem::FunctionCall(FunctionCallInput {
                id: Some(f.id.clone()),
                call_id: f.call_id.clone(),
                name: f.name.clone(),
                arguments: f.arguments.clone(),
                status: Some(status_name(f.status).to_owned()),
            }),
            Self::FunctionCallOutput(f) => InputItem::FunctionCallOutput(FunctionCallOutputInput {
                id: Some(f.id.clone()),
                call_id: f.call_id.clone(),
                output: f.output.clone(),
                status: Some(status_name(f.status).to_owned()),
            }),
            Self::Reasoning(r) => InputItem::Reasoning(ReasoningInput {
                id: Some(r.id.clone()),
                summary: r
                    .summary
                    .iter()
                    .map(|p| text_part("summary_text", p))
                    .collect(),
                content: (!r.content.is_empty()).then(|| {
                    r.content
                        .iter()
                        .map(|p| text_part("reasoning_text", p))
                        .collect()
                }),
                encrypted_content: r.encrypted_content.clone(),
            }),
            Self::Compaction(c) => InputItem::Compaction(CompactionInput {
                id: Some(c.id.clone()),
                encrypted_content: c.encrypted_content.clone(),
            }),
        }
    }
}

/// The wire name of a status.
pub fn status_name(status: ItemStatus) -> &'static str {
    match status {
        ItemStatus::InProgress => "in_progress",
        ItemStatus::Completed => "completed",
        ItemStatus::Incomplete => "incomplete",
    }
}

fn content_to_input(part: &OutputContent) -> InputContent {
    match part {
        OutputContent::OutputText {
            text, annotations, ..
        } => InputContent::OutputText {
            text: text.clone(),
            annotations: annotations.clone(),
        },
        OutputContent::Refusal { refusal } => InputContent::Refusal {
            refusal: refusal.clone(),
        },
        other => InputContent::InputText {
            text: other.text().to_owned(),
        },
    }
}

fn text_part(kind: &str, part: &OutputContent) -> TextPart {
    TextPart {
        kind: kind.to_owned(),
        text: part.text().to_owned(),
    }
}
