//! Streaming events (digest §5b): the 24-event catalogue as one
//! `#[serde(tag = "type")]` enum. The `stream_events!` list below is the one
//! source of event names: it generates the serde renames, [`StreamEvent::event_type`]
//! and [`EVENT_TYPES`]. Every event carries `sequence_number`.

use super::error::ErrorPayload;
use super::output::{LogProb, OutputContent, OutputItem};
use super::response::ResponseObject;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `response.{created,queued,in_progress,completed,failed,incomplete}`:
/// a full response snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseEvent {
    /// Position in the stream, from 0.
    pub sequence_number: u64,
    /// The response at this point.
    pub response: Box<ResponseObject>,
}

/// `response.output_item.{added,done}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputItemEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The item's index in `response.output`.
    pub output_index: usize,
    /// The item (zero-valued on `added`, final on `done`).
    pub item: OutputItem,
}

/// `response.content_part.{added,done}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPartEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The owning item's id.
    pub item_id: String,
    /// The owning item's index.
    pub output_index: usize,
    /// The part's index in the item's `content`.
    pub content_index: usize,
    /// The part (empty on `added`, final on `done`).
    pub part: OutputContent,
}

/// `response.output_text.delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputTextDeltaEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The message's id.
    pub item_id: String,
    /// The message's index.
    pub output_index: usize,
    /// The part's index.
    pub content_index: usize,
    /// New text.
    pub delta: String,
    /// Log-probabilities of the delta's tokens (`[]` unless asked for).
    #[serde(default)]
    pub logprobs: Vec<LogProb>,
}

/// `response.output_text.done`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputTextDoneEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The message's id.
    pub item_id: String,
    /// The message's index.
    pub output_index: usize,
    /// The part's index.
    pub content_index: usize,
    /// The part's full text.
    pub text: String,
    /// All log-probabilities of the part (`[]` unless asked for).
    #[serde(default)]
    pub logprobs: Vec<LogProb>,
}

/// `response.output_text.annotation.added`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnnotationAddedEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The message's id.
    pub item_id: String,
    /// The message's index.
    pub output_index: usize,
    /// The part's index.
    pub content_index: usize,
    /// The annotation's index in the part.
    pub annotation_index: usize,
    /// The annotation (`url_citation`).
    pub annotation: Value,
}

/// `response.refusal.delta` and `response.reasoning.delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartDeltaEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The item's id.
    pub item_id: String,
    /// The item's index.
    pub output_index: usize,
    /// The part's index.
    pub content_index: usize,
    /// New text.
    pub delta: String,
}

/// `response.refusal.done`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefusalDoneEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The message's id.
    pub item_id: String,
    /// The message's index.
    pub output_index: usize,
    /// The part's index.
    pub content_index: usize,
    /// The full refusal.
    pub refusal: String,
}

/// `response.reasoning.done`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartTextDoneEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The item's id.
    pub item_id: String,
    /// The item's index.
    pub output_index: usize,
    /// The part's index.
    pub content_index: usize,
    /// The full text.
    pub text: String,
}

/// `response.function_call_arguments.delta` (no `content_index`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArgumentsDeltaEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The call item's id.
    pub item_id: String,
    /// The call item's index.
    pub output_index: usize,
    /// New argument text.
    pub delta: String,
}

/// `response.function_call_arguments.done`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArgumentsDoneEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The call item's id.
    pub item_id: String,
    /// The call item's index.
    pub output_index: usize,
    /// The full arguments JSON string.
    pub arguments: String,
}

/// `response.reasoning_summary_part.{added,done}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryPartEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The reasoning item's id.
    pub item_id: String,
    /// The reasoning item's index.
    pub output_index: usize,
    /// The part's index in `summary`.
    pub summary_index: usize,
    /// The part.
    pub part: OutputContent,
}

/// `response.reasoning_summary_text.delta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryTextDeltaEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The reasoning item's id.
    pub item_id: String,
    /// The reasoning item's index.
    pub output_index: usize,
    /// The part's index in `summary`.
    pub summary_index: usize,
    /// New text.
    pub delta: String,
}

/// `response.reasoning_summary_text.done`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryTextDoneEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// The reasoning item's id.
    pub item_id: String,
    /// The reasoning item's index.
    pub output_index: usize,
    /// The part's index in `summary`.
    pub summary_index: usize,
    /// The full text.
    pub text: String,
}

/// `error`: `{type:"error", sequence_number, error:{type, code, message, param}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEvent {
    /// Position in the stream.
    pub sequence_number: u64,
    /// What went wrong.
    pub error: ErrorPayload,
}

macro_rules! stream_events {
    ($( $(#[doc = $doc:literal])* $variant:ident($payload:ty) = $name:literal, )*) => {
        /// A streaming event; serializes as `{"type": <name>, "sequence_number", ...}`.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        pub enum StreamEvent {
            $( $(#[doc = $doc])* #[serde(rename = $name)] $variant($payload), )*
        }

        /// Every event type name, in catalogue order.
        pub const EVENT_TYPES: &[&str] = &[$($name),*];

        impl StreamEvent {
            /// The event's `type` (also the SSE `event:` field).
            pub fn event_type(&self) -> &'static str {
                match self { $( Self::$variant(_) => $name, )* }
            }

            /// The event's `sequence_number`.
            pub fn sequence_number(&self) -> u64 {
                match self { $( Self::$variant(e) => e.sequence_number, )* }
            }
        }
    };
}

stream_events! {
    /// `response.created`: first event, `status: in_progress` (or `queued`).
    Created(ResponseEvent) = "response.created",
    /// `response.queued` (background mode).
    Queued(ResponseEvent) = "response.queued",
    /// `response.in_progress`.
    InProgress(ResponseEvent) = "response.in_progress",
    /// `response.completed`: terminal.
    Completed(ResponseEvent) = "response.completed",
    /// `response.failed`: terminal, after `error`.
    Failed(ResponseEvent) = "response.failed",
    /// `response.incomplete`: terminal.
    Incomplete(ResponseEvent) = "response.incomplete",
    /// `response.output_item.added`.
    OutputItemAdded(OutputItemEvent) = "response.output_item.added",
    /// `response.output_item.done`.
    OutputItemDone(OutputItemEvent) = "response.output_item.done",
    /// `response.content_part.added`.
    ContentPartAdded(ContentPartEvent) = "response.content_part.added",
    /// `response.content_part.done`.
    ContentPartDone(ContentPartEvent) = "response.content_part.done",
    /// `response.output_text.delta`.
    OutputTextDelta(OutputTextDeltaEvent) = "response.output_text.delta",
    /// `response.output_text.done`.
    OutputTextDone(OutputTextDoneEvent) = "response.output_text.done",
    /// `response.output_text.annotation.added`.
    AnnotationAdded(AnnotationAddedEvent) = "response.output_text.annotation.added",
    /// `response.refusal.delta`.
    RefusalDelta(PartDeltaEvent) = "response.refusal.delta",
    /// `response.refusal.done`.
    RefusalDone(RefusalDoneEvent) = "response.refusal.done",
    /// `response.function_call_arguments.delta`.
    FunctionCallArgumentsDelta(ArgumentsDeltaEvent) = "response.function_call_arguments.delta",
    /// `response.function_call_arguments.done`.
    FunctionCallArgumentsDone(ArgumentsDoneEvent) = "response.function_call_arguments.done",
    /// `response.reasoning.delta` (Open Responses' name; OpenAI says `reasoning_text`).
    ReasoningDelta(PartDeltaEvent) = "response.reasoning.delta",
    /// `response.reasoning.done`.
    ReasoningDone(PartTextDoneEvent) = "response.reasoning.done",
    /// `response.reasoning_summary_part.added`.
    ReasoningSummaryPartAdded(SummaryPartEvent) = "response.reasoning_summary_part.added",
    /// `response.reasoning_summary_part.done`.
    ReasoningSummaryPartDone(SummaryPartEvent) = "response.reasoning_summary_part.done",
    /// `response.reasoning_summary_text.delta`.
    ReasoningSummaryTextDelta(SummaryTextDeltaEvent) = "response.reasoning_summary_text.delta",
    /// `response.reasoning_summary_text.done`.
    ReasoningSummaryTextDone(SummaryTextDoneEvent) = "response.reasoning_summary_text.done",
    /// `error`: always followed by `response.failed` on SSE.
    Error(ErrorEvent) = "error",
}

/// The SSE stream's last line.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

impl StreamEvent {
    /// Whether this event ends the response (`completed`, `failed`, `incomplete`).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Completed(_) | Self::Failed(_) | Self::Incomplete(_)
        )
    }

    /// The response snapshot of a lifecycle event.
    pub fn response(&self) -> Option<&ResponseObject> {
        match self {
            Self::Created(e)
            | Self::Queued(e)
            | Self::InProgress(e)
            | Self::Completed(e)
            | Self::Failed(e)
            | Self::Incomplete(e) => Some(&e.response),
            _ => None,
        }
    }

    /// The event's JSON on one line.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// One SSE frame: `event: <type>\ndata: <json>\n\n` (`\n` endings, one
    /// `data:` line), to be written in one write.
    pub fn to_sse(&self) -> Result<String, serde_json::Error> {
        let json = self.to_json()?;
        let name = self.event_type();
        let mut frame = String::with_capacity(json.len() + name.len() + 16);
        frame.push_str("event: ");
        frame.push_str(name);
        frame.push_str("\ndata: ");
        frame.push_str(&json);
        frame.push_str("\n\n");
        Ok(frame)
    }
}
